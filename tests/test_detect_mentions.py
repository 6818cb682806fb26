"""Detect: the host or ranks a writer-less line names are read from the log's own text only.

A vocabulary event's detail is the vocabulary's gloss (`<row id>: <meaning>`): a host it seems to
name (`the address its hostname resolves to`) is nobody's. NCCL's `Last error:` detail is the log's:
its `remote peer <host>` names the culprit host. Message and detail are read apart: a message
ending `No route to host` does not name the detail's first word.
"""

from __future__ import annotations

from pathlib import Path

from analyzer.detect import _pattern_findings
from analyzer.events import events_from_records
from analyzer.facts.correlate import JobContext
from analyzer.rules import Rule

RULE = Rule(id="net", title="net", category="other", severity="error", role="cause", priority=1, confidence=0.5,
            attribution="ranks", explanation="", remediation="", references=(), path=Path("net.toml"),
            match={"anywhere": ["refused|closed|No route"]})


def _hosts(kind: str, message: str, detail: str) -> list[str]:
    before = {"kind": "train.step", "severity": "info", "message": "step 10 loss 2.1"}
    events = events_from_records([before, {"kind": kind, "severity": "error", "message": message, "detail": detail},
                                  before]).with_row_index("event_id")
    found = _pattern_findings(events, [RULE], JobContext())
    assert found.height == 1
    return found.row(0, named=True)["hosts"]


def test_a_vocabulary_gloss_names_no_host():
    gloss = ("pytorch-c10d/gloo-connect-loopback-peer: Gloo's device took the address its hostname resolves to "
             "(an /etc/hosts line), so no other host can connect to it.")
    assert _hosts("vocab.wrong_network_interface", "SO_ERROR: Connection refused, remote=[127.0.0.1]:<port>", gloss) == []


def test_the_last_error_detail_of_the_log_names_the_remote_peer():
    detail = "Last error:\nsocketProgress: Connection closed by remote peer node-7.cluster<45123>"
    assert _hosts("nccl.error_raised", "NCCL error: remote process exited or there was a network error", detail) == ["node-7.cluster"]


def test_a_message_ending_in_host_does_not_name_the_details_first_word():
    assert _hosts("nccl.last_error", "socketStartConnect: Connect to 10.0.0.1<52822> failed : No route to host",
                  "unhandled system error") == []
