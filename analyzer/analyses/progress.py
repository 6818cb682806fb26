"""Stage 4, detect (cross-rank analysis "progress_matrix"): who never arrived, who called something else.

Builds the collective progress matrix (process group x rank x sequence number) from every source
that knows a rank's position in a process group's collective sequence:

* Flight Recorder entries (`fr.entry`: op, sizes, dtype, state per seq) and `fr.pg_status`
  (last enqueued / completed, and the PG's member ranks from pg_config);
* watchdog lines: `watchdog.timeout` (the seq, op and sizes a rank timed out in) and
  `watchdog.pg_status` ("last enqueued work: E, last completed work: C");
* `c10d.fingerprint_mismatch` (TORCH_DISTRIBUTED_DEBUG=DETAIL reports).

From it two findings: `hang-rank-absent-from-collective` (ranks whose last enqueued seq is below
the seq the others wait in, or ranks of the group that left no evidence at all), here, and
`hang-collective-mismatch` (ranks that disagree on op, size or dtype at the same seq), read by
`analyzer.analyses.mismatch`. Everything
that grows with ranks x entries is a polars group_by; Python only touches the few stalled groups.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.analyses.mismatch import MAX_EVIDENCE, fingerprint_findings, mismatch_findings, with_dtype_and_family
from analyzer.findings import finding, findings_frame
from analyzer.ranks import format_ranks, ranks_label

ABSENT_RULE = "hang-rank-absent-from-collective"

P2P_OPS = ["SEND", "RECV", "RECVANYSOURCE"]
WAITING_STATES = ["scheduled", "started", "timeout"]
WAITING_EVIDENCE = 6

_SMALL_KINDS = ["fr.pg_status", "watchdog.timeout", "watchdog.pg_status", "c10d.fingerprint_mismatch"]
_PG_NAME = r"^\s*(?:PG\s+(?:ID\s+)?)?([^\s(]+)"


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
    rows += mismatch_findings(observations, progress, job)
    rows += fingerprint_findings(small, job)
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
    return with_dtype_and_family(_observations(events, small)).collect()


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
        # Ties (a dump entry and a watchdog line at one seq) go to the earliest event: never row order.
        pl.col("event_id").sort_by("seq", "event_id", descending=[False, True]).last().alias("last_eid"),
    )
    timed_out = (
        observations.filter(pl.col("src") == "watchdog").select("pg", "rank").unique().with_columns(pl.lit(True).alias("timed_out"))
    )
    per_status = status.lazy().group_by("pg", "rank").agg(
        pl.col("enq").max().alias("st_enq"),
        pl.col("done").max().alias("st_done"),
        pl.col("at_seq").min().alias("st_at"),
        # The status with the highest "last enqueued"; among equal ones a watchdog line (a dump's
        # pg_status has no line to cite), then the earliest: never row order.
        pl.col("event_id")
        .sort_by(pl.col("enq"), pl.col("src") == "watchdog", pl.col("event_id"), descending=[False, False, True], nulls_last=False)
        .last()
        .alias("st_eid"),
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
            pl.col("not_dump").alias("wait_timed_out"),
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
            pl.col("wait_timed_out").fill_null(False), "hang_evidence",
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
    # A rank whose own watchdog timed out in seq s waits there, and no rank of its group can wait
    # beyond s + 1 (completing s + 1 takes it too). A group holding one "behind" by more than that
    # mixes groups or runs (watchdog lines without a PG prefix, files of two attempts): its stall
    # proves nobody absent, and it is left out.
    impossible = pl.col("wait_timed_out") & (pl.col("stuck") < pl.col("target") - 1)
    mixed = pg_table.filter(impossible.fill_null(False)).get_column("pg").unique()
    targets = targets.filter(~pl.col("pg").is_in(mixed.implode()))
    pg_table = pg_table.filter(~pl.col("pg").is_in(mixed.implode()))
    if not targets.height:
        return []
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
    parts = [f"{ranks_label(wait_ranks)} {verb} in {op} #{target} (pg {pg})"] if wait_ranks else [f"pg {pg} stalled at #{target}"]
    if absent_ranks:
        parts.append(_last_enqueued_text(absent))
    evidence = absent.get_column("st_eid").drop_nulls().to_list() + absent.get_column("last_eid").drop_nulls().to_list()
    # A few of the waiting ranks: the absent ranks' own entries must stay within the first lines shown.
    evidence += waiting.get_column("wait_eid").drop_nulls().head(WAITING_EVIDENCE).to_list()
    world, suspect = stall.get("world"), stall.get("suspect")
    if silent and world:
        # The job's size was never stated: its ranks are taken as 0..the highest seen, and said to be.
        inferred = "a range inferred from the highest rank seen: the job may have more"
        span = format_ranks(world)
        if len(silent) == 1:
            parts.append(f"rank {silent[0]} is the only one of ranks {span} with no progress evidence ({inferred}; suspect by absence)")
        else:
            parts.append(f"no progress evidence from {ranks_label(silent)} of ranks {span} ({inferred}; suspects by absence)")
    elif silent:
        parts.append(f"no progress evidence from {ranks_label(silent)} (suspect{'s' if len(silent) > 1 else ''} by absence)")
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
        return "; ".join(f"{ranks_label(ranks)} last enqueued #{seq}" for seq, ranks in sorted(by_seq.items(), reverse=True))
    seqs = sorted(by_seq)
    return f"{ranks_label([r for r, _ in pairs])} last enqueued #{seqs[0]}-#{seqs[-1]}"


def _stall_text(stall: dict) -> str:
    text = f"pg {stall['pg']} at {stall['op'] or 'collective'} #{stall['target']}"
    behind = stall["absent"].get_column("rank").to_list() + list(stall["silent"])
    if behind:
        text += f" (waiting for {ranks_label(sorted(behind))})"
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
