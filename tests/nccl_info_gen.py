"""What NCCL_DEBUG=INFO prints while communicators are set up, at a chosen scale (tests, bench).

Modelled on NCCL 2.18-2.21 output (and on ../shared/perf/gen_logs.py): per communicator each rank
prints `Init START`, its `nRanks nNodes` line, the tree and ring listings, then one connection
line per channel and peer (`Channel 03/0 : 2[2] -> 3[3] via P2P/IPC/read`, `[send] via
NET/IB/0/GDRDMA` across nodes, a `[receive]` line from the previous rank), `Connected all rings`
and `Init COMPLETE`. Channel lines are most of the volume; what a connection says does not depend
on the channel, which is what the parser's aggregation relies on.
"""

from __future__ import annotations

from pathlib import Path

GPUS_PER_NODE = 8


def rank_lines(rank: int, nranks: int, *, communicators: int, channels: int) -> list[str]:
    """Lines one rank prints for `communicators` world-sized communicators of `channels` channels."""
    host, dev, pid = f"node-{rank // GPUS_PER_NODE}", rank % GPUS_PER_NODE, 4000 + rank
    nnodes = (nranks + GPUS_PER_NODE - 1) // GPUS_PER_NODE
    nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
    lines = [f"{host}:{pid}:{pid} [{dev}] NCCL INFO NCCL version 2.21.5+cuda12.4"]
    for c in range(communicators):
        comm = f"0x55d4{c:04x}{rank:06x}"
        p = f"{host}:{pid}:{pid + 100 + c} [{dev}] NCCL INFO "
        lines += [
            f"{p}ncclCommInitRank comm {comm} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {dev} busId {dev}a000 commId 0x{c:016x} - Init START",
            f"{p}comm {comm} rank {rank} nRanks {nranks} nNodes {nnodes} localRanks {min(nranks, GPUS_PER_NODE)} localRank {dev} MNNVL 0",
            p + "Trees " + " ".join(f"[{ch}] -1/-1/-1->{rank}->{prv}" for ch in range(channels)),
        ]
        lines += [f"{p}Channel {ch:02d}/{channels:02d} :" + "".join(f"{r:4d}" for r in range(nranks)) for ch in range(channels)]
        for ch in range(channels):
            if nxt // GPUS_PER_NODE == rank // GPUS_PER_NODE:
                lines.append(f"{p}Channel {ch:02d}/0 : {rank}[{dev}] -> {nxt}[{nxt % GPUS_PER_NODE}] via P2P/IPC/read")
            else:
                lines.append(f"{p}Channel {ch:02d}/0 : {rank}[{dev}] -> {nxt}[{nxt % GPUS_PER_NODE}] [send] via NET/IB/{dev % 4}/GDRDMA")
            if prv // GPUS_PER_NODE != rank // GPUS_PER_NODE:
                lines.append(f"{p}Channel {ch:02d}/0 : {prv}[{prv % GPUS_PER_NODE}] -> {rank}[{dev}] [receive] via NET/IB/{dev % 4}/GDRDMA")
        lines += [
            f"{p}Connected all rings",
            f"{p}comm {comm} rank {rank} nranks {nranks} cudaDev {dev} nvmlDev {dev} busId {dev}a000 commId 0x{c:016x} - Init COMPLETE",
        ]
    return lines


def write_job(job: Path, nranks: int, *, communicators: int, channels: int) -> Path:
    """One log per rank (`rank-N.log`) under `job`."""
    job.mkdir(parents=True, exist_ok=True)
    for rank in range(nranks):
        text = "\n".join(rank_lines(rank, nranks, communicators=communicators, channels=channels)) + "\n"
        (job / f"rank-{rank}.log").write_text(text)
    return job


REPEATED_CHANNEL_LINE = "node-0:4000:4000 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"


def write_repeated_line(path: Path, size: int, line: str = REPEATED_CHANNEL_LINE) -> Path:
    """A log of one kept NCCL INFO line repeated to about `size` bytes (issue 18's amplification)."""
    block = ((line + "\n") * 4096).encode()
    with open(path, "wb") as fh:
        for _ in range(max(1, size // len(block))):
            fh.write(block)
    return path
