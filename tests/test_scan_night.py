"""A night scan that keeps going and keeps what it did: jobs decided by content, a time limit per
job, every row kept as it finishes (a SIGKILLed scan re-run redoes only the rest), and the findings
and events tables beside the jobs table."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from analyzer.api import analyze
from analyzer.cli import main
from analyzer.fleet.jobs import RULE_LOGS, find_jobs
from analyzer.fleet.rows import STATUS_ANALYSED, STATUS_OVER_MEMORY, STATUS_TIMED_OUT
from analyzer.fleet.scan import scan
from tests import scan_hooks
from tests.scan_hooks import code_unchanged, versions_at_start  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[1]
# A recorded 2-rank hang: rank 1 never joined the all-reduce (verdict rank_absent_from_collective).
HANG = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"
RANK_LOGS = sorted(HANG.rglob("stderr.log"))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def make_job(path: Path) -> Path:
    """A job directory holding the recorded hang's two rank logs (`rank0.log`, `rank1.log`)."""
    path.mkdir(parents=True)
    for rank, log in enumerate(RANK_LOGS):
        (path / f"rank{rank}.log").write_bytes(log.read_bytes())
    return path


def night_with_readme(root: Path, n: int) -> list[Path]:
    (root / "README.md").parent.mkdir(parents=True, exist_ok=True)
    (root / "README.md").write_text("# Incidents of the night\n\nOne folder per incident; see the tickets.\n")
    return [make_job(root / f"incident-{i:02d}") for i in range(n)]


def test_a_readme_beside_ten_job_folders_gives_ten_rows_and_says_so(tmp_path):
    jobs = night_with_readme(tmp_path / "night", 10)
    search = find_jobs([tmp_path / "night"])
    assert search.paths() == [str(j) for j in jobs]
    assert search.by_rule() == {RULE_LOGS: 10}
    result = run("scan", tmp_path / "night", "--out", tmp_path / "out" / "night.parquet", "-j", 2, "--no-cache")
    assert result.exit_code == 1, result.output
    assert f"found 10 jobs under {tmp_path / 'night'}: 10 {RULE_LOGS}" in result.output
    assert f"not jobs: 1 directory holding files but no training log or dump: {tmp_path / 'night'} (README.md)" in result.output
    rows = pl.read_parquet(tmp_path / "out" / "night.parquet")
    assert rows.get_column("job").to_list() == [str(j) for j in jobs]
    assert set(rows.get_column("category")) == {"rank_absent_from_collective"}


def test_a_job_holding_several_job_shaped_subtrees_is_warned_about(tmp_path):
    root = tmp_path / "night"
    night_with_readme(root / "all-in-one", 3)
    (root / "all-in-one" / "launcher.log").write_bytes(RANK_LOGS[0].read_bytes())  # makes all-in-one a job
    result = run("scan", root, "--out", tmp_path / "s.parquet", "--no-cache", "-j", 1)
    assert "found 1 job under" in result.output
    assert (f"warning: the job {root / 'all-in-one'} holds 3 subdirectories that look like jobs of their own "
            "(incident-00, incident-01, incident-02)") in result.output


def test_a_job_past_the_time_limit_is_a_timed_out_row_and_the_others_finish(tmp_path):
    jobs = [make_job(tmp_path / name) for name in ("a", scan_hooks.SLOW_NAME, "b", "c")]
    started = time.monotonic()
    result = scan([str(j) for j in jobs], workers=2, job_timeout=30, task=scan_hooks.sleeping_task)
    assert time.monotonic() - started < 300  # the sleeper (600 s) was killed, not waited for
    rows = {Path(r["job"]).name: r for r in result.frame.iter_rows(named=True)}
    assert rows["slow"]["status"] == STATUS_TIMED_OUT
    assert rows["slow"]["error"].startswith("the analysis did not finish within the 30 s job time limit")
    assert rows["slow"]["category"] is None
    assert [rows[n]["status"] for n in "abc"] == [STATUS_ANALYSED] * 3


def test_a_job_past_the_memory_budget_is_an_over_memory_row_and_the_others_finish(tmp_path):
    names = ("a", scan_hooks.HUNGRY_NAME, "b", scan_hooks.NATIVE_HUNGRY_NAME, "c")
    jobs = [make_job(tmp_path / name) for name in names]
    store = tmp_path / "s.db"
    result = scan([str(j) for j in jobs], workers=2, job_memory_mb=2048, store_path=store, task=scan_hooks.hungry_task)
    rows = {Path(r["job"]).name: r for r in result.frame.iter_rows(named=True)}
    for name in (scan_hooks.HUNGRY_NAME, scan_hooks.NATIVE_HUNGRY_NAME):
        assert rows[name]["status"] == STATUS_OVER_MEMORY and rows[name]["category"] is None
        assert "than the 2048 MB job memory budget (--job-memory); its worker was replaced" in rows[name]["error"]
    assert "aborted (SIGABRT)" in rows[scan_hooks.NATIVE_HUNGRY_NAME]["error"]
    assert [rows[n]["status"] for n in "abc"] == [STATUS_ANALYSED] * 3
    assert set(rows[n]["category"] for n in "abc") == {"rank_absent_from_collective"}
    with sqlite3.connect(store, timeout=5) as db:  # not kept: the next scan tries again
        assert {j for (j,) in db.execute("SELECT job FROM results")} == {str(tmp_path / n) for n in "abc"}


def test_job_memory_on_the_command_line(tmp_path):
    night_with_readme(tmp_path / "night", 2)
    result = run("scan", tmp_path / "night", "--out", tmp_path / "s.parquet", "--no-cache", "-j", 1, "--job-memory", 1)
    assert "2 jobs: 0 failed, 0 no failure found, 0 could not be analysed, 0 timed out, 2 over the memory budget" in result.output
    assert pl.read_parquet(tmp_path / "s.parquet").get_column("status").to_list() == [STATUS_OVER_MEMORY] * 2


def test_job_timeout_on_the_command_line(tmp_path):
    night_with_readme(tmp_path / "night", 2)
    result = run("scan", tmp_path / "night", "--out", tmp_path / "s.parquet", "--no-cache", "--job-timeout", 0.001)
    assert result.exit_code == 0, result.output  # nothing failed, nothing crashed: the limit is the input's
    assert "2 jobs: 0 failed, 0 no failure found, 0 could not be analysed, 2 timed out" in result.output
    assert pl.read_parquet(tmp_path / "s.parquet").get_column("status").to_list() == [STATUS_TIMED_OUT] * 2


def test_timed_out_rows_are_kept_and_retried_only_under_a_longer_limit(tmp_path, versions_at_start):
    jobs = [str(make_job(tmp_path / scan_hooks.SLOW_NAME)), str(make_job(tmp_path / "fast"))]
    store = tmp_path / "s.db"
    with code_unchanged(versions_at_start):
        first = scan(jobs, workers=2, job_timeout=8, store_path=store, task=scan_hooks.sleeping_task)
        timed_out = first.frame.filter(pl.col("status") == STATUS_TIMED_OUT).height
        assert 1 <= timed_out <= 2  # the sleeper; the other job too if this machine is that loaded
        again = scan(jobs, workers=2, job_timeout=8, store_path=store, task=scan_hooks.sleeping_task)
        assert (first.analysed, again.analysed, again.reused) == (2, 0, 2)
        longer = scan(jobs, workers=2, job_timeout=9, store_path=store, task=scan_hooks.sleeping_task)
        assert (longer.analysed, longer.reused) == (timed_out, 2 - timed_out)


KILLED_SCAN = """
import sys
from pathlib import Path
from analyzer.fleet.scan import scan
from tests import scan_hooks
from tests.scan_hooks import code_unchanged, versions_at_start  # noqa: F401 - a fixture
jobs = sys.argv[2:]
scan(jobs, workers=1, store_path=Path(sys.argv[1]), task=scan_hooks.paced_task)
"""


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            if f"\nPPid:\t{pid}\n" in status:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state  # a zombie has exited; its parent (killed) no longer reaps it


def _stored(store: Path) -> set[str]:
    try:
        with sqlite3.connect(store, timeout=5) as db:
            return {job for (job,) in db.execute("SELECT job FROM results")}
    except sqlite3.OperationalError:  # not created yet
        return set()


def test_a_scan_killed_half_way_keeps_its_rows_and_the_rerun_does_only_the_rest(tmp_path, versions_at_start):
    jobs = [str(make_job(tmp_path / "night" / f"job-{i}")) for i in range(8)]
    store = tmp_path / "night.scan.db"
    child = subprocess.Popen([sys.executable, "-c", KILLED_SCAN, str(store), *jobs], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while len(_stored(store)) < 3 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
        assert child.poll() is None, child.stderr.read().decode()
        workers = _children(child.pid)
        os.kill(child.pid, signal.SIGKILL)  # no clean-up of any kind: a Slurm time limit, the OOM killer
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    done = _stored(store)
    assert 3 <= len(done) < len(jobs)
    time.sleep(2 * scan_hooks.PACE_S)  # the killed scan's worker died with it: nothing more is stored
    assert _stored(store) == done
    assert workers and not [pid for pid in workers if _alive(pid)]  # no orphan analysing on
    with code_unchanged(versions_at_start):
        rerun = scan(jobs, workers=2, store_path=store)
        assert (rerun.reused, rerun.analysed) == (len(done), len(jobs) - len(done))
    assert rerun.frame.get_column("job").to_list() == jobs
    assert set(rerun.frame.get_column("status")) == {STATUS_ANALYSED}


def test_findings_and_events_tables(tmp_path, versions_at_start):
    """The tables hold what `analyze` gives for each job (compared while the code is unchanged)."""
    jobs = night_with_readme(tmp_path / "night", 2)
    out = tmp_path / "out" / "night.parquet"
    with code_unchanged(versions_at_start):
        result = run("scan", tmp_path / "night", "--out", out, "--events", "-j", 2)
        assert result.exit_code == 1, result.output
        findings = pl.read_parquet(tmp_path / "out" / "night.findings.parquet")
        events = pl.read_parquet(tmp_path / "out" / "night.events.parquet")
        report = json.loads(run("analyze", jobs[0], "--format", "json").output)
        analysis = analyze(jobs[0])
        for job in jobs:
            mine = findings.filter(pl.col("job") == str(job)).sort("position")
            assert mine.select("rule_id", "category", "ranks", "hosts", "confidence").to_dicts() == [
                {k: f[k] for k in ("rule_id", "category", "ranks", "hosts", "confidence")} for f in report["findings"]
            ]
            assert mine.item(0, "rule_id") == report["verdict"]["rule_id"]
            assert events.filter(pl.col("job") == str(job)).height == analysis.events.height
        assert set(analysis.events.columns) <= set(events.columns)
        # The fleet can be queried beyond the summary: which ranks were named, in how many jobs.
        named = findings.filter(pl.col("position") == 0).explode("ranks").group_by("ranks").agg(pl.col("job").n_unique())
        assert named.rows() == [(1, 2)]
        # A re-run wanting events again reuses the rows and their events files.
        again = run("scan", tmp_path / "night", "--out", out, "--events", "-j", 2)
        assert "2 jobs: 0 analysed, 2 reused" in again.output
        assert pl.read_parquet(tmp_path / "out" / "night.events.parquet").height == events.height


def test_the_ray_engine_times_a_job_out_too(tmp_path):
    ray = pytest.importorskip("ray", reason="the Ray engine needs the ray extra")
    jobs = [str(make_job(tmp_path / name)) for name in ("a", scan_hooks.SLOW_NAME)]
    # The workers import the test's task by name: they need this checkout on their path.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        result = scan(jobs, engine="ray", job_timeout=30, task=scan_hooks.sleeping_task)
    finally:
        ray.shutdown()
    statuses = dict(result.frame.select(pl.col("job").str.extract(r"([^/]+)$"), "status").iter_rows())
    assert statuses == {"a": STATUS_ANALYSED, scan_hooks.SLOW_NAME: STATUS_TIMED_OUT}
