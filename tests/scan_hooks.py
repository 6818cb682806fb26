"""Test-only helpers of the scan tests: tasks for the engines, and the guard of reuse checks.

The engines run a task given by its importable name, so a test hands one of these tasks (the real
per-job function, with an explicit delay) to `scan(task=...)`; nothing in the analyzer reads them,
and no environment variable switches them on.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from analyzer.fleet.rows import JobSpec, analyse_job
from analyzer.fleet.store import current_versions

SLOW_NAME = "slow"  # a job directory of this name sleeps far past any test's --job-timeout
HUNGRY_NAME = "hungry"  # a job directory of this name asks for far more memory than any test's --job-memory
NATIVE_HUNGRY_NAME = "hungry-native"  # the same, in polars (Rust aborts on the failed allocation)
HUNGRY_BYTES = 64 << 30
PACE_S = 1.0  # the paced task's delay per job, so a test can kill a scan half-way


def sleeping_task(spec: JobSpec) -> dict:
    if Path(spec.job).name == SLOW_NAME:
        time.sleep(600)
    return analyse_job(spec)


def hungry_task(spec: JobSpec) -> dict:
    name = Path(spec.job).name
    if name == HUNGRY_NAME:
        bytearray(HUNGRY_BYTES)
    elif name == NATIVE_HUNGRY_NAME:
        import polars as pl

        pl.select(pl.repeat(1, n=HUNGRY_BYTES // 8, dtype=pl.Int64).alias("x")).sum()
    return analyse_job(spec)


def paced_task(spec: JobSpec) -> dict:
    time.sleep(PACE_S)
    return analyse_job(spec)


@pytest.fixture
def versions_at_start() -> dict[str, str]:
    return current_versions()


@contextmanager
def code_unchanged(before: dict[str, str]):
    """Reuse depends on the analyzer's code hash: a reuse check that fails while the checkout's code
    changed since `before` (another edit in progress) is skipped, saying so; with the code unchanged it fails."""
    try:
        yield
    except AssertionError:
        if current_versions() != before:
            pytest.skip("the analyzer's code changed while the test ran (another edit in this checkout)")
        raise
