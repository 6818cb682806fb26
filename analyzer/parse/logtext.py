"""Stage 2, parse (text logs): classify lines of NCCL, c10d, Python, torchrun and system output.

Lines are read in bulk into polars, peeled of wrapper prefixes (`lines.py`), and given a `kind`
by vectorised literal/regex tests. Only the rare lines that carry structure (WorkNCCL records,
process-group status, structured NCCL WARNs, torchrun failure tables) go through the Lark
grammars. Lines that match no kind are counted, not kept: the input table reports them.
Alike kept lines of one writer (NCCL's per-channel connection lines, a line repeated verbatim) are
aggregated into one event before the costly field extraction, so events grow with communicators,
not with channels or repeats, and memory stays bounded by one batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import polars as pl

from analyzer.io import InputFile, iter_text_chunks
from analyzer.events import conform, detached, empty_events
from analyzer.parse.grammars import parse_body
from analyzer.parse.line_kinds import LineKind, line_kinds
from analyzer.parse.lines import lines_frame_many, peel_prefixes, split_interleaved
from analyzer.parse.nodestate import NODE_STATE_START_LITERALS, node_state_events
from analyzer.parse.vocabulary import BENIGN, vocabulary, with_hits

# --- headers -------------------------------------------------------------------------------------

# `[ts] host:pid:tid [dev] file:line (func) NCCL WARN msg`; old NCCL (2.0-era) omits "NCCL ".
# Pasted logs keep markdown bold (`**NCCL WARN`), so asterisks are tolerated.
_NCCL = (
    r"^\s*(?:\[(?P<nccl_ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\] )?"
    # A spliced half-line from another process can precede the host: skip up to a non-host char.
    r"(?:(?:\S*?[^\w.\-<>\s])?(?P<nccl_host>[\w.\-<>]+):(?P<nccl_pid>\d+):(?P<nccl_tid>\d+) (?:\[(?P<nccl_dev>\d+)\] )?"
    r"(?:[\w/.\-]+\.(?:cc|cu|c|h|cpp|hpp):\d+ )?(?:\(\w+\) )?\**(?:NCCL )?(?P<nccl_level>INFO|WARN|TRACE|CALL|ERROR)\**\s?(?P<nccl_msg>.*)$"
    # Pasted or redacted lines: `host:XXXXXX [5] ibvwrap.c:262 NCCL WARN`, `include/shm.h:28 NCCL WARN`,
    # `ibvwrap.cc: NCCL WARN`, a bare `NCCL INFO ...`. Without a numeric host:pid:tid the literal
    # `NCCL ` before the level is required.
    r"|(?:(?P<nccl_host_r>[\w.\-<>]+):[Xx*#]{2,}(?::\w+)? )?(?:\[(?P<nccl_dev_r>\d+)\] )?"
    r"(?:[\w/.\-]+\.(?:cc|cu|c|h|cpp|hpp):\d*:? )?\**NCCL (?P<nccl_level_r>INFO|WARN|TRACE|CALL|ERROR)\**\s?(?P<nccl_msg_r>.*)$)"
)
# `[rank0]:[E1130 14:57:41.704937190 ProcessGroupNCCL.cpp:689] msg`, `[E ProcessGroupNCCL.cpp:458] msg`.
# Searched anywhere in the body: a tqdm bar can precede it on the same line.
_C10D = (
    r"\[(?P<c_level>[IWEF])(?P<c_md>\d{3,4})? ?(?P<c_time>\d\d:\d\d:\d\d(?:\.\d+)?)? ?"
    r"(?P<c_src>[\w.]+\.(?:cpp|hpp|h|cc)):\d+\] (?P<c_msg>.*)$"
)
# glog-style: PyTorch 1.x C++ and torchelastic >= 2.4 (`W1130 14:58:48.527000 2133 torch/.../api.py:1012] msg`).
_GLOG = (
    r"^(?P<g_level>[IWEF])(?P<g_md>\d{4}) (?P<g_time>\d\d:\d\d:\d\d\.\d+)\s+\d+ "
    r"[\w./\-]+\.(?:cpp|py|cc|h):\d+\] (?P<g_msg>.*)$"
)
_TRACEBACK_LINE = r'^\s*(?:File ".*", line \d+|Traceback \(most recent call last\)|\^+\s*$|~*\^+~*\s*$)|^\s{2,}\S'

# --- line kinds -------------------------------------------------------------------------------------
# The registry (grammars/line_kinds.toml): regex, severity, header family and prefilter literals per
# kind, validated at load. First match wins, so specific kinds precede generic ones.

LINE_KINDS: tuple[LineKind, ...] = line_kinds()
_PY_EXCEPTION = next(k.pattern for k in LINE_KINDS if k.kind == "traceback.exception")
_TABLE_KINDS = ["torchrun.table_field", "torchrun.table_section", "torchrun.table_entry"]

_KIND_SEVERITY = {k.kind: k.severity for k in LINE_KINDS}
# Kinds whose lines differ only in a part that says nothing (the channel number): that part's regex.
_COLLAPSE = {k.kind: k.collapse for k in LINE_KINDS if k.collapse}
# A communicator's set-up starts and ends with these lines: connection lines between two of them in
# one writer's stream belong to one communicator (the connection lines themselves do not name it).
_COMM_BOUNDARY_KINDS = ("nccl.comm_init", "nccl.topology", "nccl.comm_teardown")
# A line of any other kind repeated verbatim keeps its first few as events of their own (a summary
# counting matching lines reads the same); the rest of the run becomes one event that counts them.
REPEATS_KEPT = 8


# Every literal of every line kind: a line containing none of them cannot be classified, so it is
# counted and dropped before any regex runs (Aho-Corasick over the raw text, the cheap part).
# Step and progress lines are numerous and only the first and last per file matter to the report:
# they are sampled instead of classified.
_SAMPLED_KINDS = ("train.step", "progress")
# Node-state block starts and the vocabularies' literals ride on the same pass (more literals cost
# little in Aho-Corasick).
PREFILTER_LITERALS: tuple[str, ...] = tuple(
    sorted(
        {lit for k in LINE_KINDS if k.kind not in _SAMPLED_KINDS for lit in k.literals}
        | set(NODE_STATE_START_LITERALS)
        | set(vocabulary().prefilter)
    )
)
VOCAB_KIND_PREFIX = "vocab."  # a vocabulary hit becomes an event of kind `vocab.<category>`
_STEP_LITERALS = tuple(sorted({lit for k in LINE_KINDS if k.kind in _SAMPLED_KINDS for lit in k.literals}))
# Lines that may belong to a multi-line record (traceback frames and their indented source lines).
_CONTEXT_LITERALS = ('File "', "Traceback", "    ")
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
        text.str.contains_any(list(PREFILTER_LITERALS)).alias("_cand"),
        text.str.contains_any(list(_STEP_LITERALS)).alias("_step"),
        text.str.contains_any(list(_CONTEXT_LITERALS)).alias("_ctx"),
        (text.str.strip_chars().str.len_chars() > 0).alias("_nonempty"),
    )
    chosen = _chosen_lines(lines)
    # Each step returns only what the next needs, so the batch-sized frames in between are freed.
    kept, recognised = _kept_lines(chosen, year_hint)
    node_state = node_state_events(lines, candidates="_cand")
    events = [_to_events(kept, chosen, year_hint), node_state, _time_bound_events(lines, recognised, year_hint)]
    last_files = [p.item.path for p in pieces if p.last_piece]
    last = lines.filter(pl.col("_nonempty") & pl.col("file").is_in(last_files)).group_by("file", maintain_order=True).last()
    if last.height:
        events.append(_last_line_event(split_interleaved(peel_prefixes(last.select("file", "line", "text"))), year_hint))
    _count_lines(pieces, lines, pl.concat([recognised, node_state.select("file", "line", "kind")]))
    if not any(e.height for e in events):
        return empty_events()
    # Kept string columns are views into the whole batch's buffers: detach them so the batch can be
    # freed and memory stays bounded by one batch rather than growing with the input.
    return detached(pl.concat([e for e in events if e.height], how="vertical"))


def _chosen_lines(lines: pl.DataFrame) -> pl.DataFrame:
    """The lines worth classifying: prefilter candidates, their neighbours, multi-line context, and
    a sample of step lines; cut where writers interleave, numbered for `_with_context`."""
    near = pl.lit(False)
    for offset in range(1, _NEIGHBOURS_AFTER + 1):
        near = near | pl.col("_cand").shift(offset).over("file").fill_null(False)
    near = near | pl.col("_cand").shift(-1).over("file").fill_null(False)  # `[N]:` before a table field
    selected = lines.filter(pl.col("_cand") | pl.col("_ctx") | near)
    steps = _sampled_steps(lines.filter(pl.col("_step") & ~pl.col("_cand") & ~pl.col("_ctx") & ~near))
    # Interleaved writers: a line carrying another process's record becomes logical lines (`part`);
    # line counts below stay physical (`lines`, and `kept`'s distinct line numbers).
    chosen = split_interleaved(peel_prefixes(pl.concat([selected, steps], how="vertical").sort("file", "line")))
    return chosen.with_row_index("_at")  # an event's row here: its neighbours are found by number


def _kept_lines(chosen: pl.DataFrame, year_hint: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The classified lines that have a kind, and their vocabulary hits, alike lines aggregated; and
    (file, line, kind) of every one of them before aggregation, for the line counts.

    What `_classify` adds depends on a line's body alone, so each distinct body is classified once
    (a line repeated verbatim costs one hash, not a hundred regexes). Which rows survive is decided
    on narrow keys (`collapse_repeats`); only the survivors are gathered into wide rows.
    """
    classified = _classify(chosen.select("body").unique()).with_columns(_same_message().alias("_same"))
    classified = classified.with_row_index("_class")
    narrow = ["_class", "kind", "vocab_category", "_same", "nccl_host", "nccl_pid", "nccl_tid", *_TIME_COLUMNS]
    lines = chosen.select("_at", "file", "line", "part", "body", "pfx_host", "pfx_pid", "pfx_rank", "collector_ts").join(
        classified.select("body", *narrow), on="body", how="left", maintain_order="left"
    )
    keys = lines.select(
        pl.col("_at").alias("_row"), "_class", "file", "line", "part", "kind", _vocabulary_kind().alias("_vocab"), *_repeat_keys(year_hint)
    )
    keys = pl.concat(
        [keys.filter(pl.col("kind").is_not_null()), keys.filter(pl.col("_vocab").is_not_null()).with_columns(pl.col("_vocab").alias("kind"))],
        how="vertical",
    ).drop("_vocab")
    survivors = collapse_repeats(keys)
    kept = pl.concat(
        [
            chosen[survivors.get_column("_row")],
            classified.drop("body", "_class", "_same")[survivors.get_column("_class")].with_columns(survivors.get_column("kind")),
            survivors.drop("_row", "_class", "kind"),
        ],
        how="horizontal",
    )
    return kept, keys.select("file", "line", "kind")


def _sampled_steps(steps: pl.DataFrame) -> pl.DataFrame:
    position = pl.int_range(pl.len()).over("file")
    return steps.filter((position == 0) | (position >= pl.len().over("file") - _STEPS_KEPT_AT_END))


def _count_lines(pieces: list[TextPiece], lines: pl.DataFrame, kept: pl.DataFrame) -> None:
    """Per file: lines read, and non-empty lines that no kind recognised (step lines count as read)."""
    totals = lines.group_by("file").agg(
        pl.len().alias("n"),
        (pl.col("_nonempty") & ~pl.col("_step")).sum().alias("nonempty"),
    )
    recognised = kept.group_by("file").agg(pl.col("line").filter(pl.col("kind") != "train.step").n_unique().alias("k"))
    counts = totals.join(recognised, on="file", how="left").fill_null(0)
    by_file = {f: (n, max(ne - k, 0)) for f, n, ne, k in counts.iter_rows()}
    for item in {id(p.item): p.item for p in pieces}.values():
        n, unparsed = by_file.get(item.path, (0, 0))
        item.lines += n
        item.unparsed_lines += unparsed


def _vocabulary_kind() -> pl.Expr:
    """A line a vocabulary row knows is also an event of kind `vocab.<category>`.

    The line keeps its own kind too, so signatures written against it still see it. A benign line
    (`vocab.none`, severity info) is a known line that no signature matches.
    """
    return pl.lit(VOCAB_KIND_PREFIX) + pl.col("vocab_category")


def _classify(lines: pl.DataFrame) -> pl.DataFrame:
    frame = lines.with_columns(pl.col("body").str.extract_groups(_NCCL).alias("_n")).unnest("_n")
    frame = frame.with_columns(
        *[pl.coalesce(name, f"{name}_r").alias(name) for name in ("nccl_host", "nccl_dev", "nccl_level", "nccl_msg")]
    ).drop("nccl_host_r", "nccl_dev_r", "nccl_level_r", "nccl_msg_r")
    is_nccl = pl.col("nccl_level").is_not_null()
    has_c10d_hint = pl.col("body").str.contains("] ", literal=True) & ~is_nccl
    frame = frame.with_columns(
        pl.when(has_c10d_hint).then(pl.col("body").str.extract_groups(_C10D)).alias("_c"),
        pl.when(~is_nccl).then(pl.col("body").str.extract_groups(_GLOG)).alias("_g"),
    ).unnest("_c", "_g")
    message = pl.coalesce("nccl_msg", "c_msg", "g_msg", "body")
    frame = with_hits(frame.with_columns(message.alias("message")), "body")
    # A line whose writer gave it a level (NCCL, c10d, glog headers) is judged by that level, and a line
    # the benign vocabulary knows is no failure report: neither gets a catch-all (generic) kind.
    leveled = pl.coalesce("nccl_level", "c_level", "g_level").is_not_null()
    benign = (pl.col("vocab_category") == BENIGN).fill_null(False)
    not_generic = leveled | benign
    kind_expr = pl.lit(None, dtype=pl.String)
    for line_kind in reversed(LINE_KINDS):
        if line_kind.family == "nccl_warn":
            condition = pl.col("nccl_level") == "WARN"
        elif line_kind.family == "nccl":
            condition = is_nccl & pl.col("message").str.contains(line_kind.pattern)
        else:
            condition = pl.col("message").str.contains(line_kind.pattern)
        if line_kind.generic:
            condition = condition & ~not_generic
        kind_expr = pl.when(condition).then(pl.lit(line_kind.kind)).otherwise(kind_expr)
    level_kind = (
        pl.when(pl.col("c_level").is_in(["E", "F"]) | pl.col("g_level").is_in(["E", "F"]))
        .then(pl.lit("c10d.error"))
        .when(pl.col("c_level") == "W")
        .then(pl.lit("c10d.warning"))
    )
    return frame.with_columns(pl.coalesce(kind_expr, level_kind).alias("kind"))


def _to_events(kept: pl.DataFrame, lines: pl.DataFrame, year_hint: int) -> pl.DataFrame:
    if kept.height == 0:
        return empty_events()
    base = kept.with_columns(
        *_writer(),
        pl.col("nccl_dev").cast(pl.Int64, strict=False).alias("device"),
        pl.col("pfx_local_rank").alias("local_rank"),
        pl.when(pl.col("nccl_level").is_not_null())
        .then(pl.lit("nccl"))
        .when(pl.col("c_level").is_not_null() | pl.col("g_level").is_not_null())
        .then(pl.lit("c10d"))
        .when(pl.col("kind").str.starts_with("torchrun"))
        .then(pl.lit("torchrun"))
        .when(pl.col("kind").str.starts_with("traceback"))
        .then(pl.lit("python"))
        .when(pl.col("kind").str.contains(r"^(?:system|slurm|gpu)\."))
        .then(pl.lit("system"))
        .otherwise(pl.lit("text"))
        .alias("source"),
        _severity_expr().alias("severity"),
        pl.col("text").str.slice(0, 2000),
    )
    base = _with_timestamps(base, year_hint)
    base = _with_regex_fields(base)
    base = _with_grammar_fields(base)
    base = _with_context(base, lines)
    vocab = pl.col("kind").str.starts_with(VOCAB_KIND_PREFIX)
    # A vocabulary event carries the row's code (cudaErrorIllegalAddress, Xid 79, ...) and meaning.
    base = base.with_columns(
        pl.when(vocab).then(pl.col("vocab_code")).otherwise(pl.col("code")).alias("code"),
        pl.when(vocab).then(pl.col("vocab_id") + pl.lit(": ") + pl.col("vocab_meaning")).otherwise(pl.col("detail")).alias("detail"),
    )
    return conform(pl.concat([conform(base), _failure_table_entries(base)]))


def _writer() -> list[pl.Expr]:
    """The columns naming who wrote a line: host, pid, tid, rank."""
    return [
        pl.coalesce(pl.col("nccl_host"), pl.col("pfx_host")).alias("host"),
        pl.coalesce(pl.col("nccl_pid").cast(pl.Int64, strict=False), pl.col("pfx_pid")).alias("pid"),
        pl.col("nccl_tid").cast(pl.Int64, strict=False).alias("tid"),
        pl.col("pfx_rank").alias("rank"),
    ]


def _same_message() -> pl.Expr:
    """A 64-bit hash of the message without its kind's collapse part: lines that say one thing."""
    kind = pl.col("kind")
    same = pl.col("message")
    for name, pattern in _COLLAPSE.items():  # one branch per registry row, not per line
        same = pl.when(kind == name).then(pl.col("message").str.replace(pattern, "")).otherwise(same)
    return same.hash()


def _repeat_keys(year_hint: int) -> list[pl.Expr]:
    """Narrow keys of a classified line for `collapse_repeats`: a 64-bit hash of its writer (file,
    host, pid, tid, rank), whether it opens a communicator, how many of a run stay events of their
    own, and its time (with `_same`, from `_same_message`)."""
    kind = pl.col("kind")
    return [
        pl.struct("file", *_writer()).hash().alias("_stream"),
        kind.is_in(_COMM_BOUNDARY_KINDS).alias("_boundary"),
        pl.when(kind.is_in(list(_COLLAPSE))).then(0).otherwise(REPEATS_KEPT).alias("_kept_alone"),
        _timestamp(year_hint)[0].alias("ts"),
        "_same",
    ]


def collapse_repeats(keys: pl.DataFrame) -> pl.DataFrame:
    """Which kept lines stay events: alike lines of one writer and communicator become one, the
    first line's, with `repeat` (how many lines it stands for), `last_line` and `last_ts`; evidence
    still cites a real line. Takes `_repeat_keys` rows (with `_row`, `_class`, `line`, `part`, `kind`),
    returns the survivors' `_row`, `_class` and `kind` in input order with the three columns (null:
    one line).

    A communicator is the stretch of one writer's stream between two boundary lines (`Init START`,
    the `nRanks nNodes` line, teardown): connection lines do not name theirs. Collapsible kinds
    are compared without their collapse part (one event per connection and transport, whatever the
    channel count); any other kind only verbatim, and only past its first REPEATS_KEPT lines.
    A hash collision would merge two rows' counts, at odds of about n^2 / 2^64.
    """
    keys = keys.with_row_index("_pos")
    # Within one stream, file order is line order (the vocabulary's rows come after the lines).
    keys = keys.sort("_stream", "line", "part").with_columns(pl.col("_boundary").cum_sum().over("_stream").alias("_comm"))
    group = ["_stream", "_comm", "kind", "_same"]
    keys = keys.with_columns((pl.int_range(pl.len()).over(group) < pl.col("_kept_alone")).alias("_alone"))
    alone = keys.filter(pl.col("_alone")).select("_pos", "_row", "_class", "kind")
    merged = keys.filter(~pl.col("_alone")).group_by(group).agg(
        pl.col("_pos", "_row", "_class").first(),
        pl.len().alias("_n"),
        pl.col("line").last().alias("last_line"),
        pl.col("ts").drop_nulls().last().alias("last_ts"),
    )
    several = pl.col("_n") > 1
    merged = merged.select(
        "_pos", "_row", "_class", "kind",
        pl.when(several).then(pl.col("_n")).alias("repeat"),
        pl.when(several).then(pl.col("last_line")).alias("last_line"),
        pl.when(several).then(pl.col("last_ts")).alias("last_ts"),
    )
    return pl.concat([alone, merged], how="diagonal").sort("_pos").drop("_pos")


def _severity_expr() -> pl.Expr:
    # A vocabulary hit is a failure; a line the benign vocabulary knows is informational, whatever its level.
    vocab = (
        pl.when(pl.col("vocab_category") == BENIGN)
        .then(pl.lit("info"))
        .when(pl.col("kind").str.starts_with(VOCAB_KIND_PREFIX))
        .then(pl.lit("error"))
    )
    by_kind = pl.col("kind").replace_strict(_KIND_SEVERITY, default=None)
    by_level = pl.coalesce("c_level", "g_level").replace_strict(
        {"I": "info", "W": "warning", "E": "error", "F": "fatal"}, default=None
    )
    nccl_warn = pl.when(pl.col("nccl_level") == "WARN").then(pl.lit("warning"))
    return pl.coalesce(vocab, nccl_warn, by_level, by_kind, pl.lit("info"))


def _with_timestamps(frame: pl.DataFrame, year_hint: int) -> pl.DataFrame:
    return frame.with_columns(*_timestamp(year_hint))


_TIME_COLUMNS = ("nccl_ts", "c_md", "g_md", "c_time", "g_time")  # with collector_ts: what `_timestamp` reads


def _timestamp(year_hint: int) -> tuple[pl.Expr, pl.Expr]:
    """Wall-clock time from whichever header had one, and which header. c10d/glog omit the year:
    `year_hint` fills it."""
    nccl_ts = pl.col("nccl_ts").str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    md = pl.coalesce("c_md", "g_md").str.zfill(4)
    clock = pl.coalesce("c_time", "g_time")
    c10d_ts = (pl.lit(str(year_hint)) + md + pl.lit(" ") + clock.str.slice(0, 15)).str.to_datetime(
        "%Y%m%d %H:%M:%S%.f", strict=False, time_unit="us"
    )
    collector = pl.col("collector_ts").str.replace(",", ".").str.replace("T", " ").str.replace("Z", "")
    collector_ts = collector.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    collector_ts = pl.coalesce(collector_ts, collector.str.to_datetime("%Y-%m-%d %H:%M", strict=False, time_unit="us"))
    return (
        pl.coalesce(nccl_ts, c10d_ts, collector_ts).dt.replace_time_zone("UTC").alias("ts"),
        pl.when(nccl_ts.is_not_null())
        .then(pl.lit("nccl"))
        .when(c10d_ts.is_not_null())
        .then(pl.lit("c10d-year-inferred"))
        .when(collector_ts.is_not_null())
        .then(pl.lit("collector"))
        .alias("ts_source"),
    )


def _int(pattern: str, group: int = 1) -> pl.Expr:
    return pl.col("message").str.extract(pattern, group).cast(pl.Int64, strict=False)


def _with_regex_fields(frame: pl.DataFrame) -> pl.DataFrame:
    """Fields that are cheap to pull with vectorised regex (lines that scale with ranks x comms)."""
    kind = pl.col("kind")
    comm = kind == "nccl.comm_init"
    exc = kind == "traceback.exception"
    raised = kind == "nccl.error_raised"
    mismatch = kind == "c10d.fingerprint_mismatch"
    return frame.with_columns(
        pl.coalesce(
            pl.when(mismatch).then(_int(r"Rank (\d+) is running collective")),
            pl.when(kind == "ddp.unused_parameters").then(_int(r"for rank (\d+)")),
            pl.col("rank"),
        ).alias("rank"),
        pl.when(comm).then(_int(r" nr?anks (\d+)")).alias("nranks"),
        pl.when(comm).then(pl.col("message").str.extract(r"busId ([0-9a-fA-F]+)")).alias("peer"),
        pl.when(comm).then(_int(r"cudaDev (\d+)")).otherwise(pl.col("device")).alias("device"),
        pl.coalesce(
            pl.when(comm).then(pl.col("message").str.extract(r"comm (0x[0-9a-fA-F]+)")),
            pl.col("message").str.extract(r"\[(?:PG ID |PG )?(\d+)(?: PG GUID \d+)?(?:\s*\(([^)]*)\))? Rank \d+\]"),
        ).alias("pg"),
        pl.coalesce(
            pl.when(comm).then(_int(r" rank (\d+) nr?anks")),
            pl.col("message").str.extract(r"\[(?:PG[^\]]*)?Rank (\d+)\]").cast(pl.Int64, strict=False),
        ).alias("pg_rank"),
        pl.coalesce(
            pl.when(exc).then(pl.col("message").str.extract(_PY_EXCEPTION, 1)),
            pl.when(raised).then(pl.col("message").str.extract(r"(unhan\w*led system error|unhandled cuda error|internal error|invalid usage|invalid argument|remote process exited|ncclSystemError|ncclInternalError|ncclInvalidUsage|ncclUnhandledCudaError|ncclRemoteError)")),
            pl.when(kind == "torchrun.worker_failed").then(pl.col("message").str.extract(r"exitcode: (-?\d+)")),
            pl.when(kind == "nccl.env").then(pl.col("message").str.extract(r"(\w+) set by environment")),
        ).alias("code"),
        pl.when(kind == "torchrun.worker_failed").then(_int(r"exitcode: (-?\d+)")).alias("exitcode"),
        # `srun: error: <node>: task(s) <list>: ...` names the node whose tasks ended.
        pl.coalesce(pl.when(kind == "slurm.task_exit").then(pl.col("message").str.extract(r"^srun: error: ([^:\s]+): tasks? ")), pl.col("host")).alias("host"),
        pl.when(kind == "torchrun.worker_failed").then(_int(r"local_rank: (\d+)")).otherwise(pl.col("local_rank")).alias("local_rank"),
        pl.when(mismatch)
        .then(
            pl.concat_list(
                _int(r"Rank (\d+) is running collective"),
                _int(r"but Rank (\d+) is running collective"),
            ).list.drop_nulls()
        )
        .when(kind == "c10d.monitored_barrier")
        .then(pl.col("message").str.extract(r"Ranks? ([\d, ]+) failed to pass").str.extract_all(r"\d+").cast(pl.List(pl.Int64)))
        .when(kind == "desync.report")
        .then(pl.col("message").str.extract(r"\[([\d,\s]+)\]").str.extract_all(r"\d+").cast(pl.List(pl.Int64)))
        .alias("ranks_ref"),
        pl.coalesce(
            pl.when(mismatch).then(_int(r"SequenceNumber=(\d+)")),
            pl.when(kind == "desync.report").then(_int(r"#(\d+)")),
        ).alias("seq"),
        pl.when(mismatch).then(pl.col("message").str.extract(r"OpType=(\w+)")).when(kind == "desync.report").then(
            pl.col("message").str.extract(r"Timeout at collective: (\w+)")
        ).alias("op"),
    )


def _with_grammar_fields(frame: pl.DataFrame) -> pl.DataFrame:
    """The rare structured lines: message segments found by a literal go through Lark."""
    segments = frame.select(
        pl.col("kind"),
        pl.col("message").str.extract(r"(WorkNCCL\((?:[^()]|\(ms\))*\))").alias("work"),
        pl.col("message").str.extract(r"((?:failure detected by|Exception \(either|Timeout at NCCL work:|Received a dump signal).*)").alias("status"),
        pl.when(pl.col("kind") == "nccl.warn").then(pl.col("message")).alias("warn"),
    )
    work_rows = [_parse_work(w) for w in segments.get_column("work").to_list()]
    status_rows = [_parse_status(s) for s in segments.get_column("status").to_list()]
    warn_rows = [_parse_warn(w) for w in segments.get_column("warn").to_list()]
    parsed = pl.DataFrame(
        {
            "g_seq": [w.get("seq") if w else s.get("seq") if s else None for w, s in zip(work_rows, status_rows)],
            "g_op": [w.get("op") if w else None for w in work_rows],
            "g_numel_in": [w.get("numel_in") if w else None for w in work_rows],
            "g_numel_out": [w.get("numel_out") if w else None for w in work_rows],
            "g_timeout": [w.get("timeout_ms") if w else None for w in work_rows],
            "g_enq": [s.get("last_enqueued") if s else None for s in status_rows],
            "g_done": [s.get("last_completed") if s else None for s in status_rows],
            "g_peer": [x.get("peer") if x else None for x in warn_rows],
            "g_code": [x.get("code") if x else None for x in warn_rows],
            "g_ranks": [x.get("ranks") if x else None for x in warn_rows],
        },
        schema={
            "g_seq": pl.Int64, "g_op": pl.String, "g_numel_in": pl.Int64, "g_numel_out": pl.Int64,
            "g_timeout": pl.Int64, "g_enq": pl.Int64, "g_done": pl.Int64, "g_peer": pl.String,
            "g_code": pl.String, "g_ranks": pl.List(pl.Int64),
        },
    )
    return pl.concat([frame, parsed], how="horizontal").with_columns(
        pl.coalesce("seq", "g_seq").alias("seq"),
        pl.coalesce("op", "g_op").alias("op"),
        pl.col("g_numel_in").alias("numel_in"),
        pl.col("g_numel_out").alias("numel_out"),
        pl.col("g_timeout").alias("timeout_ms"),
        pl.col("g_enq").alias("last_enqueued"),
        pl.col("g_done").alias("last_completed"),
        pl.coalesce("g_peer", "peer").alias("peer"),
        pl.coalesce("g_code", "code").alias("code"),
        pl.coalesce("ranks_ref", "g_ranks").alias("ranks_ref"),
    )


def _parse_work(segment: str | None) -> dict | None:
    return parse_body("c10d", "work", segment) if segment else None


def _parse_status(segment: str | None) -> dict | None:
    return parse_body("c10d", "pg_status", segment) if segment else None


# The WARN families with structure; the literal picks the grammar start symbol.
_WARN_FAMILIES: tuple[tuple[str, str], ...] = (
    ("Got completion from peer", "ib_completion"),
    ("async event", "ib_async"),
    ("Duplicate GPU detected", "duplicate_gpu"),
    ("Connection closed by remote peer", "peer_closed"),
    ("Connect to ", "connect_failed"),
    ("Cuda failure", "cuda_failure"),
)
_IBV_STATUS = {1: "IBV_WC_LOC_LEN_ERR", 2: "IBV_WC_LOC_QP_OP_ERR", 4: "IBV_WC_LOC_PROT_ERR", 5: "IBV_WC_WR_FLUSH_ERR",
               9: "IBV_WC_REM_INV_REQ_ERR", 10: "IBV_WC_REM_ACCESS_ERR", 11: "IBV_WC_REM_OP_ERR",
               12: "IBV_WC_RETRY_EXC_ERR", 13: "IBV_WC_RNR_RETRY_EXC_ERR"}


def _parse_warn(message: str | None) -> dict | None:
    if not message:
        return None
    for literal, start in _WARN_FAMILIES:
        position = message.find(literal)
        if position < 0:
            continue
        segment = message[max(0, message.rfind("NET/IB", 0, position + 1)) :] if start.startswith("ib_") else message
        if start in ("connect_failed", "peer_closed"):
            segment = message[max(0, message.rfind(" ", 0, max(position - 1, 0)) + 1) :] if ":" in message[:position] else message
        fields = parse_body("nccl", start, segment.strip()) or parse_body("nccl", start, message[position:].strip())
        if not fields:
            return None
        if "status" in fields:
            fields["code"] = fields.get("status_name") or _IBV_STATUS.get(fields["status"], f"status {fields['status']}")
        elif "event" in fields:
            fields["code"] = fields["event"]
        elif "cuda_error" in fields:
            fields["code"] = fields["cuda_error"]
        return fields
    return None


def _with_context(events: pl.DataFrame, lines: pl.DataFrame) -> pl.DataFrame:
    """Attach multi-line context to the lines that need it: tracebacks, `Last error:`, wrapped WorkNCCL.

    `lines` is the frame the events were classified from, and an event's `_at` its row there. The
    neighbours are found as row numbers over every line and their text gathered for the events only:
    no string column the size of the batch is copied.
    """
    stream = ["file", "pfx_rank", "pfx_host"]
    ctx = lines.select(*stream, "_at", pl.col("body").str.contains(_TRACEBACK_LINE).alias("tb"))
    ctx = ctx.with_columns(
        pl.col("tb").shift(1).over(stream).fill_null(False).alias("prev_tb"),
        *[pl.col("_at").shift(-k).over(stream).alias(f"_next{k}") for k in (1, 2, 3)],
    )
    ctx = ctx.with_columns((pl.col("tb") & ~pl.col("prev_tb")).cum_sum().over(stream).alias("block"))
    stripped = pl.col("body").str.strip_chars()
    stacks = (
        lines.select(*stream, "body")
        .filter(ctx.get_column("tb"))
        .with_columns(ctx.get_column("block").filter(ctx.get_column("tb")))
        .group_by([*stream, "block"])
        .agg(stripped.filter(stripped.str.len_chars() > 0).tail(40).str.join(" | ").alias("stack"))
    )
    near = ctx.select("prev_tb", "block", "_next1", "_next2", "_next3")[events.get_column("_at")]
    body = lines.get_column("body")
    nexts = pl.DataFrame({f"next{k}": body.gather(near.get_column(f"_next{k}")).str.strip_chars() for k in (1, 2, 3)})
    events = pl.concat([events, near.select("prev_tb", "block"), nexts], how="horizontal")
    events = events.join(stacks, on=[*stream, "block"], how="left", nulls_equal=True, maintain_order="left")
    last_error = pl.coalesce(
        *[
            pl.when(pl.col(n).str.starts_with("Last error:")).then(
                pl.when(pl.col(n).str.strip_prefix("Last error:").str.strip_chars().str.len_chars() > 0)
                .then(pl.col(n).str.strip_prefix("Last error:").str.strip_chars())
                .otherwise(pl.col(m))
            )
            for n, m in (("next1", "next2"), ("next2", "next3"))
        ]
    )
    wrapped_work = pl.coalesce(
        *[pl.col(n).str.extract(r"(WorkNCCL\((?:[^()]|\(ms\))*\))") for n in ("next1", "next2")]
    )
    kind = pl.col("kind")
    events = events.with_columns(
        pl.when(pl.col("prev_tb")).then(pl.col("stack")).alias("stack"),
        last_error.alias("last_error"),
        wrapped_work.alias("next_work"),
    ).with_columns(
        pl.when(kind == "nccl.error_raised")
        .then(pl.col("last_error"))
        .when(kind == "traceback.exception")
        .then(pl.col("stack"))
        # The WARN's source location tells which part of NCCL failed (`transport/nvls.cc:223`):
        # a generic `Cuda failure 999` from the NVLS transport is a fabric problem.
        .when(kind == "nccl.warn")
        .then(pl.col("body").str.extract(r"([\w/.\-]+\.(?:cc|cu|c|h|cpp|hpp):\d+) (?:\(\w+\) )?\**NCCL WARN"))
        .alias("detail")
    )
    return _merge_wrapped_work(events)


def _failure_table_entries(events: pl.DataFrame) -> pl.DataFrame:
    """torchrun's ChildFailedError table: field lines grouped per `[N]:` entry, parsed by the grammar.

    Table lines are a handful per job, so grouping them in Python costs nothing.
    """
    table = events.filter(pl.col("kind").is_in(_TABLE_KINDS)).sort("file", "line")
    entries: list[dict] = []
    section = "Failures"
    current: dict | None = None
    for row in table.iter_rows(named=True):
        body = (row["message"] or "").strip()
        if row["kind"] == "torchrun.table_section":
            section = body.rstrip(":")
            continue
        if body.startswith("[") and body.endswith("]:"):
            current = {"row": row, "fields": [], "section": section}
            entries.append(current)
        elif current is not None:
            current["fields"].append(body)
    records = []
    for entry in entries:
        fields = parse_body("torchrun", "entry", "\n".join(entry["fields"]))
        if not fields or "rank" not in fields:
            continue
        row = entry["row"]
        root = entry["section"].startswith("Root Cause")
        records.append({
            **{k: row[k] for k in ("file", "line", "text", "ts", "ts_source")},
            "source": "torchrun",
            "kind": "torchrun.root_cause" if root else "torchrun.failure",
            "severity": "error",
            "rank": fields["rank"],
            "local_rank": fields["local_rank"],
            "host": fields.get("host"),
            "pid": fields.get("pid"),
            "exitcode": fields.get("exitcode"),
            "code": fields.get("signal"),
            "message": f"{'Root Cause' if root else 'Failure'}: rank {fields['rank']} on {fields.get('host')} "
                       f"exitcode {fields.get('exitcode')}: {fields.get('traceback', '')}"[:2000],
        })
    return conform(pl.DataFrame(records)) if records else conform(events.head(0))


def _merge_wrapped_work(events: pl.DataFrame) -> pl.DataFrame:
    """A terminal-wrapped watchdog line carries its WorkNCCL record on the next line."""
    needs = (pl.col("kind") == "watchdog.timeout") & pl.col("op").is_null() & pl.col("next_work").is_not_null()
    if events.filter(needs).height == 0:
        return events
    parsed = [
        _parse_work(w) if n else None
        for w, n in zip(events.get_column("next_work").to_list(), events.select(needs).to_series().to_list())
    ]
    fill = pl.DataFrame(
        {
            "w_seq": [p.get("seq") if p else None for p in parsed],
            "w_op": [p.get("op") if p else None for p in parsed],
            "w_in": [p.get("numel_in") if p else None for p in parsed],
            "w_out": [p.get("numel_out") if p else None for p in parsed],
            "w_to": [p.get("timeout_ms") if p else None for p in parsed],
        },
        schema={"w_seq": pl.Int64, "w_op": pl.String, "w_in": pl.Int64, "w_out": pl.Int64, "w_to": pl.Int64},
    )
    return pl.concat([events, fill], how="horizontal").with_columns(
        pl.coalesce("seq", "w_seq").alias("seq"),
        pl.coalesce("op", "w_op").alias("op"),
        pl.coalesce("numel_in", "w_in").alias("numel_in"),
        pl.coalesce("numel_out", "w_out").alias("numel_out"),
        pl.coalesce("timeout_ms", "w_to").alias("timeout_ms"),
    )


# A timestamped line that no kind recognises still bounds the job's time span (torchrun's glog
# header lines open most consoles): per file and batch, the earliest and latest such lines (of the
# ones that are no event already) become `log.timed` events, without a message so that no signature
# can match them.
_CLOCK_SCREEN = r"\d\d:\d\d"  # every header time has HH:MM; lines without one are not peeled
_CLOCK_TRIED = 16  # screened lines tried at each end of a file's batch (a "12:30" in prose has no header)


def _time_bound_events(lines: pl.DataFrame, recognised: pl.DataFrame, year_hint: int) -> pl.DataFrame:
    position = pl.int_range(pl.len()).over("file")
    screened = lines.filter(pl.col("_nonempty") & pl.col("text").str.contains(_CLOCK_SCREEN))
    ends = screened.join(recognised.select("file", "line"), on=["file", "line"], how="anti", maintain_order="left").filter(
        (position < _CLOCK_TRIED) | (position >= pl.len().over("file") - _CLOCK_TRIED)
    )
    if ends.height == 0:
        return empty_events()
    stamped = _with_timestamps(_classify(peel_prefixes(ends.select("file", "line", "text"))), year_hint).filter(
        pl.col("ts").is_not_null()
    )
    bounds = pl.concat([stamped.group_by("file").first(), stamped.group_by("file").last()]).unique(["file", "line"])
    return conform(bounds.with_columns(
        *_writer(), pl.lit("log.timed").alias("kind"), pl.lit("text").alias("source"), pl.lit("info").alias("severity"),
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
