"""Stage 4, detect (cross-rank analysis "progress_matrix"): who never arrived, who called something else.

Builds the collective progress matrix (process group x rank x sequence number) from every source
that knows a rank's position in a process group's collective sequence:

* Flight Recorder entries (`fr.entry`: op, sizes, dtype, state per seq) and `fr.pg_status`
  (last enqueued / completed, and the PG's member ranks from pg_config);
* watchdog lines: `watchdog.timeout` (the seq, op and sizes a rank timed out in) and
  `watchdog.pg_status` ("last enqueued work: E, last completed work: C");
* `c10d.fingerprint_mismatch` (TORCH_DISTRIBUTED_DEBUG=DETAIL reports).

From it two findings: `hang-rank-absent-from-collective` (ranks whose last enqueued seq is below
the seq the others wait in, or ranks of the group that left no evidence at all) and
`hang-collective-mismatch` (ranks that disagree on op, size or dtype at the same seq). Everything
that grows with ranks x entries is a polars group_by; Python only touches the few stalled groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

ABSENT_RULE = "hang-rank-absent-from-collective"
MISMATCH_RULE = "hang-collective-mismatch"

P2P_OPS = ["SEND", "RECV", "RECVANYSOURCE"]
WAITING_STATES = ["scheduled", "started", "timeout"]
# Ops whose input/output element counts must agree on every rank. all_to_all (uneven splits),
# gather/scatter (root vs non-root) and coalesced groups legitimately differ, so only op and dtype
# are compared for them.
SIZED_FAMILIES = ["ALLREDUCE", "BROADCAST", "REDUCE", "ALLGATHER", "REDUCE_SCATTER"]
MAX_EVIDENCE = 40
WAITING_EVIDENCE = 6

_SMALL_KINDS = ["fr.pg_status", "watchdog.timeout", "watchdog.pg_status", "c10d.fingerprint_mismatch"]
# Mismatches are looked for among the collectives that not every rank has completed (where a hang
# lives) plus a margin before them; at 16k ranks x 2k entries comparing every seq costs seconds.
MISMATCH_WINDOW = 16
_PG_NAME = r"^\s*(?:PG\s+(?:ID\s+)?)?([^\s(]+)"
# `Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=21, OpType=BROADCAST, TensorShape=[1], TensorDtypes=Long, ...`
_FINGERPRINT = (
    r"Rank (?P<r>\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(?P<s>\d+),?\s*OpType=(?P<o>\w+)"
    r"(?:, TensorShape=\[(?P<shape>[^\]]*)\])?(?:, TensorDtypes=(?P<dt>\w+))?"
)


@register("progress_matrix")
def progress_matrix(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    """Findings for ranks absent from a stalled collective and for mismatched collectives."""
    events = _with_event_id(events)
    # Status lines, watchdog lines and mismatch reports are few; FR entries can be ranks x 2k rows
    # and stay lazy so each aggregate below reads only the columns it needs.
    small = events.lazy().filter(pl.col("kind").is_in(_SMALL_KINDS) & pl.col("rank").is_not_null()).collect()
    observations = _observations(events, small)
    status = _status_rows(small)
    progress = progress_table(observations, status)
    if not progress.height and not small.height:
        return findings_frame([])
    rows = []
    rows += _absent_findings(small, progress, events, job)
    rows += _mismatch_findings(observations, progress, job)
    rows += _fingerprint_findings(small, job)
    return findings_frame(rows)


# --- the matrix ----------------------------------------------------------------------------------


def collective_progress(events: pl.DataFrame) -> pl.DataFrame:
    """The progress matrix for reports: per (pg, rank) last enqueued, last completed and the seq it
    waits in (see `progress_table`), from every source in the event frame."""
    events = _with_event_id(events)
    small = events.lazy().filter(pl.col("kind").is_in(_SMALL_KINDS) & pl.col("rank").is_not_null()).collect()
    return progress_table(_observations(events, small), _status_rows(small))


def collective_observations(events: pl.DataFrame) -> pl.DataFrame:
    """One row per (pg, rank, seq) sighting of a collective: FR entries and watchdog timeouts.

    Columns: pg, rank, seq, op, family, numel_in, numel_out, dtype, state, start_ts, timeout_ms,
    event_id, src. p2p entries are left out: their seq is the p2p counter, not the collective one.
    """
    events = _with_event_id(events)
    small = events.lazy().filter(pl.col("kind").is_in(_SMALL_KINDS) & pl.col("rank").is_not_null()).collect()
    return _with_dtype_and_family(_observations(events, small)).collect()


def _observations(events: pl.DataFrame, small: pl.DataFrame) -> pl.LazyFrame:
    # Expressions here run on every FR entry (ranks x 2k rows): no regex, no string rewriting. The
    # FR parser already writes the pg_config key and lower-case states; the dtype (a regex on the
    # message) is extracted later, only for the rows a mismatch check looks at.
    fr = events.lazy().filter(
        (pl.col("kind") == "fr.entry") & pl.col("rank").is_not_null() & pl.col("seq").is_not_null() & ~pl.col("op").is_in(P2P_OPS)
    ).select(
        pl.col("pg").fill_null("0"),
        "rank",
        "seq",
        "op",
        "numel_in",
        "numel_out",
        pl.col("message"),
        pl.col("code").alias("state"),
        pl.col("ts").alias("start_ts"),
        "timeout_ms",
        "event_id",
        pl.lit("fr").alias("src"),
    )
    watchdog = _fill_unknown_pg(
        small.lazy().filter((pl.col("kind") == "watchdog.timeout") & pl.col("seq").is_not_null()).select(
            _pg_expr(),
            "rank",
            "seq",
            pl.col("op").str.to_uppercase(),
            "numel_in",
            "numel_out",
            pl.lit(None, dtype=pl.String).alias("message"),
            pl.lit("timeout").alias("state"),
            # The watchdog fires timeout_ms after the work was enqueued: that is when this rank arrived.
            (pl.col("ts") - pl.duration(milliseconds=pl.col("timeout_ms").fill_null(0))).alias("start_ts"),
            "timeout_ms",
            "event_id",
            pl.lit("watchdog").alias("src"),
        ),
        small,
    )
    return pl.concat([fr, watchdog], how="vertical_relaxed")


def _with_dtype_and_family(observations: pl.LazyFrame) -> pl.LazyFrame:
    # FR messages read "... in=[[1024]] Float out=...": the dtype follows the input sizes.
    return observations.with_columns(
        pl.col("message").str.extract(r" in=\S* (\S+)", 1).alias("dtype"),
        pl.col("message").str.extract(r" in=(\S*) ", 1).alias("shape"),
        _family(pl.col("op")).alias("family"),
    ).drop("message")


def _status_rows(small: pl.DataFrame) -> pl.DataFrame:
    """pg_status sightings: (pg, rank, enq, done, at_seq, members, event_id, src)."""
    status = small.lazy().filter(pl.col("kind").is_in(["fr.pg_status", "watchdog.pg_status"])).select(
        _pg_expr(),
        "rank",
        pl.when(pl.col("last_enqueued") >= 0).then(pl.col("last_enqueued")).alias("enq"),
        # PyTorch 2.3 printed an uninitialised "last completed" (3452013982) when nothing had completed.
        pl.when((pl.col("last_completed") >= 0) & (pl.col("last_completed") <= pl.col("last_enqueued").fill_null(2**62)))
        .then(pl.col("last_completed"))
        .alias("done"),
        pl.when(pl.col("kind") == "watchdog.pg_status").then(pl.col("seq")).alias("at_seq"),
        "event_id",
        pl.when(pl.col("kind") == "fr.pg_status").then(pl.lit("fr")).otherwise(pl.lit("watchdog")).alias("src"),
    )
    return _fill_unknown_pg(status, small).collect()


def progress_table(observations: pl.DataFrame | pl.LazyFrame, status: pl.DataFrame) -> pl.DataFrame:
    """Per (pg, rank): enq (last enqueued seq), done (last completed), stuck (the seq it waits in),
    the op it waits in, when it started waiting, and event ids for evidence."""
    observations = observations.lazy()
    completed = pl.col("state") == "completed"
    per_obs = observations.group_by("pg", "rank").agg(
        pl.col("seq").max().alias("obs_enq"),
        pl.col("seq").filter(completed).max().alias("obs_done"),
        pl.col("event_id").get(pl.col("seq").arg_max()).alias("last_eid"),
    )
    timed_out = (
        observations.filter(pl.col("src") == "watchdog").select("pg", "rank").unique().with_columns(pl.lit(True).alias("timed_out"))
    )
    per_status = status.lazy().group_by("pg", "rank").agg(
        pl.col("enq").max().alias("st_enq"),
        pl.col("done").max().alias("st_done"),
        pl.col("at_seq").min().alias("st_at"),
        pl.col("event_id").sort_by("enq", nulls_last=False).last().alias("st_eid"),
        pl.col("src").eq("watchdog").any().alias("st_watchdog"),
    )
    joined = (
        per_obs.join(per_status, on=["pg", "rank"], how="full", coalesce=True)
        .join(timed_out, on=["pg", "rank"], how="left")
        .with_columns(
            pl.max_horizontal("obs_enq", "st_enq").alias("enq"),
            pl.max_horizontal("obs_done", "st_done").alias("done"),
        )
        .collect()
    )
    # The unfinished entry each rank waits in: only a handful of rows per rank are not completed.
    waiting = (
        observations.filter(pl.col("state").is_in(WAITING_STATES))
        .select("pg", "rank", "seq", "op", "start_ts", "timeout_ms", "event_id", (pl.col("src") != "fr").alias("not_dump"))
        .join(joined.lazy().select("pg", "rank", "done"), on=["pg", "rank"], how="left")
        .filter(pl.col("seq") > pl.col("done").fill_null(-1))
        # At the same seq the dump entry (op, sizes, stack) beats a watchdog line, then the earliest
        # line: a watchdog repeats its timeout, and the pick must not depend on row order.
        .sort("seq", "not_dump", "event_id")
        .group_by("pg", "rank", maintain_order=True)
        .first()
        .select(
            "pg", "rank",
            pl.col("seq").alias("obs_wait"),
            pl.col("op").alias("wait_op"),
            pl.col("start_ts").alias("wait_ts"),
            pl.col("timeout_ms").alias("wait_timeout_ms"),
            pl.col("event_id").alias("wait_eid"),
        )
        .collect()
    )
    return (
        joined.join(waiting, on=["pg", "rank"], how="left")
        .with_columns(
            # The seq a rank waits in: its oldest unfinished entry (FR) or timed-out work (watchdog),
            # else the "at work" seq of a watchdog status line, else the one after its last completed
            # when it enqueued more than it completed.
            pl.coalesce(
                pl.col("obs_wait"),
                pl.when(pl.col("st_at") > pl.col("done").fill_null(-1)).then(pl.col("st_at")),
                pl.when(pl.col("enq") > pl.col("done")).then(pl.col("done") + 1),
            ).alias("stuck"),
            (pl.col("timed_out").fill_null(False) | pl.col("st_watchdog").fill_null(False)).alias("hang_evidence"),
        )
        .select(
            "pg", "rank", "enq", "done", "stuck", "wait_op", "wait_ts", "wait_timeout_ms", "wait_eid", "last_eid", "st_eid",
            "hang_evidence",
        )
        .sort("pg", "rank")
    )


# --- rank absent from the collective ------------------------------------------------------------


def _absent_findings(small: pl.DataFrame, progress: pl.DataFrame, events: pl.DataFrame, job: JobContext) -> list[dict]:
    if not progress.height:
        return []
    # The seq each PG waits in: the most common "stuck" seq among its waiting ranks (ties: the later).
    targets = (
        progress.lazy()
        .filter(pl.col("stuck").is_not_null())
        .group_by("pg", "stuck")
        .agg(
            pl.len().alias("n_wait"),
            pl.col("wait_ts").min().alias("stall_ts"),
            pl.col("wait_timeout_ms").max().alias("timeout_ms"),
            pl.col("hang_evidence").any().alias("hang_evidence"),
        )
        .sort(["pg", "n_wait", "stuck"], descending=[False, True, True])
        .group_by("pg", maintain_order=True)
        .first()
        .rename({"stuck": "target"})
        .collect()
    )
    if not targets.height:
        return []
    members = _pg_members(small, progress, job)
    pg_table = progress.join(targets.select("pg", "target"), on="pg", how="inner")
    absent = pg_table.filter(pl.col("enq").is_not_null() & (pl.col("enq") < pl.col("target")))
    waiting = pg_table.filter(pl.col("stuck") == pl.col("target"))
    seen = progress.group_by("pg").agg(pl.col("rank").unique().alias("seen"))
    silent = (
        members.join(seen, on="pg", how="left")
        .join(targets.select("pg"), on="pg", how="inner")
        .with_columns(pl.col("members").list.set_difference(pl.col("seen").fill_null(pl.lit([], dtype=pl.List(pl.Int64)))).alias("silent"))
        .select("pg", pl.col("silent").list.sort())
    )
    alive = set(events.get_column("rank").drop_nulls().unique().to_list())
    wait_ops = (
        waiting.filter(pl.col("wait_op").is_not_null())
        .group_by("pg")
        .agg(pl.col("wait_op").mode().sort().first().alias("op"))
    )

    stalls = []
    for row in targets.sort("stall_ts", nulls_last=True).iter_rows(named=True):  # one row per stalled PG
        pg = row["pg"]
        pg_absent = absent.filter(pl.col("pg") == pg).sort("rank")
        pg_wait = waiting.filter(pl.col("pg") == pg).sort("rank")
        silent_row = silent.filter(pl.col("pg") == pg)
        pg_silent = silent_row.get_column("silent")[0].to_list() if silent_row.height else []
        op_row = wait_ops.filter(pl.col("pg") == pg)
        stalls.append(
            {
                "pg": pg,
                "target": row["target"],
                "stall_ts": row["stall_ts"],
                "hang_evidence": row["hang_evidence"] or _outlived_timeout(row, job),
                "op": op_row.get_column("op")[0] if op_row.height else None,
                "absent": pg_absent,
                "waiting": pg_wait,
                "silent": pg_silent,
            }
        )
    culprit_stalls = [s for s in stalls if s["absent"].height or s["silent"]]
    if not culprit_stalls:
        return []  # every rank arrived: a hang inside NCCL or the network, not a missing rank
    first = culprit_stalls[0]
    earlier = [s for s in stalls if s is not first and _before(s, first)]
    later = [s for s in stalls if s is not first and s not in earlier]
    if not first["absent"].height:
        first.update(_silent_context(first, small, events, job))
    return [_absent_finding(first, earlier, later, alive, job)]


def _silent_context(stall: dict, small: pl.DataFrame, events: pl.DataFrame, job: JobContext) -> dict:
    """For a stall whose only suspects are silent: whether the default group's ranks are only inferred
    (0..highest seen, see `hang.world_ranks`), and which silent rank the waiting ones most likely wait
    for when the stuck collective may be a barrier (`hang.silent_suspect`)."""
    from analyzer.analyses.hang import BARRIER_OPS, busy_rank, silent_suspect, world_ranks

    wait_ranks = set(stall["waiting"].get_column("rank").to_list())
    configured = small.filter(
        (pl.col("kind") == "fr.pg_status") & pl.col("ranks_ref").is_not_null() & (pl.col("pg").str.extract(_PG_NAME, 1) == stall["pg"])
    ).height
    world, inferred = world_ranks(events, job)
    inferred = inferred and stall["pg"] == "0" and not configured
    stuck = events.filter(pl.col("event_id").is_in(stall["waiting"].get_column("wait_eid").drop_nulls().to_list()))
    ops = set(stuck.get_column("op").drop_nulls().str.to_uppercase().to_list()) or ({stall["op"].upper()} if stall["op"] else set())
    sizes = set(stuck.get_column("numel_in").drop_nulls().to_list())
    maybe_barrier = bool(ops) and ops <= set(BARRIER_OPS) and sizes <= {1}
    busy = busy_rank(events, wait_ranks) if maybe_barrier else None
    suspect = silent_suspect(stall["silent"], wait_ranks, busy, maybe_barrier, inferred)
    return {"world": world if inferred else None, "suspect": suspect}


def _absent_finding(stall: dict, earlier: list[dict], later: list[dict], alive: set[int], job: JobContext) -> dict:
    pg, target = stall["pg"], stall["target"]
    absent: pl.DataFrame = stall["absent"]
    waiting: pl.DataFrame = stall["waiting"]
    silent: list[int] = stall["silent"]
    op = stall["op"] or "collective"
    wait_ranks = waiting.get_column("rank").to_list()
    absent_ranks = absent.get_column("rank").to_list()
    verb = "waits" if len(wait_ranks) == 1 else "wait"
    parts = [f"{_ranks_label(wait_ranks)} {verb} in {op} #{target} (pg {pg})"] if wait_ranks else [f"pg {pg} stalled at #{target}"]
    if absent_ranks:
        parts.append(_last_enqueued_text(absent))
    evidence = absent.get_column("st_eid").drop_nulls().to_list() + absent.get_column("last_eid").drop_nulls().to_list()
    # A few of the waiting ranks: the absent ranks' own entries must stay within the first lines shown.
    evidence += waiting.get_column("wait_eid").drop_nulls().head(WAITING_EVIDENCE).to_list()
    world, suspect = stall.get("world"), stall.get("suspect")
    if silent and world:
        # The job's size was never stated: its ranks are taken as 0..the highest seen, and said to be.
        inferred = "a range inferred from the highest rank seen: the job may have more"
        span = compress_ranks(world)
        if len(silent) == 1:
            parts.append(f"rank {silent[0]} is the only one of ranks {span} with no progress evidence ({inferred}; suspect by absence)")
        else:
            parts.append(f"no progress evidence from {_ranks_label(silent)} of ranks {span} ({inferred}; suspects by absence)")
    elif silent:
        parts.append(f"no progress evidence from {_ranks_label(silent)} (suspect{'s' if len(silent) > 1 else ''} by absence)")
    if suspect is not None:
        parts.append(suspect.note)
        evidence = suspect.evidence + evidence
    if earlier:
        parts.append("stalled after " + ", ".join(_stall_text(s) for s in earlier))
    if later:
        parts.append("then " + ", ".join(_stall_text(s) for s in later))
    if absent_ranks:
        culprits = absent_ranks
        # A watchdog line (or a timeout's worth of later activity) proves the hang; FR dumps alone
        # are usually written at a timeout but could be a snapshot of a live job.
        confidence = 0.85 if stall["hang_evidence"] else 0.7
        if len(absent_ranks) > max(len(wait_ranks), 1):
            # Most of the group is "behind": the waiting minority may instead have issued an extra collective.
            confidence -= 0.2
        if earlier:
            confidence -= 0.15  # this PG's stall may only be a consequence of an earlier one
    else:
        # Suspects by absence: a lone silent rank among many waiting ones is telling (the culprit's
        # dump is often the missing one); many silent ranks more likely mean missing logs.
        culprits = silent
        share = len(silent) / max(len(silent) + len(wait_ranks), 1)
        confidence = 0.55 if share <= 0.1 else 0.4 if share < 0.5 else 0.25
        if not any(r in alive for r in silent):
            confidence -= 0.05
        if len(silent) == 1 and len(wait_ranks) >= 3:
            confidence = max(confidence, 0.5)  # every other rank waits at the same seq: they all point at it
        if world:
            confidence = min(confidence, 0.5)  # the job may have more ranks than the highest one seen
        if suspect is not None:
            culprits = [suspect.rank]
            # Seen busy with its own work: evidence. Named by the rank-0 heuristic: a guess, said as one.
            confidence = max(confidence, 0.6) if suspect.direct else min(confidence, 0.3)
    hosts = [job.rank_hosts[r] for r in culprits if r in job.rank_hosts]
    return finding(
        ABSENT_RULE,
        ranks=culprits,
        hosts=hosts,
        confidence=confidence,
        summary="; ".join(parts),
        evidence=evidence[:MAX_EVIDENCE * 2],
    )


def _last_enqueued_text(absent: pl.DataFrame) -> str:
    pairs = list(zip(absent.get_column("rank").to_list(), absent.get_column("enq").to_list()))
    by_seq: dict[int, list[int]] = {}
    for rank, enq in pairs:  # one entry per absent rank
        by_seq.setdefault(enq, []).append(rank)
    if len(by_seq) <= 3:
        return "; ".join(f"{_ranks_label(ranks)} last enqueued #{seq}" for seq, ranks in sorted(by_seq.items(), reverse=True))
    seqs = sorted(by_seq)
    return f"{_ranks_label([r for r, _ in pairs])} last enqueued #{seqs[0]}-#{seqs[-1]}"


def _stall_text(stall: dict) -> str:
    text = f"pg {stall['pg']} at {stall['op'] or 'collective'} #{stall['target']}"
    behind = stall["absent"].get_column("rank").to_list() + list(stall["silent"])
    if behind:
        text += f" (waiting for {_ranks_label(sorted(behind))})"
    return text


def _outlived_timeout(row: dict, job: JobContext) -> bool:
    """Something else in the job happened a full timeout after the stuck collective started."""
    end, start, timeout = job.end_ts, row["stall_ts"], row["timeout_ms"]
    if end is None or start is None or not timeout:
        return False
    try:
        return (end - start).total_seconds() * 1000 >= timeout
    except TypeError:  # naive vs aware datetimes from a caller
        return False


def _before(a: dict, b: dict) -> bool:
    if a["stall_ts"] is None or b["stall_ts"] is None:
        return False
    return a["stall_ts"] < b["stall_ts"]


def _pg_members(small: pl.DataFrame, progress: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    """Member ranks per PG: pg_config from FR dumps; for the default PG ("0") the job's world."""
    configured = (
        small.lazy()
        .filter((pl.col("kind") == "fr.pg_status") & pl.col("ranks_ref").is_not_null())
        .select(_pg_expr(), pl.col("ranks_ref"))
        .explode("ranks_ref")
        .group_by("pg")
        .agg(pl.col("ranks_ref").drop_nulls().unique().alias("members"))
        .collect()
    )
    world = list(range(job.world_size)) if job.world_size else sorted(job.ranks)
    pgs = progress.select(pl.col("pg").unique()).filter(pl.col("pg").is_not_null())
    if world:
        default = pl.DataFrame({"pg": ["0"], "members": [world]}, schema={"pg": pl.String, "members": pl.List(pl.Int64)})
        configured = pl.concat([configured, default.join(configured, on="pg", how="anti")])
    return pgs.join(configured, on="pg", how="left").with_columns(
        pl.col("members").fill_null(pl.lit([], dtype=pl.List(pl.Int64)))
    )


# --- collective mismatch (FR entries and watchdog lines) ----------------------------------------


def _mismatch_findings(observations: pl.LazyFrame, progress: pl.DataFrame, job: JobContext) -> list[dict]:
    window = progress.group_by("pg").agg((pl.col("done").min().fill_null(0) - MISMATCH_WINDOW).alias("_from"))
    lower = pl.col("pg").replace_strict(
        window.get_column("pg").to_list(), window.get_column("_from").to_list(), default=-1, return_dtype=pl.Int64
    )
    comparable = (
        _with_dtype_and_family(observations.lazy().filter(pl.col("seq") > lower))
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
    sides = " vs ".join(f"{_ranks_label(r['rank'])} {r['op']} in={r['shape']}" for r in camps.iter_rows(named=True))
    return f"the sequences had already diverged at #{seq}: {sides} (equal element counts, exchanged silently)"


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
        .sort("n", descending=True)
    )
    sizes = groups.get_column("n").to_list()
    camps = list(groups.iter_rows(named=True))
    if len(sizes) > 1 and sizes[0] == sizes[1]:
        # Equal camps: blame the barrier (a rank that left its loop early), else the camp that
        # advanced further (it skipped a collective), else the smaller op; if none of these tells
        # them apart, implicate every camp rather than guess.
        leaders = [c for c in camps if c["n"] == sizes[0]]
        keyed = sorted(leaders, key=_tie_key)
        if _tie_key(keyed[0]) == _tie_key(keyed[1]):
            culprit_rows, majority_rows, confidence = camps, [], 0.35
        else:
            culprit_rows = [keyed[0]]
            majority_rows = [c for c in camps if c is not keyed[0]]
            confidence = 0.5
    else:
        majority_rows, culprit_rows = camps[:1], camps[1:]
        total = sum(sizes)
        confidence = 0.85 if (total - sizes[0]) * 3 <= total else 0.7
    culprits = sorted({r for row in culprit_rows for r in row["ranks"]})
    majority_ranks = sorted({r for row in majority_rows for r in row["ranks"]})
    describe = lambda rows: "; ".join(_value_text(r, field, label) for r in rows)  # noqa: E731
    if majority_rows:
        summary = (
            f"pg {pg} #{seq}: {_ranks_label(majority_ranks)} {_verb(majority_ranks, 'call')} {describe(majority_rows)}"
            f" but {_ranks_label(culprits)} {_verb(culprits, 'call')} {describe(culprit_rows)}"
        )
    else:
        summary = f"pg {pg} #{seq}: " + " vs ".join(
            f"{_ranks_label(r['ranks'])} {_verb(r['ranks'], 'call')} {_value_text(r, field, label)}" for r in culprit_rows
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


def _fingerprint_findings(small: pl.DataFrame, job: JobContext) -> list[dict]:
    reports = small.filter(pl.col("kind") == "c10d.fingerprint_mismatch")
    if not reports.height:
        return []
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
    sightings = (
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
    out = []
    for seq in sorted(sightings.get_column("seq").unique().drop_nulls().to_list())[:1]:  # the first mismatch
        at = sightings.filter(pl.col("seq") == seq)
        camps = (
            at.group_by("sig")
            .agg(pl.col("rank").sort().alias("ranks"), pl.len().alias("n"), pl.col("op").first(), pl.col("shape").first(),
                 pl.col("dtype").first(), pl.col("event_id").alias("eids"))
            .sort("n", "sig", descending=[True, False])
        )
        rows = list(camps.iter_rows(named=True))
        if len(rows) == 1:
            only = rows[0]
            out.append(
                finding(
                    MISMATCH_RULE,
                    ranks=only["ranks"],
                    hosts=[job.rank_hosts[r] for r in only["ranks"] if r in job.rank_hosts],
                    confidence=0.45,
                    summary=f"collective fingerprint mismatch at #{seq} (TORCH_DISTRIBUTED_DEBUG=DETAIL): "
                    f"{_ranks_label(only['ranks'])} {_verb(only['ranks'], 'run')} {_fp_text(only)}; "
                    "the other side of the report was not captured",
                    evidence=only["eids"],
                )
            )
            continue
        if rows[0]["n"] == rows[1]["n"]:
            leaders = sorted((r for r in rows if r["n"] == rows[0]["n"]), key=_fp_tie_key)
            if _fp_tie_key(leaders[0]) == _fp_tie_key(leaders[1]):
                culprit_rows, majority_rows, confidence = rows, [], 0.35
            else:
                culprit_rows = [leaders[0]]
                majority_rows = [r for r in rows if r is not leaders[0]]
                confidence = 0.5
        else:
            majority_rows, culprit_rows = rows[:1], rows[1:]
            confidence = 0.85
        culprits = sorted({r for row in culprit_rows for r in row["ranks"]})
        majority = sorted({r for row in majority_rows for r in row["ranks"]})
        out.append(
            finding(
                MISMATCH_RULE,
                ranks=culprits,
                hosts=[job.rank_hosts[r] for r in culprits if r in job.rank_hosts],
                confidence=confidence,
                summary=_fp_summary(seq, majority, majority_rows, culprits, culprit_rows),
                evidence=[e for row in culprit_rows + majority_rows for e in row["eids"]][:MAX_EVIDENCE],
            )
        )
    return out


def _fp_summary(seq: int, majority: list[int], majority_rows: list[dict], culprits: list[int], culprit_rows: list[dict]) -> str:
    head = f"collective fingerprint mismatch at #{seq} (TORCH_DISTRIBUTED_DEBUG=DETAIL): "
    if not majority_rows:
        return head + " vs ".join(
            f"{_ranks_label(r['ranks'])} {_verb(r['ranks'], 'run')} {_fp_text(r)}" for r in culprit_rows
        ) + " (equal camps: cannot tell which side is wrong)"
    return (
        head
        + f"{_ranks_label(majority)} {_verb(majority, 'run')} {'; '.join(_fp_text(r) for r in majority_rows)} but "
        + f"{_ranks_label(culprits)} {_verb(culprits, 'run')} {'; '.join(_fp_text(r) for r in culprit_rows)}"
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


# --- helpers --------------------------------------------------------------------------------------


def _with_event_id(events: pl.DataFrame) -> pl.DataFrame:
    if "event_id" in events.columns:
        return events
    return events.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))


def _pg_expr() -> pl.Expr:
    # "0", "0(default_pg)", "PG 0", "0 (default_pg)" -> "0": the pg_config key FR uses.
    return pl.col("pg").str.extract(_PG_NAME, 1).alias("pg")


def _fill_unknown_pg(frame: pl.LazyFrame, small: pl.DataFrame) -> pl.LazyFrame:
    """A watchdog line without a PG prefix ("[Rank 0] Watchdog caught ...") belongs to the PG the same
    rank's status lines name when that is unambiguous, else to the default PG "0"."""
    by_rank = (
        small.lazy()
        .filter(pl.col("kind").is_in(["watchdog.pg_status", "watchdog.timeout"]) & pl.col("pg").is_not_null())
        .select("rank", _pg_expr())
        .group_by("rank")
        .agg(pl.col("pg").unique().alias("_pgs"))
        .select("rank", pl.when(pl.col("_pgs").list.len() == 1).then(pl.col("_pgs").list.first()).alias("_pg_fill"))
    )
    return (
        frame.join(by_rank, on="rank", how="left")
        .with_columns(pl.coalesce("pg", "_pg_fill", pl.lit("0")).alias("pg"))
        .drop("_pg_fill")
    )


def _family(op: pl.Expr) -> pl.Expr:
    """Ops that are one NCCL call compare equal: BARRIER is a 1-element ALLREDUCE on NCCL,
    _ALLGATHER_BASE and ALLGATHER are both ncclAllGather, ALLTOALL_BASE and ALLTOALL both all-to-all."""
    upper = op.str.to_uppercase()
    return (
        pl.when(upper == "BARRIER")
        .then(pl.lit("ALLREDUCE"))
        .otherwise(upper.str.strip_prefix("_").str.strip_suffix("_BASE"))
    )


def ranks_label(ranks: Iterable[int]) -> str:
    """`[0, 2, 3, 4, 7]` -> "ranks 0,2-4,7"; one rank -> "rank 5"."""
    ordered = sorted(set(ranks))
    prefix = "rank " if len(ordered) == 1 else "ranks "
    return prefix + compress_ranks(ordered)


def compress_ranks(ranks: Sequence[int]) -> str:
    """Sorted unique ints -> "0,2-63" (runs collapsed)."""
    from analyzer.detect import format_ranks  # detect imports the analysis registry at load time

    return format_ranks(list(ranks))


_ranks_label = ranks_label
