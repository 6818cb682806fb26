"""Cause over symptom for the c10d store client: a socket closed from the other end (`DistNetworkError:
Connection closed by peer`, `failed to recv, got 0 bytes`) is the store host's death, not the network;
a connect that times out stays the network failure. Each line sits between ordinary lines."""

from __future__ import annotations

from pathlib import Path

from analyzer.api import analyze

_STEP = "[rank{r}]: step 10 loss 1.0412"
_CRASH = [
    "[rank0]: Traceback (most recent call last):",
    '[rank0]:   File "/app/train.py", line 71, in main',
    "[rank0]:     batch = next(loader)",
    "[rank0]: ValueError: too many values to unpack (expected 2)",
]
_CLOSED = [
    "[rank1]: torch.distributed.DistNetworkError: Connection closed by peer [10.0.0.1]:29500",
    "[rank1]: torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. "
    "Did the remote server shutdown or crash?",
]
_TIMEOUT = ("[rank1]: torch.distributed.DistNetworkError: The client socket has timed out after 600s while trying "
            "to connect to (10.0.0.1, 29500).")


def _job(tmp_path: Path, rank0: list[str], rank1: str) -> dict:
    (tmp_path / "rank0.log").write_text("\n".join([_STEP.format(r=0), *rank0, _STEP.format(r=0)]) + "\n")
    (tmp_path / "rank1.log").write_text("\n".join([_STEP.format(r=1), rank1, _STEP.format(r=1)]) + "\n")
    return analyze(tmp_path).report


def _rules(report: dict) -> dict[str, list[str]]:
    return {f["rule_id"]: f["caused_by"] for f in report["findings"]}


def test_store_peer_closed_after_the_store_host_crashed_is_its_consequence(tmp_path):
    for i, line in enumerate(_CLOSED):
        job = tmp_path / str(i)
        job.mkdir()
        report = _job(job, _CRASH, line)
        found = _rules(report)
        assert "vocabulary-network-unreachable-or-firewall" not in found, line
        assert found["peer-connection-closed"] == ["python-uncaught-exception"], line
        assert report["verdict"]["culprit_ranks"] == [0], line


def test_store_peer_closed_alone_names_the_peer_exit_not_the_network(tmp_path):
    report = _job(tmp_path, [], _CLOSED[0])
    assert report["verdict"]["category"] == "rank_crash_exception_then_hang"


def test_store_connect_timeout_beside_a_crash_stays_the_network(tmp_path):
    report = _job(tmp_path, _CRASH, _TIMEOUT)
    assert report["verdict"]["category"] == "network_unreachable_or_firewall"
    assert "peer-connection-closed" not in _rules(report)
