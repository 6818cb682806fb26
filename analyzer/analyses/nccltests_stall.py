"""Stage 4, detect (analysis "nccltests_stalled_on_one_host"): a collective test on one machine that
printed its column header and never a result.

nccl-tests (and NCCL 1's own test programs before it) print the device table, create the
communicators, print the column header, and then run the first collective; each size's row is
printed when it completes. A run whose column header is there with no row after it, no failure
line, no summary line, stopped inside its first collective. On one machine the only paths between
its GPUs are peer-to-peer (NVLink, PCIe) and shared memory: NCCL's troubleshooting guide names PCIe
Access Control Services and the IOMMU as what makes such a run hang with no error. A run across
hosts has the network too, and is not judged here.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.parse.nccltests import runs_frame


@register("nccltests_stalled_on_one_host")
def nccltests_stalled_on_one_host(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    runs = runs_frame(events)
    if runs.height == 0:
        return findings_frame([])
    with_rows = events.filter(pl.col("kind") == "nccltests.result").get_column("pg").unique().to_list()
    failed_files = events.filter(pl.col("severity").is_in(["error", "fatal"])).get_column("file").unique().to_list()
    stalled = runs.filter(
        pl.col("columns").fill_null(False) & ~pl.col("run").is_in(with_rows) & ~pl.col("file").is_in(failed_files)
        & pl.col("avg_busbw").is_null() & pl.col("out_of_bounds").is_null()
        & (pl.col("nranks").fill_null(0) >= 2) & (pl.col("hosts").list.len() <= 1)
    )
    rows = []
    for run in stalled.iter_rows(named=True):
        hosts = [h for h in run["hosts"] or [] if h]
        where = f" on {hosts[0]}" if hosts else " in one process"
        gpus = ", ".join(run["gpus"] or []) or "GPUs"
        rows.append(finding(
            "nccltests-stalled-on-one-host",
            hosts=hosts, confidence=0.45,
            summary=(f"{run['file']}: {run['test'] or 'the collective test'} with {run['nranks']} ranks{where} ({gpus}) printed its "
                     "column header and no result, failure or summary after it: its first collective between the GPUs never completed"),
            evidence=[run["event_id"]],
        ))
    return findings_frame(rows)
