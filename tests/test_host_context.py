"""Host context (analyzer/facts/host_context.py): a line that names a machine (a shell prompt, `Host: X`,
`SLURMD_NODENAME=X`, an `=== X ===` banner) is the host of the following lines of its file that name none,
up to the next such line. Made-up lines, with ordinary lines between the context and the failure."""

from pathlib import Path

import polars as pl
import pytest

from analyzer.api import NoTrainingLogs, analyze
from analyzer.facts.host_context import CONTEXT_KIND, context_patterns

FAILURE = "RuntimeError: CUDA error: an illegal memory access was encountered"
ORDINARY = ["loading the dataset", "building the model", "epoch 0 starts"]


def write(tmp_path: Path, lines: list[str], name: str = "console.log") -> None:
    (tmp_path / name).write_text("\n".join(lines) + "\n")


def verdict(tmp_path: Path) -> dict:
    return analyze(str(tmp_path)).report["verdict"]


@pytest.mark.parametrize("context, host", [
    ("(base) ray@worker-7c9f-x2k4q:/tmp$ ray start --block", "worker-7c9f-x2k4q"),
    ("[root@gpu-node-07 ~]# python train.py", "gpu-node-07"),
    ("Host: dgx03", "dgx03"),
    ("hostname = dgx03.cluster.local", "dgx03.cluster.local"),
    ("export SLURMD_NODENAME=c002", "c002"),
    ("SLURM_JOB_NODELIST='gpu17'", "gpu17"),
    ("===== node012 =====", "node012"),
    ("### host: gpu-a100-3 ###", "gpu-a100-3"),
])
def test_a_context_line_above_names_the_host_of_a_failure_below(tmp_path, context, host):
    write(tmp_path, ["job 4711 starting", context, *ORDINARY, FAILURE, "worker exiting"])
    assert verdict(tmp_path)["culprit_hosts"] == [host]


def test_each_failure_takes_the_nearest_context_above_it(tmp_path):
    write(tmp_path, ["alice@node-a1:~$ python train.py", *ORDINARY, FAILURE,
                     "alice@node-b2:~$ python train.py", *ORDINARY, FAILURE.replace("illegal memory access", "misaligned address")])
    events = analyze(str(tmp_path)).events.filter(pl.col("message").str.starts_with("RuntimeError"))
    hosts = events.group_by("line").agg(pl.col("host").unique()).sort("line").get_column("host").to_list()
    assert hosts == [["node-a1"], ["node-b2"]]


def test_a_loopback_name_ends_the_context(tmp_path):
    write(tmp_path, ["Host: node-a1", *ORDINARY, "Host: localhost", *ORDINARY, FAILURE, "worker exiting"])
    assert verdict(tmp_path)["culprit_hosts"] == []


def test_a_context_stays_in_its_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()  # apart: the only host of a directory names its files' host-less lines (correlate)
    write(tmp_path, ["Host: node-a1", *ORDINARY, "step 1 loss 0.3"], name="a/console.log")
    write(tmp_path, [*ORDINARY, FAILURE, "worker exiting"], name="b/console.log")
    assert verdict(tmp_path)["culprit_hosts"] == []


def test_a_host_the_line_writes_itself_wins(tmp_path):
    write(tmp_path, ["Host: node-a1", *ORDINARY,
                     "node-b2:4121:4188 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4422> "
                     "with error 12, opcode 0, len 0, vendor err 129 (Recv)", "worker exiting"])
    assert verdict(tmp_path)["culprit_hosts"] == ["node-b2"]


def test_context_lines_are_no_events_and_hold_no_training_log(tmp_path):
    write(tmp_path, ["alice@node-a1:~$ ls", "data  runs  train.py", "Host: node-a1", "===== node-a1 ====="])
    with pytest.raises(NoTrainingLogs):
        analyze(str(tmp_path))
    write(tmp_path, ["alice@node-a1:~$ python train.py", *ORDINARY, FAILURE])
    assert analyze(str(tmp_path)).events.filter(pl.col("kind") == CONTEXT_KIND).height == 0


@pytest.mark.parametrize("line", [
    "Host: localhost:8080",  # an HTTP header with its port: no machine of the job
    "Node: 0",  # a node rank, not a name
    "===== Summary =====",  # a banner without a digit in its word is a section title
    "=== epoch 3 ===",
    "    node = build_graph(config)",  # source text
])
def test_lines_that_only_look_like_a_context_name_no_host(tmp_path, line):
    write(tmp_path, ["job 4711 starting", line, *ORDINARY, FAILURE, "worker exiting"])
    assert verdict(tmp_path)["culprit_hosts"] == []


def test_every_context_row_has_a_host_group():
    assert len(context_patterns()) >= 3
    assert all(group >= 1 for _, group in context_patterns())
