"""Detect (cross-rank analysis): explain watchdog timeouts from log evidence alone.

When ranks time out in a collective, the cause is elsewhere. In order of strength:
a peer that raised or died while the others waited (crash then hang); a rank visibly busy with
rank-specific work while the others wait in a barrier (absent from the collective); and, with no
named culprit, the shape of the stuck collective: the very first barrier (device binding),
a barrier-like 1-element collective mid-run (a rank off doing extra work), or a data collective
mid-run (ranks issuing different collective sequences).

Ranks are global ranks only: correlate lifts the default process group's `[Rank N]` to the global
rank; a sub-group's `[PG 3 Rank 1]` is not one and is not counted. When no line states the job's
size (an NCCL communicator's nranks, a Flight Recorder pg_status), the job is taken to be ranks
0..highest seen, and every finding built on that range says so: the job may have more ranks.
Before torch 2.0 the watchdog line carries no NumelIn, so an ALLREDUCE of unknown size may be a
barrier; with a rank of the job silent, it is not called a divergence.

The helpers `world_ranks`, `busy_rank` and `silent_suspect` are shared with the progress matrix,
which names silent ranks under `hang-rank-absent-from-collective`.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.ranks import format_ranks, ranks_label

_CRASH_KINDS = ["traceback.exception", "nccl.error_raised", "cuda.error"]
_BUSY_KINDS = ["progress", "log.last", "train.end"]
_RANK_IN_TEXT = r"(?i)\bon rank[ =:_]?(\d+)\b|\brank=(\d+)"
_PROGRESS_BAR = r"\d+%\|[^|]*\|\s*\d+/\d+ \["
# A watchdog timeout under 5 minutes was set on purpose (torch's defaults are 10 and 30 minutes).
_SHORT_TIMEOUT_MS = 300_000


@register("hang_heuristics")
def hang_heuristics(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    timeouts = events.filter(pl.col("kind").is_in(["watchdog.timeout", "watchdog.frame"]))
    if timeouts.height == 0:
        # No timeout because the launcher tore the survivors down first: they are victims too.
        victims = _torn_down_ranks(events)
        crashed = _crashed_peers(events, victims, confidence=0.6, waited="were torn down by the launcher") if victims else None
        return findings_frame([crashed] if crashed else [])
    waiting = set(timeouts.get_column("rank").drop_nulls().to_list())
    crashed = _crashed_peers(events, waiting)
    if crashed is not None:
        return findings_frame([crashed])
    stuck = timeouts.sort("seq", "op", nulls_last=True).row(0, named=True)
    op_name = stuck["op"].upper() if stuck["op"] else None
    barrier_like = stuck["numel_in"] == 1 or op_name == "BARRIER"
    maybe_barrier = barrier_like or op_name is None or (stuck["numel_in"] is None and op_name in BARRIER_OPS)
    world, inferred = world_ranks(events, job)
    silent = silent_ranks(events, world)
    busy = busy_rank(events, waiting)
    evidence = timeouts.get_column("event_id").head(10).to_list()
    op = f"{stuck['op'] or 'a collective'}" + (f" #{stuck['seq']}" if stuck["seq"] is not None else "")
    who = ranks_label(waiting) if waiting else "the ranks"
    if busy is not None and maybe_barrier:
        rank, event_id, text = busy
        return findings_frame([finding(
            "hang-busy-rank-while-others-wait",
            ranks=[rank],
            hosts=[job.rank_hosts[rank]] if rank in job.rank_hosts else [],
            confidence=0.6,
            summary=f"{who} timed out in {op} while rank {rank} was still busy: {text[:160]}",
            evidence=[event_id, *evidence],
        )])
    if stuck["seq"] == 1 and barrier_like:
        return findings_frame([finding(
            "hang-first-barrier-never-completed",
            confidence=0.4,
            summary=f"the very first collective ({op}, 1 element: a barrier) never completed on {who}",
            evidence=evidence,
        )])
    if barrier_like:
        if not silent and not inferred:
            return findings_frame([])  # every rank of the job waited in it: none is elsewhere
        suspect = silent_suspect(silent, waiting, busy, maybe_barrier, inferred)
        named = [suspect.rank] if suspect else silent
        summary = f"{who} waited in a 1-element {op} (a barrier) that another rank never entered"
        if silent:
            summary += f"; no timeout line from {ranks_label(silent)}"
        summary += range_note(world, inferred)
        if suspect:
            summary += f"; {suspect.note}"
        return findings_frame([finding(
            "hang-barrier-rank-elsewhere",
            ranks=named,
            hosts=[job.rank_hosts[r] for r in named if r in job.rank_hosts],
            confidence=0.35 if suspect and not suspect.direct else 0.45,
            summary=summary,
            evidence=(suspect.evidence if suspect else []) + evidence,
        )])
    unplaced = _unplaced_absent(events, timeouts, stuck, silent, waiting, world, inferred, job)
    if unplaced is not None:
        return findings_frame([unplaced])
    if stuck["op"] is not None:
        return _data_collective_finding(stuck, op_name, timeouts, world, inferred, silent, waiting, who, op, evidence)
    return findings_frame([])


def _data_collective_finding(stuck: dict, op_name: str | None, timeouts: pl.DataFrame, world: list[int], inferred: bool,
                             silent: list[int], waiting: set[int], who: str, op: str, evidence: list) -> pl.DataFrame:
    """A data collective (not a barrier) timed out mid-run: a divergence, when some rank's position
    differs from the waiting ranks' (`_rank_elsewhere`). Otherwise the timeout finding stands alone."""
    if not _rank_elsewhere(stuck, op_name, timeouts, world, inferred, silent, waiting):
        return findings_frame([])
    return findings_frame([finding(
        "hang-data-collective-diverged",
        confidence=0.4,
        summary=f"{who} timed out mid-run in {op} (numel {stuck['numel_in']}); no rank logged an error",
        evidence=evidence,
    )])


def _rank_elsewhere(stuck: dict, op_name: str | None, timeouts: pl.DataFrame, world: list[int], inferred: bool,
                    silent: list[int], waiting: set[int]) -> bool:
    """Whether a rank's position differs from the waiting ranks': a divergence needs one.

    A rank is elsewhere when its own lines place it there (progress evidence, a watchdog status or
    Flight Recorder entries, but no timeout in the stuck collective; or a timeout in the same
    collective, process group and sequence number, of another op or size), or when it is a rank of the
    job that left no line. Where every rank the logs show waits in the collective, only a rank beyond
    them can be elsewhere: none where the job's size is stated (the collective itself is stuck; a job
    of one rank has no other rank at all).

    A rank that is merely late, still busy before the same collective, is not elsewhere; the timeout
    and absence findings speak for it. A rank that left no line may be late for a collective that may
    be a barrier (its size unknown, an all-reduce: ranks wait in barriers for one rank's own work, and
    the progress matrix names that rank absent) or, in an excerpt (the job's size inferred), for one
    that nothing places (no sequence number, no size). A rank beyond those shown may be late where the
    timeout was configured below torch's defaults (10-30 min): a peer that is only slow outlasts it.
    """
    if len(world) == 1 and not inferred:
        return False  # a job of one rank (stated so): its collective waited for the rank's own GPU work
    size_unknown = stuck["numel_in"] is None
    maybe_late = (size_unknown and op_name in BARRIER_OPS) or (size_unknown and stuck["seq"] is None and inferred)
    if silent:
        return not maybe_late
    if set(world) - waiting or _positions_differ(timeouts):
        return True
    return inferred and (stuck.get("timeout_ms") or _SHORT_TIMEOUT_MS) >= _SHORT_TIMEOUT_MS


def _positions_differ(timeouts: pl.DataFrame) -> bool:
    """Two ranks timed out in the same collective (process group, sequence number) of different ops or
    sizes: each rank's shape of it is its op and the size its lines state."""
    placed = timeouts.filter(pl.col("rank").is_not_null() & pl.col("seq").is_not_null() & pl.col("op").is_not_null())
    per_rank = placed.group_by("pg", "seq", "rank").agg(pl.col("op").first(), pl.col("numel_in").max())
    shapes = per_rank.group_by("pg", "seq").agg(pl.struct("op", "numel_in").n_unique().alias("shapes"))
    return bool((shapes.get_column("shapes") > 1).any())


@register("horovod_stall")
def horovod_stall(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    """Horovod's stall check names, per stalled op, the ranks that did not submit it
    (`[missing ranks: 1]`) or, before 0.16, those that did (`[ready ranks: 5, 6, 3, 1, 4, 0]`).
    The culprits are the ranks missing from every stalled op; from `ready` lists they are the
    complement within the job's ranks (0..the highest seen unless something states the size)."""
    lines = events.filter(pl.col("kind") == "horovod.stall").with_columns(
        pl.col("message").str.extract(r"\[missing ranks: ([\d, ]+)\]").str.extract_all(r"\d+").cast(pl.List(pl.Int64)).alias("missing"),
        pl.col("message").str.extract(r"\[ready ranks: ([\d, ]+)\]").str.extract_all(r"\d+").cast(pl.List(pl.Int64)).alias("ready"),
    ).filter(pl.col("missing").is_not_null() | pl.col("ready").is_not_null())
    if lines.height == 0:
        return findings_frame([])
    named = [set(m) for m in lines.get_column("missing").drop_nulls().to_list()]
    ready = [set(r) for r in lines.get_column("ready").drop_nulls().to_list()]
    highest = max([max(s) for s in named + ready if s] + [(job.world_size or 0) - 1])
    world = set(range(highest + 1))
    per_op = named + [world - r for r in ready]
    stalled = set.intersection(*per_op) or set.union(*per_op)
    if not stalled:
        return findings_frame([])
    ranks = sorted(stalled)
    from_ready = not named
    inferred = from_ready and not job.world_size
    note = f" (the complement of the ready ranks within 0-{highest}, a range inferred from the highest rank seen)" if inferred else ""
    return findings_frame([finding(
        "horovod-stalled-rank-missing",
        ranks=ranks,
        hosts=[job.rank_hosts[r] for r in ranks if r in job.rank_hosts],
        confidence=0.6 if inferred else 0.8,
        summary=f"Horovod's stall check: {ranks_label(ranks)} never submitted {lines.height} stalled op(s) the other ranks wait in{note}",
        evidence=lines.get_column("event_id").head(10).to_list(),
    )])


def _unplaced_absent(
    events: pl.DataFrame, timeouts: pl.DataFrame, stuck: dict, silent: list[int], waiting: set[int],
    world: list[int], inferred: bool, job: JobContext,
) -> dict | None:
    """Ranks absent from a collective whose watchdog lines carry no SeqNum (torch < 1.10).

    The progress matrix places ranks by sequence number, so it cannot place these lines; nothing
    else in the job (Flight Recorder, pg_status) can either. When every rank that logged timed out
    in the same op, a lone rank of the job that left no line is the one the others wait for, as
    the matrix says of a seq it can place; the confidence follows its rule (several silent ranks
    more likely mean lines cut from an excerpt) and stays moderate where the range is inferred.
    """
    if stuck["seq"] is not None or not silent or len(waiting) < 2:
        return None
    if timeouts.get_column("op").drop_nulls().n_unique() != 1:
        return None
    if events.filter(pl.col("kind").is_in(["fr.entry", "fr.pg_status", "watchdog.pg_status"])).height:
        return None  # the progress matrix has something to place and speaks for itself
    share = len(silent) / (len(silent) + len(waiting))
    confidence = 0.5 if len(silent) == 1 and len(waiting) >= 3 else 0.4 if share < 0.5 else 0.25
    if inferred:
        confidence = min(confidence, 0.5)
    return finding(
        "hang-rank-absent-from-collective",
        ranks=silent,
        hosts=[job.rank_hosts[r] for r in silent if r in job.rank_hosts],
        confidence=confidence,
        summary=f"{ranks_label(waiting)} timed out in {stuck['op']} (no SeqNum); no timeout line from {ranks_label(silent)}"
        + range_note(world, inferred) + " (suspect by absence)",
        evidence=timeouts.get_column("event_id").head(10).to_list(),
    )


# --- shared with the progress matrix -----------------------------------------------------------

BARRIER_OPS = ("ALLREDUCE", "BARRIER")  # dist.barrier() on NCCL is a 1-element all-reduce
_SIZE_KINDS = ["nccl.comm_init", "fr.pg_status"]
_PROGRESS_KINDS = ["watchdog.timeout", "watchdog.frame", "watchdog.pg_status", "fr.entry", "fr.pg_status"]


@dataclass(frozen=True)
class Suspect:
    rank: int
    direct: bool  # seen busy in a line of its own, not named by the rank-0 heuristic
    note: str
    evidence: list[int]


def world_ranks(events: pl.DataFrame, job: JobContext) -> tuple[list[int], bool]:
    """The job's ranks, and whether that range is inferred: no line stated the size (an NCCL
    communicator's nranks, a Flight Recorder pg_status), so it is 0..the highest rank seen."""
    stated = events.filter(pl.col("kind").is_in(_SIZE_KINDS)).get_column("nranks").max()
    seen = events.get_column("rank").drop_nulls().max()
    from_ranks = (seen + 1) if seen is not None else 0
    size = max(job.world_size or 0, from_ranks)
    # A size larger than the ranks seen was stated somewhere (the caller's context); one equal to
    # them is only stated if a communicator or pg_status says so.
    return list(range(size)), size == from_ranks and (stated is None or stated < size)


def silent_ranks(events: pl.DataFrame, world: list[int]) -> list[int]:
    """Ranks of the job with no timeout line, watchdog status or Flight Recorder entry."""
    reported = events.filter(pl.col("kind").is_in(_PROGRESS_KINDS)).get_column("rank").drop_nulls().unique().to_list()
    return sorted(set(world) - set(reported))


def range_note(world: list[int], inferred: bool) -> str:
    """Said wherever the job's ranks are only 0..the highest seen."""
    if not inferred or not world:
        return ""
    if len(world) == 1:
        return " (rank 0 is the only rank seen; no line states the job's size)"
    return f" (of ranks {format_ranks(world)}, a range inferred from the highest rank seen: the job may have more)"


def silent_suspect(
    silent: list[int], waiting: set[int], busy: tuple[int, int, str] | None, maybe_barrier: bool, inferred: bool
) -> Suspect | None:
    """Which of the ranks that left no progress evidence the waiting ranks most likely wait for, when
    the stuck collective may be a barrier (1 element, or its size unknown).

    Evidence first: a silent rank seen busy with its own work (a progress bar, a line naming it).
    Failing that, when rank 0 is one of several silent ranks and the job's ranks are only inferred
    from the ranks seen: rank 0, by a low-confidence heuristic, said as such. Work that only the
    main process does (evaluation, checkpoint saving, dataset preparation) is the usual reason ranks
    1..N wait in a barrier. Only where the size is unstated: such logs are excerpts, whose missing
    lines make silence weak evidence, so the other silent ranks are more likely waiting with their
    lines cut; where the logs state the size, each silent rank is a firm suspect and all are named.
    """
    if not maybe_barrier or not silent or not waiting:
        return None
    if busy is not None and busy[0] in silent:
        rank, event_id, text = busy
        return Suspect(rank, True, f"rank {rank} was still busy: {text[:160]}", [event_id])
    if inferred and 0 in silent and len(silent) > 1:
        return Suspect(
            0,
            False,
            f"rank 0 named first by a heuristic, not by evidence: {ranks_label(waiting)} "
            f"{'waits' if len(waiting) == 1 else 'wait'} in a barrier-like collective, "
            "and work that only the main process does (evaluation, checkpointing, data preparation) is the usual reason "
            f"for a missed barrier; {ranks_label([r for r in silent if r != 0])} left no line either",
            [],
        )
    return None


def _torn_down_ranks(events: pl.DataFrame) -> set[int]:
    """Ranks the elastic agent terminated (exit -15 in its failure table, or a SignalException)."""
    torn = events.filter(
        (pl.col("kind").is_in(["torchrun.failure", "torchrun.root_cause"]) & (pl.col("exitcode") == -15))
        | pl.col("message").fill_null("").str.contains("SignalException: Process \\d+ got signal: 15")
    )
    return set(torn.get_column("rank").drop_nulls().to_list())


def _crashed_peers(
    events: pl.DataFrame, waiting: set[int], confidence: float = 0.75, waited: str = "waited in a collective"
) -> dict | None:
    """A rank that raised, and is not itself only reporting the timeout, is the first failure."""
    raised = events.filter(
        pl.col("kind").is_in(_CRASH_KINDS)
        & pl.col("rank").is_not_null()
        & ~pl.col("message").fill_null("").str.contains("Watchdog caught|watchdog thread terminated|DistBackendError: \\[")
    )
    culprits = raised.filter(~pl.col("rank").is_in(sorted(waiting)))
    if culprits.height == 0:
        return None
    first = culprits.sort("ts", "event_id", nulls_last=True).row(0, named=True)
    ranks = culprits.get_column("rank").unique().to_list()
    return finding(
        "hang-peer-crashed-others-waited",
        ranks=ranks,
        hosts=culprits.get_column("host").drop_nulls().unique().to_list(),
        confidence=confidence,
        summary=f"{ranks_label(ranks)} raised ({first['message'][:160]}) while {ranks_label(waiting) if waiting else 'the other ranks'} "
        + (waited.replace("were ", "was ", 1) if len(waiting) == 1 else waited),
        evidence=culprits.get_column("event_id").head(10).to_list(),
    )


def busy_rank(events: pl.DataFrame, waiting: set[int]) -> tuple[int, int, str] | None:
    """The last rank-specific activity not from a waiting rank: a progress bar or a line naming a rank.

    Progress bars are usually printed by the main process only, so an unprefixed one counts as
    rank 0's unless rank 0 is among the waiting ranks. A bar that tqdm left without a newline, with
    another rank's log line glued after it, is still the bar printer's: the glued line's rank is not.
    """
    has_bar = pl.col("text").fill_null("").str.contains(_PROGRESS_BAR)
    glued = has_bar & ~pl.col("message").fill_null("").str.contains(_PROGRESS_BAR)
    activity = events.filter(pl.col("kind").is_in(_BUSY_KINDS) | has_bar).with_columns(
        pl.coalesce(
            pl.col("message").str.extract(_RANK_IN_TEXT, 1).cast(pl.Int64, strict=False),
            pl.col("message").str.extract(_RANK_IN_TEXT, 2).cast(pl.Int64, strict=False),
            pl.when(~glued).then(pl.col("rank")),
            pl.when(has_bar).then(pl.lit(0, dtype=pl.Int64)),
        ).alias("busy_rank"),
        pl.when(glued)
        .then(pl.col("text").str.extract(r"^(.*?" + _PROGRESS_BAR + r"[^\]]*\])"))
        .otherwise(pl.col("message"))
        .alias("busy_text"),
    )
    activity = activity.filter(pl.col("busy_rank").is_not_null() & ~pl.col("busy_rank").is_in(sorted(waiting)))
    activity = activity.filter(pl.col("kind") != "log.last")
    if activity.height == 0:
        return None
    last = activity.sort("event_id").row(-1, named=True)
    return int(last["busy_rank"]), int(last["event_id"]), last["busy_text"] or last["message"] or ""
