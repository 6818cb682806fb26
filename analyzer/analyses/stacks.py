"""Stage 4, detect (cross-rank analysis "stack_clustering"): STAT-style grouping of py-spy stacks.

Each rank's main-thread stack (from `stack.thread` events) is reduced to its Python frames
(function and file, no line numbers, so the same code path matches across ranks and py-spy
variants), ranks with identical reduced stacks form a cluster, and each stack is tested for a
collective frame (`all_reduce`, `barrier`, `broadcast`, a torch.distributed `wait`,
`torch.cuda.synchronize`, or with --native an NCCL / CUDA-synchronize symbol).

The classic hang culprit is the rank whose main thread is outside any collective while the others
wait inside one: rule `hang-rank-stuck-outside-collective`.

A Python stack alone cannot see every wait: after `dist.all_reduce(t)` a rank blocks in
`t.item()` (a CUDA synchronize, invisible without --native), and a rank that has enqueued its
collectives asynchronously may already sit in unrelated code. So each rank's stack is correlated
with the collective progress matrix (Flight Recorder entries and pg_status, watchdog lines; see
`progress.py`): a rank with an unfinished collective there is waiting in it, whatever its stack
shows, and a rank whose dump shows nothing pending while its stack is elsewhere is confirmed
outside.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.ranks import ranks_label

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
    # Clusters are told apart by row, not signature: one stack can form two clusters when the
    # progress matrix puts some of its ranks inside a collective and the others outside.
    clusters = stack_clusters(events, progress=_progress_of_stacked_ranks(events)).with_row_index("_cluster")
    if clusters.height < 2:
        return findings_frame([])
    inside = clusters.filter(pl.col("in_collective"))
    outside = clusters.filter(~pl.col("in_collective"))
    n_in = int(inside.get_column("n").sum()) if inside.height else 0
    n_out = int(outside.get_column("n").sum()) if outside.height else 0
    total = n_in + n_out
    if n_in and n_out and n_out <= n_in:
        culprit_clusters, confidence = outside, (0.8 if n_out * 3 <= total else 0.6 if n_out < n_in else 0.5)
        if outside.get_column("idle_confirmed").all():
            # Two independent sources agree: the stack is elsewhere and the rank's own Flight
            # Recorder / watchdog status has no collective pending.
            confidence = min(confidence + 0.15, 0.9)
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
    majority = clusters.filter(~pl.col("_cluster").is_in(culprit_clusters.get_column("_cluster").implode()))
    culprit_ranks = sorted({r for ranks in culprit_clusters.get_column("ranks").to_list() for r in ranks})
    shown = list(majority.head(3).iter_rows(named=True)) + list(culprit_clusters.head(3).iter_rows(named=True))
    summary = "; ".join(f"{_members_label(c)}: {c['label']} ({c['state']})" for c in shown)
    if majority.height + culprit_clusters.height > len(shown):
        summary += f"; {majority.height + culprit_clusters.height - len(shown)} more stack group(s)"
    summary += note
    evidence = [e for ids in culprit_clusters.get_column("event_ids").to_list() for e in ids][:MAX_EVIDENCE]
    evidence += [e for ids in majority.get_column("event_ids").to_list() for e in ids][:10]
    # The progress-matrix events that placed a rank inside (or outside) a collective: a few, so
    # the stacks themselves stay within the report's first lines of evidence.
    evidence += [e for ids in culprit_clusters.get_column("matrix_eids").to_list() for e in ids][:2]
    evidence += [e for ids in majority.get_column("matrix_eids").to_list() for e in ids][:2]
    if not culprit_ranks:
        # pid-only dumps (no rank known yet): still worth reporting, the pids are in the summary.
        confidence *= 0.8
    hosts = [job.rank_hosts[r] for r in culprit_ranks if r in job.rank_hosts]
    return findings_frame(
        [finding(RULE, ranks=culprit_ranks, hosts=hosts, confidence=confidence, summary=summary, evidence=evidence)]
    )


def stack_clusters(events: pl.DataFrame, progress: pl.DataFrame | None = None) -> pl.DataFrame:
    """Ranks grouped by main-thread stack, biggest group first.

    Columns: signature, label (innermost meaningful frames, "all_reduce <- global_mean"), n,
    ranks, pids (members without a known rank), in_collective, state (py-spy status of the
    members, plus what the progress matrix says when it decides), event_ids, idle_confirmed (every
    member's progress shows nothing pending), matrix_eids (the progress events used).

    `progress` (from `_progress_of_stacked_ranks`: rank, waiting, wait_text, idle, matrix_eid)
    overrides the stack: a rank waiting in an unfinished collective there is in a collective, and
    ranks with the same stack but a different progress state form separate clusters.
    """
    if "event_id" not in events.columns:
        events = events.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))
    mains = _main_threads(events)
    per_process = _per_process(_per_dump(_frames(mains)), mains)
    if progress is None or not progress.height:
        progress = pl.DataFrame(schema=_PROGRESS_SCHEMA)
    return _clusters(_with_progress(per_process, progress))


def _main_threads(events: pl.DataFrame) -> pl.LazyFrame:
    """The main thread of each dump file, per process (who_kind, who); a rank can have several
    dumps (text, --native, --json, or snapshots over time)."""
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
    return threads.sort("who_kind", "who", "file", "_priority", "line").group_by("who_kind", "who", "file", maintain_order=True).first()


def _frames(mains: pl.LazyFrame) -> pl.LazyFrame:
    """One row per frame of each main thread: func, where, is_python, is_collective."""
    return (
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


def _per_dump(frames: pl.LazyFrame) -> pl.LazyFrame:
    """Per dump: in a collective or not, the Python signature and the labels."""
    return frames.group_by("who_kind", "who", "file", "event_id").agg(
        pl.col("is_collective").any().alias("in_collective"),
        # File basenames only: install paths differ across hosts and between py-spy's text (short
        # names) and JSON (absolute) output, and must not split a cluster.
        pl.concat_str([pl.col("func"), pl.lit(" ("), pl.col("where").str.extract(r"([^/]*)$", 1), pl.lit(")")])
        .filter(pl.col("is_python"))
        .str.join(" <- ")
        .alias("signature"),
        # `context_decorator.<locals>.decorate_context` is noise too: compare the last name only.
        pl.col("func")
        .filter(pl.col("is_python") & ~pl.col("func").str.extract(r"([^.]*)$", 1).is_in(_NOISE))
        .head(2)
        .str.join(" <- ")
        .alias("python_label"),
        pl.col("func").filter(~pl.col("func").str.contains(r"^0[xX][0-9a-fA-F]+$")).head(2).str.join(" <- ").alias("native_label"),
    )


def _per_process(per_dump: pl.LazyFrame, mains: pl.LazyFrame) -> pl.LazyFrame:
    """Per process, its dumps folded: the last signature and label, the py-spy state."""
    return (
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


def _with_progress(per_process: pl.LazyFrame, progress: pl.DataFrame) -> pl.LazyFrame:
    """The progress matrix joined on rank: it overrides the stack where it decides (_matrix_in,
    _matrix_out, _matrix_note)."""
    return per_process.join(
        progress.lazy().with_columns(pl.lit("rank").alias("who_kind")).rename({"rank": "who"}), on=["who_kind", "who"], how="left"
    ).with_columns(
        # The matrix decides only where the stack does not already show a collective.
        (pl.col("waiting").fill_null(False) & ~pl.col("in_collective")).alias("_matrix_in"),
        (pl.col("idle").fill_null(False) & ~pl.col("in_collective")).alias("_matrix_out"),
    ).with_columns(
        (pl.col("in_collective") | pl.col("_matrix_in")).alias("in_collective"),
        pl.when(pl.col("_matrix_in"))
        .then(pl.col("wait_text"))
        .when(pl.col("_matrix_out"))
        .then(pl.lit("nothing pending per Flight Recorder/watchdog"))
        .alias("_matrix_note"),
    )


def _clusters(per_process: pl.LazyFrame) -> pl.DataFrame:
    """Processes grouped by signature and state, biggest group first."""
    clusters = (
        per_process.group_by("signature", "in_collective", "_matrix_note")
        .agg(
            pl.len().alias("n"),
            pl.col("who").filter(pl.col("who_kind") == "rank").sort().alias("ranks"),
            pl.col("who").filter(pl.col("who_kind") == "pid").sort().alias("pids"),
            pl.col("label").first(),
            pl.col("state").drop_nulls().unique().sort().str.join("/").alias("state"),
            pl.col("event_id").list.explode(keep_nulls=False, empty_as_null=False).sort().alias("event_ids"),
            pl.col("_matrix_out").all().alias("idle_confirmed"),
            pl.col("matrix_eid").filter(pl.col("_matrix_in") | pl.col("_matrix_out")).drop_nulls().sort().alias("matrix_eids"),
        )
        .sort(["n", "signature", "in_collective"], descending=[True, False, True], nulls_last=True)
        .collect()
    )
    state = pl.col("state").replace("", "unknown")
    return clusters.with_columns(
        pl.when(pl.col("_matrix_note").is_not_null()).then(pl.concat_str([state, pl.lit("; "), pl.col("_matrix_note")])).otherwise(state).alias("state")
    ).drop("_matrix_note")


_PROGRESS_SCHEMA = {"rank": pl.Int64, "waiting": pl.Boolean, "wait_text": pl.String, "idle": pl.Boolean, "matrix_eid": pl.Int64}


def _progress_of_stacked_ranks(events: pl.DataFrame) -> pl.DataFrame:
    """Per rank with a stack dump: is it waiting in an unfinished collective according to the progress
    matrix (Flight Recorder entries / pg_status, watchdog lines), or does it have nothing pending?

    Columns as `_PROGRESS_SCHEMA`: `waiting` with `wait_text` ("waiting in ALLREDUCE #20 per Flight
    Recorder") and the event that shows it; `idle` when every process group the rank has status for
    shows last enqueued == last completed (it is not inside NCCL at all).
    """
    from analyzer.analyses.progress import collective_progress

    stacked = events.lazy().filter((pl.col("kind") == "stack.thread") & pl.col("rank").is_not_null()).select(pl.col("rank").unique()).collect()
    if not stacked.height:
        return pl.DataFrame(schema=_PROGRESS_SCHEMA)
    if "event_id" not in events.columns:
        events = events.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))
    relevant = events.join(stacked, on="rank", how="semi")
    progress = collective_progress(relevant)
    if not progress.height:
        return pl.DataFrame(schema=_PROGRESS_SCHEMA)
    sources = relevant.select("event_id", pl.col("source").alias("_src"))
    by_rank = (
        progress.lazy()
        .join(sources.lazy(), left_on="wait_eid", right_on="event_id", how="left")
        .sort("rank", "stuck", nulls_last=True)
        .group_by("rank", maintain_order=True)
        .agg(
            pl.col("stuck").is_not_null().any().alias("waiting"),
            pl.col("stuck").drop_nulls().first().alias("_seq"),
            pl.col("wait_op").filter(pl.col("stuck").is_not_null()).first().alias("_op"),
            pl.col("_src").filter(pl.col("stuck").is_not_null()).first().alias("_src"),
            (pl.col("enq").is_not_null() & (pl.col("enq") == pl.col("done"))).all().alias("idle"),
            pl.coalesce(pl.col("wait_eid"), pl.col("last_eid"), pl.col("st_eid")).drop_nulls().first().alias("matrix_eid"),
        )
        .with_columns(
            pl.concat_str(
                [
                    pl.lit("waiting in "),
                    pl.col("_op").fill_null("collective"),
                    pl.lit(" #"),
                    pl.col("_seq").cast(pl.String),
                    pl.lit(" per "),
                    pl.when(pl.col("_src") == "flight_recorder").then(pl.lit("Flight Recorder")).otherwise(pl.lit("watchdog")),
                ]
            ).alias("wait_text"),
            (pl.col("idle") & ~pl.col("waiting")).alias("idle"),
        )
        .select(list(_PROGRESS_SCHEMA))
        .collect()
    )
    return by_rank.cast(_PROGRESS_SCHEMA)


def _members_label(cluster: dict) -> str:
    ranks, pids = cluster["ranks"], cluster["pids"]
    parts = []
    if ranks:
        parts.append(ranks_label(ranks))
    if pids:
        parts.append(("pid " if len(pids) == 1 else "pids ") + ",".join(map(str, pids[:8])) + ("..." if len(pids) > 8 else ""))
    return " + ".join(parts) or "?"
