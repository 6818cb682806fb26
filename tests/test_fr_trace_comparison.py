"""PyTorch's own Flight Recorder analyzer (fr_trace) and postmortem, run on the same dumps.

`python -m torch.distributed.flight_recorder.fr_trace DIR` (shipped with torch) pairs each rank's
ring-buffer entries greedily, starting from whichever dump the directory lists first, and prints
what it finds ("Not all ranks joining collective ... missing ranks", "Collective sequence number:
N has errors ... Culprit rank R"). It runs here as a subprocess with a timeout and its output is
parsed; postmortem runs on the same directory. Where fr_trace gets it right, both must agree; where
it errors (a missing dump), gives up (more than 10 mismatches) or blames healthy ranks, postmortem
must still name the right rank. The synthetic sets come from tests/frgen.py (a real dump's
structure, full 2,000-entry ring buffers).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from analyzer.api import analyze
from tests.frgen import DumpFactory, DumpSetSpec, dump_name, write_dump_set
from tests.test_recorded_hangs import with_known_gap

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "fixtures" / "recorded"
SAMPLES = REPO.parent / "shared" / "formats-samples" / "flight-recorder"
FR_TRACE_MODULE = "torch.distributed.flight_recorder.fr_trace"
FR_TRACE_TIMEOUT_S = 300
WORLD = 8


def _fr_trace_missing() -> str | None:
    torch = importlib.util.find_spec("torch")  # finds the package without importing it (seconds)
    if torch is None or torch.origin is None:
        return "torch is not installed"
    if not (Path(torch.origin).parent / "distributed" / "flight_recorder" / "fr_trace.py").is_file():
        return f"this torch build has no {FR_TRACE_MODULE}"
    return None


pytestmark = pytest.mark.skipif(_fr_trace_missing() is not None, reason=str(_fr_trace_missing()))


# --- fr_trace: run it, read what it says -----------------------------------------------------------


@dataclass
class Report:
    """One problem fr_trace prints: its kind, the collective's seq (when printed) and the ranks named."""

    kind: str  # not_all_joined | errors | size_mismatch | undecided | no_errors
    seq: int | None = None
    ranks: set[int] = field(default_factory=set)


@dataclass
class FrTrace:
    returncode: int
    output: str
    reports: list[Report]
    gave_up: bool  # "Too many mismatches for process_group ...: aborting" (the --mismatch_cap of 10)
    error: str | None  # the exception it died with

    @property
    def blamed(self) -> set[int]:
        """The ranks its first report names: what a reader of its output takes as the answer."""
        return self.reports[0].ranks if self.reports else set()

    def report_at(self, seq: int) -> Report | None:
        return next((r for r in self.reports if r.seq == seq), None)


_HEADERS = (
    (re.compile(r"^Not all ranks joining collective, sequence number: (\d+)"), "not_all_joined"),
    (re.compile(r"^Collective sequence number: (\d+) has errors"), "errors"),
    (re.compile(r"^Input/output mismatch in the collective sequence number: (\d+)"), "size_mismatch"),
)
_MISSING = re.compile(r"^missing ranks: \{([\d, ]*)\}")
_CULPRIT = re.compile(r"Culprit rank (\d+);")
_UNDECIDED = re.compile(r"^We cannot decide what's wrong .* missed FR dumps from ranks \(\{([\d, ]*)\}\)")
_EXCEPTION = re.compile(r"^(\w+(?:Error|Exception)): (.*)$")


def _ranks(text: str) -> set[int]:
    return {int(r) for r in re.findall(r"\d+", text)}


def parse_fr_trace(returncode: int, output: str) -> FrTrace:
    reports: list[Report] = []
    gave_up = False
    for line in output.splitlines():
        for pattern, kind in _HEADERS:
            match = pattern.match(line)
            if match:
                reports.append(Report(kind, int(match.group(1))))
                break
        else:
            if (match := _MISSING.match(line)) and reports:
                reports[-1].ranks = _ranks(match.group(1))
            elif line.startswith("error msg: ") and reports:
                reports[-1].ranks = {int(r) for r in _CULPRIT.findall(line)}
            elif match := _UNDECIDED.match(line):
                reports.append(Report("undecided", None, _ranks(match.group(1))))
            elif line.startswith("No errors found for this collective entry"):
                reports.append(Report("no_errors"))
            elif line.startswith("Too many mismatches for process_group"):
                gave_up = True
    error = None
    if returncode != 0:
        found = [m for m in (_EXCEPTION.match(line) for line in output.splitlines()) if m]
        error = f"{found[-1].group(1)}: {found[-1].group(2)}" if found else f"exit status {returncode}"
    return FrTrace(returncode, output, reports, gave_up, error)


def run_fr_trace(trace_dir: Path, *args: str) -> FrTrace:
    done = subprocess.run(
        [sys.executable, "-m", FR_TRACE_MODULE, str(trace_dir), *args],
        capture_output=True, text=True, timeout=FR_TRACE_TIMEOUT_S, check=False,
    )
    return parse_fr_trace(done.returncode, done.stdout + done.stderr)


def ours(path: Path) -> dict:
    return analyze(path).report["verdict"]


def listing_order(directory: Path) -> list[int]:
    """The ranks in the order fr_trace reads their dumps (os.walk's order, the file system's)."""
    _, _, files = next(os.walk(directory))
    return [int(name.rsplit("_", 1)[1]) for name in files if name.startswith("nccl_trace_rank_")]


def test_parser_reads_fr_trace_output():
    text = (
        "Not all ranks joining collective, sequence number: 20\ninternal record id: 19\nmissing ranks: {1}\n"
        "Collective sequence number: 29 has errors\nerror msg: Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH, "
        "Expected collective type: 'all_reduce' does not match found collective type: 'all_reduce_barrier', "
        "Culprit rank 3; Error type: COLLECTIVE_TYPE_MISMATCH, x\n"
        "We cannot decide what's wrong with this collective entry because we missed FR dumps from ranks ({7}) so ...\n"
        "Too many mismatches for process_group 05744: default_pg aborting\n"
    )
    parsed = parse_fr_trace(0, text)
    assert [(r.kind, r.seq, r.ranks) for r in parsed.reports] == [
        ("not_all_joined", 20, {1}), ("errors", 29, {1, 3}), ("undecided", None, {7})
    ]
    assert parsed.gave_up and parsed.error is None and parsed.blamed == {1}
    died = parse_fr_trace(1, "Traceback (most recent call last):\n  ...\nAssertionError: Missing dump files from ranks {1}\n")
    assert died.error == "AssertionError: Missing dump files from ranks {1}" and not died.reports


# --- the recorded hangs' own dumps ---------------------------------------------------------------

FR_CASES = sorted({p.parents[2] for p in RECORDED.glob("*/job/fr/nccl_trace_rank_*")})


def _group_size(fr_dir: Path) -> int:
    import pickle

    doc = pickle.loads(next(fr_dir.iterdir()).read_bytes())  # recorded by this project: trusted
    return len(json.loads(doc["pg_config"]["0"]["ranks"]))


def _pickle_dumps(fr_dir: Path, tmp_path: Path) -> Path:
    """The folder of the rank's pickle dumps alone: fr_trace takes every file's suffix after the
    prefix as a rank number, so a JSON twin (`nccl_trace_rank_0.json`) beside them stops it."""
    dumps = [p for p in fr_dir.iterdir() if not p.suffix]
    if len(dumps) == len(list(fr_dir.iterdir())):
        return fr_dir
    (tmp_path / "fr").mkdir()
    for dump in dumps:
        shutil.copy(dump, tmp_path / "fr" / dump.name)
    return tmp_path / "fr"


@pytest.mark.parametrize("case", [with_known_gap(c) for c in FR_CASES], ids=lambda c: c.name)
def test_recorded_dumps(case: Path, tmp_path: Path):
    fr_dir = _pickle_dumps(case / "job" / "fr", tmp_path)
    culprits = set(tomllib.loads((case / "truth.toml").read_text())["culprit_ranks"])
    verdict = ours(fr_dir)  # the dumps alone, as fr_trace sees them
    assert set(verdict["culprit_ranks"]) == culprits, verdict["summary"]
    theirs = run_fr_trace(fr_dir)
    complete = len(list(fr_dir.iterdir())) == _group_size(fr_dir)
    if complete:
        # With every rank's dump, fr_trace finds these too: the two agree.
        assert theirs.error is None and theirs.blamed == culprits, theirs.output[-2000:]
    else:
        # A rank that died left no dump (rank_raises_2nodes): fr_trace refuses to analyse, and with
        # --allow-incomplete-ranks it only says it cannot decide.
        assert theirs.error is not None and "Missing dump files" in theirs.error
        partial = run_fr_trace(fr_dir, "--allow-incomplete-ranks")
        assert partial.reports and all(r.kind == "undecided" for r in partial.reports), partial.output[-2000:]
        assert verdict["category"] == "rank_absent_from_collective" and "suspect by absence" in verdict["summary"]


# --- the real samples in shared/formats-samples ----------------------------------------------------


def _sample(name: str) -> Path:
    path = SAMPLES / name
    if not path.is_dir():
        pytest.skip("shared/formats-samples not available")
    return path


def test_sample_timeout_dump():
    directory = _sample("timeout-dump_TORCH_NCCL_DUMP_ON_TIMEOUT")
    theirs = run_fr_trace(directory)
    assert theirs.error is None and theirs.reports[0].kind == "not_all_joined" and theirs.blamed == {1}
    verdict = ours(directory)
    assert verdict["category"] == "rank_absent_from_collective" and verdict["culprit_ranks"] == [1]


def test_sample_api_dump_pickle_and_json(tmp_path: Path):
    """`_dump_nccl_trace` output of a healthy job, both as pickles (`*_rank0.pkl`) and JSON: fr_trace
    cannot even name the files' rank (it needs bare `<prefix><rank>` names); postmortem reads all
    four and finds nothing wrong, as there is nothing wrong."""
    directory = _sample("api-dump")
    theirs = run_fr_trace(directory)
    assert theirs.error is not None and "prefix" in theirs.error
    with_prefix = run_fr_trace(directory, "--prefix", "_dump_nccl_trace_rank")
    assert with_prefix.error is not None and "invalid literal for int()" in with_prefix.error
    analysis = analyze(directory)
    assert analysis.report["verdict"]["category"] == "none"
    read = {i["file"]: (i["format"], i["ranks"], i["status"]) for i in analysis.report["inputs"]}
    assert sorted(read.values()) == [
        ("flight_recorder_json", [0], "parsed"), ("flight_recorder_json", [1], "parsed"),
        ("pickle", [0], "parsed"), ("pickle", [1], "parsed"),
    ]


# --- synthetic sets where fr_trace fails ---------------------------------------------------------


def _arrange(directory: Path, make_spec) -> tuple[DumpSetSpec, list[int]]:
    """Write a healthy set to learn the file system's listing order, then rewrite it with the roles
    `make_spec(order)` gives (same file names, so the order stays)."""
    write_dump_set(directory, DumpSetSpec(world=WORLD))
    order = listing_order(directory)
    spec = make_spec(order)
    for rank in spec.missing:
        (directory / dump_name(rank)).unlink()
    write_dump_set(directory, spec)
    assert listing_order(directory) == [r for r in order if r not in spec.missing]
    return spec, order


def test_missing_culprit_dump(tmp_path: Path):
    """The culprit's own dump is the one that is missing (its node hung or died)."""
    spec, order = _arrange(tmp_path, lambda order: DumpSetSpec(world=WORLD, culprit=order[3], missing=(order[3],)))
    theirs = run_fr_trace(tmp_path)
    assert theirs.error == f"AssertionError: Missing dump files from ranks {{{spec.culprit}}}"
    partial = run_fr_trace(tmp_path, "--allow-incomplete-ranks")
    # It cannot decide on any collective (every one lacks a rank's entry), so the oldest entries of
    # the ring buffer use up its 10 mismatches and it stops long before the stuck collective.
    assert partial.gave_up and partial.reports and {r.kind for r in partial.reports} == {"undecided"}
    verdict = ours(tmp_path)
    assert verdict["category"] == "rank_absent_from_collective" and verdict["culprit_ranks"] == [spec.culprit]
    assert verdict["confidence"] >= 0.5


def test_more_than_ten_mismatches_before_the_hang(tmp_path: Path):
    """Two ranks also run a side process group (one extra collective per step, as pipeline or tensor
    parallel groups do), so their ring buffers cover fewer steps and their record ids run ahead.
    fr_trace aligns buffers by record id, then cannot pair the oldest collectives of the first rank
    it reads: it blames healthy ranks as missing, hits its 10-mismatch cap and aborts before the
    collective the job hung in. postmortem aligns by sequence number per process group."""
    spec, order = _arrange(
        tmp_path, lambda order: DumpSetSpec(world=WORLD, culprit=order[5], side_group=(order[0], order[1]))
    )
    theirs = run_fr_trace(tmp_path)
    assert theirs.error is None and theirs.gave_up
    assert len(theirs.reports) > 10
    stall = DumpFactory(spec).stall_seq
    assert theirs.report_at(stall) is None  # never got there
    assert all(r.seq is not None and r.seq < stall for r in theirs.reports)
    assert theirs.blamed and theirs.blamed != {spec.culprit}  # healthy ranks named "missing"
    verdict = ours(tmp_path)
    assert verdict["category"] == "rank_absent_from_collective" and verdict["culprit_ranks"] == [spec.culprit]
    assert f"#{stall}" in verdict["summary"]


@pytest.mark.parametrize("position", [0, 4], ids=["culprit-read-first", "culprit-read-later"])
def test_barrier_against_all_reduce(tmp_path: Path, position: int):
    """One rank calls barrier() while the other seven issue the gradient all_reduce at the same seq.
    fr_trace takes the first dump it reads as the reference: when that is the culprit's, it names the
    seven healthy ranks. postmortem names the minority, whatever the order."""
    spec, order = _arrange(
        tmp_path, lambda order: DumpSetSpec(world=WORLD, culprit=order[position], culprit_mode="barrier")
    )
    stall = DumpFactory(spec).stall_seq
    theirs = run_fr_trace(tmp_path)
    report = theirs.report_at(stall)
    assert theirs.error is None and report is not None and report.kind == "errors"
    healthy = set(range(WORLD)) - {spec.culprit}
    assert report.ranks == ({spec.culprit} if position else healthy)
    verdict = ours(tmp_path)
    assert verdict["category"] == "collective_mismatch" and verdict["culprit_ranks"] == [spec.culprit]
    assert "BARRIER" in verdict["summary"]
