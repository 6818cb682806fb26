"""A 3-rank gloo job on the CPU that hangs the classic way, for the `postmortem capture` test.

    python -m torch.distributed.run --nproc-per-node 3 gloo_hang_job.py READY_DIR

Rank 1 stalls in `load_shard()` (a sleep standing in for a read from a wedged filesystem) while
ranks 0 and 2 go on into `dist.all_reduce` and wait there for it; the process-group timeout is
long, so nothing times out while the test captures. Each rank writes READY_DIR/rank<R>.ready just
before it blocks, so the test knows when the hang is in place. The job never ends on its own
before HANG_S; the test kills it.
"""

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

HANG_S = 300


def load_shard(rank: int, ready: Path) -> torch.Tensor:
    if rank == 1:
        (ready / f"rank{rank}.ready").write_text(str(os.getpid()))
        time.sleep(HANG_S)
    return torch.full((8,), float(rank))


def sync_gradients(rank: int, grads: torch.Tensor, ready: Path) -> None:
    (ready / f"rank{rank}.ready").write_text(str(os.getpid()))
    dist.all_reduce(grads)


def main() -> None:
    ready = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=timedelta(seconds=HANG_S))
    rank = dist.get_rank()
    print(f"rank {rank} of {dist.get_world_size()}: pid {os.getpid()}, starting step 0", flush=True)
    grads = load_shard(rank, ready)
    sync_gradients(rank, grads, ready)
    print(f"rank {rank}: step 0 done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
