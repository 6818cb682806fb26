"""Build the drift fixtures from real recorded logs (test helper; see fixtures/drift/README.md).

`fixtures/drift/recorded/` holds a real two-node run (two torchrun agents, one GPU each, NCCL
over its socket transport) recorded on a 2x H200 host by `fixtures/drift/record.sh`: a healthy
run and one where rank 1 ran out of memory. Every variant here is that recording with host names,
addresses and version / model strings edited per node, nothing else: each line keeps NCCL's,
PyTorch's and nvidia-smi's own wording. The edits are listed in VARIANTS, one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "drift" / "recorded"
RECORDED_HOST = "vm"
RECORDED_ADDRESS = "192.0.2.2"


@dataclass(frozen=True)
class Node:
    directory: str  # where this node's logs are collected in the job directory
    host: str  # its host name in every NCCL prefix
    address: str  # its address on eth0 (documentation range)
    edits: tuple[tuple[str, str], ...] = ()  # (regex, replacement) applied to its console and nvidia-smi


@dataclass(frozen=True)
class Variant:
    recording: str  # "healthy" or "oom"
    nodes: tuple[Node, Node]
    note: str = field(default="")


_V100 = (
    # nvidia-smi's GPU row and memory column, keeping the table's width
    (r"NVIDIA H200(\s+)On", lambda m: "Tesla V100-SXM2-32GB" + " " * max(1, len(m.group(1)) - 9) + "On"),
    (r"(\s*)143771MiB", lambda m: " " * (len(m.group(1)) + 1) + "32768MiB"),
    # torch.cuda.get_device_properties
    (r"name='NVIDIA H200', major=9, minor=0, total_memory=143155MB", "name='Tesla V100-SXM2-32GB', major=7, minor=0, total_memory=32494MB"),
    # the OOM message of that rank, scaled to the smaller card
    (r"Tried to allocate 174\.75 GiB\. GPU 0 has a total capacity of 139\.80 GiB of which 138\.81 GiB is free",
     "Tried to allocate 39.66 GiB. GPU 0 has a total capacity of 31.73 GiB of which 30.74 GiB is free"),
)

VARIANTS: dict[str, Variant] = {
    "healthy": Variant("healthy", (Node("node-a", "node-a", "192.0.2.11"), Node("node-b", "node-b", "192.0.2.12"))),
    "nccl_version": Variant("healthy", (
        Node("node-a", "node-a", "192.0.2.11"),
        Node("node-b", "node-b", "192.0.2.12", ((r"NCCL version 2\.28\.9\+cuda13\.0", "NCCL version 2.27.7+cuda13.0"),)),
    ), "node-b runs an older NCCL"),
    "net_plugin": Variant("healthy", (
        # The HPC-X SHARP plugin line, verbatim as NCCL prints it (NVIDIA/nccl#952, #1634).
        Node("node-a", "node-a", "192.0.2.11", ((r"NET/Plugin: Could not find: libnccl-net\.so",
                                                 "Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"),)),
        Node("node-b", "node-b", "192.0.2.12"),
    ), "node-a loads the HPC-X net plugin, node-b does not"),
    "gpu_models": Variant("oom", (
        Node("node-a", "node-a", "192.0.2.11"),
        Node("node-b", "node-b", "192.0.2.12", _V100),
    ), "node-b carries a V100 32 GB, and its rank is the one that ran out of memory"),
    "cuda_driver": Variant("healthy", (
        Node("node-a", "node-a", "192.0.2.11", ((r"cudaDriverVersion 13000", "cudaDriverVersion 13010"),
                                                 (r"Driver Version: 580\.159\.04", "Driver Version: 590.44.01 "),
                                                 (r"CUDA Version: 13\.0", "CUDA Version: 13.1"))),
        Node("node-b", "node-b", "192.0.2.12"),
    ), "node-b's driver is one CUDA minor version behind node-a's"),
    "identical_hostnames": Variant("healthy", (
        Node("machine-1", "trainer", "192.0.2.11"),
        Node("machine-2", "trainer", "192.0.2.12"),
    ), "two machines both named 'trainer' (containers started with the same --hostname)"),
}


def build(name: str, dest: Path) -> Path:
    """Write variant `name` as a job directory under `dest` and return it."""
    variant = VARIANTS[name]
    job = dest / name
    for index, node in enumerate(variant.nodes):
        directory = job / node.directory
        directory.mkdir(parents=True, exist_ok=True)
        sources = {
            "console.log": (RECORDED / variant.recording / f"console_node{index}.log").read_text(encoding="utf-8"),
            "nvidia-smi.txt": (RECORDED / "nvidia-smi.txt").read_text(encoding="utf-8"),
        }
        edited = {target: _rename(text, node) for target, text in sources.items()}
        for pattern, replacement in node.edits:
            matched = 0
            for target, text in edited.items():
                edited[target], count = re.subn(pattern, replacement, text)
                matched += count
            if matched == 0:
                raise ValueError(f"edit {pattern!r} matched nothing: the recording changed")
        for target, text in edited.items():
            (directory / target).write_text(text, encoding="utf-8")
    return job


def _rename(text: str, node: Node) -> str:
    # The host name as NCCL prints it: `vm:646:646 [0] NCCL ...` (also after a `[timestamp] `).
    text = re.sub(rf"\b{RECORDED_HOST}:(\d+:\d+ \[)", rf"{node.host}:\1", text)
    return text.replace(f"{RECORDED_ADDRESS}<", f"{node.address}<")
