"""Stage 2, parse (text logs): NCCL, c10d, Python, torchrun and system output -> events, a batch at a time.

Lines are read in bulk into polars, peeled of wrapper prefixes (`lines.py`), and given a `kind`
by vectorised literal/regex tests. Only the rare lines that carry structure (WorkNCCL records,
process-group status, structured NCCL WARNs, torchrun failure tables) go through the Lark
grammars. Lines that match no kind are counted, not kept: the input table reports them.
Alike kept lines of one writer (NCCL's per-channel connection lines, a line repeated verbatim) are
aggregated into one event before the costly field extraction, so events grow with communicators,
not with channels or repeats, and memory stays bounded by one batch.
The parts: `classify.py` (headers and kinds), `repeats.py` (aggregation), `fields.py` and
`records.py` (event fields, grammar-parsed records).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import polars as pl

from analyzer.io import InputFile, iter_text_chunks
from analyzer.events import conform, detached, empty_events
from analyzer.parse.classify import LINE_KINDS, TIME_COLUMNS, classify, vocabulary_kind, with_timestamps, writer_columns
from analyzer.parse.fields import to_events
from analyzer.parse.lines import lines_frame_many, peel_prefixes, split_interleaved
from analyzer.parse.nodestate import NODE_STATE_START_LITERALS, node_state_events
from analyzer.parse.repeats import PRE_COLLAPSED, collapse_connection_lines, collapse_repeats, repeat_keys, same_message
from analyzer.parse.vocabulary import vocabulary


# Every literal of every line kind: a line containing none of them cannot be classified, so it is
# counted and dropped before any regex runs (Aho-Corasick over the raw text, the cheap part).
# Step and progress lines are numerous and only the first and last per file matter to the report:
# they are sampled instead of classified.
_SAMPLED_KINDS = ("train.step", "progress")
# Node-state block starts and the vocabularies' literals ride on the same pass. A kind with a
# `screen` (its literals are common in healthy logs) brings the screen instead of its literals.
PREFILTER_LITERALS: tuple[str, ...] = tuple(
    sorted(
        {lit for k in LINE_KINDS if k.kind not in _SAMPLED_KINDS and not k.screen for lit in k.literals}
        | set(NODE_STATE_START_LITERALS)
        | set(vocabulary().prefilter)
    )
)
PREFILTER_SCREENS: tuple[str, ...] = tuple(dict.fromkeys(k.screen for k in LINE_KINDS if k.screen))
_STEP_LITERALS = tuple(sorted({lit for k in LINE_KINDS if k.kind in _SAMPLED_KINDS for lit in k.literals}))
# Lines that may belong to a multi-line record (traceback frames and their indented source lines).
_CONTEXT_LITERALS = ('File "', "Traceback", "    ")
# Each set of literals is tested as regex alternations: the regex engine's own literal search runs
# about twice as fast here as `contains_any`'s Aho-Corasick (and finds the same lines). Its speed
# is not smooth in the number of literals: between about 2,500 and 3,000 literals Rust's regex
# runs a lazy DFA whose cache thrashes, 30-90x slower than below or above (measured for issue 19:
# the prefilter grew from 2,497 to 2,716 literals and analyze tripled on the genjob workload). So a
# literal that contains another one of the set is dropped (a line holding it holds the shorter
# one: the same lines are candidates) and the rest is cut into alternations of at most
# _ALTERNATION_LITERALS, each well inside the fast range.
_ALTERNATION_LITERALS = 1000


def minimal_literals(literals: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The literals of which no other literal of the set is a substring (a line holds one of
    `literals` exactly when it holds one of these)."""
    kept: list[str] = []
    for lit in sorted(set(literals), key=lambda x: (len(x), x)):
        if not any(shorter in lit for shorter in kept):
            kept.append(lit)
    return tuple(sorted(kept))


def alternations(literals: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Regex alternations that together match a text exactly when it holds one of `literals`."""
    lits = minimal_literals(literals)
    return tuple(
        "|".join(re.escape(lit) for lit in lits[at : at + _ALTERNATION_LITERALS]) for at in range(0, len(lits), _ALTERNATION_LITERALS)
    )


def holds_any(expr: pl.Expr, patterns: tuple[str, ...]) -> pl.Expr:
    """`expr` matches one of `patterns` (the output of `alternations`)."""
    flag = pl.lit(False)
    for pattern in patterns:
        flag = flag | expr.str.contains(pattern)
    return flag


_SCREENS = ("|".join(f"(?:{screen})" for screen in PREFILTER_SCREENS),) if PREFILTER_SCREENS else ()
PREFILTER_PATTERNS = alternations(PREFILTER_LITERALS) + _SCREENS  # what makes a raw line a candidate
_STEP = alternations(_STEP_LITERALS)
_CONTEXT = alternations(_CONTEXT_LITERALS)
_STEPS_KEPT_AT_END = 2
_NEIGHBOURS_AFTER = 3  # `Last error:` and wrapped WorkNCCL records continue on the next lines


@dataclass
class TextPiece:
    """One decoded chunk of one input, with the line number its first line has in the file."""

    item: InputFile
    text: str
    first_line: int
    last_piece: bool


def iter_pieces(item: InputFile) -> Iterator[TextPiece]:
    first_line = 1
    previous: str | None = None
    for chunk in iter_text_chunks(item):
        if previous is not None:
            yield TextPiece(item, previous, first_line, last_piece=False)
            first_line += _line_count(previous)
        previous = chunk
    if previous is not None:
        yield TextPiece(item, previous, first_line, last_piece=True)


def _line_count(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def parse_text_file(item: InputFile, year_hint: int) -> pl.DataFrame:
    """All events of one text log (sets `item.lines` / `item.unparsed_lines`)."""
    return parse_text_pieces(list(iter_pieces(item)), year_hint)


def parse_text_pieces(pieces: list[TextPiece], year_hint: int) -> pl.DataFrame:
    """Events of a batch of text chunks, possibly from many files, processed as one frame."""
    if not pieces:
        return empty_events()
    lines = lines_frame_many([(p.text, p.item.path, p.first_line) for p in pieces])
    text = pl.col("text")
    lines = lines.with_columns(
        holds_any(text, PREFILTER_PATTERNS).alias("_cand"),
        holds_any(text, _STEP).alias("_step"),
        holds_any(text, _CONTEXT).alias("_ctx"),
        text.str.contains(r"\S").alias("_nonempty"),
    )
    files = [p.item.path for p in pieces]
    chosen = _chosen_lines(lines, in_order=files == sorted(files))
    # Each step returns only what the next needs, so the batch-sized frames in between are freed.
    kept, recognised = _kept_lines(chosen, year_hint)
    node_state = node_state_events(lines, candidates="_cand")
    events = [to_events(kept, chosen, year_hint), node_state, _time_bound_events(lines, recognised, year_hint)]
    last_files = [p.item.path for p in pieces if p.last_piece]
    last = lines.filter(pl.col("_nonempty") & pl.col("file").is_in(last_files)).group_by("file", maintain_order=True).last()
    if last.height:
        events.append(_last_line_event(split_interleaved(peel_prefixes(last.select("file", "line", "text"))), year_hint))
    _count_lines(pieces, lines, pl.concat([recognised, node_state.select("file", "line", "kind", pl.lit(1, dtype=pl.Int64).alias("_pre_n"))]))
    if not any(e.height for e in events):
        return empty_events()
    # Kept string columns are views into the whole batch's buffers: detach them so the batch can be
    # freed and memory stays bounded by one batch rather than growing with the input.
    return detached(pl.concat([e for e in events if e.height], how="vertical"))


def _chosen_lines(lines: pl.DataFrame, in_order: bool) -> pl.DataFrame:
    """The lines worth classifying: prefilter candidates, their neighbours, multi-line context, and
    a sample of step lines, in (file, line) order (`in_order`: the batch already is); cut where
    writers interleave, numbered for `_with_context`."""
    near = pl.lit(False)
    for offset in (*range(1, _NEIGHBOURS_AFTER + 1), -1):  # -1: `[N]:` before a table field
        near = near | _shifted_in_file("_cand", offset)
    selected = pl.col("_cand") | pl.col("_ctx") | near
    step = pl.col("_step") & ~selected
    position = step.cum_sum().over("_fid")  # 1 for a file's first step line
    sampled = step & ((position == 1) | (position > step.sum().over("_fid") - _STEPS_KEPT_AT_END))
    chosen = lines.filter(selected | sampled)
    chosen = collapse_connection_lines(chosen if in_order else chosen.sort("file", "line"))
    # Interleaved writers: a line carrying another process's record becomes logical lines (`part`);
    # line counts below stay physical (`lines`, and `kept`'s distinct line numbers).
    chosen = split_interleaved(peel_prefixes(chosen))
    return chosen.with_row_index("_at")  # an event's row here: its neighbours are found by number


def _shifted_in_file(flag: str, offset: int) -> pl.Expr:
    """`flag` of the line `offset` rows before (after, when negative) in the same file: a file's
    lines are contiguous, so that is a shift and a comparison of file ids, not a window per file."""
    same_file = pl.col("_fid").shift(offset) == pl.col("_fid")
    return (pl.col(flag).shift(offset) & same_file).fill_null(False)


def _kept_lines(chosen: pl.DataFrame, year_hint: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The classified lines that have a kind, and their vocabulary hits, alike lines aggregated; and
    (file, line, kind, `_pre_n`) of every one of them before aggregation, for the line counts.

    What `classify` adds depends on a line's body alone, so each distinct body is classified once
    (a line repeated verbatim costs one hash, not a hundred regexes). Which rows survive is decided
    on narrow keys (`collapse_repeats`); only the survivors are gathered into wide rows.
    """
    classified = classify(chosen.select("body").unique()).with_columns(same_message().alias("_same"))
    classified = classified.with_row_index("_class")
    narrow = ["_class", "kind", "vocab_category", "_same", "nccl_host", "nccl_pid", "nccl_tid", *TIME_COLUMNS]
    lines = chosen.select("_at", "_fid", "file", "line", "part", "body", "pfx_host", "pfx_pid", "pfx_rank", "collector_ts", *PRE_COLLAPSED).join(
        classified.select("body", *narrow), on="body", how="left", maintain_order="left"
    )
    keys = lines.select(
        pl.col("_at").alias("_row"), "_class", "_fid", "file", "line", "part", "kind", vocabulary_kind().alias("_vocab"), *PRE_COLLAPSED,
        *repeat_keys(year_hint),
    )
    keys = pl.concat(
        [keys.filter(pl.col("kind").is_not_null()), keys.filter(pl.col("_vocab").is_not_null()).with_columns(pl.col("_vocab").alias("kind"))],
        how="vertical",
    ).drop("_vocab")
    # Step lines that were chosen for another reason (a neighbour, a literal of another kind) are
    # sampled like the others: a file's first and last few stay events.
    step = pl.col("kind").is_in(_SAMPLED_KINDS)
    position = step.cum_sum().over("_fid")
    unsampled = step & (position > 1) & (position <= step.sum().over("_fid") - _STEPS_KEPT_AT_END)
    survivors = collapse_repeats(keys.filter(~unsampled).drop("_fid"))
    kept = pl.concat(
        [
            chosen.drop(PRE_COLLAPSED)[survivors.get_column("_row")],
            classified.drop("body", "_class", "_same")[survivors.get_column("_class")].with_columns(survivors.get_column("kind")),
            survivors.drop("_row", "_class", "kind"),
        ],
        how="horizontal",
    )
    return kept, keys.select("file", "line", "kind", "_pre_n")


def _count_lines(pieces: list[TextPiece], lines: pl.DataFrame, kept: pl.DataFrame) -> None:
    """Per file: lines read, and non-empty lines that no kind recognised (step lines count as read)."""
    totals = lines.group_by("file").agg(
        pl.len().alias("n"),
        (pl.col("_nonempty") & ~pl.col("_step")).sum().alias("nonempty"),
    )
    # A line is counted once whatever its kinds and parts; a row standing for several lines counts them all.
    recognised = (
        kept.filter(pl.col("kind") != "train.step").unique(["file", "line"]).group_by("file").agg(pl.col("_pre_n").sum().alias("k"))
    )
    counts = totals.join(recognised, on="file", how="left").fill_null(0)
    by_file = {f: (n, max(ne - k, 0)) for f, n, ne, k in counts.iter_rows()}
    for item in {id(p.item): p.item for p in pieces}.values():
        n, unparsed = by_file.get(item.path, (0, 0))
        item.lines += n
        item.unparsed_lines += unparsed

# A timestamped line that no kind recognises still bounds the job's time span (torchrun's glog
# header lines open most consoles): per file and batch, the earliest and latest such lines (of the
# ones that are no event already) become `log.timed` events, without a message so that no signature
# can match them.
_CLOCK_SCREEN = r"\d\d:\d\d"  # every header time has HH:MM; lines without one are not peeled
_CLOCK_TRIED = 16  # screened lines tried at each end of a file's batch (a "12:30" in prose has no header)


def _time_bound_events(lines: pl.DataFrame, recognised: pl.DataFrame, year_hint: int) -> pl.DataFrame:
    position = pl.int_range(pl.len()).over("_fid")
    screened = lines.filter(pl.col("_nonempty") & pl.col("text").str.contains(_CLOCK_SCREEN))
    ends = screened.join(recognised.select("file", "line"), on=["file", "line"], how="anti", maintain_order="left").filter(
        (position < _CLOCK_TRIED) | (position >= pl.len().over("_fid") - _CLOCK_TRIED)
    )
    if ends.height == 0:
        return empty_events()
    stamped = with_timestamps(classify(peel_prefixes(ends.select("file", "line", "text"))), year_hint).filter(
        pl.col("ts").is_not_null()
    )
    bounds = pl.concat([stamped.group_by("file").first(), stamped.group_by("file").last()]).unique(["file", "line"])
    return conform(bounds.with_columns(
        *writer_columns(), pl.lit("log.timed").alias("kind"), pl.lit("text").alias("source"), pl.lit("info").alias("severity"),
        pl.lit(None, dtype=pl.String).alias("message"),
    ).sort("file", "line"))


def _last_line_event(last: pl.DataFrame, year_hint: int) -> pl.DataFrame:
    frame = last.with_columns(
        pl.lit("log.last").alias("kind"),
        pl.col("body").alias("message"),
        pl.col("pfx_rank").alias("rank"),
        pl.col("pfx_local_rank").alias("local_rank"),
        pl.col("pfx_host").alias("host"),
        pl.lit("text").alias("source"),
        pl.lit("info").alias("severity"),
    )
    return conform(frame)


def year_hint_for(item: InputFile) -> int:
    """c10d headers have no year; the file's modification time is the best local guess."""
    try:
        if item._disk_path is not None:
            return datetime.fromtimestamp(item._disk_path.stat().st_mtime, tz=timezone.utc).year
    except OSError:
        pass
    return datetime.now(tz=timezone.utc).year
