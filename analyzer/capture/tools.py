"""Live capture (tools): external commands under a hard timeout, and the node's own context.

Every external tool runs in its own process group with a per-call timeout; on expiry the whole
group is killed, so one wedged process (or a wedged nvidia-smi) cannot stall the capture. The
node context is nvidia-smi's read-outs, ibstat and the kernel messages since the job started.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 20.0
MAX_TOOL_OUTPUT_BYTES = 64 << 20
DMESG_MAX_LINES = 2000
DMESG_SLACK_S = 5.0  # kernel lines this long before the job's first process started are kept too (clock skew)

_DMESG_UPTIME = re.compile(r"^\[\s*(\d+)\.(\d+)\]")
_XID = re.compile(r"NVRM: Xid")


# --- running tools -----------------------------------------------------------------------------------


@dataclass
class ToolRun:
    status: str  # ok, failed, timeout, missing
    returncode: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    seconds: float = 0.0
    reason: str = ""


def run_tool(argv: list[str], timeout: float) -> ToolRun:
    """Run one external command with a hard timeout.

    The command gets its own session (process group): on timeout the whole group is killed, so
    a tool that forked a helper holding our pipes cannot keep us waiting either.
    """
    started = time.monotonic()
    env = {**os.environ, "LC_ALL": "C"}
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv is built here, never from a shell string
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env
        )
    except FileNotFoundError:
        return ToolRun("missing", reason=f"{argv[0]}: not installed (not found on PATH)")
    except OSError as exc:
        return ToolRun("failed", reason=f"{argv[0]}: cannot run: {exc.strerror or exc}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a child left the group and holds the pipes: give up on it
            out, err = b"", b""
        return ToolRun("timeout", proc.returncode, out[:MAX_TOOL_OUTPUT_BYTES], err[:MAX_TOOL_OUTPUT_BYTES],
                       time.monotonic() - started, f"timed out after {timeout:g} s; killed")
    seconds = time.monotonic() - started
    status = "ok" if proc.returncode == 0 else "failed"
    return ToolRun(status, proc.returncode, out[:MAX_TOOL_OUTPUT_BYTES], err[:MAX_TOOL_OUTPUT_BYTES], seconds)


def _kill_group(proc: subprocess.Popen) -> None:
    # Only the tool's own process group: the job is never in it (start_new_session above).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.kill()


def find_py_spy(explicit: str | None = None) -> str | None:
    """py-spy from --py-spy, beside this interpreter (a pip install into an unactivated venv), or on PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


# --- node context ----------------------------------------------------------------------------------------


NODE_TOOLS = (
    ("nvidia-smi-q", ["nvidia-smi", "-q"], "node.nvidia-smi-q.txt"),
    ("nvidia-smi-topo", ["nvidia-smi", "topo", "-m"], "node.nvidia-smi-topo.txt"),
    ("nvidia-smi-nvlink", ["nvidia-smi", "nvlink", "-s"], "node.nvidia-smi-nvlink.txt"),
    ("ibstat", ["ibstat"], "node.ibstat.txt"),
)


def capture_node_tool(name: str, argv: list[str], path: Path, timeout: float) -> dict:
    record: dict = {"call": name, "command": " ".join(argv)}
    result = run_tool(argv, timeout)
    record["seconds"] = round(result.seconds, 3)
    if result.status != "ok":
        detail = result.reason or (result.stderr or result.stdout).decode("utf-8", "replace").strip()[:300]
        return {**record, "status": result.status, "reason": detail or f"exit status {result.returncode}"}
    if not result.stdout.strip():
        return {**record, "status": "empty", "reason": "no output"}
    path.write_bytes(result.stdout)
    return {**record, "status": "ok", "file": path.name}


def capture_dmesg(path: Path, since_uptime: float | None, timeout: float) -> tuple[dict, list[str]]:
    """Kernel messages since the job started (older ones are other jobs' news), and every Xid line.

    `dmesg` stamps lines with seconds since boot, the clock /proc/<pid>/stat's start time uses too.
    """
    record: dict = {"call": "dmesg", "command": "dmesg"}
    result = run_tool(["dmesg"], timeout)
    record["seconds"] = round(result.seconds, 3)
    if result.status != "ok":
        detail = result.reason or result.stderr.decode("utf-8", "replace").strip()[:300]
        if "not permitted" in detail.lower() or "permission" in detail.lower():
            detail += " (kernel.dmesg_restrict, or a container without CAP_SYSLOG)"
        return {**record, "status": result.status, "reason": detail or f"exit status {result.returncode}"}, []
    lines = result.stdout.decode("utf-8", "replace").splitlines()
    xids = [line for line in lines if _XID.search(line)][-200:]
    kept = lines
    if since_uptime is not None and any(_DMESG_UPTIME.match(line) for line in lines):
        floor = since_uptime - DMESG_SLACK_S
        kept, keep = [], False
        for line in lines:
            stamp = _DMESG_UPTIME.match(line)
            if stamp:  # an unstamped line continues the stamped one above it
                keep = float(f"{stamp.group(1)}.{stamp.group(2)}") >= floor
            if keep:
                kept.append(line)
        record["since_uptime_s"] = round(floor, 3)
    kept = kept[-DMESG_MAX_LINES:]
    record["lines"] = len(kept)
    record["xid_lines"] = len(xids)
    if not kept:
        return {**record, "status": "empty", "reason": "no kernel message since the job started"}, xids
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    return {**record, "status": "ok", "file": path.name}, xids
