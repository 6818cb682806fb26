"""The CLI contract: exit codes, JSON validated against the shipped schema, bad inputs never traceback."""

import gzip
import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from analyzer.cli import main
from tests.test_recorded_hangs import with_known_gap

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schema" / "report.schema.json").read_text())
CASE = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"
HEALTHY = ROOT / "fixtures" / "healthy" / "torchrun-2gpu-normal" / "job"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_text_verdict_with_evidence():
    result = run("analyze", CASE)
    assert result.exit_code == 1
    assert "VERDICT: rank_absent_from_collective" in result.output
    assert "stderr.log:3" in result.output


@pytest.mark.parametrize("case", [with_known_gap(job.parent, "refused_gap") for job in sorted((ROOT / "fixtures").glob("*/*/job"))],
                         ids=lambda p: p.name)
def test_json_validates_against_schema(case):
    result = run("analyze", case / "job", "--format", "json")
    assert result.exit_code in (0, 1)
    report = json.loads(result.output)
    jsonschema.validate(report, SCHEMA)
    assert (report["verdict"]["category"] == "none") == (result.exit_code == 0)


def test_json_is_deterministic():
    assert run("analyze", CASE, "--format", "json").output == run("analyze", CASE, "--format", "json").output


def test_healthy_exits_zero():
    assert run("analyze", HEALTHY).exit_code == 0


def test_missing_path_exits_two():
    result = run("analyze", "/no/such/job")
    assert result.exit_code == 2
    assert "no such file or directory" in result.output


def test_empty_directory_exits_two(tmp_path):
    result = run("analyze", tmp_path)
    assert result.exit_code == 2
    assert "holds no files" in result.output


def test_binary_only_exits_two(tmp_path):
    (tmp_path / "core").write_bytes(bytes(range(256)) * 400)
    result = run("analyze", tmp_path)
    assert result.exit_code == 2
    assert "binary" in result.output


def test_truncated_gzip_is_a_partial_report(tmp_path):
    log = (CASE / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log").read_bytes()
    (tmp_path / "good.log").write_bytes(log)
    (tmp_path / "cut.log.gz").write_bytes(gzip.compress(log * 50)[:300])
    result = run("analyze", tmp_path, "--format", "json")
    assert result.exit_code == 1
    inputs = {i["file"]: i for i in json.loads(result.output)["inputs"]}
    assert inputs["cut.log.gz"]["status"] == "error"
    assert inputs["cut.log.gz"]["reason"]


def test_gzip_log_is_read(tmp_path):
    log = (CASE / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log").read_bytes()
    (tmp_path / "rank0.log.gz").write_bytes(gzip.compress(log))
    report = json.loads(run("analyze", tmp_path, "--format", "json").output)
    assert report["inputs"][0]["status"] == "parsed"
    assert report["findings"]


def test_huge_single_line_is_bounded(tmp_path):
    (tmp_path / "one.log").write_bytes(b"x" * (50 << 20))
    result = run("analyze", tmp_path, "--format", "json")
    assert result.exit_code in (0, 2)
    if result.exit_code == 0:
        inputs = json.loads(result.output)["inputs"]
        assert inputs[0]["status"] in ("partial", "parsed")


def test_rules_list_and_explain():
    listing = run("rules", "list")
    assert listing.exit_code == 0 and "nccl-duplicate-gpu" in listing.output
    explained = run("rules", "explain", "nccl-duplicate-gpu")
    assert explained.exit_code == 0 and "set_device" in explained.output
    assert run("rules", "explain", "no-such-rule").exit_code == 2


def test_rules_test_command_passes():
    result = run("rules", "test")
    assert result.exit_code == 0, result.output


def test_every_command_is_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for command in ("analyze", "rules list", "rules explain", "rules test"):
        assert f"postmortem {command}" in readme


def test_host_pid_text_is_not_turned_into_emoji(tmp_path):
    (tmp_path / "x.log").write_text("host-a:100:107 [0] misc/socket.cc:1 NCCL WARN socketStartConnect: Connect to 10.0.0.2<4576> failed : Connection refused\n")
    result = run("analyze", tmp_path)
    assert "\U0001f4af" not in result.output
    assert "host-a:100:107" in result.output


# --- "no evidence" is not "no failure" --------------------------------------------------------------


def test_unrelated_text_is_no_training_log(tmp_path):
    (tmp_path / "README").write_text("hello world\n")
    (tmp_path / "notes.md").write_text("# Shopping\n\n- eggs\n- a 10 GB disk for the photos\n")
    (tmp_path / "style.css").write_text("body { margin: 0; }\n" * 40)
    result = run("analyze", tmp_path)
    assert result.exit_code == 2
    assert "no training logs found: 3 files read, none of a known format" in result.stderr
    assert "VERDICT" not in result.output
    json_result = run("analyze", tmp_path, "--format", "json")
    assert json_result.exit_code == 2 and json_result.stdout == ""


def test_a_single_hello_world_file_is_no_training_log(tmp_path):
    (tmp_path / "hello.txt").write_text("hello world\n")
    result = run("analyze", tmp_path / "hello.txt")
    assert result.exit_code == 2
    assert "no training logs found: 1 file read" in result.stderr


@pytest.mark.parametrize("job", sorted((ROOT / "fixtures" / "healthy").glob("*/job")), ids=lambda p: p.parent.name)
def test_every_healthy_run_is_still_none(job):
    result = run("analyze", job, "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["verdict"]["category"] == "none" and report["job"]["outcome"] == "ok"
    assert "Not read" not in report["verdict"]["summary"] and not any(i["capped"] for i in report["inputs"])


def test_a_clean_verdict_names_what_a_cap_left_unread(tmp_path, monkeypatch):
    import analyzer.io.walk as discover

    for n, log in enumerate(sorted(HEALTHY.rglob("*.log"))):
        (tmp_path / f"{n:02d}-{log.name}").write_bytes(log.read_bytes())
    total = len(list(tmp_path.iterdir()))
    monkeypatch.setattr(discover, "MAX_FILES", total - 1)
    result = run("analyze", tmp_path, "--format", "json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    (capped,) = [i for i in report["inputs"] if i["capped"]]
    assert report["verdict"]["category"] == "none" and report["job"]["outcome"] == "unknown"
    assert (f"Not read in full: 1 of {len(report['inputs'])} inputs (1 {capped['status']}: {capped['reason']})"
            in report["verdict"]["summary"])
    assert "Not read in full: 1 of" in run("analyze", tmp_path).stdout


def test_a_clean_verdict_with_an_unreadable_input_is_not_ok(tmp_path):
    for log in HEALTHY.rglob("*.log"):
        (tmp_path / f"{log.parent.name}-{log.name}").write_bytes(log.read_bytes())
    log = (CASE / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log").read_bytes()
    (tmp_path / "cut.log.gz").write_bytes(gzip.compress(log * 50)[:300])
    report = json.loads(run("analyze", tmp_path, "--format", "json").stdout)
    assert report["verdict"]["category"] == "none"
    assert report["job"]["outcome"] == "unknown"
    (cut,) = [i for i in report["inputs"] if i["status"] == "error"]
    assert f"Not read in full: 1 of {len(report['inputs'])} inputs (1 error: {cut['reason']})" in report["verdict"]["summary"]


def test_files_skipped_for_what_they_are_leave_a_clean_verdict_clean(tmp_path):
    for log in HEALTHY.rglob("*.log"):
        (tmp_path / f"{log.parent.name}-{log.name}").write_bytes(log.read_bytes())
    (tmp_path / "empty.log").write_bytes(b"")
    (tmp_path / "core").write_bytes(bytes(range(256)) * 64)
    report = json.loads(run("analyze", tmp_path, "--format", "json").stdout)
    assert {i["status"] for i in report["inputs"]} == {"parsed", "skipped"}
    assert report["verdict"]["summary"] == "No failure signature matched any input."
    assert report["job"]["outcome"] == "ok"


# --- output paths are checked before the work -------------------------------------------------------


@pytest.fixture
def analysis_must_not_run(monkeypatch):
    import analyzer.api

    def never(*_args, **_kwargs):
        raise AssertionError("the analysis ran although an output path cannot be written")

    monkeypatch.setattr(analyzer.api, "analyze", never)


@pytest.mark.parametrize("option,what", [("--html", "HTML report"), ("-o", "report")])
def test_output_in_a_missing_folder_fails_first(tmp_path, analysis_must_not_run, option, what):
    target = tmp_path / "no" / "such" / "dir" / "r.html"
    result = run("analyze", CASE, option, target)
    assert result.exit_code == 2
    assert f"cannot write the {what} to {target}: the folder {target.parent} does not exist" in result.stderr
    assert "Traceback" not in result.output


def test_output_below_a_file_fails_first(tmp_path, analysis_must_not_run):
    (tmp_path / "plain").write_text("")
    result = run("analyze", CASE, "-o", tmp_path / "plain" / "r.json", "--format", "json")
    assert result.exit_code == 2
    assert "is not a directory" in result.stderr


def test_output_on_a_directory_fails_first(tmp_path, analysis_must_not_run):
    (tmp_path / "r.html").mkdir()
    result = run("analyze", CASE, "--html", tmp_path / "r.html")
    assert result.exit_code == 2
    assert "directory" in result.output


def test_unwritable_output_fails_first(tmp_path, analysis_must_not_run, monkeypatch):
    target = tmp_path / "r.txt"
    real_open = Path.open

    def read_only_fs(self, mode="r", *args, **kwargs):
        if self == target and set(mode) & set("wax+"):
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", read_only_fs)  # root ignores file modes: the refusal is simulated
    result = run("analyze", CASE, "-o", target)
    assert result.exit_code == 2
    assert f"cannot write the report to {target}: Permission denied" in result.stderr


def test_the_check_leaves_nothing_behind(tmp_path):
    target = tmp_path / "report.txt"
    assert run("analyze", tmp_path / "missing-job", "-o", target).exit_code == 2
    assert not target.exists()


# --- terminal text that survives a pipe ----------------------------------------------------------------


def test_piped_text_is_not_hard_wrapped():
    out = run("analyze", CASE).stdout  # CliRunner's stdout is not a terminal, as with `| grep`
    lines = out.splitlines()
    verdict = next(line for line in lines if line.startswith("VERDICT:"))
    assert verdict == ("VERDICT: rank_absent_from_collective - A rank never arrived at the collective "
                       "the other ranks wait in")
    assert len(verdict) > 80
    evidence = [line for line in lines if "stderr.log:3  " in line]
    assert evidence and all("Last enqueued NCCL work: 1" in line for line in evidence[:1])
    assert "\x1b[" not in out  # no colour codes into a pipe


def test_piped_inputs_table_keeps_whole_distinct_names(tmp_path):
    log = (CASE / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log").read_bytes()
    deep = tmp_path / "cluster-a" / "experiment-with-a-long-descriptive-name" / "attempt_0"
    names = []
    for rank in range(3):
        (deep / str(rank)).mkdir(parents=True)
        (deep / str(rank) / "stderr.log").write_bytes(log.replace(b"[rank0]", f"[rank{rank}]".encode()))
        names.append(f"cluster-a/experiment-with-a-long-descriptive-name/attempt_0/{rank}/stderr.log")
    out = run("analyze", tmp_path).stdout
    rows = [line for line in out.splitlines() if line.startswith("\u2502 cluster-a/")]
    assert [row.split("\u2502")[1].strip() for row in rows] == names


def test_numbered_remediation_steps_keep_their_lines():
    out = run("analyze", CASE).stdout
    block = out[out.index("What to do\n"):out.index("Other findings")]
    steps = [line for line in block.splitlines()[1:] if line.strip()]
    assert [line[:3] for line in steps] == ["1. ", "2. ", "3. ", "4. ", "5. "]


def test_report_to_a_file_is_not_hard_wrapped(tmp_path):
    target = tmp_path / "report.txt"
    assert run("analyze", CASE, "-o", target).exit_code == 1
    assert any(line.startswith("VERDICT:") and len(line) > 80 for line in target.read_text().splitlines())


@pytest.mark.parametrize("recording", ["hang_conditional_collective", "dup_gpu_nccl"])
def test_each_line_is_evidence_once_under_the_best_ranked_finding(recording):
    # dup_gpu_nccl: each NCCL WARN line is two events (the WARN and the vocabulary row it matches)
    from analyzer.api import analyze

    job = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / recording / "job"
    findings = analyze(job).report["findings"]
    assert len(findings) >= 2
    cited = [(e["file"], e["line"]) for f in findings for e in f["evidence"]]
    assert len(cited) == len(set(cited)), "a line is shown as evidence twice"
    assert findings[0]["evidence"], "the verdict keeps its evidence"


def test_rules_list_as_json_names_every_signature():
    from analyzer.rules import catalogue

    result = CliRunner().invoke(main, ["rules", "list", "--format", "json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert [r["id"] for r in listed] == [r.id for r in catalogue()]
    assert all({"id", "category", "severity", "title", "role"} <= set(r) for r in listed)
