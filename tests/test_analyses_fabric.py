"""ib_port_state: HCA ports down or slow, weighed by what NCCL used."""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext
from analyzer.analyses.fabric import ib_port_state
from analyzer.facts.correlate import correlate
from analyzer.events import concat_events, events_from_records
from analyzer.parse.lines import lines_frame_many
from analyzer.parse.nodestate import node_state_events


def ibstat(*ports: tuple[str, int, str, str, int]) -> str:
    out = []
    for ca, port, state, physical, rate in ports:
        out += [f"CA '{ca}'", "\tCA type: MT4123", "\tNumber of ports: 1", f"\tPort {port}:", f"\t\tState: {state}",
                f"\t\tPhysical state: {physical}", f"\t\tRate: {rate}", "\t\tBase lid: 12", "\t\tLink layer: InfiniBand"]
    return "\n".join(out) + "\n"


UP = ("mlx5_0", 1, "Active", "LinkUp", 200)


def job(node_files: dict[str, str], nccl_using: dict[str, str] | None = None) -> pl.DataFrame:
    """Hosts' ibstat files (`<host>/node.ibstat.txt`) and NCCL `NET/IB : Using` lines in their consoles."""
    frames = [node_state_events(lines_frame_many([(text, f"{host}/node.ibstat.txt", 1)])) for host, text in node_files.items()]
    nccl = [
        {"file": f"{host}/console.log", "line": 1, "host": host, "pid": 10, "source": "nccl", "kind": "nccl.net",
         "message": f"NET/IB : Using {devices} ; OOB eth0:10.0.0.1<0>", "text": ""}
        for host, devices in (nccl_using or {}).items()
    ]
    names = [{"file": f"{host}/console.log", "line": 2, "host": host, "source": "text", "kind": "log.last", "message": "", "text": ""}
             for host in node_files]
    return correlate(concat_events([*frames, events_from_records(nccl + names)]), [])[0]


def by_rule(events: pl.DataFrame) -> dict[str, dict]:
    return {row["rule_id"]: row for row in ib_port_state(events, JobContext()).iter_rows(named=True)}


def test_a_down_port_that_nccl_uses_is_the_cause_on_that_host():
    events = job(
        {"node-a": ibstat(UP, ("mlx5_1", 1, "Active", "LinkUp", 200)),
         "node-b": ibstat(UP, ("mlx5_1", 1, "Down", "Polling", 10))},
        {"node-a": "[0]mlx5_0:1/IB [1]mlx5_1:1/IB", "node-b": "[0]mlx5_0:1/IB [1]mlx5_1:1/IB"},
    )
    found = by_rule(events)
    assert list(found) == ["ib-port-down-used-by-nccl"]
    assert found["ib-port-down-used-by-nccl"]["hosts"] == ["node-b"]
    assert "mlx5_1:1 on node-b (Down, Polling)" in found["ib-port-down-used-by-nccl"]["summary"]


def test_a_down_port_nccl_did_not_choose_is_no_finding():
    events = job(
        {"node-a": ibstat(UP, ("mlx5_2", 1, "Down", "Disabled", 10)), "node-b": ibstat(UP, ("mlx5_2", 1, "Down", "Disabled", 10))},
        {"node-a": "[0]mlx5_0:1/IB", "node-b": "[0]mlx5_0:1/RoCE [RO]"},
    )
    assert by_rule(events) == {}


def test_without_nccl_lines_a_down_port_is_context():
    found = by_rule(job({"node-a": ibstat(UP), "node-b": ibstat(("mlx5_0", 1, "Initializing", "LinkUp", 200))}))
    assert list(found) == ["ib-port-not-active"]
    assert found["ib-port-not-active"]["hosts"] == ["node-b"]


def test_a_port_slower_than_its_peers():
    hosts = {f"node-{i}": ibstat(UP) for i in range(4)}
    hosts["node-2"] = ibstat(("mlx5_0", 1, "Active", "LinkUp", 100))
    found = by_rule(job(hosts))
    assert list(found) == ["ib-port-rate-degraded"]
    assert found["ib-port-rate-degraded"]["hosts"] == ["node-2"]
    assert "mlx5_0:1 on node-2 at 100 Gb/s (others 200)" in found["ib-port-rate-degraded"]["summary"]


def test_healthy_fabric_is_no_finding():
    assert by_rule(job({f"node-{i}": ibstat(UP, ("mlx5_1", 1, "Active", "LinkUp", 200)) for i in range(3)},
                       {f"node-{i}": "[0]mlx5_0:1/IB [1]mlx5_1:1/IB" for i in range(3)})) == {}


def test_merged_nic_list_of_newer_nccl():
    events = job({"node-a": ibstat(("mlx5_0", 1, "Down", "Polling", 10))}, {"node-a": "[0]={[0] mlx5_0:1/IB, [1] mlx5_1:1/IB}"})
    assert list(by_rule(events)) == ["ib-port-down-used-by-nccl"]
