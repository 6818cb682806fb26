"""Live capture (one rank): py-spy dumps of a training process, and its Flight Recorder on request.

py-spy pauses each process briefly while it reads the stacks (a process that cannot be paused is
read with --nonblocking); the Flight Recorder pipe is written only when asked. The job itself is
never signalled. The manifest entry of each rank says how every call went and why one failed.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from analyzer.capture.jobs import Worker
from analyzer.capture.processes import Proc, read_process
from analyzer.capture.tools import DEFAULT_TIMEOUT_S, run_tool

MAX_FR_DUMP_BYTES = 1 << 30

# The environment kept per rank: what configures NCCL / torch / the launcher. An allow-list, so
# that tokens and passwords in the job's environment never land in the capture.
_KEPT_ENV = re.compile(
    r"^(?:NCCL_\w*|TORCH_\w*|TORCHELASTIC_\w*|PYTORCH_\w*|GLOO_\w*|CUDA_\w*|NVIDIA_\w*|UCX_\w*|FI_\w*"
    r"|OMPI_COMM_WORLD_\w*|SLURM_(?:JOB_ID|JOBID|STEP_ID|PROCID|LOCALID|NODEID|JOB_NODELIST|NNODES|NTASKS)"
    r"|MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE"
    r"|ROLE_RANK|ROLE_WORLD_SIZE|OMP_NUM_THREADS|HOSTNAME)$"
)
_PYSPY_ERROR = re.compile(r"^(?:Error: |Permission Denied|Failed to |Caused by:|\s+\d+: )")


# --- capturing one rank --------------------------------------------------------------------------------


@dataclass
class Capture:
    py_spy: str | None
    timeout: float = DEFAULT_TIMEOUT_S
    native: bool = True
    flight_recorder: bool = False


_PYSPY_CALLS = (
    # (call name, extra py-spy arguments, file suffix); the plain dump first: it matters most.
    ("pyspy_text", (), "pyspy.txt"),
    ("pyspy_json", ("--json",), "pyspy.json"),
    ("pyspy_native", ("--native",), "pyspy-native.txt"),
)


def capture_worker(worker: Worker, proc: Proc | None, job_dir: Path, stem: str, cfg: Capture) -> dict:
    """py-spy dumps (and on request a Flight Recorder dump) of one rank; the manifest entry says how it went."""
    entry: dict = {
        "pid": worker.pid,
        "rank": worker.rank,
        "local_rank": worker.local_rank,
        "rank_source": worker.rank_source,
        "job": worker.job,
        "launcher_pid": worker.launcher,
        "cmdline": proc.cmdline[:2000] if proc else None,
        "env": _kept_env(proc),
        "env_error": proc.env_error if proc else "process not found",
        "calls": [],
    }
    calls = [c for c in _PYSPY_CALLS if cfg.native or c[0] != "pyspy_native"]
    nonblocking = False
    exited = False
    for name, extra, suffix in calls:
        if exited:
            entry["calls"].append({"call": name, "status": "skipped", "reason": "process exited during capture"})
            continue
        if nonblocking and name == "pyspy_native":
            entry["calls"].append({"call": name, "status": "skipped", "reason": "--native needs to pause the process"})
            continue
        record = _pyspy_call(cfg, worker.pid, name, extra, job_dir / f"{stem}.{suffix}", nonblocking)
        if record.pop("_suspend_failed", False) and not nonblocking:
            # A stopped or already-traced process cannot be paused: read it without pausing.
            nonblocking = True
            record = _pyspy_call(cfg, worker.pid, name, extra, job_dir / f"{stem}.{suffix}", True)
            record["note"] = "process could not be paused (stopped, or traced by another tool): read with --nonblocking"
        if record["status"] != "ok" and not _alive(worker.pid, proc):
            record["reason"] = f"process exited during capture ({record.get('reason', '')})".replace(" ()", "")
            exited = True
        entry["calls"].append(record)
    if cfg.flight_recorder and not exited:
        entry["flight_recorder"] = trigger_flight_recorder(worker, proc, job_dir / f"{stem}.flight_recorder", cfg.timeout)
    ok = [c for c in entry["calls"] if c["status"] == "ok"]
    if exited:
        entry["status"] = "exited" if not ok else "partial"
    else:
        entry["status"] = "captured" if len(ok) == len(entry["calls"]) else "partial" if ok else "failed"
    failed = [c for c in entry["calls"] if c["status"] != "ok"]
    entry["reason"] = "; ".join(f"{c['call']}: {c['reason']}" for c in failed) if failed else ""
    entry["files"] = [c["file"] for c in ok] + (
        [entry["flight_recorder"]["file"]] if entry.get("flight_recorder", {}).get("status") == "ok" else []
    )
    return entry


def _kept_env(proc: Proc | None) -> dict[str, str] | None:
    if proc is None or proc.env is None:
        return None
    return {key: value for key, value in sorted(proc.env.items()) if _KEPT_ENV.match(key)}


def _pyspy_call(cfg: Capture, pid: int, name: str, extra: tuple[str, ...], path: Path, nonblocking: bool) -> dict:
    record: dict = {"call": name}
    if cfg.py_spy is None:
        record.update(status="missing", reason="py-spy not installed (pip install py-spy, or pass --py-spy PATH)")
        return record
    argv = [cfg.py_spy, "dump", *extra, *(("--nonblocking",) if nonblocking else ()), "--pid", str(pid)]
    result = run_tool(argv, cfg.timeout)
    record["command"] = " ".join(argv[1:])
    record["seconds"] = round(result.seconds, 3)
    if result.status == "ok" and not _looks_like_dump(name, result.stdout):
        result.status, result.reason = "failed", "py-spy printed no thread stacks"
    if result.status != "ok":
        record["status"] = result.status
        record["reason"] = result.reason or _pyspy_reason(result.stderr, result.stdout, alive=read_process(pid) is not None)
        if "Failed to suspend process" in result.stderr.decode("utf-8", "replace"):
            record["_suspend_failed"] = True
        return record
    path.write_bytes(result.stdout)
    record.update(status="ok", file=path.name)
    return record


def _looks_like_dump(name: str, stdout: bytes) -> bool:
    if name == "pyspy_json":
        try:
            doc = json.loads(stdout)
        except ValueError:
            return False
        return isinstance(doc, list) and bool(doc)
    return b"\nThread " in stdout or stdout.startswith(b"Thread ")


def _pyspy_reason(stderr: bytes, stdout: bytes, alive: bool = False) -> str:
    """py-spy's error and its 'Caused by' chain, without the Rust backtrace; the usual causes named.

    py-spy 0.4 reports a denied ptrace of a live process as not finding its executable
    (/proc/PID/exe needs the same access), so that wording means "denied" while the process lives.
    """
    lines = []
    for line in stderr.decode("utf-8", "replace").splitlines():
        if line.startswith("Stack backtrace"):
            break
        if _PYSPY_ERROR.match(line) and line.strip() != "Caused by:":
            lines.append(line.strip())
    text = " / ".join(lines) or stderr.decode("utf-8", "replace").strip()[:300] or stdout.decode("utf-8", "replace").strip()[-300:]
    lowered = text.lower()
    if ("permission denied" in lowered or "operation not permitted" in lowered
            or (alive and "failed to get process executable name" in lowered)):
        return (f"ptrace denied ({text[:300]}): run as root or as the job's user; in a container add "
                "CAP_SYS_PTRACE (docker --cap-add SYS_PTRACE); check kernel.yama.ptrace_scope")
    if "not supported" in lowered and "native" in lowered:
        return f"--native is not supported here ({text[:300]})"
    return text[:500] or "py-spy failed without a message"


def _alive(pid: int, proc: Proc | None) -> bool:
    """Still the same live process: not gone, not a zombie its parent has yet to reap, not a reused pid."""
    now = read_process(pid)
    return now is not None and now.state not in ("Z", "X") and (proc is None or now.start_ticks == proc.start_ticks)


# --- Flight Recorder ---------------------------------------------------------------------------------


def trigger_flight_recorder(worker: Worker, proc: Proc | None, stem: Path, timeout: float) -> dict:
    """Ask one rank's ProcessGroupNCCL for a Flight Recorder dump through its debug pipe.

    With TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem> (and a trace buffer, TORCH_NCCL_TRACE_BUFFER_SIZE or
    TORCH_FR_BUFFER_SIZE > 0) in its environment, the rank's heartbeat monitor creates the FIFO
    `<stem><rank>.pipe` and polls it; anything written to it makes the rank write its dump to
    `<TORCH_FR_DUMP_TEMP_FILE | TORCH_NCCL_DEBUG_INFO_TEMP_FILE | /tmp/nccl_trace_rank_><rank>`.
    Paths are the rank's own, so they are resolved through /proc/<pid>/root (containers).
    """
    result: dict = {"call": "flight_recorder"}
    env = proc.env if proc else None
    if env is None:
        return {**result, "status": "failed", "reason": "the rank's environment is unreadable: pipe location unknown"}
    pipe_stem = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    if not pipe_stem:
        return {**result, "status": "unavailable",
                "reason": "the job was not started with TORCH_NCCL_DEBUG_INFO_PIPE_FILE (and TORCH_NCCL_TRACE_BUFFER_SIZE>0); "
                          "set them at launch to allow on-demand Flight Recorder dumps"}
    if worker.rank is None:
        return {**result, "status": "failed", "reason": "rank unknown: cannot name the pipe"}
    pipe = _in_process_fs(worker.pid, f"{pipe_stem}{worker.rank}.pipe")
    dump = _in_process_fs(
        worker.pid,
        (env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or "/tmp/nccl_trace_rank_") + str(worker.rank),
    )
    result.update(pipe=str(pipe), dump=str(dump))
    try:
        if not stat.S_ISFIFO(os.stat(pipe).st_mode):
            return {**result, "status": "failed", "reason": f"{pipe} is not a named pipe"}
    except OSError as exc:
        return {**result, "status": "failed",
                "reason": f"no pipe {pipe} ({exc.strerror}): the rank has no NCCL process group yet, or no trace buffer"}
    before = _mtime(dump)
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        # ENXIO: nobody holds the read end, i.e. the rank's heartbeat monitor is not running.
        return {**result, "status": "failed", "reason": f"cannot open {pipe} for writing: {exc.strerror}"}
    try:
        os.write(fd, b"1\n")
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    last_size = -1
    while time.monotonic() < deadline:
        now = _mtime(dump)
        if now is not None and (before is None or now > before):
            size = os.stat(dump).st_size
            if size == last_size and size > 0:
                data = _read_capped(dump, MAX_FR_DUMP_BYTES)
                target = stem.with_name(stem.name + (".pkl" if data[:1] == b"\x80" else ".json"))
                target.write_bytes(data)
                return {**result, "status": "ok", "file": target.name}
            last_size = size
        time.sleep(0.25)
    return {**result, "status": "timeout",
            "reason": f"no new dump at {dump} within {timeout:g} s of the trigger (the heartbeat monitor may be wedged too)"}


def _in_process_fs(pid: int, path: str) -> Path:
    if os.path.isabs(path):
        return Path(f"/proc/{pid}/root") / path.lstrip("/")
    return Path(f"/proc/{pid}/cwd") / path


def _mtime(path: Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _read_capped(path: Path, limit: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(limit)
