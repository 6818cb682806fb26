"""Batch (engines): run the per-job task on local worker processes or on Ray, each job under a time limit.

- **local**: `workers` processes started with `spawn` (no fork of a process that has polars
  threads), each running one job at a time and talking to the scan over its own pipe. A job past
  `job_timeout` seconds has its worker killed (SIGKILL) and replaced, and is a `timed_out` row; a
  worker that dies is a `crashed` row for exactly the job it held; either way the other jobs go on.
  Each job runs under `job_memory` bytes of new address space (the parse stage's RLIMIT_AS budget,
  `analyzer.io.budget.address_space`): a job that needs more is an `over_memory` row and its
  worker is replaced (a MemoryError in Python; a native library that aborts on the failed
  allocation, SIGABRT, costs the worker the same way).
  A worker reports ready once it has imported the analyzer, so start-up never counts against a
  job's limit. Workers ask the kernel to kill them when the scan dies (Linux `PR_SET_PDEATHSIG`),
  so a scan killed by SIGKILL or a scheduler leaves no orphan analysing on.
- **ray**: the same task as Ray tasks on an existing cluster (`RAY_ADDRESS` or `address`); at most
  one task per CPU in flight, so a task starts when it is submitted and its limit counts from
  there; a task past it is cancelled with `force=True` (Ray kills its worker process). Memory is
  Ray's to police (its memory monitor kills a task's worker: a `crashed` row); no address-space
  limit is set inside Ray's long-lived worker processes.

`on_result` is called in this process, one finished job at a time, as soon as each finishes.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.fleet import ScanError
from analyzer.fleet.rows import (
    STATUS_CRASHED,
    STATUS_OVER_MEMORY,
    STATUS_TIMED_OUT,
    WORKER_DIED,
    JobSpec,
    describe_exception,
    error_result,
)

Task = Callable[[JobSpec], dict]
OnResult = Callable[[JobSpec, dict], None]
WORKER_START_S = 300  # a worker that cannot import the analyzer in this long is broken, not slow


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def timeout_message(seconds: float) -> str:
    return (f"the analysis did not finish within the {seconds:g} s job time limit (--job-timeout); its worker "
            "was killed and the other jobs went on")


def memory_message(limit: int, how: str = "needed more memory") -> str:
    return (f"the analysis {how} than the {limit >> 20} MB job memory budget (--job-memory); its worker was "
            "replaced and the other jobs went on")


def _task_name(task: Task) -> str:
    return f"{task.__module__}:{task.__qualname__}"


def _resolve(name: str) -> Task:
    module, _, qualname = name.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


# ---------------------------------------------------------------------------------------------
# Local engine.
# ---------------------------------------------------------------------------------------------


def worker_main(conn: Any, task_name: str, job_memory: int | None = None) -> None:
    """A worker process: import, say ready, then analyse each job the scan sends until the pipe closes,
    each under `job_memory` more bytes of address space (None: no budget)."""
    _die_with_parent()
    try:
        task = _resolve(task_name)
        _import_the_pipeline()
    except Exception as exc:  # noqa: BLE001 - the scan reports it as the reason the workers cannot start
        conn.send(("broken", describe_exception(exc)))
        return
    conn.send(("ready", None))
    while True:
        try:
            spec = conn.recv()
        except (EOFError, OSError):
            return  # the scan closed the pipe (finished) or died
        try:
            result = _run_within_memory(task, spec, job_memory)
        except Exception as exc:  # noqa: BLE001 - a task that raises is its job's crashed row
            result = error_result(spec.job, STATUS_CRASHED, describe_exception(exc))
        try:
            conn.send(result)
        except Exception as exc:  # noqa: BLE001 - e.g. a result that cannot be pickled
            conn.send(error_result(spec.job, STATUS_CRASHED, describe_exception(exc)))


# Not loaded by a job's analysis: the command line, live capture, batch work (this worker's own part is
# loaded), the renderers.
_NOT_PIPELINE = ("analyzer.cli", "analyzer.__main__", "analyzer.capture", "analyzer.fleet", "analyzer.render")


def _import_the_pipeline() -> None:
    """Import every module a job's analysis may load lazily (the parser of each format, its grammars and
    vocabularies) before "ready": a job's time limit and memory budget are then its own work, never
    the loading of a module the first job of that format needs."""
    import analyzer

    packages = [(analyzer.__path__, "analyzer.")]
    while packages:
        path, prefix = packages.pop()
        for module in pkgutil.iter_modules(path, prefix):
            if module.name.startswith(_NOT_PIPELINE):
                continue
            loaded = importlib.import_module(module.name)
            if module.ispkg:
                packages.append((loaded.__path__, module.name + "."))


def _run_within_memory(task: Task, spec: JobSpec, job_memory: int | None) -> dict:
    """`task(spec)` under the job's memory budget; past it, the job's over_memory row."""
    if job_memory is None:
        return task(spec)
    from analyzer.io.budget import BudgetExceeded, address_space, is_refused_allocation

    import polars as pl

    # polars starts its thread pool on first use: started under the limit, the pool is poisoned for
    # every later job and for the scan's own tables.
    pl.DataFrame({"warm": range(64)}).group_by("warm").agg(pl.len())
    try:
        with address_space(job_memory):
            return task(spec)
    except BaseException as exc:  # noqa: BLE001 - a polars allocation refused under the limit panics
        if isinstance(exc, BudgetExceeded) or is_refused_allocation(exc):
            return error_result(spec.job, STATUS_OVER_MEMORY, memory_message(job_memory))
        raise


def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: a killed scan's workers finish their job, then exit
        return
    if os.getppid() == 1:  # the scan died before prctl took effect
        os._exit(1)


@dataclass
class _Worker:
    process: Any
    conn: Any
    ready: bool = False
    spec: JobSpec | None = None
    deadline: float = 0.0

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class LocalPool:
    """Worker processes the scan starts, feeds, kills and replaces itself (see the module docstring)."""

    def __init__(self, task: Task, workers: int, job_timeout: float | None, job_memory: int | None = None):
        import multiprocessing

        self._context = multiprocessing.get_context("spawn")
        self._task_name = _task_name(task)
        self._threads = max(1, default_workers() // workers)
        self._size = workers
        self._timeout = job_timeout
        self._memory = job_memory
        self._workers: list[_Worker] = []

    def _start(self) -> _Worker:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=worker_main, args=(child, self._task_name, self._memory), daemon=True)
        # Several workers on few cores: each polars gets its share of threads. A spawned process takes
        # the environment at start, before anything in it can import polars.
        inherited = os.environ.get("POLARS_MAX_THREADS")
        os.environ["POLARS_MAX_THREADS"] = inherited or str(self._threads)
        try:
            process.start()
        finally:
            if inherited is None:
                del os.environ["POLARS_MAX_THREADS"]
        child.close()
        worker = _Worker(process, parent, deadline=time.monotonic() + WORKER_START_S)
        self._workers.append(worker)
        return worker

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)
        self._start()

    def run(self, specs: Sequence[JobSpec], on_result: OnResult) -> None:
        queue = deque(specs)
        try:
            for _ in range(min(self._size, len(queue))):
                self._start()
            while queue or any(w.spec for w in self._workers):
                for worker in self._workers:
                    if worker.ready and worker.spec is None and queue:
                        worker.spec = queue.popleft()
                        worker.deadline = time.monotonic() + self._timeout if self._timeout else float("inf")
                        worker.conn.send(worker.spec)
                self._step(on_result)
        finally:
            for worker in self._workers:
                worker.kill()
            self._workers.clear()

    def _step(self, on_result: OnResult) -> None:
        """Wait for a result, a death or the nearest deadline, and handle whatever happened."""
        from multiprocessing.connection import wait

        now = time.monotonic()
        nearest = min(w.deadline for w in self._workers)
        waitables = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
        wait(waitables, timeout=max(0.0, min(nearest - now, 60.0)))
        for worker in list(self._workers):
            if worker.conn.poll():
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):  # its end of the pipe closed: it died
                    self._died(worker, on_result)
                else:
                    self._receive(worker, message, on_result)
            elif not worker.process.is_alive():
                self._died(worker, on_result)
            elif time.monotonic() >= worker.deadline:
                if worker.spec is None:
                    raise ScanError(f"a worker process did not start within {WORKER_START_S} s")
                on_result(worker.spec, error_result(worker.spec.job, STATUS_TIMED_OUT, timeout_message(self._timeout)))
                self._replace(worker)

    def _died(self, worker: _Worker, on_result: OnResult) -> None:
        """A worker that died costs exactly the job it held (none when idle) and is replaced."""
        if not worker.ready:
            worker.process.join(5)
            raise ScanError(f"a worker process exited while starting (exit code {worker.process.exitcode})")
        if worker.spec is not None:
            on_result(worker.spec, self._death_result(worker))
        self._replace(worker)

    def _death_result(self, worker: _Worker) -> dict:
        """A native library aborts on an allocation the budget refused: under a budget, SIGABRT is the budget."""
        worker.process.join(5)  # its pipe may close before it is reaped
        if self._memory is not None and worker.process.exitcode == -signal.SIGABRT:
            return error_result(worker.spec.job, STATUS_OVER_MEMORY, memory_message(self._memory, "aborted (SIGABRT) needing more memory"))
        return error_result(worker.spec.job, STATUS_CRASHED, WORKER_DIED)

    def _receive(self, worker: _Worker, message: Any, on_result: OnResult) -> None:
        if isinstance(message, tuple) and message[0] == "broken":
            raise ScanError(f"the worker processes cannot load the analyzer: {message[1]}")
        if isinstance(message, tuple) and message[0] == "ready":
            worker.ready, worker.deadline = True, float("inf")
            return
        spec, worker.spec, worker.deadline = worker.spec, None, float("inf")
        on_result(spec, message)
        if message["row"]["status"] == STATUS_OVER_MEMORY:  # its heap is what the budget refused: start afresh
            self._replace(worker)


def run_local(specs: Sequence[JobSpec], task: Task, workers: int, job_timeout: float | None, on_result: OnResult,
              job_memory: int | None = None) -> None:
    LocalPool(task, workers, job_timeout, job_memory).run(specs, on_result)


# ---------------------------------------------------------------------------------------------
# Ray engine.
# ---------------------------------------------------------------------------------------------


def run_ray(specs: Sequence[JobSpec], task: Task, address: str | None, job_timeout: float | None,
            on_result: OnResult) -> None:
    """Run `task` on every job as Ray tasks (one CPU each). Uses the running Ray if this process has
    one, else `ray.init(address)`, which reads RAY_ADDRESS when address is None. The workers import
    this package, so every node needs postmortem installed and the job paths readable."""
    try:
        import ray
    except ImportError as exc:
        raise ScanError("the Ray engine needs ray: pip install 'postmortem[ray]'") from exc
    import logging

    started_here = not ray.is_initialized()
    if started_here:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError... all mean the same here
            raise ScanError(f"cannot connect to Ray at {address or os.environ.get('RAY_ADDRESS') or 'auto'}: {exc}") from exc
    try:
        _drain_ray(ray, ray.remote(num_cpus=1, max_retries=1)(task), specs, job_timeout, on_result)
    finally:
        if started_here:
            ray.shutdown()


def _drain_ray(ray: Any, remote: Any, specs: Sequence[JobSpec], job_timeout: float | None, on_result: OnResult) -> None:
    window = max(1, int(ray.cluster_resources().get("CPU", 1)))
    queue = deque(specs)
    in_flight: dict[Any, tuple[JobSpec, float]] = {}
    while queue or in_flight:
        while queue and len(in_flight) < window:
            spec = queue.popleft()
            deadline = time.monotonic() + job_timeout if job_timeout else float("inf")
            in_flight[remote.remote(spec)] = (spec, deadline)
        nearest = min(deadline for _, deadline in in_flight.values())
        done, _ = ray.wait(list(in_flight), num_returns=1, timeout=max(0.0, min(nearest - time.monotonic(), 60.0)))
        for ref in done:
            spec, _ = in_flight.pop(ref)
            on_result(spec, _ray_result(ray, ref, spec))
        for ref, (spec, deadline) in list(in_flight.items()):
            if time.monotonic() >= deadline:
                ray.cancel(ref, force=True)
                del in_flight[ref]
                on_result(spec, error_result(spec.job, STATUS_TIMED_OUT, timeout_message(job_timeout)))


def _ray_result(ray: Any, ref: Any, spec: JobSpec) -> dict:
    try:
        return ray.get(ref)
    except ray.exceptions.WorkerCrashedError:
        return error_result(spec.job, STATUS_CRASHED, WORKER_DIED)
    except Exception as exc:  # noqa: BLE001 - RayTaskError and friends: this job's row
        return error_result(spec.job, STATUS_CRASHED, describe_exception(exc))
