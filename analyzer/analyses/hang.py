"""Detect (cross-rank analysis): explain watchdog timeouts from log evidence alone.

When ranks time out in a collective, the cause is elsewhere. In order of strength:
a peer that raised or died while the others waited (crash then hang); a rank visibly busy with
rank-specific work while the others wait in a barrier (absent from the collective); and, with no
named culprit, the shape of the stuck collective: the very first barrier (device binding),
a barrier-like 1-element collective mid-run (a rank off doing extra work), or a data collective
mid-run (ranks issuing different collective sequences).
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

_CRASH_KINDS = ["traceback.exception", "nccl.error_raised", "cuda.error"]
_BUSY_KINDS = ["progress", "log.last", "train.end"]
_RANK_IN_TEXT = r"(?i)\bon rank[ =:_]?(\d+)\b|\brank=(\d+)"
_PROGRESS_BAR = r"\d+%\|[^|]*\|\s*\d+/\d+ \["


@register("hang_heuristics")
def hang_heuristics(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    timeouts = events.filter(pl.col("kind").is_in(["watchdog.timeout", "watchdog.frame"])).with_columns(
        pl.coalesce("rank", "pg_rank").alias("rank")
    )
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
    barrier_like = (stuck["numel_in"] == 1) or (stuck["op"] in ("BARRIER", "ALLREDUCE") and stuck["numel_in"] == 1)
    busy = _busy_rank(events, waiting)
    evidence = timeouts.get_column("event_id").head(10).to_list()
    op = f"{stuck['op'] or 'a collective'}" + (f" #{stuck['seq']}" if stuck["seq"] is not None else "")
    if busy is not None and (barrier_like or stuck["op"] is None):
        rank, event_id, text = busy
        return findings_frame([finding(
            "hang-busy-rank-while-others-wait",
            ranks=[rank],
            hosts=[job.rank_hosts[rank]] if rank in job.rank_hosts else [],
            confidence=0.6,
            summary=f"ranks {_ranks(waiting)} timed out in {op} while rank {rank} was still busy: {text[:160]}",
            evidence=[event_id, *evidence],
        )])
    if stuck["seq"] == 1 and barrier_like:
        return findings_frame([finding(
            "hang-first-barrier-never-completed",
            confidence=0.4,
            summary=f"the very first collective ({op}, 1 element: a barrier) never completed on ranks {_ranks(waiting)}",
            evidence=evidence,
        )])
    if barrier_like:
        others = sorted(set(job.ranks) - waiting) if job.world_size else []
        return findings_frame([finding(
            "hang-barrier-rank-elsewhere",
            ranks=others,
            confidence=0.45,
            summary=f"ranks {_ranks(waiting)} waited in a 1-element {op} (a barrier) that another rank never entered",
            evidence=evidence,
        )])
    if stuck["op"] is not None:
        return findings_frame([finding(
            "hang-data-collective-diverged",
            confidence=0.4,
            summary=f"ranks {_ranks(waiting)} timed out mid-run in {op} (numel {stuck['numel_in']}); no rank logged an error",
            evidence=evidence,
        )])
    return findings_frame([])


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
        summary=f"rank {_ranks(ranks)} raised ({first['message'][:160]}) while ranks {_ranks(waiting) or '?'} {waited}",
        evidence=culprits.get_column("event_id").head(10).to_list(),
    )


def _busy_rank(events: pl.DataFrame, waiting: set[int]) -> tuple[int, int, str] | None:
    """The last rank-specific activity not from a waiting rank: a progress bar or a line naming a rank.

    Progress bars are usually printed by the main process only, so an unprefixed one counts as
    rank 0's unless rank 0 is among the waiting ranks.
    """
    has_bar = pl.col("text").fill_null("").str.contains(_PROGRESS_BAR)
    activity = events.filter(pl.col("kind").is_in(_BUSY_KINDS) | has_bar).with_columns(
        pl.coalesce(
            pl.col("message").str.extract(_RANK_IN_TEXT, 1).cast(pl.Int64, strict=False),
            pl.col("message").str.extract(_RANK_IN_TEXT, 2).cast(pl.Int64, strict=False),
            pl.col("rank"),
            pl.when(has_bar).then(pl.lit(0, dtype=pl.Int64)),
        ).alias("busy_rank")
    )
    activity = activity.filter(pl.col("busy_rank").is_not_null() & ~pl.col("busy_rank").is_in(sorted(waiting)))
    activity = activity.filter(pl.col("kind") != "log.last")
    if activity.height == 0:
        return None
    last = activity.sort("event_id").row(-1, named=True)
    return int(last["busy_rank"]), int(last["event_id"]), last["message"] or ""


def _ranks(ranks) -> str:
    from analyzer.detect import format_ranks

    return format_ranks(list(ranks))
