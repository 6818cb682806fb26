"""Generate a job directory with what NCCL_DEBUG=INFO really prints at scale (one file per rank).

Modelled on what ../shared/perf/gen_logs.py writes, so the benchmark runs from a clone without it:
every rank initialises the world, tensor-, pipeline- and data-parallel communicators and, during
training, lazily created p2p and sub-group communicators, each with its `Trees` listing, one
`Channel NN/0 : a[b] -> c[d] via ...` connection line per channel and peer (about 40% of all lines),
rank 0's ring listings, `Init COMPLETE` and init timings. Training stdout is Megatron-, DeepSpeed-
and plain step lines; the tail is the watchdog cascade of a hang, C++ frames, a traceback on every
fourth rank and an `NET/IB` completion error on the culprit ranks. Deterministic for a seed.

    python bench/gen_nccl.py OUT --ranks 512 --mb 1024 [--nccl-frac 0.5] [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import random
import zlib
from multiprocessing import Pool
from pathlib import Path

GPUS = 8
BUS = ["18000", "2a000", "3a000", "5d000", "9a000", "ab000", "ba000", "db000"]
OPS = ["ALLREDUCE", "_ALLGATHER_BASE", "_REDUCE_SCATTER_BASE"]


def _ip(rank: int) -> str:
    node = rank // GPUS
    return f"10.1.{node // 250}.{node % 250 + 1}"


def members(kind: str, rank: int, world: int) -> list[int]:
    """Global ranks of the communicator of `kind` that `rank` belongs to (TP 8, PP 4, DP the rest)."""
    pp = 4 if world >= 32 else 1
    dp = max(world // (GPUS * pp), 1)
    stride = GPUS * dp
    if kind == "world":
        return list(range(world))
    if kind == "tp":
        base = rank // GPUS * GPUS
        return list(range(base, min(base + GPUS, world)))
    if kind == "pp":
        return [rank % stride + i * stride for i in range(pp)]
    if kind == "dp":
        block = rank // stride * stride
        return [block + rank % GPUS + i * GPUS for i in range(dp)]
    return sorted({rank, (rank + stride) % world})  # p2p: the next pipeline stage


class Rank:
    def __init__(self, rank: int, world: int, seed: int) -> None:
        self.rank, self.world, self.seed = rank, world, seed
        self.rng = random.Random(seed * 1_000_003 + rank)
        self.dev, self.host = rank % GPUS, f"node-{rank // GPUS}"
        self.pid = 40000 + rank * 37 % 20000
        self.out: list[str] = []
        self.nccl = self.other = 0
        self.comms = 0
        self.clock = 14 * 3600 + 120.0

    def nccl_line(self, line: str) -> None:
        self.out.append(line)
        self.nccl += len(line) + 1

    def line(self, line: str) -> None:
        self.out.append(line)
        self.other += len(line) + 1

    def stamp(self) -> str:
        self.clock += self.rng.random() * 0.01
        t = self.clock
        return f"1130 {int(t // 3600) % 24:02d}:{int(t // 60) % 60:02d}:{int(t % 60):02d}.{self.rng.randrange(10**9):09d}"

    def preamble(self) -> None:
        p, ip = f"{self.host}:{self.pid}:{self.pid} [{self.dev}] NCCL INFO ", _ip(self.rank)
        for body in (f"Bootstrap : Using eth0:{ip}<0>",
                     "NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation",
                     "cudaDriverVersion 12040", "NCCL version 2.21.5+cuda12.4",
                     f"NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; OOB eth0:{ip}<0>",
                     "Using non-device net plugin version 0", "Using network IB"):
            self.nccl_line(p + body)

    def comm_init(self, kind: str) -> None:
        rng, rank = self.rng, self.rank
        group = members(kind, rank, self.world)
        size, me = len(group), group.index(rank)
        self.comms += 1
        cid = random.Random(zlib.crc32(f"{self.seed}-{kind}-{group[0]}-{self.comms}".encode())).getrandbits(64)
        comm = 0x55D400000000 + rng.getrandbits(28) * 16
        p = f"{self.host}:{self.pid}:{self.pid + rng.randrange(100, 4000)} [{self.dev}] NCCL INFO "
        ident = f"rank {me} nranks {size} cudaDev {self.dev} nvmlDev {self.dev} busId {BUS[self.dev]} commId {cid:#x}"
        e = self.nccl_line
        e(f"{p}ncclCommInitRank comm {comm:#x} {ident} - Init START")
        e(f"{p}Setting affinity for GPU {self.dev} to ffffffff,00000000,ffffffff")
        nodes = len({m // GPUS for m in group})
        local = [m for m in group if m // GPUS == rank // GPUS]
        e(f"{p}comm {comm:#x} rank {me} nRanks {size} nNodes {nodes} localRanks {len(local)} localRank {local.index(rank)} MNNVL 0")
        channels = 1 if size == 1 else 32 if nodes == 1 else 16
        prev, nxt = group[(me - 1) % size], group[(me + 1) % size]
        up = group[(me - 1) // 2] if me else -1
        down = [group[i] if i < size else -1 for i in (2 * me + 1, 2 * me + 2)]
        e(p + "Trees " + " ".join(f"[{c}] {down[0]}/{down[1]}/-1->{me}->{up}" for c in range(channels)))
        e(f"{p}P2P Chunksize set to 131072")
        if me == 0:
            ring = "".join(f"{i:4d}" for i in range(size))
            for c in range(channels):
                e(f"{p}Channel {c:02d}/{channels:02d} :{ring}")
        same_next, same_prev = nxt // GPUS == rank // GPUS, prev // GPUS == rank // GPUS
        to_next, from_prev = f"{group.index(nxt)}[{nxt % GPUS}]", f"{group.index(prev)}[{prev % GPUS}]"
        mine = f"{me}[{self.dev}]"
        for c in range(channels):
            if same_next:
                e(f"{p}Channel {c:02d}/0 : {mine} -> {to_next} via P2P/IPC/read")
            else:
                e(f"{p}Channel {c:02d}/0 : {mine} -> {to_next} [send] via NET/IB/{self.dev % 4}/GDRDMA")
            if not same_prev:
                e(f"{p}Channel {c:02d}/0 : {from_prev} -> {mine} [receive] via NET/IB/{self.dev % 4}/GDRDMA")
        e(f"{p}Connected all rings")
        if same_prev:
            for c in range(channels):
                e(f"{p}Channel {c:02d}/0 : {mine} -> {from_prev} via P2P/IPC/read")
        e(f"{p}Connected all trees")
        e(f"{p}NVLS multicast support is not available on dev {self.dev}")
        e(f"{p}threadThresholds 8/8/64 | {8 * size}/8/64 | 512 | 512")
        e(f"{p}{channels} coll channels, {channels} collnet channels, 0 nvls channels, {channels} p2p channels, {max(1, channels // 16)} p2p channels per peer")
        e(f"{p}TUNER/Plugin: Plugin load returned 2 : libnccl-tuner.so: cannot open shared object file: No such file or directory : when loading libnccl-tuner.so")
        e(f"{p}TUNER/Plugin: Using internal tuner plugin.")
        e(f"{p}ncclCommInitRank comm {comm:#x} {ident} localSize 296 used 1218960 bytes on core {rng.randrange(96)}")
        e(f"{p}comm {comm:#x} {ident} - Init COMPLETE")
        total = rng.uniform(0.3, 4.0)
        e(f"{p}Init timings: rank {me} nranks {size} total {total:.2f} (kernels 0.12, alloc 0.01, bootstrap {total * 0.4:.2f}, "
          f"allgathers 0.02, topo {total * 0.2:.2f}, graphs 0.01, connections {total * 0.3:.2f}, rest 0.02)")

    def step(self, step: int) -> None:
        rng, r = self.rng, self.rank
        k, loss = rng.random(), 8.0 / (1 + step / 500) + rng.random() * 0.05
        if k < 0.62:
            self.line(f"[rank{r}]: step {step} loss {loss:.4f} step_time {0.38 + rng.random() * 0.08:.3f}s")
        elif k < 0.77:
            self.line(f"[rank{r}]:  iteration {step:8d}/   50000 | consumed samples: {step * 1024:12d} | elapsed time per iteration (ms): "
                      f"{380 + rng.random() * 80:.1f} | learning rate: {3e-4 * min(1, step / 2000):.3E} | global batch size:  1024 | "
                      f"lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {0.5 + rng.random():.3f} | number of skipped iterations:   0 | "
                      "number of nan iterations:   0 |")
        elif k < 0.87:
            self.line(f"[2024-11-30 14:{step // 60 % 60:02d}:{step % 60:02d},{rng.randrange(1000):03d}] [INFO] [logging.py:128:log_dist] "
                      f"[Rank {r}] step={step}, skipped=0, lr=[{3e-4 * min(1, step / 2000):.6g}], mom=[(0.9, 0.95)]")
        elif k < 0.91:
            self.line(f"[rank{r}]: /usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:464: UserWarning: torch.utils.checkpoint: "
                      "the use_reentrant parameter should be passed explicitly. In version 2.4 we will raise an exception if use_reentrant is not passed.")
            self.line(f"[rank{r}]:   warnings.warn(")
        elif k < 0.95:
            self.line(f"[rank{r}]: [{rng.randrange(100):3d}%] data loader worker {rng.randrange(8)} prefetched {rng.randrange(10000)} samples "
                      f"from shard-{rng.randrange(4096):05d}.tar")
        elif k < 0.98:
            self.line(f"[rank{r}]: throughput: {rng.uniform(100, 200):.2f} TFLOP/s/GPU, tokens/s: {rng.randrange(10**6, 10**7)}, mem: {rng.uniform(40, 79):.1f} GiB")
        else:
            self.line(f"[rank{r}]:[W{self.stamp()} ProcessGroupNCCL.cpp:4115] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS=1 has no effect for "
                      "point-to-point collectives. (function operator())")

    def crash(self, step: int, culprit: bool) -> None:
        rng, r = self.rng, self.rank
        if culprit:
            p, peer = f"{self.host}:{self.pid}:{self.pid + 911} [{self.dev}]", _ip((r + GPUS) % self.world)
            for _ in range(3):
                self.nccl_line(f"{p} transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer {peer}<{rng.randrange(40000, 60000)}> "
                               f"with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:{_ip(r)} remoteGids::ffff:{peer}")
                for tail in ("transport/net.cc:1302 -> 6", "proxy.cc:698 -> 6", "proxy.cc:878 -> 6 [Progress Thread]"):
                    self.nccl_line(f"{p} NCCL INFO {tail}")
        seq, op, numel = step + 1, rng.choice(OPS), rng.choice([262144000, 466119168, 9801523, 1])
        work = f"WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000)"
        pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
        e = self.line
        for s in (seq, seq + 1):
            e(f"[rank{r}]:[E{self.stamp()} ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: "
              f"WorkNCCL(SeqNum={s}, OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for {600000 + rng.randrange(200)} milliseconds before timing out.")
        e(f"[rank{r}]:[E{self.stamp()} ProcessGroupNCCL.cpp:1785] {pg} Exception (either an error or timeout) detected by watchdog at work: {seq}, "
          f"last enqueued NCCL work: {seq + 2}, last completed NCCL work: {seq - 1}.")
        e(f"[rank{r}]:[E{self.stamp()} ProcessGroupNCCL.cpp:1834] {pg} Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq + 2}, last completed NCCL work: {seq - 1}.")
        e(f"[rank{r}]:[E{self.stamp()} ProcessGroupNCCL.cpp:630] [Rank {r}] Some NCCL operations have failed or timed out. Due to the asynchronous "
          "nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")
        e(f"[rank{r}]:[E{self.stamp()} ProcessGroupNCCL.cpp:636] [Rank {r}] To avoid data inconsistency, we are taking the entire process down.")
        e(f"[rank{r}]:[E{self.stamp()} ProcessGroupNCCL.cpp:1595] {pg} Process group watchdog thread terminated with exception: [Rank {r}] "
          f"Watchdog caught collective operation timeout: {work} ran for 600083 milliseconds before timing out.")
        e("Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 (most recent call first):")
        lib = "/usr/local/lib/python3.10/dist-packages/torch/lib"
        for i, frame in enumerate((
            f"c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f3c2a9b5f86 in {lib}/libc10.so)",
            f"c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7f3be0c8a8d2 in {lib}/libtorch_cuda.so)",
            f"c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x7f3be0c91313 in {lib}/libtorch_cuda.so)",
            f"c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (0x7f3be0c92d2d in {lib}/libtorch_cuda.so)",
            "<unknown function> + 0xdc253 (0x7f3c2a2b0253 in /lib/x86_64-linux-gnu/libstdc++.so.6)",
            "<unknown function> + 0x94ac3 (0x7f3c2b8d1ac3 in /lib/x86_64-linux-gnu/libc.so.6)",
        )):
            e(f"frame #{i}: {frame}")
        e("")
        e("terminate called after throwing an instance of 'c10::DistBackendError'")
        if r % 4 == 0:
            for t in ("Traceback (most recent call last):", '  File "/workspace/train.py", line 412, in <module>', "    main()",
                      '  File "/workspace/train.py", line 211, in train_step', "    torch.distributed.all_reduce(grad_norm, group=dp_group)",
                      '  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/distributed_c10d.py", line 2501, in all_reduce',
                      "    work.wait()",
                      f"torch.distributed.DistBackendError: [Rank {r}] NCCL communicator was aborted on rank {r}. Original reason for failure was: "
                      f"[Rank {r}] Watchdog caught collective operation timeout: {work} ran for 600083 milliseconds before timing out."):
                e(f"[rank{r}]: {t}")
        if r % GPUS == 0:
            e(f"E1130 14:12:11.123000 {self.pid - 1} torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -6) "
              f"local_rank: {self.dev} (pid: {self.pid}) of binary: /usr/bin/python")

    def build(self, target: float, nccl_frac: float, culprit: bool) -> str:
        self.line(f"[rank{self.rank}]: Initializing torch.distributed with backend=nccl world_size={self.world} rank={self.rank} local_rank={self.dev}")
        self.preamble()
        big = self.world >= 32
        for kind in ["world", "tp", *(["pp", "dp"] if big else [])]:
            self.comm_init(kind)
        step = 0
        while self.nccl + self.other < target:
            # A communicator is created lazily whenever the NCCL share lags behind its target.
            if self.nccl < target * nccl_frac * min(1.0, (self.nccl + self.other) / (target * 0.9)):
                self.comm_init(self.rng.choice(["p2p", "p2p", "tp", "dp"] if big else ["p2p", "tp"]))
                continue
            for _ in range(50):
                step += 1
                self.step(step)
        self.crash(step, culprit)
        return "\n".join(self.out) + "\n"


def _write(job: tuple) -> int:
    rank, world, per_rank, nccl_frac, seed, out, culprits = job
    text = Rank(rank, world, seed).build(per_rank, nccl_frac, rank in culprits)
    Path(out, f"rank-{rank:05d}.log").write_text(text)
    return len(text)


def generate(out: Path, ranks: int, target_bytes: int, nccl_frac: float = 0.5, seed: int = 1, jobs: int = 2) -> Path:
    """Write `ranks` rank files totalling about `target_bytes` into `out`; returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    culprits = set(random.Random(seed).sample(range(ranks), max(1, ranks // 256)))
    work = [(r, ranks, target_bytes / ranks, nccl_frac, seed, str(out), culprits) for r in range(ranks)]
    with Pool(max(jobs, 1)) as pool:
        sum(pool.imap_unordered(_write, work, chunksize=4))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--nccl-frac", type=float, default=0.5, help="share of bytes that are NCCL lines")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(generate(args.out, args.ranks, int(args.mb * 2**20), args.nccl_frac, args.seed, args.jobs))


if __name__ == "__main__":
    main()
