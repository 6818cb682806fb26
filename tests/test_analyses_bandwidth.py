"""The bandwidth judgement: every expected-bandwidth row, the real outputs' verdicts, a slow host among several."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from analyzer.analyses.bandwidth import expectations, expected_busbw, gpu_row
from analyzer.api import analyze

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "nccl-tests"
CASES = sorted(p for p in FIXTURES.iterdir() if (p / "truth.toml").exists())

# One GPU name per [[gpu]] row, as `# Using devices` prints it, and the figure the row gives.
GPU_NAMES = {
    "h100-h200-sxm-nvlink4": ("NVIDIA H100 80GB HBM3", "p2p", 370.0),
    "h800-nvlink4-reduced": ("NVIDIA H800", "p2p", 160.0),
    "a100-sxm-nvlink3": ("NVIDIA A100-SXM4-80GB", "p2p", 230.0),
    "v100-sxm2-nvlink2": ("Tesla V100-SXM2-32GB", "p2p", 125.0),
    "pcie-gen5-gpu": ("NVIDIA GeForce RTX 5090", "p2p", 28.0),
    "pcie-gen4-gpu": ("NVIDIA A100-PCIE-40GB", "p2p", 20.0),
    "pcie-gen3-gpu": ("Tesla V100-PCIE-16GB", "p2p", 10.0),
}


def test_every_gpu_row_has_a_test_and_a_reference_or_pcie_generation():
    rows = expectations()["gpu"]
    assert {r["id"] for r in rows} == set(GPU_NAMES)
    for row in rows:
        assert row.get("reference") or row.get("pcie_gen"), row["id"]


@pytest.mark.parametrize("row_id", sorted(GPU_NAMES))
def test_gpu_row(row_id):
    name, transport, figure = GPU_NAMES[row_id]
    assert gpu_row(name)["id"] == row_id
    assert expected_busbw(transport, name)[0] == figure


def test_nvls_row():
    assert expected_busbw("p2p", "NVIDIA H100 80GB HBM3", nvls=True)[0] == 480.0
    assert expected_busbw("p2p", "NVIDIA A100-SXM4-80GB", nvls=True)[0] == 230.0  # no NVLS before Hopper


@pytest.mark.parametrize("row_id, args, figure", [
    ("p2p-pcie-gen3", ("p2p", "Tesla T4"), 10.0),
    ("p2p-pcie-gen4", ("p2p", "NVIDIA GeForce RTX 4090"), 20.0),
    ("p2p-pcie-gen5", ("p2p", "NVIDIA H100 PCIe"), 28.0),
    ("shm", ("shm", "NVIDIA GeForce RTX 4090"), 10.0),
    ("shm", ("shm", "NVIDIA A100-SXM4-80GB"), 10.0),  # P2P disabled on an NVLink machine: its PCIe Gen4 host link
    ("shm", ("shm", "NVIDIA H100 80GB HBM3"), 14.0),
    ("net-ib", ("net-ib", None), None),
    ("net-socket", ("net-socket", None), None),
])
def test_transport_row(row_id, args, figure):
    assert any(r["id"] == row_id and r["reference"] for r in expectations()["transport"])
    assert expected_busbw(*args)[0] == figure


def test_network_rows_scale_with_the_links_the_job_reports():
    assert expected_busbw("net-ib", None, ib_gbps=400, ib_nics=1)[0] == pytest.approx(46.0)
    assert expected_busbw("net-ib", None, ib_gbps=200, ib_nics=4)[0] == pytest.approx(92.0)
    assert expected_busbw("net-socket", None, eth_mbps=100)[0] == pytest.approx(0.01)
    assert expected_busbw("net-socket", None, eth_mbps=25000)[0] == pytest.approx(2.5)
    assert expected_busbw("p2p", "AMD Instinct MI300X")[0] is None  # unknown model: not judged


def test_every_transport_row_is_tested():
    ids = {r["id"] for r in expectations()["transport"]}
    assert ids == {"p2p-pcie-gen3", "p2p-pcie-gen4", "p2p-pcie-gen5", "shm", "net-ib", "net-socket"}


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_real_outputs_give_their_truth(case):
    truth = tomllib.loads((case / "truth.toml").read_text())
    verdict = analyze(case / "job").report["verdict"]
    if truth.get("undecidable"):  # the excerpt cannot settle the cause: it must not be a clean report
        assert verdict["category"] != "none"
        return
    assert verdict["category"] == truth["category"], verdict["summary"]
    assert sorted(verdict["culprit_hosts"]) == sorted(truth["culprit_hosts"])


def _per_host_set(tmp_path: Path, hosts: list[str], slow: str | None, factor: float = 0.1) -> Path:
    """Per-host outputs derived from the real single-node run: host names edited, one host's busbw scaled."""
    text = (FIXTURES / "h100-nvls-single-node" / "job" / "all_reduce_perf.log").read_text()
    for host in hosts:
        (tmp_path / host).mkdir()
        out = text.replace("NODE A", host)
        if host == slow:
            out = re.sub(r"(\d+\.\d\d)(\s+\d+\s+\d+\s+)(\d+\.\d\d)(\s+)(\d+\.\d\d)",
                         lambda m: f"{float(m[1]) * factor:.2f}{m[2]}{float(m[3]) * factor:.2f}{m[4]}{float(m[5]) * factor:.2f}", out)
            out = out.replace("273.95  479.41", f"{273.95 * factor:6.2f}  {479.41 * factor:6.2f}")
        (tmp_path / host / "all_reduce_perf.log").write_text(out)
    return tmp_path


def test_one_host_a_fraction_of_the_others_is_named(tmp_path):
    job = _per_host_set(tmp_path, ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"], slow="gpu-node-03")
    verdict = analyze(job).report["verdict"]
    assert verdict["rule_id"] == "nccltests-run-slower-than-peers"
    assert verdict["culprit_hosts"] == ["gpu-node-03"] and verdict["category"] == "degraded_transport"


def test_alike_hosts_give_no_finding(tmp_path):
    job = _per_host_set(tmp_path, ["gpu-node-01", "gpu-node-02", "gpu-node-03"], slow=None)
    assert analyze(job).report["findings"] == []


def test_wrong_elements_are_a_hardware_finding(tmp_path):
    text = (FIXTURES / "h100-nvls-single-node" / "job" / "all_reduce_perf.log").read_text()
    (tmp_path / "a.log").write_text(text.replace("479.41      0", "479.41     17").replace("# Out of bounds values : 0 OK", "# Out of bounds values : 17 FAILED"))
    verdict = analyze(tmp_path).report["verdict"]
    assert verdict["rule_id"] == "nccltests-wrong-results" and verdict["category"] == "p2p_nvlink_or_pcie_error"
    assert verdict["culprit_hosts"] == ["NODE A"] and "17 wrong elements" in verdict["summary"]


def test_socket_run_without_a_nic_speed_is_not_judged(tmp_path):
    two = """# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
# Using devices
#  Rank  0 Group  0 Pid   3595 on      test1 device  0 [0x81] NVIDIA A100-PCIE-40GB
#  Rank  1 Group  0 Pid   4017 on      test2 device  0 [0x81] NVIDIA A100-PCIE-40GB
test1:3595:3609 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
  1073741824     268435456     float     sum      -1   1073742    1.00    0.10      0   1073742    1.00    0.10      0
"""
    (tmp_path / "run.log").write_text(two)
    assert analyze(tmp_path).report["findings"] == []  # NIC speed unknown: not judged


SOCKET_RUN = """# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
# Using devices
#  Rank  0 Group  0 Pid   3595 on      test1 device  0 [0x81] NVIDIA A100-PCIE-40GB
#  Rank  1 Group  0 Pid   4017 on      test2 device  0 [0x81] NVIDIA A100-PCIE-40GB
test1:3595:3609 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
  1073741824     268435456     float     sum      -1   89478485    0.01    0.01      0   89478485    0.01    0.01      0
"""


def test_the_host_whose_nic_negotiated_100mbps_is_named(tmp_path):
    """The classic incident: sockets between two hosts, one data NIC at 100 Mb/s (real ethtool pastes)."""
    readouts = FIXTURES / "readouts"
    (tmp_path / "run.log").write_text(SOCKET_RUN)
    for host, name in (("test1", "ethtool-enp5s0-10g.txt"), ("test2", "ethtool-eth15-100mbps.txt")):
        (tmp_path / host).mkdir()
        (tmp_path / host / "ethtool.txt").write_text((readouts / name).read_text())
    verdict = analyze(tmp_path).report["verdict"]
    assert verdict["rule_id"] == "nccltests-busbw-below-expected" and verdict["category"] == "degraded_transport"
    assert verdict["culprit_hosts"] == ["test2"] and "test2's link runs at 100 Mb/s (best 10000)" in verdict["summary"]


def test_ib_run_far_below_its_ports_names_the_slow_port_and_cross_numa_gpus(tmp_path):
    run = SOCKET_RUN.replace("via NET/Socket/0", "via NET/IB/0").replace("0.01    0.01      0   89478485    0.01    0.01", "2.00    2.00      0   536870    2.00    2.00")
    (tmp_path / "run.log").write_text(run)
    port = (FIXTURES / "readouts" / "ibv_devinfo-port-down.txt").read_text().replace("PORT_DOWN (1)", "PORT_ACTIVE (4)").replace(
        "                        link_layer:             Ethernet",
        "                        phys_state:             LINK_UP (5)\n                        active_width:           4X (2)\n"
        "                        active_speed:           {lane} Gbps (32)\n                        link_layer:             Ethernet")
    for host, lane in (("test1", "50.0"), ("test2", "25.0")):
        (tmp_path / host).mkdir()
        (tmp_path / host / "ibv_devinfo.txt").write_text(port.replace("{lane}", lane))
    (tmp_path / "test1" / "topo.txt").write_text((FIXTURES / "readouts" / "topo-a100-nics-across-numa.txt").read_text())
    verdict = analyze(tmp_path).report["verdict"]
    assert verdict["rule_id"] == "nccltests-busbw-below-expected-ib" and verdict["category"] == "ib_link_or_hca_error"
    assert "of the 23 GB/s expected for 1 x 200 Gb/s" in verdict["summary"]


def test_report_draws_the_busbw_curve_per_host_with_the_expected_line(tmp_path):
    import json as _json

    from analyzer.render.html import _script_hash, _asset, render_html

    job = _per_host_set(tmp_path, ["gpu-node-01", "gpu-node-02", "gpu-node-03"], slow="gpu-node-02")
    page = render_html(analyze(job))
    data = re.search(r'<script type="application/json" id="pm-busbw">(.*?)</script>', page).group(1)
    runs = _json.loads(data)["runs"]
    assert [r["label"] for r in runs] == ["nccl-tests gpu-node-01", "nccl-tests gpu-node-02", "nccl-tests gpu-node-03"]
    assert [r["flagged"] for r in runs] == [False, True, False] and runs[0]["expected"] == 370.0  # no NVLS line: NVLink
    assert runs[1]["busbw"] == [48.01] and runs[0]["size"] == [8589934592]
    assert _script_hash(_asset("assets", "busbw.js")) in page  # allowed by the page's CSP


def test_report_without_nccl_tests_has_no_busbw_section():
    from analyzer.render.html import render_html

    assert 'id="busbw"' not in render_html(analyze(ROOT / "fixtures" / "healthy" / "torchrun-2gpu-normal" / "job"))


def test_the_host_common_to_slow_pairs_is_named(tmp_path):
    """Pair runs over IB with the pair figures of NVIDIA/nccl-tests#106 (49.36, 88.36, 49.30, 86.81 GB/s, scaled): node 644 in every slow pair."""
    def pair(a: str, b: str, busbw: float) -> str:
        return SOCKET_RUN.replace("test1", a).replace("test2", b).replace("via NET/Socket/0", "via NET/IB/0").replace(
            "0.01    0.01      0   89478485    0.01    0.01", f"{busbw:.2f}  {busbw:.2f}      0   89478485  {busbw:.2f}  {busbw:.2f}")
    for i, (a, b, bw) in enumerate([("gn644", "gn699", 4.94), ("gn632", "gn641", 8.84), ("gn641", "gn644", 4.93), ("gn404", "gn699", 8.68),
                                     ("gn632", "gn404", 8.8)]):
        (tmp_path / f"pair{i}.log").write_text(pair(a, b, bw))
    found = analyze(tmp_path).report["findings"]
    peers = [f for f in found if f["rule_id"] == "nccltests-run-slower-than-peers-ib"]
    assert peers and {h for f in peers for h in f["hosts"]} == {"gn644"}
    assert peers[0]["category"] == "ib_link_or_hca_error" and "over InfiniBand/RoCE" in peers[0]["summary"]
