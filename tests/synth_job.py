"""Write a synthetic hung job of any size, for the HTML report's scale tests and benchmark.

The shape is the classic large-job hang: every rank initialises NCCL, rank 0 logs training steps,
then every rank but one times out in ALLREDUCE #`seq` while the culprit last enqueued `seq - 1`
(it never arrived). One rank on the side logs an NCCL warning whose text carries a script tag, so
the report's escaping is exercised at scale too. One file per host, 8 ranks per host, the way a
Slurm per-node output looks; lines are written exactly as PyTorch and NCCL print them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SCRIPT_TAG = "<script>alert(1)</script>"
RANKS_PER_HOST = 8


@dataclass(frozen=True)
class SynthJob:
    path: Path
    world: int
    culprit: int
    odd: int  # the rank with the extra warning
    seq: int


def _c10d_time(second: int, micro: int) -> str:
    minute, sec = divmod(second, 60)
    return f"1130 14:{minute % 60:02d}:{sec:02d}.{micro:06d}000"


def write_job(dest: Path, world: int, culprit: int | None = None, seq: int = 35) -> SynthJob:
    culprit = (world * 3) // 4 + 1 if culprit is None else culprit
    odd = 5 if culprit != 5 else 6
    dest.mkdir(parents=True, exist_ok=True)
    hosts = (world + RANKS_PER_HOST - 1) // RANKS_PER_HOST
    for h in range(hosts):
        host = f"gpu-{h:05d}"
        lines: list[str] = []
        ranks = range(h * RANKS_PER_HOST, min(world, (h + 1) * RANKS_PER_HOST))
        for r in ranks:
            local = r % RANKS_PER_HOST
            pid = 10000 + r
            lines.append(
                f"{host}:{pid}:{pid} [{local}] NCCL INFO ncclCommInitRankConfig comm 0x{0x1000 + r:x} rank {r} "
                f"nranks {world} cudaDev {local} nvmlDev {local} busId {local}0 commId 0xabc - Init COMPLETE"
            )
        if h == 0:
            for step in range(1, 4):
                lines.append(f"[rank0]: step {step * 100} loss {2.5 - step * 0.1:.3f}")
        if odd in ranks:
            pid = 10000 + odd
            lines.append(f"{host}:{pid}:{pid + 7} [{odd % RANKS_PER_HOST}] NCCL WARN NET/IB : peer said {SCRIPT_TAG}")
        for r in ranks:
            jitter = (r * 7919) % 900_000
            stamp = _c10d_time(41 + jitter // 1_000_000, jitter % 1_000_000)
            if r == culprit:
                lines.append(
                    f"[rank{r}]:[E{_c10d_time(47, r % 1000)} ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
                    f"Received a dump signal due to a collective timeout from  rank 0 and we will try our best to dump the "
                    f"debug info. Last enqueued NCCL work: {seq - 1}, last completed NCCL work: {seq - 1}."
                )
                continue
            lines.append(
                f"[rank{r}]:[E{stamp} ProcessGroupNCCL.cpp:689] [Rank {r}] Watchdog caught collective operation timeout: "
                f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for "
                f"600068 milliseconds before timing out."
            )
            lines.append(
                f"[rank{r}]:[E{stamp} ProcessGroupNCCL.cpp:2303] [PG ID 0 PG GUID 0(default_pg) Rank {r}]  failure detected "
                f"by watchdog at work sequence id: {seq} PG status: last enqueued work: {seq}, last completed work: {seq - 1}"
            )
        (dest / f"{host}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return SynthJob(dest, world, culprit, odd, seq)
