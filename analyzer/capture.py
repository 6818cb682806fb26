"""Capture (before the pipeline): snapshot a hung job on this node before anyone kills it.

The best evidence of a hang exists only while the job is still hung. `postmortem capture` finds
the job's training processes on this node (from a pid of the launcher or of any worker, a
command-line pattern, a Slurm job id, or explicit pids), maps each to its rank, and writes into
DIR what `postmortem analyze` reads:

- per rank: `rank<R>.pyspy.txt`, `rank<R>.pyspy.json`, `rank<R>.pyspy-native.txt` (py-spy dump,
  plain, --json and --native), and on request `rank<R>.flight_recorder.pkl` (a Flight Recorder
  dump triggered through the rank's TORCH_NCCL_DEBUG_INFO_PIPE_FILE pipe). The `rank<R>` in the
  name is what discovery attributes the rank from; a process whose rank is unknown is `pid<P>`;
- node context, where the tools exist: `node.nvidia-smi-q.txt`, `node.nvidia-smi-topo.txt`,
  `node.nvidia-smi-nvlink.txt`, `node.dmesg.txt` (kernel messages since the job started),
  `node.ibstat.txt`;
- `manifest.json`: what was selected and why, each rank's pid, rank source, NCCL/TORCH
  environment, and every call's outcome with the reason when it failed (tool missing, ptrace
  denied, process exited mid-capture, timed out).

Every external tool runs in its own process group with a per-call timeout; on expiry the whole
group is killed, so one wedged process (or a wedged nvidia-smi) cannot stall the capture. The
job itself is never signalled: py-spy pauses each process briefly while it reads the stacks, and
the Flight Recorder pipe is written only when asked. Only the standard library (and click for
the command) is imported: this runs on a node in trouble.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import click

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1  # value of the manifest's "postmortem_capture" key (how discovery recognises it)
DEFAULT_TIMEOUT_S = 20.0
MAX_ENVIRON_BYTES = 1 << 20
MAX_TOOL_OUTPUT_BYTES = 64 << 20
MAX_FR_DUMP_BYTES = 1 << 30
DMESG_MAX_LINES = 2000
DMESG_SLACK_S = 5.0  # kernel lines this long before the job's first process started are kept too (clock skew)
MAX_LISTED = 50  # excluded / matched-but-ignored processes listed in the manifest

EXIT_CAPTURED = 0
EXIT_NOTHING_CAPTURED = 2

# torch.distributed launchers whose direct children are the workers (torchrun is a console script
# of torch.distributed.run; DeepSpeed's per-node launcher spawns workers the same way).
_AGENT_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.launch")
_AGENT_SCRIPTS = ("torchrun",)
_AGENT_FLAGS = frozenset({"standalone", "no_python", "module", "m", "run_path"})  # torchrun options without a value
_PYTHON_EXE = re.compile(r"^python[\d.]*(?:-dbg)?$")
# torch renames the main thread of its workers, and /proc/<pid>/comm follows the main thread.
_PYTHON_COMM = re.compile(r"^(?:python|pt_main_thread)")
# Rank variables set by torch.distributed launchers (strong: the process is a torch worker) and by
# MPI / Slurm launchers (weak: also set on wrappers and on torchrun itself under srun).
_TORCH_RANK_VARS = ("RANK", "LOCAL_RANK")
_LAUNCHER_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_LAUNCHER_LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
# The environment kept per rank: what configures NCCL / torch / the launcher. An allow-list, so
# that tokens and passwords in the job's environment never land in the capture.
_KEPT_ENV = re.compile(
    r"^(?:NCCL_\w*|TORCH_\w*|TORCHELASTIC_\w*|PYTORCH_\w*|GLOO_\w*|CUDA_\w*|NVIDIA_\w*|UCX_\w*|FI_\w*"
    r"|OMPI_COMM_WORLD_\w*|SLURM_(?:JOB_ID|JOBID|STEP_ID|PROCID|LOCALID|NODEID|JOB_NODELIST|NNODES|NTASKS)"
    r"|MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE"
    r"|ROLE_RANK|ROLE_WORLD_SIZE|OMP_NUM_THREADS|HOSTNAME)$"
)
_DMESG_UPTIME = re.compile(r"^\[\s*(\d+)\.(\d+)\]")
_XID = re.compile(r"NVRM: Xid")
_PYSPY_ERROR = re.compile(r"^(?:Error: |Permission Denied|Failed to |Caused by:|\s+\d+: )")


# --- the process table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it; `env` is None when /proc/<pid>/environ cannot be read."""

    pid: int
    ppid: int
    comm: str
    argv: tuple[str, ...]
    start_ticks: int = 0
    state: str = "S"  # /proc/<pid>/stat's state letter; Z (zombie) and X (dead) have exited
    env: dict[str, str] | None = None
    env_error: str | None = None
    cgroup: str = ""

    @property
    def cmdline(self) -> str:
        return " ".join(self.argv) if self.argv else f"[{self.comm}]"

    @property
    def is_python(self) -> bool:
        exe = os.path.basename(self.argv[0]) if self.argv else ""
        return bool(_PYTHON_EXE.match(exe) or _PYTHON_COMM.match(self.comm))

    @property
    def is_agent(self) -> bool:
        argv = self.argv
        for index, arg in enumerate(argv[:-1]):
            if arg == "-m" and argv[index + 1] in _AGENT_MODULES:
                return True
        return any(os.path.basename(arg) in _AGENT_SCRIPTS for arg in argv[:2])


def scan_processes(proc_root: str = "/proc") -> dict[int, Proc]:
    """Every process this user can see; ones that exit while being read are left out."""
    table: dict[int, Proc] = {}
    for name in os.listdir(proc_root):
        if name.isdigit():
            proc = read_process(int(name), proc_root)
            if proc is not None:
                table[proc.pid] = proc
    return table


def read_process(pid: int, proc_root: str = "/proc") -> Proc | None:
    base = Path(proc_root) / str(pid)
    try:
        raw_stat = (base / "stat").read_text(errors="replace")
        argv_raw = (base / "cmdline").read_bytes()
    except OSError:
        return None  # gone, or a kernel thread that vanished
    # `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so split at the last ')'.
    comm = raw_stat[raw_stat.find("(") + 1 : raw_stat.rfind(")")]
    fields = raw_stat[raw_stat.rfind(")") + 2 :].split()
    try:
        state, ppid, start_ticks = fields[0], int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None
    argv = tuple(a.decode("utf-8", "replace") for a in argv_raw.split(b"\0") if a)
    env: dict[str, str] | None = None
    env_error = None
    try:
        with open(base / "environ", "rb") as fh:
            env = _parse_environ(fh.read(MAX_ENVIRON_BYTES))
    except OSError as exc:
        env_error = f"environ unreadable: {exc.strerror or exc}"
    try:
        cgroup = (base / "cgroup").read_text(errors="replace")
    except OSError:
        cgroup = ""
    return Proc(pid, ppid, comm, argv, start_ticks, state, env, env_error, cgroup)


def _parse_environ(raw: bytes) -> dict[str, str]:
    env = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


# --- jobs: training processes grouped by the job they belong to ---------------------------------------


@dataclass
class Worker:
    """A training process (one rank) on this node."""

    pid: int
    rank: int | None
    local_rank: int | None
    rank_source: str
    job: str = ""
    launcher: int | None = None


@dataclass
class Job:
    key: str  # how the workers were grouped: "agent:<pid>", "rendezvous:<addr>:<port>", ...
    workers: list[Worker] = field(default_factory=list)
    launcher: int | None = None


@dataclass
class ProcessTree:
    """The node's training processes, grouped into jobs, and the helpers (dataloader workers...) below them."""

    table: dict[int, Proc]
    jobs: dict[str, Job]
    workers: dict[int, Worker]
    helpers: dict[int, int]  # helper pid -> the worker pid above it
    children: dict[int, list[int]]

    def ancestors(self, pid: int) -> Iterator[int]:
        seen = {pid}
        proc = self.table.get(pid)
        while proc is not None and proc.ppid not in seen and proc.ppid > 0:
            seen.add(proc.ppid)
            yield proc.ppid
            proc = self.table.get(proc.ppid)

    def descendants(self, pid: int) -> Iterator[int]:
        stack, seen = list(self.children.get(pid, ())), {pid}
        while stack:
            child = stack.pop()
            if child in seen:
                continue
            seen.add(child)
            yield child
            stack.extend(self.children.get(child, ()))


def build_tree(table: dict[int, Proc]) -> ProcessTree:
    """Find every training process on the node and the job each belongs to.

    A worker is the top-most process carrying a rank: torch's RANK / LOCAL_RANK in its environment
    (set by torchrun, DeepSpeed, accelerate, or the user's srun script), or an MPI / Slurm rank on
    a Python process. Processes below a worker with the same variables (dataloader workers, compile
    workers) are its helpers, not ranks. Where the environment cannot be read, the direct children
    of a torchrun agent are its workers, in start order (torchrun starts local rank 0 first).
    """
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    for pids in children.values():
        pids.sort(key=lambda p: (table[p].start_ticks, p))

    def strong(proc: Proc) -> bool:
        return proc.env is not None and any(v in proc.env for v in _TORCH_RANK_VARS) and not proc.is_agent

    tree = ProcessTree(table, {}, {}, {}, children)
    strong_pids = {p.pid for p in table.values() if strong(p)}
    # `torchrun --no-python bash train.sh`: the shell holds the rank variables too, but the rank is
    # the Python process below it.
    strong_pids -= {
        pid for pid in strong_pids
        if not table[pid].is_python and any(d in strong_pids and table[d].is_python for d in tree.descendants(pid))
    }
    weak_pids = {
        p.pid
        for p in table.values()
        if p.pid not in strong_pids
        and p.is_python
        and not p.is_agent
        and p.env is not None
        and any(v in p.env for v in _LAUNCHER_RANK_VARS)
        and not any(d in strong_pids for d in tree.descendants(p.pid))  # a launcher of torch workers
    }
    candidates = strong_pids | weak_pids
    for pid in sorted(candidates):
        above = next((a for a in tree.ancestors(pid) if a in candidates), None)
        if above is not None:
            top = above
            for a in tree.ancestors(above):
                if a in candidates:
                    top = a
            tree.helpers[pid] = top
            continue
        tree.workers[pid] = _env_worker(tree, table[pid])
    _tree_workers(tree)
    for worker in sorted(tree.workers.values(), key=lambda w: (table[w.pid].start_ticks, w.pid)):
        job = tree.jobs.setdefault(worker.job, Job(worker.job, launcher=worker.launcher))
        job.workers.append(worker)
    for job in tree.jobs.values():
        job.workers.sort(key=lambda w: (w.rank is None, w.rank if w.rank is not None else 0, w.local_rank or 0, w.pid))
    return tree


def _agent_above(tree: ProcessTree, pid: int) -> int | None:
    return next((a for a in tree.ancestors(pid) if tree.table.get(a) and tree.table[a].is_agent), None)


def _env_worker(tree: ProcessTree, proc: Proc) -> Worker:
    env = proc.env or {}
    agent = _agent_above(tree, proc.pid)
    parent = tree.table.get(proc.ppid)
    if agent is None and "TORCHELASTIC_RUN_ID" in env and parent is not None and parent.is_python and parent.pid > 1:
        # torchelastic workers are children of the agent even when it is not named torchrun
        # (accelerate launch); an orphan (agent killed) is grouped by its rendezvous below.
        agent = parent.pid
    launcher = agent
    rank, source = _int(env.get("RANK")), "environ:RANK"
    local = _int(env.get("LOCAL_RANK"))
    if rank is None and launcher is None:
        # MPI / Slurm ranks count only without a torch launcher in between (under srun, torchrun
        # and its workers all inherit the node's SLURM_PROCID).
        var = next((v for v in _LAUNCHER_RANK_VARS if _int(env.get(v)) is not None), None)
        rank, source = (_int(env.get(var)), f"environ:{var}") if var else (None, "unknown")
    if local is None and launcher is None:
        local = next((_int(env.get(v)) for v in _LAUNCHER_LOCAL_VARS if _int(env.get(v)) is not None), None)
    if rank is None and local is not None and launcher is not None:
        rank, source = _rank_from_agent(tree.table.get(launcher), local)
    if launcher is not None:
        job = f"agent:{launcher}"
    elif env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        job = f"rendezvous:{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    elif env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"):
        job = f"slurm:{env.get('SLURM_JOB_ID') or env.get('SLURM_JOBID')}.{env.get('SLURM_STEP_ID', '?')}"
    else:
        job = f"parent:{proc.ppid}"
    return Worker(proc.pid, rank, local, source, job, launcher)


def _tree_workers(tree: ProcessTree) -> None:
    """Workers of torchrun agents whose environment could not be read: the tree alone says who they are."""
    for agent in sorted(p.pid for p in tree.table.values() if p.is_agent):
        for local, child in enumerate(tree.children.get(agent, ())):
            pid = child if tree.table[child].is_python else next(
                (d for d in _breadth_first(tree, child) if tree.table[d].is_python), child
            )
            if pid in tree.workers or pid in tree.helpers or tree.table[pid].env is not None:
                continue
            rank, source = _rank_from_agent(tree.table[agent], local)
            tree.workers[pid] = Worker(pid, rank, local, source, f"agent:{agent}", agent)


def _breadth_first(tree: ProcessTree, pid: int) -> Iterator[int]:
    queue = list(tree.children.get(pid, ()))
    while queue:
        head = queue.pop(0)
        yield head
        queue.extend(tree.children.get(head, ()))


def _rank_from_agent(agent: Proc | None, local: int) -> tuple[int | None, str]:
    """Global rank from torchrun's own arguments, where they fix it (single node or static rendezvous)."""
    if agent is None:
        return None, "unknown (local rank only)"
    args = _agent_args(agent.argv)
    nproc = _int(args.get("nproc_per_node"))
    if "standalone" in args or args.get("nnodes") in ("1", "1:1"):
        return local, "torchrun tree (single node: rank = local rank)"
    node_rank = _int(args.get("node_rank"))
    if nproc is not None and node_rank is not None and args.get("rdzv_backend", "static") == "static":
        return node_rank * nproc + local, "torchrun tree (static rendezvous: node_rank * nproc_per_node + local rank)"
    return None, "unknown (local rank only)"


def _agent_args(argv: tuple[str, ...]) -> dict[str, str]:
    """torchrun's own options: from after `torchrun` / `-m torch.distributed.run` to the training script."""
    start = next(
        (i + 1 for i, arg in enumerate(argv) if arg in _AGENT_MODULES or os.path.basename(arg) in _AGENT_SCRIPTS), len(argv)
    )
    args: dict[str, str] = {}
    index = start
    while index < len(argv):
        arg = argv[index]
        if not arg.startswith("-"):
            break  # the training script: what follows are its arguments, not torchrun's
        key, sep, value = arg.lstrip("-").partition("=")
        key = key.replace("-", "_")
        if not sep and key not in _AGENT_FLAGS and index + 1 < len(argv):
            index += 1
            value = argv[index]
        args.setdefault(key, value)
        index += 1
    return args


# --- selection -------------------------------------------------------------------------------------


@dataclass
class Selection:
    jobs: list[Job]
    notes: list[dict]  # why a pid or pattern selected nothing, matched-but-ignored processes


def select(
    tree: ProcessTree,
    pids: Iterable[int] = (),
    pattern: str | None = None,
    slurm_job: str | None = None,
    exclude: Iterable[int] = (),
) -> Selection:
    """The jobs that the given pids, pattern and Slurm job id point at.

    A pid selects the whole job it belongs to: its own if it is a worker, its worker's if it is a
    helper, every job below it if it is a launcher (torchrun, srun's step, a wrapper script). An
    explicit pid that is none of those is captured as it is (rank from its environment if any).
    """
    excluded = set(exclude)
    chosen: dict[str, Job] = {}
    notes: list[dict] = []
    lone: list[Worker] = []

    def take(pid: int, explicit: bool, why: str) -> bool:
        keys = _jobs_of(tree, pid)
        for key in keys:
            chosen.setdefault(key, tree.jobs[key])
        if keys:
            return True
        proc = tree.table.get(pid)
        if explicit and proc is not None:
            env = proc.env or {}
            rank = _int(env.get("RANK"))
            lone.append(Worker(pid, rank, _int(env.get("LOCAL_RANK")), "environ:RANK" if rank is not None else "unknown",
                               f"pid:{pid}"))
            notes.append({"pid": pid, "note": f"{why}: not recognised as a training process; captured as given"})
            return True
        return False

    for pid in pids:
        if pid not in tree.table:
            notes.append({"pid": pid, "note": "no such process on this node (or not visible to this user)"})
            continue
        take(pid, True, f"--pid {pid}")
    if pattern is not None:
        regex = re.compile(pattern)
        matched = [p for p in tree.table.values() if p.pid not in excluded and regex.search(p.cmdline)]
        ignored = [p for p in matched if not take(p.pid, False, f"--pattern {pattern!r}")]
        if not matched:
            notes.append({"pattern": pattern, "note": "no process's command line matches"})
        for proc in ignored[:MAX_LISTED]:
            notes.append({"pid": proc.pid, "cmdline": proc.cmdline[:300], "note": "matches --pattern but is not a training process"})
    if slurm_job is not None:
        members = [p for p in tree.table.values() if p.pid not in excluded and _in_slurm_job(p, slurm_job)]
        found = [p.pid for p in members if _jobs_of(tree, p.pid)]
        for pid in found:
            take(pid, False, f"--slurm-job {slurm_job}")
        if not members:
            notes.append({"slurm_job": slurm_job, "note": "no process of this Slurm job on this node (environment or cgroup)"})
        elif not found:
            notes.append({"slurm_job": slurm_job, "note": f"{len(members)} process(es) of the job here, none a training process"})
    jobs = sorted(chosen.values(), key=lambda j: j.key)
    taken = {w.pid for job in jobs for w in job.workers}
    for worker in lone:
        if worker.pid not in taken:
            taken.add(worker.pid)
            jobs.append(Job(worker.job, [worker]))
    return Selection(jobs, notes)


def _jobs_of(tree: ProcessTree, pid: int) -> list[str]:
    if pid in tree.workers:
        return [tree.workers[pid].job]
    if pid in tree.helpers:
        return [tree.workers[tree.helpers[pid]].job]
    below = {tree.workers[d].job for d in tree.descendants(pid) if d in tree.workers}
    return sorted(below)


def _in_slurm_job(proc: Proc, job_id: str) -> bool:
    env = proc.env or {}
    if job_id in (env.get("SLURM_JOB_ID"), env.get("SLURM_JOBID")):
        return True
    # slurmd's cgroup plugin puts every task under .../job_<id>/step_<n>/...
    return re.search(rf"/job_{re.escape(job_id)}(?:/|$)", proc.cgroup, re.MULTILINE) is not None


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


# --- node context ----------------------------------------------------------------------------------------


_NODE_TOOLS = (
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
    chosen = {w.pid for job in selection.jobs for w in job.workers}
    manifest: dict = {
        "postmortem_capture": MANIFEST_FORMAT,
        "host": socket.gethostname(),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": None,
        "status": "in progress",
        "selection": {"pids": pids, "pattern": pattern, "slurm_job": slurm_job},
        "py_spy": cfg.py_spy,
        "timeout_s": timeout,
        "notes": selection.notes,
        "helpers_not_captured": [
            {"pid": h, "worker_pid": w, "cmdline": table[h].cmdline[:300]} for h, w in sorted(tree.helpers.items()) if w in chosen
        ][:MAX_LISTED],
        "jobs": [],
        "node": [],
        "xid_lines": [],
        "processes": [],
    }
    # One job: everything in DIR. Several (a pattern or a Slurm id can match more than one): each
    # job's dumps with its own manifest in DIR/job<N>/, so that each job can be analysed alone.
    several = len(selection.jobs) > 1
    job_dirs = [out / f"job{index}" if several else out for index in range(1, len(selection.jobs) + 1)]
    for job, job_dir in zip(selection.jobs, job_dirs):
        job_dir.mkdir(exist_ok=True)
        manifest["jobs"].append({"job": job.key, "launcher_pid": job.launcher, "dir": job_dir.relative_to(out).as_posix(),
                                 "ranks": [w.rank for w in job.workers], "pids": [w.pid for w in job.workers]})
    _write_json(out / MANIFEST, manifest)  # a capture cut short still says what it was doing

    tasks = [(job_dir, worker, stem) for job, job_dir in zip(selection.jobs, job_dirs) for worker, stem in _named(job.workers)]
    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as pool:
        node_futures = []
        if node_context:
            since = _job_start_uptime(table, selection.jobs)
            node_futures = [pool.submit(capture_node_tool, name, argv, out / file, timeout) for name, argv, file in _NODE_TOOLS]
            dmesg_future = pool.submit(capture_dmesg, out / "node.dmesg.txt", since, timeout)
        rank_futures = [
            (job_dir, pool.submit(capture_worker, worker, table.get(worker.pid), job_dir, stem, cfg)) for job_dir, worker, stem in tasks
        ]
        entries = [(job_dir, future.result()) for job_dir, future in rank_futures]
        if node_context:
            manifest["node"] = [future.result() for future in node_futures]
            dmesg_record, manifest["xid_lines"] = dmesg_future.result()
            manifest["node"].append(dmesg_record)
    statuses = [entry["status"] for _, entry in entries]
    manifest["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    manifest["status"] = "captured" if any(s in ("captured", "partial") for s in statuses) else "nothing captured"
    manifest["summary"] = {
        "processes": len(statuses),
        "captured": statuses.count("captured"),
        "partial": statuses.count("partial"),
        "failed": len(statuses) - statuses.count("captured") - statuses.count("partial"),
    }
    if several:
        # File names in a job's manifest are relative to that job's directory.
        for job_dir in job_dirs:
            own = [entry for d, entry in entries if d == job_dir]
            _write_json(job_dir / MANIFEST, {**manifest, "processes": own, "node_dir": ".."})
        manifest["process_manifests"] = [f"{d.name}/{MANIFEST}" for d in job_dirs]
    else:
        manifest["processes"] = [entry for _, entry in entries]
    _write_json(out / MANIFEST, manifest)
    return manifest


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


def _int(value: object) -> int | None:
    if value is None:
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None


# --- the command -------------------------------------------------------------------------------------


@click.command("capture")
@click.option("--pid", "pids", type=int, multiple=True,
              help="A pid of the job on this node: the torchrun agent or any worker (repeatable).")
@click.option("--pattern", help="A regular expression over command lines; every job it matches is captured.")
@click.option("--slurm-job", help="A Slurm job id: the job's training processes on this node.")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Directory to write into (created; must not already hold a capture).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT_S, show_default=True,
              help="Seconds allowed for each tool call (each py-spy dump, nvidia-smi, ...).")
@click.option("--native/--no-native", default=True, show_default=True, help="Also dump native (C/C++) frames.")
@click.option("--flight-recorder", is_flag=True,
              help="Also trigger a Flight Recorder dump through each rank's TORCH_NCCL_DEBUG_INFO_PIPE_FILE pipe.")
@click.option("--node-context/--no-node-context", default=True, show_default=True,
              help="Also save nvidia-smi -q, nvidia-smi topo -m, dmesg since the job started and ibstat.")
@click.option("--py-spy", "py_spy", type=click.Path(dir_okay=False), help="The py-spy binary (default: found beside Python or on PATH).")
def capture(pids: tuple[int, ...], pattern: str | None, slurm_job: str | None, out: Path, timeout: float, native: bool,
            flight_recorder: bool, node_context: bool, py_spy: str | None) -> None:
    """Snapshot a hung job's processes on this node before it is killed; run it on every node.

    Writes py-spy stacks of every rank, the node's GPU / kernel / InfiniBand state and a manifest
    into OUT; `postmortem analyze` then reads OUT (put it inside the job's log directory to have
    both read together). The job is never signalled. Exit status: 0 if any rank was captured,
    2 if none.
    """
    if not pids and pattern is None and slurm_job is None:
        raise click.UsageError("choose the job: --pid PID (repeatable), --pattern REGEX or --slurm-job ID")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise click.BadParameter(f"not a regular expression: {exc}", param_hint="--pattern") from exc
    if (out / MANIFEST).exists():
        raise click.UsageError(f"{out} already holds a capture ({MANIFEST}); choose another --out (one per node)")
    manifest = run_capture(out, pids, pattern, slurm_job, timeout, native, flight_recorder, node_context, py_spy)
    _report(manifest, out)
    sys.exit(EXIT_CAPTURED if manifest["status"] == "captured" else EXIT_NOTHING_CAPTURED)


def _report(manifest: dict, out: Path) -> None:
    for note in manifest["notes"]:
        click.echo(f"note: {note['note']} ({', '.join(f'{k}={v}' for k, v in note.items() if k != 'note')})", err=True)
    processes = manifest["processes"]
    for path in manifest.get("process_manifests", []):
        processes = processes + json.loads((out / path).read_text(encoding="utf-8"))["processes"]
    for entry in processes:
        who = f"rank {entry['rank']}" if entry["rank"] is not None else f"pid {entry['pid']} (rank unknown)"
        line = f"{who:>22}  pid {entry['pid']:<8} {entry['status']:<9} {', '.join(entry['files']) or '-'}"
        if entry["reason"]:
            line += f"\n{'':>24}{entry['reason']}"
        click.echo(line)
    for record in manifest["node"]:
        click.echo(f"{record['call']:>22}  {record['status']:<9} {record.get('file') or record.get('reason', '')}")
    summary = manifest.get("summary", {})
    if not processes:
        click.echo("no training process selected on this node; nothing written", err=True)
        return
    if not summary.get("captured", 0) + summary.get("partial", 0):
        click.echo(f"nothing captured ({summary.get('failed', 0)} failed); manifest: {out / MANIFEST}", err=True)
        return
    click.echo(f"{summary.get('captured', 0)} captured, {summary.get('partial', 0)} partial, {summary.get('failed', 0)} failed; "
               f"manifest: {out / MANIFEST}; next: postmortem analyze {out}")
