"""Stage 4, detect (part of the "progress_matrix" analysis): ranks that called a different collective.

`hang-collective-mismatch` from two sources: the progress matrix's observations (Flight Recorder
entries and watchdog lines: ranks that disagree on op, size or dtype at the same seq of a process
group), and c10d's `CollectiveFingerPrint` reports (TORCH_DISTRIBUTED_DEBUG=DETAIL). The matrix
itself is built by `analyzer.analyses.progress`, which calls the two functions here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import polars as pl

from analyzer.analyses import JobContext
from analyzer.findings import finding
from analyzer.ranks import ranks_label

MISMATCH_RULE = "hang-collective-mismatch"

# Ops whose input/output element counts must agree on every rank. all_to_all (uneven splits),
# gather/scatter (root vs non-root) and coalesced groups legitimately differ, so only op and dtype
# are compared for them.
SIZED_FAMILIES = ["ALLREDUCE", "BROADCAST", "REDUCE", "ALLGATHER", "REDUCE_SCATTER"]
MAX_EVIDENCE = 40
# Mismatches are looked for among the collectives that not every rank has completed (where a hang
# lives) plus a margin before them; at 16k ranks x 2k entries comparing every seq costs seconds.
MISMATCH_WINDOW = 16
# `Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=21, OpType=BROADCAST, TensorShape=[1], TensorDtypes=Long, ...`
_FINGERPRINT = (
    r"Rank (?P<r>\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(?P<s>\d+),?\s*OpType=(?P<o>\w+)"
    r"(?:, TensorShape=\[(?P<shape>[^\]]*)\])?(?:, TensorDtypes=(?P<dt>\w+))?"
)


def with_dtype_and_family(observations: pl.LazyFrame) -> pl.LazyFrame:
    # FR messages read "... in=[[1024]] Float out=...": the dtype follows the input sizes.
    return observations.with_columns(
        pl.col("message").str.extract(r" in=\S* (\S+)", 1).alias("dtype"),
        pl.col("message").str.extract(r" in=(\S*) ", 1).alias("shape"),
        _family(pl.col("op")).alias("family"),
    ).drop("message")


def _family(op: pl.Expr) -> pl.Expr:
    """Ops that are one NCCL call compare equal: BARRIER is a 1-element ALLREDUCE on NCCL,
    _ALLGATHER_BASE and ALLGATHER are both ncclAllGather, ALLTOALL_BASE and ALLTOALL both all-to-all."""
    upper = op.str.to_uppercase()
    return (
        pl.when(upper == "BARRIER")
        .then(pl.lit("ALLREDUCE"))
        .otherwise(upper.str.strip_prefix("_").str.strip_suffix("_BASE"))
    )


# --- collective mismatch (FR entries and watchdog lines) ----------------------------------------


def mismatch_findings(observations: pl.LazyFrame, progress: pl.DataFrame, job: JobContext) -> list[dict]:
    window = progress.group_by("pg").agg((pl.col("done").min().fill_null(0) - MISMATCH_WINDOW).alias("_from"))
    lower = pl.col("pg").replace_strict(
        window.get_column("pg").to_list(), window.get_column("_from").to_list(), default=-1, return_dtype=pl.Int64
    )
    comparable = (
        with_dtype_and_family(observations.lazy().filter(pl.col("seq") > lower))
        .filter(pl.col("family").is_not_null() & ~pl.col("family").str.contains("COALESCED"))
        .collect()
        .lazy()
    ).with_columns(
        pl.when(pl.col("family").is_in(SIZED_FAMILIES)).then(pl.col("numel_in")).alias("cmp_in"),
        pl.when(pl.col("family").is_in(SIZED_FAMILIES)).then(pl.col("numel_out")).alias("cmp_out"),
    )
    fields = ["family", "cmp_in", "cmp_out", "dtype"]
    candidates = (
        comparable.group_by("pg", "seq")
        .agg([pl.col(f).drop_nulls().n_unique().alias(f"n_{f}") for f in fields])
        .filter(pl.any_horizontal([pl.col(f"n_{f}") > 1 for f in fields]))
        .select("pg", "seq")
    )
    rows = comparable.join(candidates, on=["pg", "seq"], how="semi")
    # A rank with two different values at one seq is a coalesced group or a ring-buffer artefact, not
    # a cross-rank disagreement: drop those seqs.
    ambiguous = (
        rows.group_by("pg", "seq", "rank")
        .agg([pl.col(f).drop_nulls().n_unique().alias(f"n_{f}") for f in fields])
        .filter(pl.any_horizontal([pl.col(f"n_{f}") > 1 for f in fields]))
        .select("pg", "seq")
        .unique()
    )
    rows = rows.join(ambiguous, on=["pg", "seq"], how="anti")
    first = rows.group_by("pg").agg(pl.col("seq").min().alias("seq"))
    per_rank = (
        rows.join(first, on=["pg", "seq"], how="semi")
        .sort("src")  # "fr" before "watchdog": FR has the dtype
        .group_by("pg", "seq", "rank")
        .agg(
            pl.col("family").drop_nulls().first(),
            pl.col("op").drop_nulls().first(),
            pl.col("cmp_in").drop_nulls().first(),
            pl.col("cmp_out").drop_nulls().first(),
            pl.col("numel_in").drop_nulls().first(),
            pl.col("dtype").drop_nulls().first(),
            pl.col("state").first(),
            pl.col("start_ts").min(),
            pl.col("event_id").min(),
            # Evidence from each source: the rank's own dump entry and its watchdog line.
            pl.col("event_id").filter(pl.col("src") == "fr").min().alias("fr_eid"),
            pl.col("event_id").filter(pl.col("src") == "watchdog").min().alias("wd_eid"),
        )
        .join(progress.lazy().select("pg", "rank", "enq"), on=["pg", "rank"], how="left")
        .collect()
    )
    if not per_rank.height:
        return []
    out = []
    diverged = _silent_divergence(comparable, first)
    ordered = per_rank.group_by("pg").agg(pl.col("start_ts").min().alias("ts"), pl.col("seq").first()).sort("ts", "pg", nulls_last=True)
    for pg, seq in ordered.select("pg", "seq").iter_rows():  # one per PG with a mismatch
        found = _mismatch_finding(per_rank.filter((pl.col("pg") == pg) & (pl.col("seq") == seq)), pg, seq, job)
        earlier = diverged.filter(pl.col("pg") == pg)
        if earlier.height:
            found["summary"] += "; " + _divergence_text(earlier)
            found["evidence"] = sorted(set(found["evidence"]) | set(earlier.get_column("eid").head(MAX_EVIDENCE).to_list()))
            found["first_event"] = found["evidence"][0]
        out.append(found)
    if len(out) > 1:
        for extra in out[1:]:
            extra["confidence"] = round(extra["confidence"] * 0.8, 3)  # later PGs: likely knock-on effects
    return out


def _silent_divergence(comparable: pl.LazyFrame, first: pl.LazyFrame) -> pl.DataFrame:
    """Per PG, the earliest seq before its mismatch where the ranks ran the same op with the same
    element count but tensors of different shapes (in=[[1]] vs in=[[]]): NCCL compares only counts
    and exchanged them without complaint, but the ranks were already at different call sites (a
    skipped collective shifts every later one). Columns: pg, seq, rank, op, shape, eid."""
    shaped = (
        comparable.filter(pl.col("shape").is_not_null() & (pl.col("src") == "fr"))
        .join(first.rename({"seq": "_mismatch"}), on="pg", how="inner")
        .filter(pl.col("seq") < pl.col("_mismatch"))
    )
    per_rank = shaped.group_by("pg", "seq", "rank").agg(
        pl.col("shape").n_unique().alias("_n"), pl.col("shape").first(), pl.col("op").first(), pl.col("event_id").min().alias("eid")
    )
    seqs = (
        per_rank.group_by("pg", "seq")
        .agg((pl.col("_n") > 1).any().alias("_ambiguous"), pl.col("shape").n_unique().alias("_shapes"))
        .filter(~pl.col("_ambiguous") & (pl.col("_shapes") > 1))
        .group_by("pg")
        .agg(pl.col("seq").min())
    )
    return per_rank.join(seqs, on=["pg", "seq"], how="semi").select("pg", "seq", "rank", "op", "shape", "eid").sort("rank").collect()


def _divergence_text(rows: pl.DataFrame) -> str:
    seq = rows.get_column("seq")[0]
    camps = rows.group_by("shape", "op").agg(pl.col("rank").sort()).sort(pl.col("rank").list.len(), "shape", descending=[True, False])
    sides = " vs ".join(f"{ranks_label(r['rank'])} {r['op']} in={r['shape']}" for r in camps.iter_rows(named=True))
    return f"the sequences had already diverged at #{seq}: {sides} (equal element counts, exchanged silently)"


def _split_camps(camps: list[dict], tie_key: Callable[[dict], tuple], *,
                 majority_confidence: float) -> tuple[list[dict], list[dict], float]:
    """(culprit camps, majority camps, confidence) of camps sorted largest first (`n` ranks each).
    The largest camp is the majority; equal leading camps are told apart by `tie_key` (the lowest
    is the culprit), and where it cannot tell them apart every camp is implicated rather than a
    guess made."""
    if len(camps) < 2 or camps[0]["n"] != camps[1]["n"]:
        return camps[1:], camps[:1], majority_confidence
    leaders = sorted((c for c in camps if c["n"] == camps[0]["n"]), key=tie_key)
    if tie_key(leaders[0]) == tie_key(leaders[1]):
        return camps, [], 0.35
    return [leaders[0]], [c for c in camps if c is not leaders[0]], 0.5


def _mismatch_finding(rows: pl.DataFrame, pg: str, seq: int, job: JobContext) -> dict:
    fields = [("family", "op"), ("cmp_in", "NumelIn"), ("cmp_out", "NumelOut"), ("dtype", "dtype")]
    # Which field splits the ranks (the first that differs), then its majority value.
    field, label = next(((f, lab) for f, lab in fields if rows.get_column(f).drop_nulls().n_unique() > 1), fields[0])
    groups = (
        rows.filter(pl.col(field).is_not_null())
        .group_by(field)
        .agg(
            pl.col("rank").sort().alias("ranks"),
            pl.len().alias("n"),
            (pl.col("op") == "BARRIER").any().alias("barrier"),
            pl.col("enq").max().alias("enq"),
            pl.col("numel_in").min().alias("numel"),
            pl.col("op").mode().sort().first().alias("op"),
            pl.col("fr_eid").drop_nulls().alias("fr_eids"),
            pl.col("wd_eid").drop_nulls().alias("wd_eids"),
        )
        # group_by's order is arbitrary: equal camps are ordered by their lowest rank, so the
        # majority of a tie and the summary are the same on every run
        .sort(pl.col("n"), pl.col("ranks").list.first(), descending=[True, False])
    )
    sizes = groups.get_column("n").to_list()
    camps = list(groups.iter_rows(named=True))
    # Equal camps: blame the barrier (a rank that left its loop early), else the camp that advanced
    # further (it skipped a collective), else the smaller op.
    total = sum(sizes)
    culprit_rows, majority_rows, confidence = _split_camps(
        camps, _tie_key, majority_confidence=0.85 if (total - sizes[0]) * 3 <= total else 0.7)
    culprits = sorted({r for row in culprit_rows for r in row["ranks"]})
    majority_ranks = sorted({r for row in majority_rows for r in row["ranks"]})
    describe = lambda rows: "; ".join(_value_text(r, field, label) for r in rows)  # noqa: E731
    if majority_rows:
        summary = (
            f"pg {pg} #{seq}: {ranks_label(majority_ranks)} {_verb(majority_ranks, 'call')} {describe(majority_rows)}"
            f" but {ranks_label(culprits)} {_verb(culprits, 'call')} {describe(culprit_rows)}"
        )
    else:
        summary = f"pg {pg} #{seq}: " + " vs ".join(
            f"{ranks_label(r['ranks'])} {_verb(r['ranks'], 'call')} {_value_text(r, field, label)}" for r in culprit_rows
        ) + " (equal camps: cannot tell which side is wrong)"
    if label != "op":
        summary += f" ({label} {' vs '.join(str(r[field]) for r in majority_rows + culprit_rows)})"
    # Dump entries are the primary evidence (they carry op, sizes, dtype and the call stack); a few
    # watchdog lines say that the ranks really hung there. Evidence is shown in event order, with
    # log lines first, so the watchdog lines are capped to keep the dump entries in view.
    evidence = [e for row in culprit_rows for e in row["fr_eids"]][:MAX_EVIDENCE]
    evidence += [e for row in majority_rows for e in row["fr_eids"]][:10]
    evidence += [e for row in culprit_rows for e in row["wd_eids"]][:2] + [e for row in majority_rows for e in row["wd_eids"]][:1]
    hosts = [job.rank_hosts[r] for r in culprits if r in job.rank_hosts]
    return finding(MISMATCH_RULE, ranks=culprits, hosts=hosts, confidence=confidence, summary=summary, evidence=evidence)


def _tie_key(camp: dict) -> tuple:
    return (not camp["barrier"], -(camp["enq"] if camp["enq"] is not None else -1), camp["numel"] if camp["numel"] is not None else 2**62)


def _verb(ranks: Sequence[int], verb: str) -> str:
    return f"{verb}s" if len(ranks) == 1 else verb


def _value_text(row: dict, field: str, label: str) -> str:
    op = row["op"] or row.get("family") or "?"
    if field in ("cmp_in", "cmp_out"):
        return f"{op} {label}={row[field]}"
    if field == "dtype":
        return f"{op} {row[field]}"
    return op if row["numel"] is None else f"{op} (NumelIn={row['numel']})"


# --- collective mismatch (DETAIL fingerprints) ---------------------------------------------------


def fingerprint_findings(small: pl.DataFrame, job: JobContext) -> list[dict]:
    reports = small.filter(pl.col("kind") == "c10d.fingerprint_mismatch")
    if not reports.height:
        return []
    sightings = _fingerprint_sightings(reports)
    out = []
    for seq in sorted(sightings.get_column("seq").unique().drop_nulls().to_list())[:1]:  # the first mismatch
        out.append(_fingerprint_finding(sightings.filter(pl.col("seq") == seq), seq, job))
    return out


def _fingerprint_sightings(reports: pl.DataFrame) -> pl.DataFrame:
    """One row per (seq, rank): the op, shape and dtype the reports say that rank ran, and a signature."""
    me = pl.col("message").str.extract_groups(_FINGERPRINT)
    other = pl.col("message").str.extract_groups(r"but " + _FINGERPRINT)
    sides = reports.lazy().select(
        "event_id",
        pl.col("rank").alias("reporter"),
        pl.col("seq").alias("ev_seq"),
        pl.col("op").alias("ev_op"),
        me.alias("me"),
        other.alias("other"),
    )
    first = sides.select(
        "event_id",
        pl.coalesce(pl.col("me").struct.field("r").cast(pl.Int64, strict=False), "reporter").alias("rank"),
        pl.coalesce(pl.col("me").struct.field("s").cast(pl.Int64, strict=False), "ev_seq").alias("seq"),
        pl.coalesce(pl.col("me").struct.field("o"), "ev_op").alias("op"),
        pl.col("me").struct.field("shape").alias("shape"),
        pl.col("me").struct.field("dt").alias("dtype"),
        pl.lit(0).alias("side"),
    )
    second = sides.select(
        "event_id",
        pl.col("other").struct.field("r").cast(pl.Int64, strict=False).alias("rank"),
        pl.col("other").struct.field("s").cast(pl.Int64, strict=False).alias("seq"),
        pl.col("other").struct.field("o").alias("op"),
        pl.col("other").struct.field("shape").alias("shape"),
        pl.col("other").struct.field("dt").alias("dtype"),
        pl.lit(1).alias("side"),
    )
    # Each rank reports itself first; every healthy rank names the odd one, so dedupe per (seq, rank)
    # before counting camps.
    return (
        pl.concat([first, second])
        .filter(pl.col("rank").is_not_null() & pl.col("op").is_not_null())
        .sort("side", "event_id")
        .group_by("seq", "rank")
        .agg(
            pl.col("op").first(),
            pl.col("shape").drop_nulls().first(),
            pl.col("dtype").drop_nulls().first(),
            pl.col("event_id").first(),  # the report where this rank describes itself, if any
        )
        .with_columns(
            pl.concat_str([pl.col("op"), pl.col("shape").fill_null(""), pl.col("dtype").fill_null("")], separator="|").alias("sig")
        )
        .collect()
    )


def _fingerprint_finding(at: pl.DataFrame, seq: int, job: JobContext) -> dict:
    """The finding of the first mismatched seq: the odd camp against the majority, or the one side seen."""
    camps = (
        at.group_by("sig")
        .agg(pl.col("rank").sort().alias("ranks"), pl.len().alias("n"), pl.col("op").first(), pl.col("shape").first(),
             pl.col("dtype").first(), pl.col("event_id").alias("eids"))
        .sort("n", "sig", descending=[True, False])
    )
    rows = list(camps.iter_rows(named=True))
    if len(rows) == 1:
        only = rows[0]
        return finding(
            MISMATCH_RULE,
            ranks=only["ranks"],
            hosts=[job.rank_hosts[r] for r in only["ranks"] if r in job.rank_hosts],
            confidence=0.45,
            summary=f"collective fingerprint mismatch at #{seq} (TORCH_DISTRIBUTED_DEBUG=DETAIL): "
            f"{ranks_label(only['ranks'])} {_verb(only['ranks'], 'run')} {_fp_text(only)}; "
            "the other side of the report was not captured",
            evidence=only["eids"],
        )
    culprit_rows, majority_rows, confidence = _split_camps(rows, _fp_tie_key, majority_confidence=0.85)
    culprits = sorted({r for row in culprit_rows for r in row["ranks"]})
    majority = sorted({r for row in majority_rows for r in row["ranks"]})
    return finding(
        MISMATCH_RULE,
        ranks=culprits,
        hosts=[job.rank_hosts[r] for r in culprits if r in job.rank_hosts],
        confidence=confidence,
        summary=_fp_summary(seq, majority, majority_rows, culprits, culprit_rows),
        evidence=[e for row in culprit_rows + majority_rows for e in row["eids"]][:MAX_EVIDENCE],
    )


def _fp_summary(seq: int, majority: list[int], majority_rows: list[dict], culprits: list[int], culprit_rows: list[dict]) -> str:
    head = f"collective fingerprint mismatch at #{seq} (TORCH_DISTRIBUTED_DEBUG=DETAIL): "
    if not majority_rows:
        return head + " vs ".join(
            f"{ranks_label(r['ranks'])} {_verb(r['ranks'], 'run')} {_fp_text(r)}" for r in culprit_rows
        ) + " (equal camps: cannot tell which side is wrong)"
    return (
        head
        + f"{ranks_label(majority)} {_verb(majority, 'run')} {'; '.join(_fp_text(r) for r in majority_rows)} but "
        + f"{ranks_label(culprits)} {_verb(culprits, 'run')} {'; '.join(_fp_text(r) for r in culprit_rows)}"
    )


def _fp_tie_key(row: dict) -> tuple:
    return (row["op"] != "BARRIER", _shape_numel(row["shape"]))  # a barrier, then the smaller op


def _fp_text(row: dict) -> str:
    text = row["op"]
    if row.get("shape") is not None:
        text += f" shape [{row['shape']}]"
    if row.get("dtype"):
        text += f" {row['dtype']}"
    return text


def _shape_numel(shape: str | None) -> int:
    if not shape:
        return 0
    total = 1
    for part in shape.split(","):
        part = part.strip()
        total *= int(part) if part.isdigit() else 1
    return total
