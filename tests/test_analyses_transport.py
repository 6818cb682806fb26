"""Degraded NCCL transports, from NCCL's INIT/NET lines.

The degraded logs are derived from the real healthy 2-GPU log in fixtures/healthy (NCCL 2.28.9):
the transport NCCL names on each channel line is replaced by the one it prints when P2P or SHM is
disabled, and the environment line that disables it is added after NCCL's own
"NCCL_NVLS_ENABLE set by environment" line, as NCCL prints them.
"""

from __future__ import annotations

from pathlib import Path

from analyzer.api import analyze

HEALTHY = Path(__file__).resolve().parents[1] / "fixtures" / "healthy" / "nccl-init-to-destroy" / "job" / "console.log"


def transport_findings(report: dict) -> dict[str, dict]:
    return {f["rule_id"]: f for f in report["findings"] if f["rule_id"].startswith("transport-")}


def derived_job(tmp_path: Path, via: str, env: dict[str, str]) -> Path:
    lines = []
    for line in HEALTHY.read_text().splitlines():
        lines.append(line.replace("via P2P/CUMEM", f"via {via}"))
        if "NCCL_NVLS_ENABLE set by environment to 0." in line:
            prefix = line.split("NCCL INFO")[0]
            lines += [f"{prefix}NCCL INFO {k} set by environment to {v}." for k, v in env.items()]
    (tmp_path / "console.log").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_healthy_p2p_job_has_no_transport_finding():
    assert transport_findings(analyze(HEALTHY.parent).report) == {}


def test_p2p_disabled_puts_intra_node_traffic_on_shared_memory(tmp_path):
    report = analyze(derived_job(tmp_path, "SHM/direct/direct", {"NCCL_P2P_DISABLE": "1"})).report
    found = transport_findings(report)
    assert set(found) == {"transport-intra-node-shm"}
    shm = found["transport-intra-node-shm"]
    assert shm["category"] == "degraded_transport" and shm["ranks"] == [0, 1] and shm["hosts"] == ["vm"]
    assert "NCCL_P2P_DISABLE=1" in shm["summary"] and "0 -> 1 via SHM" in shm["summary"]
    assert report["verdict"]["category"] == "degraded_transport"


def test_p2p_and_shm_disabled_put_intra_node_traffic_on_sockets(tmp_path):
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
    found = transport_findings(analyze(derived_job(tmp_path, "NET/Socket/0", env)).report)
    assert set(found) == {"transport-intra-node-network"}
    assert "via NET/Socket" in found["transport-intra-node-network"]["summary"]


def test_shm_without_a_setting_that_disabled_p2p_is_not_blamed(tmp_path):
    # GPUs on different CPU sockets without NVLink legitimately use SHM.
    assert transport_findings(analyze(derived_job(tmp_path, "SHM/direct/direct", {})).report) == {}


def two_node_log(via: str, extra: list[str]) -> str:
    lines = []
    for host, rank in (("node-a", 0), ("node-b", 1)):
        p = f"[rank{rank}]:{host}:{100 + rank}:{100 + rank} [0] NCCL INFO "
        lines += [
            p + "NET/Plugin: Could not find: libnccl-net.so",
            *[p + x for x in extra],
            p + f"ncclCommInitRankConfig comm 0x1{rank} rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 60 commId 0x77 - Init START",
            p + f"Channel 00/0 : {1 - rank}[0] -> {rank}[0] [receive] via {via}",
            p + f"Channel 00/0 : {rank}[0] -> {1 - rank}[0] [send] via {via}",
            p + f"ncclCommInitRankConfig comm 0x1{rank} rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 60 commId 0x77 - Init COMPLETE",
        ]
    return "\n".join(lines) + "\n"


def test_two_nodes_over_sockets_without_infiniband(tmp_path):
    (tmp_path / "log.txt").write_text(two_node_log("NET/Socket/0", ["NET/IB : No device found.", "Using network Socket"]))
    found = transport_findings(analyze(tmp_path).report)
    assert set(found) == {"transport-multinode-socket"}
    socket = found["transport-multinode-socket"]
    assert socket["hosts"] == ["node-a", "node-b"] and "No device found" in socket["summary"]


def test_two_nodes_over_infiniband_with_and_without_gpudirect(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "log.txt").write_text(two_node_log("NET/IB/0/GDRDMA", ["Using network IB"]))
    assert transport_findings(analyze(tmp_path / "a").report) == {}
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "log.txt").write_text(
        two_node_log("NET/IB/0", ["Using network IB", "NCCL_NET_GDR_LEVEL set by environment to LOC."])
    )
    found = transport_findings(analyze(tmp_path / "b").report)
    assert set(found) == {"transport-gdr-disabled"}
    assert "NCCL_NET_GDR_LEVEL=LOC" in found["transport-gdr-disabled"]["summary"]


RECORDED = HEALTHY.parents[3] / "traces" / "transport"


def test_recorded_p2p_disabled_run():
    found = transport_findings(analyze(RECORDED / "p2p-disabled").report)
    assert set(found) == {"transport-intra-node-shm"}
    assert "NCCL_P2P_DISABLE=1 is set" in found["transport-intra-node-shm"]["summary"]


def test_recorded_p2p_and_shm_disabled_run():
    found = transport_findings(analyze(RECORDED / "p2p-shm-disabled").report)
    assert set(found) == {"transport-intra-node-network"}
    assert "NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1 are set" in found["transport-intra-node-network"]["summary"]


def test_recorded_machine_split_into_two_nodes():
    report = analyze(RECORDED / "two-nodes-socket").report
    found = transport_findings(report)
    assert set(found) == {"transport-intra-node-network"}
    assert "NCCL_HOSTID=node0" in found["transport-intra-node-network"]["summary"]
    assert report["verdict"]["category"] == "degraded_transport"


IPOIB_NODE = [
    "gpu-7:4021:4021 [0] NCCL INFO Failed to open libibverbs.so[.1]",
    "gpu-7:4021:4021 [0] NCCL INFO NET/Socket : Using [0]ib0:10.1.0.7<0>",
    "gpu-7:4021:4021 [0] NCCL INFO Using network Socket",
]


def test_sockets_over_ipoib_without_libibverbs(tmp_path):
    """One node's log: the job may span nodes, and this host's InfiniBand is unused."""
    (tmp_path / "log.txt").write_text("\n".join(IPOIB_NODE) + "\n")
    found = transport_findings(analyze(tmp_path).report)
    assert set(found) == {"transport-multinode-socket"}
    summary = found["transport-multinode-socket"]["summary"]
    assert "IPoIB interface ib0" in summary and "libibverbs" in summary and summary.startswith("if the job spans")


def test_sockets_over_ipoib_on_a_job_known_to_fit_one_node(tmp_path):
    lines = [*IPOIB_NODE, "gpu-7:4021:4021 [0] NCCL INFO comm 0x55d0 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0"]
    (tmp_path / "log.txt").write_text("\n".join(lines) + "\n")
    assert transport_findings(analyze(tmp_path).report) == {}


def test_sockets_over_ethernet_on_one_host_are_not_blamed(tmp_path):
    lines = [line.replace("[0]ib0", "[0]eth0") for line in IPOIB_NODE]
    (tmp_path / "log.txt").write_text("\n".join(lines) + "\n")
    assert transport_findings(analyze(tmp_path).report) == {}


ETHERNET_FALLBACK = [
    "gpu-3:5120:5120 [0] NCCL INFO Bootstrap : Using eth0:10.2.0.3<0>",
    "gpu-3:5120:5120 [0] NCCL INFO NET/IB : No device found.",
    "gpu-3:5120:5120 [0] NCCL INFO NET/Socket : Using [0]eth0:10.2.0.3<0>",
    "gpu-3:5120:5120 [0] NCCL INFO Using network Socket",
    "gpu-3:5120:5120 [0] NCCL INFO ncclCommInitRank comm 0x55d0 rank 0 nranks 16 cudaDev 0 busId 1b000 - Init COMPLETE",
]


def test_sockets_where_the_environment_asks_for_infiniband(tmp_path):
    """Issue 17: HCAs named (or IB enabled) and none found: the RDMA NICs are invisible to NCCL."""
    env = "gpu-3:5120:5120 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 0."
    (tmp_path / "log.txt").write_text("\n".join(["export NCCL_IB_HCA=mlx5_0,mlx5_1", env, *ETHERNET_FALLBACK]) + "\n")
    report = analyze(tmp_path).report
    summary = transport_findings(report)["transport-multinode-socket"]["summary"]
    assert "NCCL_IB_DISABLE" in summary and "NCCL_IB_HCA" in summary and summary.startswith("if the job spans")
    assert report["verdict"]["category"] == "degraded_transport"


def test_sockets_over_ethernet_without_an_infiniband_setting_are_not_blamed(tmp_path):
    (tmp_path / "log.txt").write_text("\n".join(["gpu-3:5120:5120 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.", *ETHERNET_FALLBACK]) + "\n")
    assert transport_findings(analyze(tmp_path).report) == {}


def test_an_hca_that_failed_to_open_then_sockets_is_a_degraded_transport(tmp_path):
    """The IB open WARN is what the fallback recovered from: the verdict is the slow transport, the WARN its cause line."""
    lines = [
        "gpu-3:5120:5120 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 0.",
        "gpu-3:5120:5120 [0] misc/ibvwrap.cc:212 NCCL WARN Call to ibv_open_device failed",
        "gpu-3:5120:5120 [0] transport/net_ib.cc:148 NCCL WARN NET/IB : Unable to open device mlx5_bond_0",
        *ETHERNET_FALLBACK,
    ]
    (tmp_path / "log.txt").write_text("\n".join(lines) + "\n")
    report = analyze(tmp_path).report
    assert report["verdict"]["category"] == "degraded_transport"
    ib = next(f for f in report["findings"] if f["rule_id"] == "vocabulary-ib-link-or-hca-error")
    assert ib["caused_by"] == ["transport-multinode-socket"]
    assert "ibv_open_device failed" in transport_findings(report)["transport-multinode-socket"]["summary"]
