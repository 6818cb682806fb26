"""io.budget: the address-space budget, which limit a refused allocation belongs to, and how refused allocations read."""

from __future__ import annotations

import errno

import pytest

from analyzer.fleet.engines import _run_within_memory
from analyzer.fleet.rows import STATUS_CRASHED, STATUS_OVER_MEMORY, JobSpec, analyse_job
from analyzer.io.budget import BudgetExceeded, address_space, budget_active, is_refused_allocation


class PanicException(BaseException):
    """Named as pyo3 names a Rust panic raised into Python (polars' own class needs a real panic)."""


def _raised_from(outer: Exception, inner: BaseException) -> Exception:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except Exception as chained:
        return chained


@pytest.mark.parametrize("exc", [
    MemoryError(),
    OSError(errno.ENOMEM, "Cannot allocate memory"),
    ImportError("libfoo.so: failed to map segment from shared object"),
    RuntimeError("can't start new thread"),
    PanicException("memory allocation of 4096 bytes failed"),
    _raised_from(ValueError("could not decode the header"), MemoryError()),
])
def test_refused_allocations_in_the_words_of_each_library(exc):
    assert is_refused_allocation(exc)


@pytest.mark.parametrize("exc", [
    ValueError("bad header"),
    OSError(errno.ENOENT, "No such file or directory"),
    RuntimeError("dictionary changed size during iteration"),
    ImportError("No module named 'torch'"),
    KeyboardInterrupt(),
])
def test_other_failures_are_not_refused_allocations(exc):
    assert not is_refused_allocation(exc)


def test_budget_active_only_inside_a_block():
    assert not budget_active()
    with address_space(256 << 20):
        assert budget_active()
    assert not budget_active()


def test_the_block_whose_limit_refused_the_allocation_owns_it():
    with pytest.raises(BudgetExceeded):
        with address_space(64 << 20):
            bytearray(512 << 20)
    # Under a tighter enclosing budget, an inner (looser) block does not claim the enclosing one's MemoryError.
    with pytest.raises(BudgetExceeded):
        with address_space(64 << 20):
            try:
                with address_space(1 << 30):
                    bytearray(512 << 20)
            except BudgetExceeded:
                pytest.fail("the inner block claimed the outer budget's refusal")


def _job(tmp_path) -> JobSpec:
    (tmp_path / "job").mkdir()
    return JobSpec(job=str(tmp_path / "job"))


def test_a_panic_without_a_budget_is_the_jobs_crashed_row(tmp_path, monkeypatch):
    def panics(_job):
        raise PanicException("index out of bounds")
    monkeypatch.setattr("analyzer.api.analyze", panics)
    row = analyse_job(_job(tmp_path))["row"]
    assert row["status"] == STATUS_CRASHED and row["error"].startswith("PanicException: index out of bounds")


def test_a_panic_under_a_job_budget_is_the_budgets_over_memory_row(tmp_path, monkeypatch):
    def panics(_job):
        raise PanicException("memory allocation of 4096 bytes failed")
    monkeypatch.setattr("analyzer.api.analyze", panics)
    row = _run_within_memory(analyse_job, _job(tmp_path), 256 << 20)["row"]
    assert row["status"] == STATUS_OVER_MEMORY and "job memory budget" in row["error"]


def test_a_bug_under_a_job_budget_stays_a_crashed_row(tmp_path, monkeypatch):
    def fails(_job):
        raise ValueError("a bug")
    monkeypatch.setattr("analyzer.api.analyze", fails)
    row = _run_within_memory(analyse_job, _job(tmp_path), 256 << 20)["row"]
    assert row["status"] == STATUS_CRASHED and row["error"].startswith("ValueError: a bug")
