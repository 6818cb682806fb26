"""Live capture (the process table): every process on this node, as /proc shows it.

Only the standard library is imported (see analyzer/capture/__init__.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MAX_ENVIRON_BYTES = 1 << 20

# torch.distributed launchers whose direct children are the workers (torchrun is a console script
# of torch.distributed.run; DeepSpeed's per-node launcher spawns workers the same way).
AGENT_MODULES = ("torch.distributed.run", "torch.distributed.launch", "deepspeed.launcher.launch")
AGENT_SCRIPTS = ("torchrun",)
_AGENT_FLAGS = frozenset({"standalone", "no_python", "module", "m", "run_path"})  # torchrun options without a value
_PYTHON_EXE = re.compile(r"^python[\d.]*(?:-dbg)?$")
# torch renames the main thread of its workers, and /proc/<pid>/comm follows the main thread.
_PYTHON_COMM = re.compile(r"^(?:python|pt_main_thread)")


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
            if arg == "-m" and argv[index + 1] in AGENT_MODULES:
                return True
        return any(os.path.basename(arg) in AGENT_SCRIPTS for arg in argv[:2])


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
