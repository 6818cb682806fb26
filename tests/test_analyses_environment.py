"""Drift analyses (analyzer/analyses/environment.py): nodes that are not alike, named by minority."""

import json
from pathlib import Path

import jsonschema
import polars as pl
import pytest

from analyzer.analyses import JobContext
from analyzer.analyses.environment import env_drift, gpu_heterogeneity, identical_hostnames, nccl_stack_drift
from analyzer.api import analyze
from analyzer.facts.correlate import correlate
from analyzer.facts.hostfacts import derive_host_facts
from tests.driftgen import build
from tests.test_hostfacts import nccl_process, records, write_job

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())
DRIFT_RULES = ("nccl-stack-differs-across-hosts", "drift-")


def context(events, **job):
    """The context detect gets, with the host facts the facts stage derives from `events`."""
    return JobContext(host_facts=derive_host_facts(events), **job)


def job_and_context(events):
    return events, context(events)


def drift_findings(report):
    return [f for f in report["findings"] if f["rule_id"].startswith(DRIFT_RULES)]


def only(report, rule_id):
    found = [f for f in report["findings"] if f["rule_id"] == rule_id]
    assert len(found) == 1, [f["rule_id"] for f in report["findings"]]
    return found[0]


# --- derived fixtures from a real two-node recording (tests/driftgen.py) ------------------------------


def test_healthy_two_node_run_has_no_drift_finding(tmp_path):
    report = analyze(build("healthy", tmp_path)).report
    assert drift_findings(report) == []
    assert all(h["differs"] == [] for h in report["job"]["host_facts"])
    jsonschema.validate(report, SCHEMA)


@pytest.mark.parametrize("variant,fact", [("nccl_version", "nccl_version"), ("net_plugin", "net_plugin")])
def test_nccl_stack_differences_name_the_odd_host(tmp_path, variant, fact):
    report = analyze(build(variant, tmp_path)).report
    found = only(report, "nccl-stack-differs-across-hosts")
    assert found["hosts"] == ["node-b"] and found["ranks"] == [1]
    assert report["verdict"]["category"] == "nccl_version_mismatch"
    assert report["verdict"]["culprit_hosts"] == ["node-b"]
    assert all(fact in h["differs"] for h in report["job"]["host_facts"])
    jsonschema.validate(report, SCHEMA)


def test_older_driver_is_named(tmp_path):
    report = analyze(build("cuda_driver", tmp_path)).report
    found = only(report, "drift-cuda-driver-older")
    assert found["hosts"] == ["node-b"]
    assert "13.0 on node-b; 13.1 on node-a" in found["summary"] or "580.159.04 on node-b" in found["summary"]


def test_two_machines_with_one_host_name(tmp_path):
    report = analyze(build("identical_hostnames", tmp_path)).report
    found = only(report, "drift-identical-hostnames")
    assert found["hosts"] == ["trainer"] and found["ranks"] == [0, 1]
    assert "192.0.2.11" in found["summary"] and "192.0.2.12" in found["summary"]
    assert report["verdict"]["rule_id"] == "drift-identical-hostnames"


def test_gpu_models_derived_fixture_today(tmp_path):
    """Today's parser keeps the OOM line (its total capacity) but drops nvidia-smi tables and device
    property prints, so the rank on the small card is named by the OOM rule alone."""
    report = analyze(build("gpu_models", tmp_path)).report
    assert report["verdict"]["category"] == "cuda_oom_on_some_ranks"
    assert report["verdict"]["culprit_ranks"] == [1] and report["verdict"]["culprit_hosts"] == ["node-b"]
    assert {h["host"]: h["gpu_memory"] for h in report["job"]["host_facts"]}["node-b"] == "32 GiB"


def test_gpu_models_derived_fixture_names_the_small_card(tmp_path):
    report = analyze(build("gpu_models", tmp_path)).report
    oom = only(report, "drift-oom-on-smallest-gpus")
    assert oom["hosts"] == ["node-b"] and oom["ranks"] == [1]
    assert only(report, "drift-gpu-models-differ")["hosts"] == ["node-b"]
    assert report["verdict"]["rule_id"] == "drift-oom-on-smallest-gpus"


# --- the public cases ------------------------------------------------------------------------------------


def test_case_015_plugin_only_on_some_nodes():
    report = analyze(ROOT / "fixtures" / "cases" / "015-nccl-net-plugin-only-on-some-nodes" / "job").report
    found = only(report, "nccl-stack-differs-across-hosts")
    assert found["hosts"] == ["HGX-H100-11"]
    assert "internal on HGX-H100-11" in found["summary"]
    assert report["verdict"]["category"] == "nccl_version_mismatch"


@pytest.mark.xfail(strict=True, reason=(
    "the excerpt is one process's `0 -> 1 via P2P/IPC` line, twice: nothing in it (no address, no peer "
    "line, no node count) tells two machines named mtk from one healthy two-GPU machine"))
def test_case_014_identical_hostnames():
    report = analyze(ROOT / "fixtures" / "cases" / "014-horovod-identical-hostnames-p2p-ipc" / "job").report
    assert only(report, "drift-identical-hostnames")["hosts"] == ["mtk"]


# --- the analyses on synthetic lines in NCCL's own wording ------------------------------------------------


def test_majority_decides_before_age(tmp_path):
    """Two hosts on 2.18.3, one on the newer 2.19.4: the odd one is the newer."""
    result = write_job(tmp_path, {
        f"n{i}": nccl_process(f"n{i}", 100 + i, i, 3, version="2.19.4+cuda12.2" if i == 1 else "2.18.3+cuda12.2")
        for i in range(3)
    })
    found = only(result.report, "nccl-stack-differs-across-hosts")
    assert found["hosts"] == ["n1"] and found["ranks"] == [1]


def test_env_set_on_some_hosts_names_them(tmp_path):
    result = write_job(tmp_path, {
        f"n{i}": nccl_process(f"n{i}", 100 + i, i, 3, env=[("NCCL_SOCKET_IFNAME", "eth0")] + ([("NCCL_IB_DISABLE", "1.")] if i == 2 else []))
        for i in range(3)
    })
    found = only(result.report, "drift-nccl-env-differs")
    assert found["hosts"] == ["n2"] and found["ranks"] == [2]
    assert "NCCL_IB_DISABLE differs" in found["summary"] and found["confidence"] == 0.65


def test_env_missing_on_some_hosts_is_named_with_less_confidence(tmp_path):
    result = write_job(tmp_path, {
        f"n{i}": nccl_process(f"n{i}", 100 + i, i, 3, env=[("NCCL_SOCKET_IFNAME", "eth0")] + ([("NCCL_IB_GID_INDEX", "3")] if i < 2 else []))
        for i in range(3)
    })
    found = only(result.report, "drift-nccl-env-differs")
    assert found["hosts"] == ["n2"] and found["confidence"] == 0.5
    assert "(unset) on n2" in found["summary"]


def test_env_split_evenly_names_nobody(tmp_path):
    result = write_job(tmp_path, {
        "n0": nccl_process("n0", 100, 0, 2, env=[("NCCL_P2P_LEVEL", "NVL")]),
        "n1": nccl_process("n1", 101, 1, 2, env=[("NCCL_P2P_LEVEL", "SYS")]),
    })
    found = only(result.report, "drift-nccl-env-split")
    assert found["hosts"] == [] and found["ranks"] == []
    assert "NVL on n0; SYS on n1" in found["summary"] and "split evenly" in found["summary"]
    # Context only: it is not the verdict's cause.
    assert found["severity"] == "warning" and result.report["verdict"]["rule_id"] == "drift-nccl-env-split"


def test_env_differing_across_ranks_of_one_host(tmp_path):
    lines = [line for r in range(4) for line in nccl_process("h", 10 + r, r, 4, env=[("NCCL_SOCKET_IFNAME", "eth0")] + ([("NCCL_SHM_DISABLE", "1.")] if r == 3 else []))]
    found = only(write_job(tmp_path, {"h": lines}).report, "drift-nccl-env-differs")
    assert found["ranks"] == [3] and found["hosts"] == ["h"]


@pytest.mark.parametrize("name,values", [("NCCL_DEBUG_SUBSYS", ("INIT", "INIT,NET")), ("NCCL_HOSTID", ("a", "b"))])
def test_variables_that_do_not_choose_transports_are_not_findings(tmp_path, name, values):
    result = write_job(tmp_path, {f"n{i}": nccl_process(f"n{i}", 100 + i, i, 2, env=[(name, v)]) for i, v in enumerate(values)})
    assert drift_findings(result.report) == []


def test_network_between_ranks_of_one_host_name(tmp_path):
    """Modern NCCL tells the machines apart (boot id) and connects them over the network."""
    def process(pid, rank):
        p = f"mtk:{pid}:{pid} [0] NCCL INFO"
        return [f"{p} NCCL version 2.18.3+cuda12.2", f"{p} comm 0x{pid:x} rank {rank} nranks 2 cudaDev 0 busId 1000 - Init COMPLETE",
                f"{p} Channel 00/0 : {rank}[0] -> {1 - rank}[0] [send] via NET/IB/0"]
    result = write_job(tmp_path, {"a": process(2521, 0), "b": process(3310, 1)})
    found = only(result.report, "drift-identical-hostnames")
    assert found["hosts"] == ["mtk"] and found["ranks"] == [0, 1]
    assert "over the network" in found["summary"]


def test_network_within_a_host_on_purpose_is_not_a_clash(tmp_path):
    def process(pid, rank):
        p = f"box:{pid}:{pid} [{rank}] NCCL INFO"
        return [f"{p} NCCL version 2.18.3+cuda12.2", f"{p} NCCL_P2P_DISABLE set by environment to 1.",
                f"{p} NCCL_SHM_DISABLE set by environment to 1.",
                f"{p} comm 0x{pid:x} rank {rank} nranks 2 cudaDev {rank} busId {rank + 1}000 - Init COMPLETE",
                f"{p} Channel 00/0 : {rank}[{rank}] -> {1 - rank}[{1 - rank}] [send] via NET/Socket/0"]
    result = write_job(tmp_path, {"box": process(10, 0) + process(11, 1)})
    assert drift_findings(result.report) == []


def test_old_nccl_interface_lines_with_two_addresses_under_one_name():
    """NCCL 2.0-era lines of horovod#148: four processes named node1, two addresses on eth1. (The
    text parser does not classify `NET : Using interface` yet; the events are built here.)"""
    events = records([
        {"host": "node1", "pid": pid, "kind": "nccl.net", "message": f"NET : Using interface eth1:{ip}<0>"}
        for pid, ip in ((18225, "100.102.32.176"), (18226, "100.102.32.176"), (22670, "100.102.32.175"), (22671, "100.102.32.175"))
    ])
    found = identical_hostnames(events, context(events)).row(0, named=True)
    assert found["hosts"] == ["node1"]
    assert "100.102.32.175 (pids 22670,22671), 100.102.32.176 (pids 18225,18226)" in found["summary"]


def test_local_rank_count_below_the_ranks_of_a_name():
    events = records([
        {"host": "mtk", "rank": r, "pid": 10 + r, "kind": "nccl.topology",
         "message": f"comm 0x1 rank {r} nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0"}
        for r in (0, 1)
    ])
    found = identical_hostnames(events, context(events, world_size=2, rank_hosts={0: "mtk", 1: "mtk"}))
    assert found.select("rule_id", "hosts", "ranks").rows() == [("drift-identical-hostnames", ["mtk"], [0, 1])]


def _gpu_job(oom_host="v100", bf16_host=None):
    smi = {
        "a100-1": "|   0  NVIDIA A100-SXM4-80GB          On  | 00000000:07:00.0 Off |                    0 |",
        "a100-2": "|   0  NVIDIA A100-SXM4-80GB          On  | 00000000:07:00.0 Off |                    0 |",
        "v100": "|   0  Tesla V100-SXM2-32GB           On  | 00000000:1A:00.0 Off |                    0 |",
    }
    memory = {"a100-1": 81920, "a100-2": 81920, "v100": 32768}
    capacity = {"a100-1": "79.15", "a100-2": "79.15", "v100": "31.74"}
    rows = []
    for rank, host in enumerate(smi):
        rows += [
            {"file": f"{host}/nvidia-smi.txt", "line": 1, "kind": "system.inventory", "message": smi[host]},
            {"file": f"{host}/nvidia-smi.txt", "line": 2, "kind": "system.inventory",
             "message": f"| N/A   33C    P0    62W / 400W |      4MiB / {memory[host]}MiB |      0%      Default |"},
            {"file": f"{host}/train.log", "host": host, "rank": rank, "kind": "nccl.version", "message": "NCCL version 2.18.3+cuda12.2"},
        ]
        if host == oom_host:
            rows.append({"file": f"{host}/train.log", "host": host, "rank": rank, "kind": "traceback.exception",
                         "message": f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of {capacity[host]} GiB of which 1.20 GiB is free."})
        if host == bf16_host:
            rows.append({"file": f"{host}/train.log", "host": host, "rank": rank, "kind": "traceback.exception",
                         "message": "RuntimeError: Current CUDA Device does not support bfloat16. Please switch dtype to float16."})
    return correlate(records(rows).drop("event_id"), [])[0]  # the nvidia-smi files' hosts come from their directories


def test_oom_on_the_smallest_cards_of_a_mixed_pool():
    found = gpu_heterogeneity(*job_and_context(_gpu_job()))
    by_rule = {row["rule_id"]: row for row in found.iter_rows(named=True)}
    assert (by_rule["drift-oom-on-smallest-gpus"]["ranks"], by_rule["drift-oom-on-smallest-gpus"]["hosts"]) == ([2], ["v100"])
    assert "32 GiB against 80 GiB" in by_rule["drift-oom-on-smallest-gpus"]["summary"]
    assert by_rule["drift-gpu-models-differ"]["hosts"] == ["v100"]
    assert "Tesla V100-SXM2-32GB on v100" in by_rule["drift-gpu-models-differ"]["summary"]


def test_oom_on_a_large_card_is_not_blamed_on_the_pool():
    found = gpu_heterogeneity(*job_and_context(_gpu_job(oom_host="a100-1")))
    assert "drift-oom-on-smallest-gpus" not in found.get_column("rule_id").to_list()
    assert "drift-gpu-models-differ" in found.get_column("rule_id").to_list()


def test_bf16_on_cards_without_it():
    found = gpu_heterogeneity(*job_and_context(_gpu_job(oom_host=None, bf16_host="v100")))
    bf16 = found.filter(pl.col("rule_id") == "drift-bf16-unsupported-gpu").row(0, named=True)
    assert bf16["hosts"] == ["v100"] and bf16["ranks"] == [2]
    assert "Tesla V100-SXM2-32GB" in bf16["summary"] and "NVIDIA A100-SXM4-80GB" in bf16["summary"]


def test_one_gpu_model_everywhere_is_no_finding():
    events = _gpu_job(oom_host=None).filter(~pl.col("file").str.starts_with("v100"))
    assert gpu_heterogeneity(events, context(events)).height == 0
    assert env_drift(events, context(events)).height == 0
    assert nccl_stack_drift(events, context(events)).height == 0


SINGLE_HOST_RUN = [
    "# nThread 1 nGpus 4 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 validation: 1",
    "# Using devices",
    "#   Rank  0 Pid   2201 on    box-a device  0 [0x18] NVIDIA A10",
    "#   Rank  1 Pid   2201 on    box-a device  1 [0x3b] NVIDIA A10",
    "box-a: Test NCCL failure common.cu:777 'unhandled system error'",
]


def test_system_error_on_one_host_is_its_shared_memory(tmp_path):
    """Issue 17: ncclSystemError with every rank on one host and no socket or peer line: /dev/shm."""
    (tmp_path / "nccl-tests.log").write_text("\n".join(SINGLE_HOST_RUN) + "\n")
    report = analyze(tmp_path).report
    assert report["verdict"]["rule_id"] == "nccl-system-error-single-host"
    assert report["verdict"]["category"] == "shm_too_small" and report["verdict"]["culprit_hosts"] == ["box-a"]


def test_system_error_beside_a_socket_line_stays_the_network(tmp_path):
    lines = [*SINGLE_HOST_RUN, "box-a:2201:2201 [0] NCCL INFO socketStartConnect: Connect to 10.0.0.9<41233> failed : No route to host"]
    (tmp_path / "nccl-tests.log").write_text("\n".join(lines) + "\n")
    assert "nccl-system-error-single-host" not in {f["rule_id"] for f in analyze(tmp_path).report["findings"]}


def test_system_error_across_two_hosts_is_not_blamed_on_shared_memory(tmp_path):
    lines = [*SINGLE_HOST_RUN[:4], "#   Rank  2 Pid   3302 on    box-b device  0 [0x18] NVIDIA A10", SINGLE_HOST_RUN[4]]
    (tmp_path / "nccl-tests.log").write_text("\n".join(lines) + "\n")
    assert "nccl-system-error-single-host" not in {f["rule_id"] for f in analyze(tmp_path).report["findings"]}


def _ring_process(host, pid, rank, gpu, peer, peer_gpu, via="P2P/IPC"):
    return f"{host}:{pid}:{pid + 1} [{gpu}] NCCL INFO Ring 00 : {rank}[{gpu}] -> {peer}[{peer_gpu}] via {via}"


def test_intra_node_link_to_a_gpu_another_rank_of_the_host_drives(tmp_path):
    """NCCL 2.4 took two machines whose names share the part before the first dot for one: the last
    local rank links to the next machine's rank over CUDA IPC, on a GPU index a local rank already drives."""
    lines = [_ring_process("node7", 100 + g, g, g, g + 1, g + 1) for g in range(3)] + [_ring_process("node7", 103, 3, 3, 5, 1)]
    result = write_job(tmp_path, {"node7": lines})
    found = only(result.report, "drift-identical-hostnames")
    assert found["hosts"] == ["node7"] and "rank 3 to rank 5" in found["summary"] and "rank 1 of this host" in found["summary"]


def test_every_process_on_its_own_gpu_0_is_no_clash(tmp_path):
    # CUDA_VISIBLE_DEVICES per process: every process calls its GPU 0, so GPU indices say nothing.
    lines = [_ring_process("box", 100 + r, r, 0, (r + 1) % 4, 0) for r in range(4)]
    assert drift_findings(write_job(tmp_path, {"box": lines}).report) == []


def test_a_healthy_node_ring_over_p2p_and_the_network_is_no_clash(tmp_path):
    lines = [_ring_process("box", 100 + g, g, g, g + 1, g + 1) for g in range(3)]
    lines.append(_ring_process("box", 103, 3, 3, 4, 0, via="NET/IB/0"))
    assert drift_findings(write_job(tmp_path, {"box": lines}).report) == []
