"""bench/bench_analyze.py runs end to end on a tiny job of each workload (not timed: CI is shared)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gen_nccl
from bench.bench_analyze import COLUMNS, ROOT, cpu_list, measure


def test_quick_run_prints_every_column_for_both_workloads(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_analyze.py"), "--quick", "--work", str(tmp_path)],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout.splitlines()
    header = next(line for line in out if line.startswith("workload"))
    assert header.split(" | ") == list(COLUMNS)
    rows = [line.split(" | ") for line in out if line.startswith(("genjob", "nccl"))]
    assert [r[0] for r in rows] == ["genjob", "nccl"]
    has_rg = shutil.which("rg") is not None
    for row in rows:
        assert len(row) == len(COLUMNS)
        filled = row if has_rg else row[: COLUMNS.index("rg -c s")]
        assert "-" not in filled, row
    assert sum(line.startswith("# load average") for line in out) == 2


def test_in_project_nccl_generator_writes_connection_lines(tmp_path):
    job = gen_nccl.generate(tmp_path / "job", 32, 2 << 20, jobs=1)
    files = sorted(job.glob("rank-*.log"))
    assert len(files) == 32
    lines = [line for f in files for line in f.read_text().splitlines()]
    channel = sum(" NCCL INFO Channel " in line and " via " in line for line in lines)
    assert 0.25 < channel / len(lines) < 0.6  # what NCCL_DEBUG=INFO prints at scale: mostly connection lines
    assert any("Watchdog caught collective operation timeout" in line for line in lines)
    assert sum(p.stat().st_size for p in files) > 1.5 * 2**20


def test_prefilter_stats_names_who_makes_the_candidates(tmp_path):
    from bench.prefilter_stats import stats

    job = gen_nccl.generate(tmp_path / "job", 8, 1 << 20, jobs=1)
    lines, candidates, table = stats(job)
    assert 0 < candidates < lines
    by_owner = {owner: (holding, alone) for owner, holding, alone in table.iter_rows()}
    assert by_owner["nccl.transport"][0] > 0  # the per-channel connection lines
    assert all(alone <= holding for holding, alone in by_owner.values())


def test_cpus_pins_each_measured_child_and_refuses_cpus_this_machine_lacks():
    cpus = sorted(os.sched_getaffinity(0))
    run = measure([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], 1, cpu_list(str(cpus[0])))
    assert run.stdout.strip() == f"[{cpus[0]}]"
    assert cpu_list(",".join(map(str, cpus))) == set(cpus)
    assert cpu_list(f"{cpus[0]}-{cpus[0]}") == {cpus[0]}
    with pytest.raises(argparse.ArgumentTypeError, match="not available"):
        cpu_list(str(cpus[-1] + 1))
