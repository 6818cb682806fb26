"""Live capture (jobs): which processes are training ranks, the job each belongs to, and which to capture.

`build_tree` finds the workers (one per rank) and their helpers from the environment and the
process tree; `select` picks the jobs that the given pids, pattern or Slurm job id point at.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from analyzer.bounds import int64
from analyzer.capture.processes import AGENT_MODULES, AGENT_SCRIPTS, Proc

MAX_LISTED = 50  # excluded / matched-but-ignored processes listed in the manifest

_AGENT_FLAGS = frozenset({"standalone", "no_python", "module", "m", "run_path"})  # torchrun options without a value
# Rank variables set by torch.distributed launchers (strong: the process is a torch worker) and by
# MPI / Slurm launchers (weak: also set on wrappers and on torchrun itself under srun).
_TORCH_RANK_VARS = ("RANK", "LOCAL_RANK")
_LAUNCHER_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_LAUNCHER_LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")


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
    rank, source = int64(env.get("RANK")), "environ:RANK"
    local = int64(env.get("LOCAL_RANK"))
    if rank is None and launcher is None:
        # MPI / Slurm ranks count only without a torch launcher in between (under srun, torchrun
        # and its workers all inherit the node's SLURM_PROCID).
        var = next((v for v in _LAUNCHER_RANK_VARS if int64(env.get(v)) is not None), None)
        rank, source = (int64(env.get(var)), f"environ:{var}") if var else (None, "unknown")
    if local is None and launcher is None:
        local = next((int64(env.get(v)) for v in _LAUNCHER_LOCAL_VARS if int64(env.get(v)) is not None), None)
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
    nproc = int64(args.get("nproc_per_node"))
    if "standalone" in args or args.get("nnodes") in ("1", "1:1"):
        return local, "torchrun tree (single node: rank = local rank)"
    node_rank = int64(args.get("node_rank"))
    if nproc is not None and node_rank is not None and args.get("rdzv_backend", "static") == "static":
        return node_rank * nproc + local, "torchrun tree (static rendezvous: node_rank * nproc_per_node + local rank)"
    return None, "unknown (local rank only)"


def _agent_args(argv: tuple[str, ...]) -> dict[str, str]:
    """torchrun's own options: from after `torchrun` / `-m torch.distributed.run` to the training script."""
    start = next(
        (i + 1 for i, arg in enumerate(argv) if arg in AGENT_MODULES or os.path.basename(arg) in AGENT_SCRIPTS), len(argv)
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
            rank = int64(env.get("RANK"))
            lone.append(Worker(pid, rank, int64(env.get("LOCAL_RANK")), "environ:RANK" if rank is not None else "unknown",
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
