"""Generate realistic job directories for benchmarks: torchrun `--log-dir` layout, one host per 8 ranks.

Every rank gets NCCL INFO init output for several communicators (real line shapes of NCCL 2.21-2.28),
training-step log lines, and at the end the failure of a hang: rank `culprit` stops logging while
all others print the ProcessGroupNCCL watchdog cascade of PyTorch 2.4+, and the agent prints its
ChildFailedError table. Lines are taken from the formats in shared/FORMATS.md.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

RANKS_PER_HOST = 8


def _host_ip(rank: int) -> str:
    node = rank // RANKS_PER_HOST
    return f"10.0.{node // 250}.{node % 250 + 1}"


def _nccl_init(host: str, pid: int, local: int, rank: int, world: int, comm: str, rng: random.Random) -> list[str]:
    p = f"{host}:{pid}:{pid} [{local}] NCCL INFO "
    t = f"{host}:{pid}:{pid + 40} [{local}] NCCL INFO "
    bus = f"{(local + 1) * 16:x}000"
    lines = [
        p + "cudaDriverVersion 12080",
        p + "Bootstrap: Using eth0:%s<0>" % _host_ip(rank),
        p + "NCCL version 2.21.5+cuda12.4",
        t + "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
        t + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:%s<0>" % _host_ip(rank),
        t + "Using network IB",
        t + f"ncclCommInitRank comm {comm} rank {rank} nranks {world} cudaDev {local} nvmlDev {local} busId {bus} commId 0x{rng.getrandbits(64):016x} - Init START",
        t + "NCCL_IB_TIMEOUT set by environment to 22.",
        t + f"comm {comm} rank {rank} nRanks {world} nNodes {max(world // RANKS_PER_HOST, 1)} localRanks {RANKS_PER_HOST} localRank {local} MNNVL 0",
        t + f"Trees [0] {(rank + 1) % world}/-1/-1->{rank}->{(rank - 1) % world} [1] {(rank + 1) % world}/-1/-1->{rank}->{(rank - 1) % world}",
        t + "P2P Chunksize set to 524288",
    ]
    for channel in range(24):
        peer = (rank + 1) % world
        if peer // RANKS_PER_HOST == rank // RANKS_PER_HOST:
            lines.append(t + f"Channel {channel:02d}/0 : {rank}[{local}] -> {peer}[{peer % RANKS_PER_HOST}] via P2P/CUMEM/read")
        else:
            lines.append(t + f"Channel {channel:02d}/0 : {rank}[{local}] -> {peer}[{peer % RANKS_PER_HOST}] [send] via NET/IB/0/GDRDMA")
    lines += [
        t + "Connected all rings, use ring PXN 0 GDR 1",
        t + "Connected all trees",
        t + "threadThresholds 8/8/64 | 64/8/64 | 512 | 512",
        t + "24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer",
        t + f"ncclCommInitRank comm {comm} rank {rank} nranks {world} cudaDev {local} nvmlDev {local} busId {bus} commId 0x{rng.getrandbits(64):016x} - Init COMPLETE",
        t + f"Init timings - ncclCommInitRank: rank {rank} nranks {world} total 0.62 (kernels 0.21, alloc 0.08, bootstrap 0.15, allgathers 0.00, topo 0.02, graphs 0.00, connections 0.12, rest 0.04)",
    ]
    return lines


def _steps(rank: int, steps: int, rng: random.Random) -> list[str]:
    out = []
    for step in range(steps):
        out.append(
            f"2026-11-30 03:{(step // 60) % 60:02d}:{step % 60:02d},{rng.randrange(1000):03d} - INFO - train.py:212 - "
            f"[rank{rank}] step {step}/100000 loss {rng.uniform(1.5, 3.0):.4f} lr 3.0e-04 grad_norm {rng.uniform(0.1, 2):.3f} "
            f"tokens/s {rng.randrange(90000, 110000)} mem 61.2GiB"
        )
    return out


def _watchdog(rank: int, seq: int) -> list[str]:
    pre = f"[rank{rank}]:[E1130 03:59:41.704937190 ProcessGroupNCCL.cpp:"
    return [
        pre + f"689] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1049600, NumelOut=1049600, Timeout(ms)=600000) ran for 600068 milliseconds before timing out.",
        pre + f"2303] [PG ID 0 PG GUID 0(default_pg) Rank {rank}]  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, last completed work: {seq - 1}",
        pre + f"750] [Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        pre + f"764] [Rank {rank}] To avoid data inconsistency, we are taking the entire process down.",
        pre + f"2119] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group watchdog thread terminated with exception: [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1049600, NumelOut=1049600, Timeout(ms)=600000) ran for 600068 milliseconds before timing out.",
        "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:692 (most recent call first):",
        "frame #0: c10::Error::Error(c10::SourceLocation, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >) + 0x9d (0x7fba23b7305d in /opt/torch/lib/libc10.so)",
        "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x2a7 (0x7fb96f102ba7 in /opt/torch/lib/libtorch_cuda.so)",
        "frame #2: c10d::ProcessGroupNCCL::Watchdog::runLoop() + 0x17b1 (0x7fb96f107fc1 in /opt/torch/lib/libtorch_cuda.so)",
        "",
    ]


def generate(root: Path, ranks: int, target_bytes: int, culprit: int = 1, seed: int = 0) -> Path:
    """Write a job of `ranks` ranks totalling about `target_bytes`; returns the job directory."""
    rng = random.Random(seed)
    job = root / f"job-{ranks}r-{target_bytes >> 20}mb" / "none_bench0000" / "attempt_0"
    per_rank = max(target_bytes // ranks, 4096)
    step_line = len(_steps(0, 1, rng)[0]) + 1
    comms = [f"0x{0x55d8db252140 + i * 0x1000:x}" for i in range(3)]
    seq = 35
    for rank in range(ranks):
        host, local = f"node{rank // RANKS_PER_HOST:04d}", rank % RANKS_PER_HOST
        pid = 10000 + rank
        init = [line for comm in comms for line in _nccl_init(host, pid, local, rank, ranks, comm, rng)]
        tail = _watchdog(rank, seq) if rank != culprit else ["[rank%d] loading shard 17 of 64" % rank]
        budget = per_rank - sum(len(x) + 1 for x in init + tail)
        steps = max(budget // step_line, 1)
        rank_dir = job / str(rank)
        rank_dir.mkdir(parents=True, exist_ok=True)
        (rank_dir / "stdout.log").write_text("\n".join(init) + "\n")
        (rank_dir / "stderr.log").write_text("\n".join(_steps(rank, steps, rng) + tail) + "\n")
    return job.parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    print(generate(args.out, args.ranks, args.mb << 20))


if __name__ == "__main__":
    main()
