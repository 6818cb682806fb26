"""Batch (fleet view): what a jobs table (one row per job, see `analyzer.fleet.rows`) says across jobs.

The frames here are the input of the fleet renderers (`analyzer.fleet.page_text` and
`analyzer.fleet.page_html`); nothing here reads logs.

- **Repeat-offender hosts**: every host a failed job's verdict implicates (its culprit hosts, and
  the hosts of its culprit ranks), ranked by how many distinct failed jobs name it, then by the sum
  of those verdicts' confidences (a host named by three 0.9 verdicts outranks one named by three
  0.3 verdicts), then by name. `jobs_seen` counts every scanned job the host appears in, so a host
  that is named in 5 of its 5 jobs reads differently from one named in 5 of 500. These are the
  cordon candidates.
- **GPUs** the same way, where the logs printed the culprit's device (`host/gpuN`).
- **Recurring signatures**: verdict rules by the number of failed jobs they decided, with the
  hosts they implicated, and how many jobs the rule fired in at all (as verdict or as a symptom).
- Counts by category and the jobs not analysed: could not be analysed, ran past the job time
  limit, or crashed the analyzer.

A failed job is an analysed job whose verdict category is not `none`. `exit_status` is the
contract `scan` and `fleet` share: 1 when any job failed, else 3 when a job crashed the analyzer
(its own fault: never passed off as "no failure"), else 0; a table without jobs is 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyzer.exits import EXIT_CANNOT_ANALYSE, EXIT_FAILURE_FOUND, EXIT_INTERNAL_ERROR, EXIT_NOTHING_FOUND
from analyzer.fleet.rows import STATUS_ANALYSED, STATUS_CANNOT_ANALYSE, STATUS_CRASHED, STATUS_OVER_MEMORY, STATUS_TIMED_OUT

FAILED = (pl.col("status") == STATUS_ANALYSED) & (pl.col("category") != "none")
EXAMPLE_JOBS = 5


@dataclass
class FleetView:
    totals: dict[str, int]
    hosts: pl.DataFrame
    gpus: pl.DataFrame
    signatures: pl.DataFrame
    categories: pl.DataFrame
    failed: pl.DataFrame  # the failed jobs, most confident first
    problems: pl.DataFrame  # jobs that could not be analysed, timed out or crashed the analyzer


def fleet_view(scan: pl.DataFrame) -> FleetView:
    return FleetView(
        totals=totals(scan),
        hosts=host_offenders(scan),
        gpus=gpu_offenders(scan),
        signatures=recurring_signatures(scan),
        categories=category_counts(scan),
        failed=scan.filter(FAILED)
        .select("job", "category", "rule_id", "culprit_ranks", "culprit_hosts", "culprit_gpus", "confidence", "summary", "job_end")
        .sort(["confidence", "job"], descending=[True, False]),
        problems=scan.filter(pl.col("status") != STATUS_ANALYSED).select("job", "status", "error").sort("job"),
    )


def totals(scan: pl.DataFrame) -> dict[str, int]:
    counts = scan.select(
        pl.len().alias("jobs"),
        (pl.col("status") == STATUS_ANALYSED).sum().alias("analysed"),
        FAILED.sum().alias("failed"),
        ((pl.col("status") == STATUS_ANALYSED) & (pl.col("category") == "none")).sum().alias("no_failure"),
        (pl.col("status") == STATUS_CANNOT_ANALYSE).sum().alias("cannot_analyse"),
        (pl.col("status") == STATUS_TIMED_OUT).sum().alias("timed_out"),
        (pl.col("status") == STATUS_OVER_MEMORY).sum().alias("over_memory"),
        (pl.col("status") == STATUS_CRASHED).sum().alias("crashed"),
    )
    return {name: int(value or 0) for name, value in counts.row(0, named=True).items()}


def _seen(scan: pl.DataFrame, column: str, key: str) -> pl.DataFrame:
    """How many scanned jobs mention each host (in the job's hosts or its verdict)."""
    return (
        scan.select("job", pl.concat_list(pl.col("hosts").fill_null([]), pl.col(column).fill_null([])).list.unique().alias(key))
        .explode(key)
        .drop_nulls(key)
        .group_by(key)
        .agg(pl.col("job").n_unique().alias("jobs_seen"))
    )


def _rank_named(scan: pl.DataFrame, column: str, key: str) -> pl.DataFrame:
    """One row per value of the list `column` over failed jobs, ranked as the module docstring says."""
    return (
        scan.filter(FAILED)
        .select("job", "confidence", "category", "job_end", pl.col(column).alias(key))
        .explode(key)
        .drop_nulls(key)
        .unique(["job", key])
        .group_by(key)
        .agg(
            pl.col("job").n_unique().alias("failed_jobs"),
            pl.col("confidence").sum().round(3).alias("confidence_sum"),
            pl.col("confidence").mean().round(3).alias("mean_confidence"),
            pl.col("confidence").max().alias("max_confidence"),
            pl.col("category").unique().sort().alias("categories"),
            pl.col("job_end").min().alias("first_seen"),
            pl.col("job_end").max().alias("last_seen"),
            pl.col("job").sort().head(EXAMPLE_JOBS).alias("example_jobs"),
        )
        .sort(["failed_jobs", "confidence_sum", key], descending=[True, True, False])
    )


def host_offenders(scan: pl.DataFrame) -> pl.DataFrame:
    named = _rank_named(scan, "implicated_hosts", "host")
    gpus = (
        scan.filter(FAILED)
        .select(pl.col("culprit_gpus").alias("gpu"))
        .explode("gpu")
        .drop_nulls("gpu")
        .unique()
        .with_columns(pl.col("gpu").str.replace(r"/gpu\d+$", "").alias("host"))
        .group_by("host")
        .agg(pl.col("gpu").sort().alias("gpus"))
    )
    return (
        named.join(_seen(scan, "implicated_hosts", "host"), on="host", how="left", maintain_order="left")
        .join(gpus, on="host", how="left", maintain_order="left")
        .with_columns(pl.col("gpus").fill_null([]))
    )


def gpu_offenders(scan: pl.DataFrame) -> pl.DataFrame:
    return _rank_named(scan, "culprit_gpus", "gpu").with_columns(pl.col("gpu").str.replace(r"/gpu\d+$", "").alias("host"))


def recurring_signatures(scan: pl.DataFrame) -> pl.DataFrame:
    decided = (
        scan.filter(FAILED)
        .group_by("rule_id")
        .agg(
            pl.col("category").first(),  # a rule has one category in the catalogue
            pl.col("job").n_unique().alias("failed_jobs"),
            pl.col("confidence").mean().round(3).alias("mean_confidence"),
            pl.col("implicated_hosts").list.explode(keep_nulls=False, empty_as_null=False).unique().sort().alias("hosts"),
            pl.col("job").sort().head(EXAMPLE_JOBS).alias("example_jobs"),
        )
    )
    fired = (
        scan.filter(pl.col("status") == STATUS_ANALYSED)
        .select("job", pl.col("signatures").alias("rule_id"))
        .explode("rule_id")
        .drop_nulls("rule_id")
        .group_by("rule_id")
        .agg(pl.col("job").n_unique().alias("jobs_fired"))
    )
    return decided.join(fired, on="rule_id", how="left").sort(["failed_jobs", "rule_id"], descending=[True, False])


def category_counts(scan: pl.DataFrame) -> pl.DataFrame:
    return (
        scan.with_columns(pl.coalesce("category", "status").alias("category"))
        .group_by("category")
        .agg(pl.len().alias("jobs"))
        .sort(["jobs", "category"], descending=[True, False])
    )


def exit_status(view: FleetView) -> int:
    """The exit status of `scan` and `fleet` (module docstring)."""
    totals = view.totals
    if not totals["jobs"]:
        return EXIT_CANNOT_ANALYSE
    if totals["failed"]:
        return EXIT_FAILURE_FOUND
    return EXIT_INTERNAL_ERROR if totals["crashed"] else EXIT_NOTHING_FOUND
