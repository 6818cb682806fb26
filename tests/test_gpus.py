"""Physical GPU identity (analyzer/facts/gpus.py): the culprits' GPUs as the logs print them, never a
logical index taken for a physical one."""

from __future__ import annotations

import json
from pathlib import Path

from analyzer.api import SCHEMA_VERSION, analyze
from analyzer.facts.correlate import correlate
from analyzer.events import events_from_records
from analyzer.facts.gpus import LOGICAL_ONLY, gpu_label, rank_gpus

ROOT = Path(__file__).resolve().parent.parent

_WATCHDOG = ("[rank0]:[E1130 16:54:08.201000 2074 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation"
             " timeout: WorkNCCL(SeqNum=20, OpType=ALLREDUCE, NumelIn=1049600, NumelOut=1049600, Timeout(ms)=25000) ran for"
             " 25001 milliseconds before timing out.")
_RAISES = ('Traceback (most recent call last):\n  File "train.py", line 10, in <module>\n    collate_batch()\n'
           "ValueError: sample 4711 in shard 1: expected sequence length 1024, got 0 (corrupt record)\n")


def _comm(pid: int, rank: int, device: str) -> str:
    return f"vm:{pid}:{pid} [0] NCCL INFO ncclCommInitRankConfig comm 0x4{rank}5c95a0 rank {rank} nranks 2 {device} commId 0x48 - Init COMPLETE\n"


def _job(tmp_path: Path, rank1_head: str, rank0_device: str = "cudaDev 0 nvmlDev 0 busId 1a000") -> Path:
    """Two ranks, one GPU visible to each: rank 1 raises, rank 0 waits until its watchdog fires."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.log").write_text("CUDA_VISIBLE_DEVICES=0\n" + _comm(2074, 0, rank0_device) + _WATCHDOG + "\n")
    (job / "rank1.log").write_text(rank1_head + _RAISES)
    return job


def _culprit(job: Path) -> list[dict]:
    report = analyze(job).report
    assert report["verdict"]["culprit_ranks"] == [1]
    return report["verdict"]["culprit_gpus"]


def test_the_culprits_gpu_is_the_physical_one_under_cuda_visible_devices(tmp_path):
    """`CUDA_VISIBLE_DEVICES=1`: NCCL's cudaDev 0 is nvmlDev 1, bus 0000:1b:00.0; never `gpu0`."""
    job = _job(tmp_path, "CUDA_VISIBLE_DEVICES=1\n" + _comm(2075, 1, "cudaDev 0 nvmlDev 1 busId 1b000"))
    [gpu] = _culprit(job)
    assert (gpu["host"], gpu["gpu"], gpu["bus_id"], gpu["logical_device"], gpu["rank"]) == ("vm", "1", "0000:1b:00.0", 0, 1)
    assert gpu["source"].startswith("NCCL comm init") and "rank1.log:" in gpu["source"]
    assert gpu_label(gpu) == "vm/gpu1"


def test_without_nvmldev_the_visible_devices_list_maps_the_logical_index(tmp_path):
    """Older NCCL prints `cudaDev 0 busId 1b000` only: CUDA_VISIBLE_DEVICES=3,1 makes logical 1 physical 1;
    an nvidia-smi -L line of the host adds the UUID (joined by the physical index)."""
    smi = "GPU 1: NVIDIA H200 (UUID: GPU-1b502f77-33de-897e-ff25-4e03b1bc157c)\n"
    job = _job(tmp_path, "CUDA_VISIBLE_DEVICES=3,1\n" + _comm(2075, 1, "cudaDev 1 busId 1b000").replace("[0]", "[1]") + "vm:2075:2075 [1] NCCL INFO " + smi)
    [gpu] = _culprit(job)
    assert (gpu["gpu"], gpu["bus_id"], gpu["logical_device"]) == ("1", "0000:1b:00.0", 1)
    assert gpu["uuid"] == "GPU-1b502f77-33de-897e-ff25-4e03b1bc157c"
    assert "CUDA_VISIBLE_DEVICES (rank1.log:1)" in gpu["source"] and "nvidia-smi -L" in gpu["source"]


def test_a_gpu_known_only_by_its_logical_index_says_so(tmp_path):
    """No busId, nvmlDev, visible-devices list or nvidia-smi: the process's own index, marked logical only."""
    job = _job(tmp_path, "vm:2075:2075 [1] NCCL INFO Bootstrap: Using eth0:192.0.2.2<0>\n")
    [gpu] = _culprit(job)
    assert (gpu["gpu"], gpu["bus_id"], gpu["uuid"], gpu["logical_device"], gpu["source"]) == (None, None, None, 1, LOGICAL_ONLY)
    assert gpu_label(gpu) == "vm/cuda1 (logical only)"


def test_a_one_culprit_straggler_lists_only_its_gpu():
    """Recorded: rank 1 of two on one host is slow; the host's other GPU (rank 0's) is not listed."""
    report = analyze(ROOT / "fixtures" / "recorded" / "slow_rank_traced" / "job").report
    assert report["verdict"]["culprit_ranks"] == [1]
    assert [(g["gpu"], g["bus_id"], g["rank"]) for g in report["verdict"]["culprit_gpus"]] == [("1", "0000:00:07.0", 1)]


def test_rank_gpus_joins_nvidia_smi_by_bus_id():
    """The nvidia-smi table row (index and `00000000:1B:00.0`) names the GPU NCCL saw at busId 1b000."""
    def event(line, **fields):
        return {"file": "n.log", "line": line, "source": "text", "kind": "log.line", "text": "", "host": "vm", **fields}

    events = events_from_records([
        event(1, kind="nccl.comm_init", rank=0, pid=5, device=0, peer="1b000", nranks=1, pg_rank=0,
              message="comm 0x1 rank 0 nranks 1 cudaDev 0 busId 1b000 - Init COMPLETE"),
        event(2, file="nvidia-smi.txt", message="|   4  NVIDIA H200     On  |   00000000:1B:00.0 Off |        0 |"),
    ])
    attributed, _ = correlate(events, [])
    [row] = rank_gpus(attributed).to_dicts()
    assert (row["gpu"], row["bus_id"], row["logical_device"]) == ("4", "0000:1b:00.0", 0)
    assert "nvidia-smi (nvidia-smi.txt:2)" in row["source"]


def test_the_schema_documents_this_version():
    schema = json.loads((ROOT / "schema" / "report.schema.json").read_text())
    assert f"documents {SCHEMA_VERSION})" in schema["description"]
    assert "culprit_gpus" in schema["properties"]["verdict"]["properties"]
    assert {"world_size_source", "time_span", "facts_conflicts"} <= set(schema["properties"]["job"]["properties"])

