"""Issue 18: a scan over a root that mixes every hostile class gives a row per job, each within its budget.

The root is built in tmp_path at test time: one job directory per generator of tests/hostile_gen.py
(at the bounded-test scale, small on disk), one ordinary failing job and one healthy job copied from
the fixtures. `postmortem scan ROOT` runs as a user runs it, in a child process started by a small
launcher, so that `resource.getrusage(RUSAGE_CHILDREN)` there measures the scan and its workers
alone (this test runner's own peak would otherwise be inherited across fork). The jobs table is read
back and checked: every job is exactly one row, every row has a status and the hostile ones a
reason, the ordinary job keeps its verdict, the healthy one has no finding, nothing was written
under the root, and the wall time and peak RSS are within the bounds below.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests import hostile_gen as gen
from tests.test_hostile_inputs import tree_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600, method="signal")]

SCALE = 0.05  # as tests/test_hostile_bounds.py: the mechanisms of the full-size inputs, on small files
WORKERS = 2
JOB_TIMEOUT_S = 120  # --job-timeout: a job past it would be a timed_out row; none may reach it
JOB_BOUND_S = 60  # what one job may take (the bound for one hostile input)
SCAN_BOUND_S = 400  # the whole scan on 2 workers, start-up included
RSS_BOUND_MB = 1024  # the largest process of the scan (the scan itself or one worker)
FAILING = gen.ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped"
HEALTHY = gen.ROOT / "fixtures" / "healthy" / "torchrun-2gpu-normal" / "job"
STATUSES = {"analysed", "cannot_analyse", "timed_out", "over_memory", "crashed"}

LAUNCHER = r"""
import json, resource, subprocess, sys, time
wall = time.perf_counter()
run = subprocess.run(sys.argv[1:], capture_output=True, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": time.perf_counter() - wall, "peak_rss_mb": usage.ru_maxrss / 1024,
                  "exit": run.returncode, "stderr": run.stderr[-4000:]}))
"""


def build_root(root: Path) -> dict[str, Path]:
    """The mixed root: name -> the job directory written."""
    jobs = {}
    for item in gen.ITEMS:
        jobs[item.name] = root / item.name / "job"
        gen.write(item, jobs[item.name], SCALE)
    jobs["ordinary-failing"] = root / "ordinary-failing"
    shutil.copytree(FAILING / "job", jobs["ordinary-failing"])
    jobs["healthy"] = root / "healthy"
    shutil.copytree(HEALTHY, jobs["healthy"])
    return jobs


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile-scan")
    root, out = base / "root", base / "out"
    jobs = build_root(root)
    before = tree_state(root)
    argv = [sys.executable, "-m", "analyzer.cli", "scan", str(root), "--out", str(out / "scan.parquet"),
            "--no-cache", "-j", str(WORKERS), "--job-timeout", str(JOB_TIMEOUT_S), "-q"]
    run = subprocess.run([sys.executable, "-c", LAUNCHER, *argv], capture_output=True, text=True, cwd=gen.ROOT,
                         timeout=SCAN_BOUND_S + 60)
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    after = tree_state(root)
    table = pl.read_parquet(out / "scan.parquet") if (out / "scan.parquet").exists() else None
    return {"root": root, "jobs": jobs, "measured": measured, "table": table, "before": before, "after": after}


def rows(scanned) -> dict[str, dict]:
    return {r["job"]: r for r in scanned["table"].to_dicts()}


def row_of(scanned, name: str) -> dict:
    """The row whose job holds the directory written for `name` (the job itself or a folder above it)."""
    job = scanned["jobs"][name]
    holding = [r for path, r in rows(scanned).items() if job == Path(path) or Path(path) in job.parents]
    assert len(holding) == 1, (name, [r["job"] for r in holding])
    return holding[0]


def test_the_scan_ends_with_a_table(scanned):
    measured = scanned["measured"]
    assert measured["exit"] in (0, 1), measured["stderr"]  # 1: failures found; never 3 (a job crashed)
    assert "Traceback" not in measured["stderr"], measured["stderr"]
    assert scanned["table"] is not None


def test_within_the_time_and_memory_bounds(scanned):
    measured = scanned["measured"]
    assert measured["seconds"] < SCAN_BOUND_S, measured
    assert measured["peak_rss_mb"] < RSS_BOUND_MB, measured
    slowest = scanned["table"].select(pl.col("job"), pl.col("elapsed_s")).sort("elapsed_s").row(-1)
    assert slowest[1] < JOB_BOUND_S, slowest


def test_one_row_per_job(scanned):
    table = scanned["table"]
    assert table["job"].n_unique() == table.height
    paths = [Path(p) for p in table["job"]]
    assert all(scanned["root"] in p.parents for p in paths)
    assert not [(a, b) for a in paths for b in paths if a in b.parents], "a job's row also covers another job"
    for name in scanned["jobs"]:
        row_of(scanned, name)  # exactly one row holds every job written


def test_every_row_has_a_status_and_the_not_analysed_a_reason(scanned):
    for row in rows(scanned).values():
        assert row["status"] in STATUSES, row
        assert row["status"] not in ("crashed", "timed_out"), row  # a hostile input is bounded, never the job's end
        if row["status"] == "analysed":
            assert row["category"] and row["outcome"], row
        else:
            assert row["error"], row


@pytest.mark.parametrize(("name", "reason"), [
    ("fr-pickle-object-bomb", "budget"),
    ("pickle-long-binput-2**28", "budget"),
    ("sparse-pickle", "limit"),
    ("nsys-generated-column", "CUPTI"),
    ("checkpoint-symlink-loop", "symlink loop"),
    ("safetensors-4000-digit-shape", "checkpoint"),
    ("zip-overlapping-entries", "checkpoint"),
])
def test_a_hostile_input_is_named_with_its_reason_in_the_row(scanned, name, reason):
    row = row_of(scanned, name)
    assert row["status"] == "analysed", row
    assert any(reason in note for note in row["inputs_not_read"]), row["inputs_not_read"]


def test_numbers_past_any_job_size_nothing(scanned):
    for row in rows(scanned).values():
        assert row["world_size"] is None or row["world_size"] < 1000, row
        assert all(r < 1000 for r in row["culprit_ranks"] or []), row


def test_the_ordinary_failing_job_keeps_its_verdict(scanned):
    import tomllib

    truth = tomllib.loads((FAILING / "truth.toml").read_text())
    row = row_of(scanned, "ordinary-failing")
    assert row["category"] == truth["category"]
    assert row["culprit_ranks"] == truth["culprit_ranks"]
    assert row["inputs_not_read"] == []


def test_the_healthy_job_has_no_finding(scanned):
    row = row_of(scanned, "healthy")
    assert (row["category"], row["outcome"], row["signatures"]) == ("none", "ok", [])


def test_nothing_written_under_the_root(scanned):
    assert scanned["after"] == scanned["before"]
