"""NCCL WARN rows by the code that prints them (vocabularies/nccl_warn.csv): a failure of the topology
code or of the network plugin's setup is an init failure, a fallback NCCL takes by itself stays `other`."""

from __future__ import annotations

import csv
from pathlib import Path

from analyzer.api import analyze

VOCABULARY = Path(__file__).resolve().parents[1] / "vocabularies" / "nccl_warn.csv"
BEFORE = "vm:627:627 [0] NCCL INFO NCCL version 2.28.9+cuda13.0"
AFTER = "vm:627:627 [0] NCCL INFO comm 0x5580 rank 0 nranks 1 cudaDev 0 busId 18000 - Init START"


def verdict(tmp_path: Path, line: str) -> str:
    (tmp_path / "stdout.log").write_text(f"{BEFORE}\n{line}\n{AFTER}\n")
    return analyze(str(tmp_path)).report["verdict"]["category"]


def rows() -> list[dict]:
    with VOCABULARY.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_no_net_plugin_initialised_is_an_init_failure(tmp_path):
    line = "[2026-12-02 05:02:54] vm:627:627 [0] plugin/net.cc:379 NCCL WARN Failed to initialize any NET plugin"
    assert verdict(tmp_path, line) == "nccl_init_failure"


def test_a_topology_failure_is_an_init_failure(tmp_path):
    line = "node-3:4410:4410 [2] graph/xml.cc:470 NCCL WARN XML Parse : Unexpected EOF"
    assert verdict(tmp_path, line) == "nccl_init_failure"


def test_the_topology_code_s_own_fallbacks_name_no_init_failure():
    fallbacks = [r for r in rows() if r["code"] in ("WARN rings.cu", "WARN xml.cc", "WARN connect.cc")
                 and any(word in r["message"] for word in ("falling back", "trying to use", "not dumping", "User asked"))]
    assert fallbacks and {r["category"] for r in fallbacks} == {"other"}


def test_no_topology_error_row_is_left_without_its_category():
    """`other` would make the verdict say nothing; a row with a narrower category (an NVLS graph's NIC) keeps it."""
    topology = [r for r in rows() if r["code"] in ("WARN xml.cc", "WARN topo.cc", "WARN paths.cc", "WARN search.cc")
                and r["message"].startswith(("Error", "XML Parse", "Could not find")) and "falling back" not in r["message"]]
    assert len(topology) >= 20 and "other" not in {r["category"] for r in topology}
    assert sum(r["category"] == "nccl_init_failure" for r in topology) >= 20
