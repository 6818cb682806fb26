"""Live capture (the whole capture): select the job, capture every rank and the node, write the manifest.

`run_capture` does the work; the `postmortem capture` command over it is `analyzer.cli.capture`.
Only the standard library is imported: this runs on a node in trouble.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from analyzer.capture.jobs import MAX_LISTED, Job, ProcessTree, Selection, Worker, build_tree, select
from analyzer.capture.processes import Proc, scan_processes
from analyzer.capture.ranks import Capture, capture_worker
from analyzer.capture.tools import DEFAULT_TIMEOUT_S, NODE_TOOLS, capture_dmesg, capture_node_tool, find_py_spy

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1  # value of the manifest's "postmortem_capture" key (how discovery recognises it)

EXIT_CAPTURED = 0
EXIT_NOTHING_CAPTURED = 2


# --- the whole capture ---------------------------------------------------------------------------------


def run_capture(
    out: Path,
    pids: Iterable[int] = (),
    pattern: str | None = None,
    slurm_job: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    native: bool = True,
    flight_recorder: bool = False,
    node_context: bool = True,
    py_spy: str | None = None,
) -> dict:
    """Capture the selected jobs' processes into `out`; returns the top manifest (also written there)."""
    pids = list(pids)
    started = datetime.now(timezone.utc)
    table = scan_processes()
    tree = build_tree(table)
    me = os.getpid()
    # Never match ourselves or the shell / watchdog that started us by --pattern or --slurm-job.
    selection = select(tree, pids=pids, pattern=pattern, slurm_job=slurm_job, exclude={me, *tree.ancestors(me)})
    if not selection.jobs:
        # Nothing to capture: write nothing (no node context of a job that is not there).
        return {"status": "nothing captured", "notes": selection.notes, "processes": [], "node": [],
                "summary": {"processes": 0, "captured": 0, "partial": 0, "failed": 0}}
    cfg = Capture(find_py_spy(py_spy), timeout, native, flight_recorder)
    out.mkdir(parents=True, exist_ok=True)
    manifest = _manifest_head(started, {"pids": pids, "pattern": pattern, "slurm_job": slurm_job}, cfg, tree, selection)
    job_dirs = _job_dirs(out, selection.jobs, manifest)
    _write_json(out / MANIFEST, manifest)  # a capture cut short still says what it was doing
    entries = _capture_all(out, table, selection.jobs, job_dirs, cfg, node_context, manifest)
    _finish(out, manifest, entries, job_dirs)
    return manifest


def _manifest_head(started: datetime, asked: dict, cfg: Capture, tree: ProcessTree, selection: Selection) -> dict:
    """The manifest as written before any call: what was asked, selected, and left out."""
    chosen = {w.pid for job in selection.jobs for w in job.workers}
    return {
        "postmortem_capture": MANIFEST_FORMAT,
        "host": socket.gethostname(),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": None,
        "status": "in progress",
        "selection": asked,
        "py_spy": cfg.py_spy,
        "timeout_s": cfg.timeout,
        "notes": selection.notes,
        "helpers_not_captured": [
            {"pid": h, "worker_pid": w, "cmdline": tree.table[h].cmdline[:300]}
            for h, w in sorted(tree.helpers.items()) if w in chosen
        ][:MAX_LISTED],
        "jobs": [],
        "node": [],
        "xid_lines": [],
        "processes": [],
    }


def _job_dirs(out: Path, jobs: list[Job], manifest: dict) -> list[Path]:
    """One job: everything in DIR. Several (a pattern or a Slurm id can match more than one): each
    job's dumps with its own manifest in DIR/job<N>/, so that each job can be analysed alone."""
    several = len(jobs) > 1
    job_dirs = [out / f"job{index}" if several else out for index in range(1, len(jobs) + 1)]
    for job, job_dir in zip(jobs, job_dirs):
        job_dir.mkdir(exist_ok=True)
        manifest["jobs"].append({"job": job.key, "launcher_pid": job.launcher, "dir": job_dir.relative_to(out).as_posix(),
                                 "ranks": [w.rank for w in job.workers], "pids": [w.pid for w in job.workers]})
    return job_dirs


def _capture_all(out: Path, table: dict[int, Proc], jobs: list[Job], job_dirs: list[Path], cfg: Capture,
                 node_context: bool, manifest: dict) -> list[tuple[Path, dict]]:
    """Every rank's dumps and the node's context, in parallel; (job directory, manifest entry) per rank."""
    timeout = cfg.timeout
    tasks = [(job_dir, worker, stem) for job, job_dir in zip(jobs, job_dirs) for worker, stem in _named(job.workers)]
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        node_futures = []
        if node_context:
            since = _job_start_uptime(table, jobs)
            node_futures = [pool.submit(capture_node_tool, name, argv, out / file, timeout) for name, argv, file in NODE_TOOLS]
            dmesg_future = pool.submit(capture_dmesg, out / "node.dmesg.txt", since, timeout)
        rank_futures = [
            (job_dir, pool.submit(capture_worker, worker, table.get(worker.pid), job_dir, stem, cfg)) for job_dir, worker, stem in tasks
        ]
        entries = [(job_dir, future.result()) for job_dir, future in rank_futures]
        if node_context:
            manifest["node"] = [future.result() for future in node_futures]
            dmesg_record, manifest["xid_lines"] = dmesg_future.result()
            manifest["node"].append(dmesg_record)
    return entries


def _finish(out: Path, manifest: dict, entries: list[tuple[Path, dict]], job_dirs: list[Path]) -> None:
    """The outcome and summary, then the manifest(s) written in their final form."""
    statuses = [entry["status"] for _, entry in entries]
    manifest["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    manifest["status"] = "captured" if any(s in ("captured", "partial") for s in statuses) else "nothing captured"
    manifest["summary"] = {
        "processes": len(statuses),
        "captured": statuses.count("captured"),
        "partial": statuses.count("partial"),
        "failed": len(statuses) - statuses.count("captured") - statuses.count("partial"),
    }
    if len(job_dirs) > 1:
        # File names in a job's manifest are relative to that job's directory.
        for job_dir in job_dirs:
            own = [entry for d, entry in entries if d == job_dir]
            _write_json(job_dir / MANIFEST, {**manifest, "processes": own, "node_dir": ".."})
        manifest["process_manifests"] = [f"{d.name}/{MANIFEST}" for d in job_dirs]
    else:
        manifest["processes"] = [entry for _, entry in entries]
    _write_json(out / MANIFEST, manifest)


def _job_start_uptime(table: dict[int, Proc], jobs: list[Job]) -> float | None:
    """When the earliest process of the selected jobs started, in seconds since boot (dmesg's clock)."""
    pids = [w.pid for job in jobs for w in job.workers] + [job.launcher for job in jobs if job.launcher is not None]
    ticks = [table[p].start_ticks for p in pids if p in table]
    return min(ticks) / os.sysconf("SC_CLK_TCK") if ticks else None


def _named(workers: list[Worker]) -> list[tuple[Worker, str]]:
    """File stems: `rank<R>` (what discovery attributes ranks from), `pid<P>` when the rank is unknown."""
    named, used = [], set()
    for worker in workers:
        stem = f"rank{worker.rank}" if worker.rank is not None else f"pid{worker.pid}"
        if stem in used:
            stem = f"{stem}.pid{worker.pid}"
        used.add(stem)
        named.append((worker, stem))
    return named


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
