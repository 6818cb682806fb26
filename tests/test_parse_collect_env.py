"""`python -m torch.utils.collect_env` output and pip listings as formats of their own, and the stack
versions the host facts take from them and from log lines (lines before and after each one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.facts.correlate import correlate
from analyzer.io import discover
from analyzer.facts.hostfacts import derive_host_facts, host_fact_records
from analyzer.parse import parse_inputs

OLD_LAYOUT = """Collecting environment information...
PyTorch version: 2.3.0+cu121
Is debug build: False
CUDA used to build PyTorch: 12.1
ROCM used to build PyTorch: N/A

OS: Ubuntu 22.04.3 LTS (x86_64)
Is CUDA available: True
CUDA runtime version: 12.1.105
GPU models and configuration:
GPU 0: NVIDIA H100 80GB HBM3
GPU 1: NVIDIA H100 80GB HBM3

Nvidia driver version: 535.104.05
cuDNN version: Probably one of the following:
/usr/lib/x86_64-linux-gnu/libcudnn.so.8.9.2

Versions of relevant libraries:
[pip3] numpy==1.26.4
[pip3] nvidia-nccl-cu12==2.20.5
[pip3] torch==2.3.0
[conda] Could not collect
"""

# The section layout of newer releases (as posted in vllm-project/vllm#28901).
NEW_LAYOUT = """Collecting environment information...
==============================
       PyTorch Info
==============================
PyTorch version              : 2.9.0+cu129
Is debug build               : False
CUDA used to build PyTorch   : 12.9
==============================
       CUDA / GPU Info
==============================
Is CUDA available            : True
CUDA runtime version         : 12.9.86
GPU models and configuration :
GPU 0: NVIDIA L20Y
Nvidia driver version        : 570.133.20
"""


def _job(tmp_path: Path, files: dict[str, str]) -> tuple[list, list[dict]]:
    job = tmp_path / "job"
    job.mkdir(parents=True)
    for name, text in files.items():
        (job / name).write_text(text, encoding="utf-8")
    inputs = discover(job)
    events, _ = correlate(parse_inputs(inputs), inputs)
    return inputs, events


def _facts(tmp_path, files) -> dict:
    _, events = _job(tmp_path, files)
    records = host_fact_records(derive_host_facts(events))
    assert len(records) == 1
    return records[0]


NCCL_LINE = "node-a:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"


@pytest.mark.parametrize("text", [OLD_LAYOUT, NEW_LAYOUT], ids=["old", "new"])
def test_collect_env_is_its_own_format(tmp_path, text):
    inputs, events = _job(tmp_path, {"env.txt": text})
    assert [(i.format, i.status) for i in inputs] == [("collect_env", "parsed")]
    assert set(events.get_column("kind").to_list()) == {"stack.version"}
    assert inputs[0].unparsed_lines > 0  # the lines that state no version are counted, not dropped silently


def test_collect_env_versions_become_host_facts(tmp_path):
    record = _facts(tmp_path, {"env.txt": OLD_LAYOUT, "rank0.log": NCCL_LINE})
    assert record["host"] == "node-a"
    assert record["torch_version"] == "2.3.0+cu121"
    assert record["cuda_runtime"] == "12.1"
    assert record["driver_version"] == "535.104.05"
    assert record["nccl_version"] == "2.20.5"
    assert record["cudnn_version"] == "8.9.2"
    assert record["gpu_model"] == "NVIDIA H100 80GB HBM3"


def test_new_layout_values(tmp_path):
    record = _facts(tmp_path, {"env.txt": NEW_LAYOUT, "rank0.log": NCCL_LINE})
    assert (record["torch_version"], record["cuda_runtime"], record["driver_version"]) == ("2.9.0+cu129", "12.9", "570.133.20")


def test_a_log_line_beats_the_listing(tmp_path):
    log = NCCL_LINE + "node-a:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
    record = _facts(tmp_path, {"env.txt": OLD_LAYOUT, "rank0.log": log})
    assert record["nccl_version"] == "2.21.5"


@pytest.mark.parametrize("text,fmt", [
    ("numpy==1.26.4\ntorch==2.3.0\nnvidia-nccl-cu12==2.18.1\ndeepspeed==0.14.0\n", "pip_freeze"),
    ("Package            Version\n------------------ -------\nnumpy              1.26.4\ntorch              2.3.0\nnvidia-nccl-cu12   2.18.1\ndeepspeed          0.14.0\n", "pip_freeze"),
], ids=["freeze", "list"])
def test_pip_listings(tmp_path, text, fmt):
    inputs, _ = _job(tmp_path / "alone", {"requirements.txt": text})
    assert inputs[0].format == fmt
    record = _facts(tmp_path / "with-log", {"requirements.txt": text, "rank0.log": NCCL_LINE})
    assert (record["torch_version"], record["nccl_version"], record["deepspeed_version"]) == ("2.3.0", "2.18.1", "0.14.0")


def test_a_plain_list_of_names_is_no_pip_listing(tmp_path):
    inputs, _ = _job(tmp_path, {"notes.txt": "numpy\ntorch\nthe run was fine\n"})
    assert inputs[0].format == "text"


@pytest.mark.parametrize("line,fact,value", [
    ("nv-fabricmanager[3228]: fabric manager NVIDIA GPU driver interface version 530.30.02 don't match with driver version 530.41.03. Please update with matching NVIDIA driver package.",
     "fabric_manager", "530.30.02"),
    ("nv-fabricmanager[3228]: fabric manager NVIDIA GPU driver interface version 530.30.02 don't match with driver version 530.41.03. Please update with matching NVIDIA driver package.",
     "driver_version", "530.41.03"),
    ("[2023-05-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: version=0.9.2, git-hash=unknown, git-branch=unknown",
     "deepspeed_version", "0.9.2"),
    ("node-a:100:100 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.7.4-aws", "aws_ofi_nccl", "1.7.4-aws"),
    ("PyTorch version: 2.3.1+cu118", "cuda_runtime", "11.8"),
    ("CUDA used to build PyTorch: 12.4", "cuda_runtime", "12.4"),
    ("| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |", "driver_version", "535.104.05"),
    ("| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |", "cuda_driver", "12.2"),
    ("node-a:100:100 [0] NCCL INFO cudaDriverVersion 12080", "cuda_driver", "12.8"),
])
def test_version_lines_in_a_log(tmp_path, line, fact, value):
    log = NCCL_LINE + "node-a:100:100 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n" + line + "\nTraining step 10 loss 1.2\n"
    assert _facts(tmp_path, {"rank0.log": log})[fact] == value


def test_lines_around_a_version_line_state_nothing(tmp_path):
    log = NCCL_LINE + "the fabric manager is running\nDeepSpeed info: none\n"
    record = _facts(tmp_path, {"rank0.log": log})
    assert record["fabric_manager"] is None and record["deepspeed_version"] is None
