"""Stage 4, detect (cross-rank analysis "stack_clustering"): STAT-style grouping of py-spy stacks.

Each rank's main-thread stack (from `stack.thread` events) is reduced to its Python frames
(function and file, no line numbers, so the same code path matches across ranks and py-spy
variants), ranks with identical reduced stacks form a cluster, and each stack is tested for a
collective frame (`all_reduce`, `barrier`, `broadcast`, a torch.distributed `wait`,
`torch.cuda.synchronize`, or with --native an NCCL / CUDA-synchronize symbol).

The classic hang culprit is the rank whose main thread is outside any collective while the others
wait inside one: rule `hang-rank-stuck-outside-collective`.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.analyses.progress import compress_ranks
from analyzer.findings import finding, findings_frame

RULE = "hang-rank-stuck-outside-collective"
MAX_EVIDENCE = 40

_FRAME = r"^(.*?) \((.*)\)$"
_LINE_SUFFIX = r":\d+$"
# A Python frame's location is a .py file or a pseudo-file (`<frozen runpy>`, `<string>`); native
# frames name a library (`libc.so.6`, `libcuda.so.580.159.04`) or `?`.
_PYTHON_FILE = r"(?:\.pyw?|^<[^>]*>)$"
# Collective entry points by name alone (torch.distributed, DeepSpeed, Megatron wrappers).
_COLLECTIVE_NAME = (
    r"^_?(?:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all)(?:_\w+)?$"
    r"|^(?:broadcast|broadcast_object_list|broadcast_coalesced|_broadcast_coalesced|(?:monitored_)?barrier|inference_all_reduce)$"
    # DDP all-reduces gradients from autograd hooks: a rank blocked in the backward engine is
    # waiting in that all-reduce, which py-spy shows only as the engine call.
    r"|^_engine_run_backward$|^run_backward$"
)
# Names that are collectives only inside distributed / CUDA code (`wait` is also threading's).
_GENERIC_NAME = (
    r"^_?(?:wait|synchronize|send|recv|isend|irecv|reduce|gather|scatter|wait_stream|wait_tensor"
    r"|batch_isend_irecv|gather_object|scatter_object_list)$"
)
_DISTRIBUTED_FILE = r"torch/distributed|torch/cuda|deepspeed|megatron|c10d|nccl|/comm/|comm\.py"
_NATIVE_COLLECTIVE = r"(?i)nccl|ProcessGroupNCCL|WorkNCCL|c10d::|(?:cuda|cu)(?:Device|Stream|Event|Ctx)Synchronize"
# Frames that say nothing about where a rank is (decorators, nn.Module dispatch).
_NOISE = ["wrapper", "inner", "decorate_context", "_call_impl", "_wrapped_call_impl", "_fn", "wrapped_fn"]


@register("stack_clustering")
def stack_clustering(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    """A finding when a minority of ranks sits outside every collective while the rest wait in one."""
    clusters = stack_clusters(events)
    if clusters.height < 2:
        return findings_frame([])
    inside = clusters.filter(pl.col("in_collective"))
    outside = clusters.filter(~pl.col("in_collective"))
    n_in = int(inside.get_column("n").sum()) if inside.height else 0
    n_out = int(outside.get_column("n").sum()) if outside.height else 0
    total = n_in + n_out
    if n_in and n_out and n_out <= n_in:
        culprit_clusters, confidence = outside, (0.8 if n_out * 3 <= total else 0.6 if n_out < n_in else 0.5)
        note = ""
    elif not n_in:
        # No stack shows a collective (py-spy without --native cannot see a C-level wait such as
        # `.item()`): only a lone odd cluster against a large uniform majority is worth a weak guess.
        top = clusters.row(0, named=True)
        if top["n"] < 3 or top["n"] * 4 < total * 3:
            return findings_frame([])
        culprit_clusters, confidence = clusters.slice(1), 0.3
        note = " (no collective frame visible in any stack; capture with py-spy --native to confirm)"
    else:
        return findings_frame([])
    majority = clusters.filter(~pl.col("signature").is_in(culprit_clusters.get_column("signature").implode()))
    culprit_ranks = sorted({r for ranks in culprit_clusters.get_column("ranks").to_list() for r in ranks})
    shown = list(majority.head(3).iter_rows(named=True)) + list(culprit_clusters.head(3).iter_rows(named=True))
    summary = "; ".join(f"{_members_label(c)}: {c['label']} ({c['state']})" for c in shown)
    if majority.height + culprit_clusters.height > len(shown):
        summary += f"; {majority.height + culprit_clusters.height - len(shown)} more stack group(s)"
    summary += note
    evidence = [e for ids in culprit_clusters.get_column("event_ids").to_list() for e in ids][:MAX_EVIDENCE]
    evidence += [e for ids in majority.get_column("event_ids").to_list() for e in ids][:10]
    if not culprit_ranks:
        # pid-only dumps (no rank known yet): still worth reporting, the pids are in the summary.
        confidence *= 0.8
    hosts = [job.rank_hosts[r] for r in culprit_ranks if r in job.rank_hosts]
    return findings_frame(
        [finding(RULE, ranks=culprit_ranks, hosts=hosts, confidence=confidence, summary=summary, evidence=evidence)]
    )


def stack_clusters(events: pl.DataFrame) -> pl.DataFrame:
    """Ranks grouped by main-thread stack, biggest group first.

    Columns: signature, label (innermost meaningful frames, "all_reduce <- global_mean"), n,
    ranks, pids (members without a known rank), in_collective, state (py-spy status of the
    members), event_ids.
    """
    if "event_id" not in events.columns:
        events = events.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))
    threads = events.lazy().filter((pl.col("kind") == "stack.thread") & (pl.col("rank").is_not_null() | pl.col("pid").is_not_null()))
    # One process = the rank when known, else the pid (correlate maps pids to ranks when it can).
    threads = threads.with_columns(
        pl.when(pl.col("rank").is_not_null()).then(pl.lit("rank")).otherwise(pl.lit("pid")).alias("who_kind"),
        pl.coalesce("rank", "pid").alias("who"),
        pl.when(pl.col("message").str.starts_with('thread "MainThread"'))
        .then(0)
        .when(pl.col("tid") == pl.col("pid"))
        .then(1)
        .otherwise(2)
        .alias("_priority"),
    )
    # The main thread of each dump file; a rank can have several dumps (text, --native, --json, or
    # snapshots over time).
    mains = threads.sort("who_kind", "who", "file", "_priority", "line").group_by("who_kind", "who", "file", maintain_order=True).first()
    frames = (
        mains.select("who_kind", "who", "file", "event_id", pl.col("detail").fill_null("").str.split(" <- ").alias("frame"))
        .explode("frame")
        .with_columns(
            pl.col("frame").str.extract(_FRAME, 1).alias("func"),
            pl.col("frame").str.extract(_FRAME, 2).str.replace(_LINE_SUFFIX, "").alias("where"),
        )
        .with_columns(pl.col("where").str.contains(_PYTHON_FILE).fill_null(False).alias("is_python"))
        .with_columns(
            (
                (pl.col("is_python") & pl.col("func").str.contains(_COLLECTIVE_NAME))
                | (pl.col("is_python") & pl.col("func").str.contains(_GENERIC_NAME) & pl.col("where").str.contains(_DISTRIBUTED_FILE))
                | (~pl.col("is_python") & pl.col("func").str.contains(_NATIVE_COLLECTIVE))
            )
            .fill_null(False)
            .alias("is_collective")
        )
    )
    per_dump = frames.group_by("who_kind", "who", "file", "event_id").agg(
        pl.col("is_collective").any().alias("in_collective"),
        # File basenames only: install paths differ across hosts and between py-spy's text (short
        # names) and JSON (absolute) output, and must not split a cluster.
        pl.concat_str([pl.col("func"), pl.lit(" ("), pl.col("where").str.extract(r"([^/]*)$", 1), pl.lit(")")])
        .filter(pl.col("is_python"))
        .str.join(" <- ")
        .alias("signature"),
        pl.col("func").filter(pl.col("is_python") & ~pl.col("func").is_in(_NOISE)).head(2).str.join(" <- ").alias("python_label"),
        pl.col("func").filter(~pl.col("func").str.contains(r"^0[xX][0-9a-fA-F]+$")).head(2).str.join(" <- ").alias("native_label"),
    )
    per_process = (
        per_dump.join(mains.select("who_kind", "who", "file", "code"), on=["who_kind", "who", "file"], how="left")
        .sort("who_kind", "who", "file")
        .group_by("who_kind", "who", maintain_order=True)
        .agg(
            pl.col("in_collective").any(),  # any snapshot in a collective: not stuck outside one
            pl.col("signature").filter(pl.col("signature") != "").last().alias("signature"),
            pl.col("python_label").filter(pl.col("python_label") != "").last().alias("python_label"),
            pl.col("native_label").last(),
            pl.col("code").drop_nulls().last().alias("state"),
            pl.col("event_id"),
        )
        .with_columns(
            pl.coalesce("signature", pl.concat_str([pl.lit("native: "), pl.col("native_label")]), pl.lit("(no frames)"))
            .alias("signature"),
            pl.coalesce(pl.col("python_label"), pl.col("native_label"), pl.lit("(no frames)")).alias("label"),
        )
    )
    clusters = (
        per_process.group_by("signature")
        .agg(
            pl.len().alias("n"),
            pl.col("who").filter(pl.col("who_kind") == "rank").sort().alias("ranks"),
            pl.col("who").filter(pl.col("who_kind") == "pid").sort().alias("pids"),
            pl.col("in_collective").any(),
            pl.col("label").first(),
            pl.col("state").drop_nulls().unique().sort().str.join("/").alias("state"),
            pl.col("event_id").list.explode(keep_nulls=False, empty_as_null=False).sort().alias("event_ids"),
        )
        .sort(["n", "signature"], descending=[True, False])
        .collect()
    )
    return clusters.with_columns(pl.col("state").replace("", "unknown"))


def _members_label(cluster: dict) -> str:
    ranks, pids = cluster["ranks"], cluster["pids"]
    parts = []
    if ranks:
        parts.append(("rank " if len(ranks) == 1 else "ranks ") + compress_ranks(ranks))
    if pids:
        parts.append(("pid " if len(pids) == 1 else "pids ") + ",".join(map(str, pids[:8])) + ("..." if len(pids) > 8 else ""))
    return " + ".join(parts) or "?"
