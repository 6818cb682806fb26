"""Every recorded hang fixture: the verdict names the right culprit, with evidence from the dumps or stacks.

The cases are the recorded fixtures (fixtures/recorded/*/truth.toml) whose truth is a hang category.
For each, `postmortem analyze` must give the truth's category and culprit ranks, and the verdict,
or a cause finding that names the same culprit, must cite a Flight Recorder dump or a py-spy stack
(not only log lines) whenever the job has one: the culprit's own dump or stack when it left one.
The inputs table must attribute every dump and stack file to the rank its file name carries.
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from pathlib import Path

import pytest

from analyzer.api import analyze
from analyzer.categories import categories
from analyzer.rules import rules_by_id

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
# A hang recording: every category whose peers stay alive waiting (schema/categories.toml `hangs`), a crash
# that leaves them waiting too.
HANG_CATEGORIES = {c.id for c in categories() if c.hangs}
DUMP_FORMATS = {"pickle", "flight_recorder_json"}
STACK_FORMATS = {"pyspy_text", "pyspy_json"}
# Written here, not imported: the check must not share the analyzer's own parsing of names.
_RANK_IN_NAME = re.compile(r"rank_?(\d+)")


def _truth(case: Path) -> dict:
    return tomllib.loads((case / "truth.toml").read_text())


def with_known_gap(case: Path, key: str = "known_gap"):
    """A fixture whose truth.toml names a `known_gap` (what the analyzer cannot yet do with its dumps), a
    `verdict_gap` (a first-contact verdict not yet fixed) or a `refused_gap` (a job not yet read at all) is an expected failure of the checks that need it,
    strict: the mark fails the run once the gap is closed."""
    truth = case / "truth.toml"
    gap = tomllib.loads(truth.read_text()).get(key) if truth.is_file() else None
    return pytest.param(case, marks=pytest.mark.xfail(strict=True, reason=gap)) if gap else case


CASES = sorted(p.parent for p in RECORDED.glob("*/truth.toml") if _truth(p.parent)["category"] in HANG_CATEGORIES)


def _files_under(case: Path, *subdirs: str) -> list[Path]:
    return [p for sub in subdirs for p in (case / "job" / sub).glob("*") if p.is_file()]


@cache
def _report(case: Path) -> dict:
    return analyze(case / "job").report


def test_the_recorded_hangs_are_all_here():
    names = {c.name for c in CASES}
    assert {"hang_rank_stuck_outside", "hang_uneven_data", "hang_rank0_only_branch", "hang_conditional_collective",
            "rank_raises", "rank_raises_2nodes", "cpu_gloo_hang"} <= names


@pytest.mark.parametrize("case", [with_known_gap(c, "verdict_gap") for c in CASES], ids=lambda c: c.name)
def test_verdict_names_the_culprit(case: Path):
    truth, verdict = _truth(case), _report(case)["verdict"]
    assert verdict["category"] == truth["category"], verdict["summary"]
    assert sorted(verdict["culprit_ranks"]) == sorted(truth["culprit_ranks"]), verdict["summary"]


@pytest.mark.parametrize("case", [with_known_gap(c) for c in CASES], ids=lambda c: c.name)
def test_evidence_comes_from_dumps_or_stacks(case: Path):
    report, truth = _report(case), _truth(case)
    culprits = set(truth["culprit_ranks"])
    formats = {i["file"]: i["format"] for i in report["inputs"]}
    ranks_of = {i["file"]: set(i["ranks"]) for i in report["inputs"]}
    dump_files = {f for f, fmt in formats.items() if fmt in DUMP_FORMATS | STACK_FORMATS}
    if not dump_files:
        # rank_raises: one agent killed the survivor a second after the crash, before any watchdog,
        # dump or py-spy; its verdict can only rest on log lines, and must still have some.
        assert not _files_under(case, "fr", "pyspy")
        assert report["verdict"]["evidence"]
        return
    rules = rules_by_id()
    supporting = [report["verdict"]] + [
        f for f in report["findings"]
        if rules[f["rule_id"]].role == "cause" and set(f["ranks"]) == culprits
    ]
    cited = {e["file"] for doc in supporting for e in doc["evidence"]}
    from_dumps = cited & dump_files
    assert from_dumps, f"only log lines cited: {sorted(cited)}"
    culprit_files = {f for f in dump_files if ranks_of[f] & culprits}
    if culprit_files:
        # The culprit left a dump or a stack: it is what shows where the culprit was.
        assert from_dumps & culprit_files, f"culprit's own dump/stack not cited: {sorted(from_dumps)}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dumps_and_stacks_are_attributed_to_the_rank_in_their_name(case: Path):
    report = _report(case)
    checked = 0
    for item in report["inputs"]:
        if item["format"] not in DUMP_FORMATS | STACK_FORMATS:
            continue
        name = Path(item["file"]).name
        match = _RANK_IN_NAME.search(name)
        assert match, name
        assert item["ranks"] == [int(match.group(1))], item
        assert item["status"] == "parsed", item
        checked += 1
    assert checked == len(_files_under(case, "fr", "pyspy"))


def test_stacks_and_dumps_agree_on_who_is_outside():
    """A rank blocked in `t.item()` after its all_reduce looks "outside" to py-spy; its Flight Recorder
    entry shows it waiting. Only the rank with nothing pending is named by stack clustering."""
    report = _report(RECORDED / "hang_uneven_data")
    stack_findings = [f for f in report["findings"] if f["rule_id"] == "hang-rank-stuck-outside-collective"]
    assert not stack_findings or stack_findings[0]["ranks"] == [1]
    report = _report(RECORDED / "hang_rank_stuck_outside")
    found = next(f for f in report["findings"] if f["rule_id"] == "hang-rank-stuck-outside-collective")
    assert found["ranks"] == [1]
    assert "waiting in ALLREDUCE #20 per Flight Recorder" in found["summary"]
    assert "nothing pending" in found["summary"]
