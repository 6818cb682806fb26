"""Issue 18's classes of hostile input: each ends in a bounded result, measured in a child process.

Every item of `tests/hostile_gen.py` is generated into tmp_path (small: DAG pickles, sparse files,
repeated blocks) and analysed by `postmortem analyze --format json` in a child process, as a user
runs it. The child reports its wall time and its peak RSS (VmHWM; `resource`'s ru_maxrss too, an
upper bound that includes this test runner's). Each test asserts the bound (TIME_BOUND_S,
RSS_BOUND_MB), that the result is a report naming the input with its status and reason (or exit
2), what the class must say, and that nothing was written in the job directory. Large sizes
(256 MB trace, 20M-row export, 64 MB pickle bomb) are run by bench/bench_bad_input.py; here the
budgets are shrunk by a prelude instead, so the same mechanism is exercised on small files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import hostile_gen as gen
from tests.test_hostile_inputs import tree_state

TIME_BOUND_S = 60
RSS_BOUND_MB = 1024
STATUSES = {"parsed", "partial", "skipped", "error"}
pytestmark = pytest.mark.timeout(300, method="signal")

# Smaller budgets for the test scale: the mechanism that bounds the full-size input, on a small one.
PRELUDES = {
    "kineto-without-separator": "import analyzer.parse.kineto_stream as k; k.MAX_EVENT_BYTES = 8 << 20\n",
    "nsys-many-rows": "import analyzer.parse.nsys as n; n.MAX_ROWS = 50_000\n",
    "fr-pickle-object-bomb": "import analyzer.io.budget as b; b.MEMORY_BUDGET_BYTES = 128 << 20\n",
    "nsys-generated-column": "",
}
SCALE = 0.05


def run_item(name: str, tmp_path: Path, argv: tuple[str, ...] = ()) -> tuple[dict, str, Path]:
    item = gen.BY_NAME[name]
    job = tmp_path / "job"
    entry = gen.write(item, job, SCALE)
    target = job / entry if name == "link-out-of-root" else job
    before = tree_state(tmp_path)
    result = gen.measure(target, tmp_path.parent / f"{tmp_path.name}.report.json", item.argv + argv,
                         prelude=PRELUDES.get(name, ""))
    assert tree_state(tmp_path) == before, "the analysis wrote inside the analysed directory"
    assert result["exit"] in (0, 1, 2), result["stderr"]
    assert "Traceback" not in result["stderr"], result["stderr"]
    assert result["seconds"] < TIME_BOUND_S, result
    assert result["peak_rss_mb"] < RSS_BOUND_MB, result
    if result["exit"] != 2:
        report = result["report"]
        assert report is not None, result["stderr"]
        assert {i["status"] for i in report["inputs"]} <= STATUSES
    return result, entry, job


def row(report: dict, entry: str) -> dict:
    return {i["file"]: i for i in report["inputs"]}[entry]


def checkpoints(report: dict) -> dict[str, dict]:
    return {c["path"]: c for c in report.get("checkpoints") or []}


def test_every_generator_is_tested():
    tested = {"huge-numbers-in-log-lines", "huge-numbers-in-file-names", "huge-numbers-in-fr-dump", "absurd-world-size",
              "pyspy-frame-backtracking", "kineto-without-separator", "nsys-generated-column",
              "safetensors-4000-digit-shape", "fr-shared-list-dag", "memsnapshot-shared-list-dag", "long-member-name",
              "checkpoint-self-reference", "pickle-long-binput-2**28", "fr-pickle-object-bomb", "sparse-pickle",
              "nsys-many-rows", "zip-overlapping-entries", "trojan-checkpoints", "checkpoint-symlink-loop",
              "sibling-jobs", "link-out-of-root"}
    assert tested == set(gen.BY_NAME)


# --- numbers past int64 and absurd world sizes ----------------------------------------------------


@pytest.mark.parametrize("name", ["huge-numbers-in-log-lines", "huge-numbers-in-file-names", "huge-numbers-in-fr-dump"])
def test_huge_numbers(name, tmp_path):
    result, entry, _ = run_item(name, tmp_path)
    report = result["report"]
    assert row(report, entry)["status"] in ("parsed", "partial")
    ranks = report["job"]["ranks"] + report["verdict"]["culprit_ranks"]
    assert all(r < 1 << 20 for r in ranks), ranks
    # File names may carry the digits (a fact's source quotes its file); no fact may be the number.
    facts = {k: v for k, v in report["job"].items() if k not in ("world_size_source", "time_span")}
    assert gen.HUGE not in json.dumps(facts)


def test_absurd_world_size(tmp_path):
    result, entry, _ = run_item("absurd-world-size", tmp_path)
    report = result["report"]
    assert report["job"]["world_size"] is None or report["job"]["world_size"] < 1000
    assert all(r < 1000 for r in report["verdict"]["culprit_ranks"])
    shards = [c for c in report["checkpoints"] if c["format"] == "deepspeed"]
    assert shards and all(c["shards_expected"] < 1000 for c in shards)


# --- super-linear shapes ---------------------------------------------------------------------------


def test_pyspy_frame_backtracking(tmp_path):
    result, entry, _ = run_item("pyspy-frame-backtracking", tmp_path)
    assert "cut" in row(result["report"], entry)["reason"]


def test_kineto_without_separator(tmp_path):
    result, entry, _ = run_item("kineto-without-separator", tmp_path)
    item = row(result["report"], entry)
    assert item["status"] == "error" and "no event boundary" in item["reason"], item


def test_nsys_generated_column(tmp_path):
    result, entry, _ = run_item("nsys-generated-column", tmp_path)
    item = row(result["report"], entry)
    assert item["status"] == "skipped" and "generated column" in item["reason"], item


def test_safetensors_4000_digit_shape(tmp_path):
    result, _, _ = run_item("safetensors-4000-digit-shape", tmp_path)
    record = checkpoints(result["report"])["checkpoints/model.safetensors"]
    assert record["problem"] == "corrupt" and "bad entries" in record["reason"]


@pytest.mark.parametrize("name", ["fr-shared-list-dag", "memsnapshot-shared-list-dag", "long-member-name"])
def test_rendering_is_bounded(name, tmp_path):
    result, entry, _ = run_item(name, tmp_path)
    assert row(result["report"], entry)["status"] in ("parsed", "partial")
    assert len(json.dumps(result["report"])) < 1 << 20
    assert all(len(i["file"]) <= 4096 for i in result["report"]["inputs"])


def test_checkpoint_self_reference(tmp_path):
    result, _, _ = run_item("checkpoint-self-reference", tmp_path)
    records = checkpoints(result["report"])
    assert set(records) >= {"checkpoints/step_5.pt", "checkpoints/checkpoint_deep.pkl"}
    assert "step" in records["checkpoints/step_5.pt"]["components"]


# --- memory amplification ---------------------------------------------------------------------------


def test_pickle_long_binput(tmp_path):
    result, entry, _ = run_item("pickle-long-binput-2**28", tmp_path)
    item = row(result["report"], entry)
    assert item["status"] == "skipped" and "budget" in item["reason"], item
    record = checkpoints(result["report"])["checkpoints/step_7.pt"]
    assert record["problem"] == "corrupt" and "budget" in record["reason"]


def test_fr_pickle_object_bomb(tmp_path):
    result, entry, _ = run_item("fr-pickle-object-bomb", tmp_path)
    item = row(result["report"], entry)
    assert item["status"] == "skipped" and "exceeded the 128 MB budget" in item["reason"], item


def test_sparse_pickle(tmp_path):
    result, entry, _ = run_item("sparse-pickle", tmp_path)
    item = row(result["report"], entry)
    assert item["status"] in ("error", "skipped") and "limit" in item["reason"], item


def test_nsys_many_rows(tmp_path):
    result, entry, _ = run_item("nsys-many-rows", tmp_path)
    item = row(result["report"], entry)
    assert item["status"] == "parsed" and "read the first 50,000 rows" in item["reason"], item


# --- a zip of overlapping entries ---------------------------------------------------------------


def test_zip_overlapping_entries(tmp_path):
    result, _, _ = run_item("zip-overlapping-entries", tmp_path)
    record = checkpoints(result["report"])["checkpoints/step_3.pt"]
    assert record["problem"] == "corrupt" and "overlap" in record["reason"]


# --- the checkpoint audit ---------------------------------------------------------------------------


def test_trojan_checkpoints(tmp_path):
    result, _, _ = run_item("trojan-checkpoints", tmp_path)
    records = checkpoints(result["report"])
    for path in ("checkpoints/step_900.pt", "checkpoints/step_901.pt", "checkpoints/step_902.pt"):
        assert records[path]["problem"] == "unsafe" and not records[path]["newest_resumable"], records[path]
    unknown = records["checkpoints/step_903.pt"]
    assert unknown["unknown_globals"] == ["some_lib.models.Net"]
    assert not unknown["resumable"] or "weights_only=True) will refuse" in unknown["notes"]


def test_checkpoint_symlink_loop(tmp_path):
    result, _, _ = run_item("checkpoint-symlink-loop", tmp_path)
    report = result["report"]
    assert checkpoints(report)["checkpoints/step_900.pt"]["problem"] == "unsafe"
    assert not any("checkpoint" in p for p in report["problems"]), report["problems"]


def test_sibling_jobs(tmp_path):
    # Nothing beside the job is audited unless --checkpoint names it: the job's own directory is
    # given, and the shared outputs/, ckpt-other-job/ and checkpoint-100/ beside it stay unread.
    own = tmp_path / "job-checkpoints"
    result, _, _ = run_item("sibling-jobs", tmp_path, ("--checkpoint", str(own)))
    paths = set(checkpoints(result["report"]))
    assert paths == {f"{own}/step_5.pt"}, paths


def test_link_out_of_root(tmp_path):
    result, _, _ = run_item("link-out-of-root", tmp_path)
    text = json.dumps(result["report"])
    assert "model.pt" not in text and "weights.pt" not in text and "123463" not in text
