"""Stage 4, detect (analysis "departed_rank"): a rank that left the job while its peers waited for it.

When every rank that fails, fails because a peer closed its connection (Gloo's pair and the c10d
store: `Connection closed by peer`, `Connection reset by peer`, `failed to recv, got 0 bytes`) or
because the launcher tore it down (exit -15, SIGTERM), and no rank raised anything else, the peer that
went away is among the job's ranks that report no failure at all: it ended of its own accord (a
shorter data shard, an early `return` or `sys.exit(0)`, a branch that skips the loop) while the
others entered a collective it never joined. torchrun's "Root Cause" names the first survivor to
raise, a symptom. Named only when such ranks are a minority of the job: a job whose ranks mostly say
nothing is an excerpt, not evidence.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.ranks import format_ranks, ranks_label

PEER_CLOSED = r"Connection closed by peer|Connection reset by peer|[Ff]ailed to recv, got 0 bytes"
TORN_DOWN = r"SignalException: Process \d+ got signal: 15"
_EXCEPTION_KINDS = ["traceback.exception", "nccl.error_raised", "cuda.error"]
# The launcher's rows carry only the first line of a rank's error: they say which ranks failed and how
# they ended, not why.
_LAUNCHER_KINDS = ["torchrun.failure", "torchrun.root_cause"]


@register("departed_rank")
def departed_rank(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    ranked = events.filter(pl.col("rank").is_not_null())
    text = pl.col("message").fill_null("")
    exceptions = ranked.filter(pl.col("kind").is_in(_EXCEPTION_KINDS))
    closed = exceptions.filter(text.str.contains(PEER_CLOSED))
    if closed.height == 0 or exceptions.filter(~text.str.contains(PEER_CLOSED) & ~text.str.contains(TORN_DOWN)).height:
        return findings_frame([])
    launcher = ranked.filter(pl.col("kind").is_in(_LAUNCHER_KINDS))
    survivors = set(closed.get_column("rank").to_list())
    # A rank the launcher saw fail otherwise than as a survivor (killed by a signal, or exit 1 with no
    # closed connection of its own) failed for a reason of its own: not this pattern.
    unexplained = launcher.filter((pl.col("exitcode") != -15) & ~pl.col("rank").is_in(sorted(survivors)))
    if unexplained.height:
        return findings_frame([])
    failing = survivors | set(exceptions.get_column("rank").to_list()) | set(launcher.get_column("rank").to_list())
    world = job.world_size or max(failing) + 1
    departed = sorted(set(range(world)) - failing)
    if not departed or len(departed) >= len(failing):
        return findings_frame([])
    first = closed.sort("ts", "event_id", nulls_last=True).row(0, named=True)
    own_lines = events.filter(pl.col("rank").is_in(departed)).get_column("event_id").tail(5).to_list()
    return findings_frame([finding(
        "rank-left-peers-closed",
        ranks=departed,
        hosts=[job.rank_hosts[r] for r in departed if r in job.rank_hosts],
        confidence=0.55,
        summary=(f"{ranks_label(sorted(failing))} failed only because a peer closed its connection ({first['message'][:120]}) "
                 f"or were torn down by the launcher, and no rank raised anything else; {ranks_label(departed)} of ranks "
                 f"{format_ranks(list(range(world)))} {'reports' if len(departed) == 1 else 'report'} no failure and "
                 "left the job while the others waited for it in a collective"),
        evidence=[*closed.get_column("event_id").head(8).to_list(), *own_lines],
    )])
