"""The per-host facts table (analyzer/facts/hostfacts.py): what each host and rank ran on."""

import polars as pl
import pytest

from analyzer.api import analyze
from analyzer.events import events_from_records
from analyzer.facts.hostfacts import (
    UNSET,
    address_clashes,
    fact_table,
    host_fact_records,
    derive_host_facts,
    observations,
    transport_pairs,
)
from analyzer.facts.correlate import correlate
from tests.driftgen import build


def nccl_process(host, pid, rank, nranks, *, version="2.18.3+cuda12.2", driver=12020, env=(), plugin=None, address=None):
    """The init lines one NCCL process prints at NCCL_DEBUG=INFO (2.18-era wording)."""
    p = f"{host}:{pid}:{pid} [{rank % 8}] NCCL INFO"
    address = address or f"10.0.0.{sum(map(ord, host)) % 250}"  # one address per machine
    lines = [
        f"{p} Bootstrap : Using eth0:{address}<0>",
        f"{p} cudaDriverVersion {driver}",
        f"{p} NCCL version {version}",
        f"{p} NET/Plugin : Plugin Path : {plugin}" if plugin else f"{p} NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
        *[f"{p} {name} set by environment to {value}" for name, value in env],
        f"{p} NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:{address}<0>",
        f"{p} Using network IB",
        f"{p} comm 0x{pid:x} rank {rank} nranks {nranks} cudaDev {rank % 8} busId {(rank % 8) * 4096 + 4096:x} - Init COMPLETE",
    ]
    return lines


def write_job(tmp_path, per_host):
    for host, lines in per_host.items():
        (tmp_path / f"{host}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return analyze(tmp_path)


def records(rows):
    """Events built directly (for sources the text parser does not keep yet), with event ids."""
    base = {"source": "text", "severity": "info", "line": 1}
    frame = events_from_records([{**base, **row} for row in rows])
    return frame.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))


def by_host(result):
    return {r["host"]: r for r in result.report["job"]["host_facts"]}


def test_facts_of_a_real_two_node_run(tmp_path):
    result = analyze(build("healthy", tmp_path))
    hosts = by_host(result)
    assert sorted(hosts) == ["node-a", "node-b"]
    for host, rank, address in (("node-a", 0, "192.0.2.11"), ("node-b", 1, "192.0.2.12")):
        facts = hosts[host]
        assert facts["ranks"] == [rank]
        assert facts["addresses"] == [f"eth0:{address}"]
        assert (facts["nccl_version"], facts["nccl_build"]) == ("2.28.9", "cuda13.0")
        assert (facts["net_plugin"], facts["network"], facts["nics"]) == ("internal", "Socket", "eth0")
        assert facts["transports"] == "NET/Socket"
        assert facts["cuda_driver"] == "13.0"
        assert facts["env"]["NCCL_NVLS_ENABLE"] == "0"
        # NCCL_HOSTID names each node by design: shown, never marked.
        assert facts["env"]["NCCL_HOSTID"].startswith("drift-node")
        assert facts["differs"] == [] and facts["per_rank"] == [] and facts["duplicate_name"] is False


def test_fact_table_is_a_frame_with_the_differing_cells_named(tmp_path):
    events = analyze(build("nccl_version", tmp_path)).events
    table = fact_table(derive_host_facts(events))
    assert isinstance(table, pl.DataFrame)
    assert table.get_column("host").to_list() == ["node-a", "node-b"]
    assert table.get_column("nccl_version").to_list() == ["2.28.9", "2.27.7"]
    assert table.get_column("differs").to_list() == [["nccl_version"], ["nccl_version"]]
    assert "env.NCCL_NVLS_ENABLE" in table.columns


def test_majority_value_is_not_marked(tmp_path):
    result = write_job(tmp_path, {
        f"n{i}": nccl_process(f"n{i}", 100 + i, i, 3, version="2.19.3+cuda12.2" if i == 2 else "2.18.3+cuda12.2")
        for i in range(3)
    })
    hosts = by_host(result)
    assert hosts["n2"]["differs"] == ["nccl_version"]
    assert hosts["n0"]["differs"] == hosts["n1"]["differs"] == []


def test_unset_variables_and_ranks_that_disagree_within_a_host(tmp_path):
    lines = [
        *nccl_process("h", 10, 0, 4, env=[("NCCL_SOCKET_IFNAME", "eth0")]),
        *nccl_process("h", 11, 1, 4, env=[("NCCL_SOCKET_IFNAME", "eth0")]),
        *nccl_process("h", 12, 2, 4, env=[("NCCL_SOCKET_IFNAME", "eth0")]),
        *nccl_process("h", 13, 3, 4, env=[("NCCL_SOCKET_IFNAME", "eth0"), ("NCCL_P2P_DISABLE", "1.")]),
    ]
    result = write_job(tmp_path, {"h": lines})
    facts = by_host(result)["h"]
    assert facts["env"]["NCCL_P2P_DISABLE"] == f"{UNSET} | 1"
    assert facts["differs"] == ["env.NCCL_P2P_DISABLE"]
    assert [(r["rank"], r["env"]["NCCL_P2P_DISABLE"]) for r in facts["per_rank"]] == [(0, UNSET), (1, UNSET), (2, UNSET), (3, "1")]


def test_a_loaded_plugin_outranks_the_not_found_line_of_the_same_process(tmp_path):
    lines = nccl_process("h", 10, 0, 1, plugin="/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so")
    lines.insert(3, "h:10:10 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.")
    facts = by_host(write_job(tmp_path, {"h": lines}))["h"]
    assert facts["net_plugin"] == "external: /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"
    assert facts["nics"] == "mlx5_0:1/IB, mlx5_1:1/IB"


def test_nccl_version_inside_an_error_counts_but_not_against_the_full_line():
    events = records([
        {"file": "a.log", "host": "a", "rank": 0, "kind": "nccl.version", "message": "NCCL version 2.14.3+cuda11.7"},
        {"file": "a.log", "host": "a", "rank": 0, "kind": "traceback.exception",
         "message": "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL version 2.14.3"},
        {"file": "b.log", "host": "b", "rank": 1, "kind": "traceback.exception",
         "message": "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL version 2.14.3"},
    ])
    rows = {r["host"]: r for r in host_fact_records(derive_host_facts(events))}
    assert rows["a"]["nccl_version"] == rows["b"]["nccl_version"] == "2.14.3"
    assert rows["a"]["nccl_build"] == "cuda11.7" and rows["b"]["nccl_build"] is None
    assert rows["a"]["differs"] == rows["b"]["differs"] == []


def test_gpu_facts_from_nvidia_smi_torch_and_oom_lines():
    smi = [
        "| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |",
        "|   0  NVIDIA A100-SXM4-80GB          On  | 00000000:07:00.0 Off |                    0 |",
        "| N/A   33C    P0              62W / 400W |      4MiB / 81920MiB |      0%      Default |",
    ]
    events = records([
        *[{"file": "node-a/nvidia-smi.txt", "line": i + 1, "kind": "system.inventory", "message": m} for i, m in enumerate(smi)],
        {"file": "node-a/train.log", "host": "node-a", "rank": 0, "kind": "nccl.version", "message": "NCCL version 2.18.3+cuda12.2"},
        {"file": "node-b/train.log", "host": "node-b", "rank": 1, "kind": "traceback.exception",
         "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.20 GiB is free."},
        {"file": "node-c/train.log", "host": "node-c", "rank": 2, "kind": "log.last",
         "message": "rank 2 device 0: _CudaDeviceProperties(name='Tesla V100-SXM2-32GB', major=7, minor=0, total_memory=32494MB, multi_processor_count=80)"},
        {"file": "node-c/train.log", "host": "node-c", "rank": 2, "kind": "log.last", "message": "PyTorch version: 2.1.0+cu121"},
    ])
    events = correlate(events.drop("event_id"), [])[0]
    rows = {r["host"]: r for r in host_fact_records(derive_host_facts(events))}
    # The nvidia-smi file has no host of its own: correlate takes it from its directory's name.
    assert (rows["node-a"]["gpu_model"], rows["node-a"]["gpu_memory"], rows["node-a"]["driver_version"]) == ("NVIDIA A100-SXM4-80GB", "80 GiB", "535.104.05")
    assert rows["node-a"]["cuda_driver"] == "12.2"
    # 79.15 GiB usable (PyTorch) and 81920 MiB (nvidia-smi) are one card size.
    assert rows["node-b"]["gpu_memory"] == "80 GiB"
    assert (rows["node-c"]["gpu_model"], rows["node-c"]["gpu_memory"], rows["node-c"]["torch_version"]) == ("Tesla V100-SXM2-32GB", "32 GiB", "2.1.0+cu121")
    assert "gpu_memory" in rows["node-c"]["differs"] and "gpu_memory" not in rows["node-a"]["differs"]
    oom = derive_host_facts(events).units.filter(pl.col("fact") == "oom")
    assert oom.select("host", "rank").rows() == [("node-b", 1)]


def test_transport_pairs_of_every_era():
    events = records([
        {"host": "a", "pid": 1, "kind": "nccl.transport", "message": "Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0"},
        {"host": "a", "pid": 1, "kind": "nccl.transport", "message": "Channel 01/0 : 0[0] -> 1[1] [send] via NET/Socket/0"},
        {"host": "mtk", "pid": 2521, "kind": "nccl.transport", "message": "0 -> 1 via P2P/IPC"},
        {"host": "crow", "pid": 5330, "kind": "nccl.transport", "message": "Ring 00 : 155[3d000] -> 157[b2000] via P2P/IPC"},
        {"host": "ins", "pid": 7, "kind": "nccl.transport", "message": "Channel 01 : 2[1040] -> 0[1020] via SHM/direct/direct"},
    ])
    pairs = transport_pairs(events).select("host", "src", "dst", "family").sort("host").rows()
    assert pairs == [("a", 0, 1, "NET/Socket"), ("crow", 155, 157, "P2P/IPC"), ("ins", 2, 0, "SHM"), ("mtk", 0, 1, "P2P/IPC")]


def test_address_clash_means_several_machines(tmp_path):
    result = analyze(build("identical_hostnames", tmp_path))
    clashes = address_clashes(derive_host_facts(result.events).observations)
    assert clashes.select("host", "iface", "ip", "ranks").rows() == [("trainer", "eth0", "192.0.2.11", [0]), ("trainer", "eth0", "192.0.2.12", [1])]
    facts = by_host(result)["trainer"]
    assert facts["duplicate_name"] is True and "addresses" in facts["differs"]


def test_no_events_no_table():
    empty = records([{"host": "a", "kind": "log.last", "message": "hello"}])
    assert observations(empty).height == 0
    assert host_fact_records(derive_host_facts(empty)) == []


@pytest.mark.parametrize("line", [
    "RuntimeError: Current CUDA Device does not support bfloat16. Please switch dtype to float16.",
    "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla V100-SXM2-32GB GPU has compute capability 7.0.",
    "ptxas error   : Feature '.bf16' requires .target sm_80 or higher",
])
def test_bf16_refusals_are_flagged(line):
    events = records([{"host": "a", "rank": 0, "kind": "traceback.exception", "message": line}])
    assert derive_host_facts(events).units.filter(pl.col("fact") == "bf16_unsupported").height == 1


@pytest.mark.parametrize("line", ["Using bf16 mixed precision", "bf16: True", "torch_dtype=torch.bfloat16 loaded in 3.2 s"])
def test_bf16_use_is_not_a_refusal(line):
    events = records([{"host": "a", "rank": 0, "kind": "log.last", "message": line}])
    assert derive_host_facts(events).units.filter(pl.col("fact") == "bf16_unsupported").height == 0
