"""Discovery's caps never hide the evidence silently: depth, file count, listing, symlinks.

A 1,500-level directory tree is walked without recursion and the levels past MAX_DEPTH are a row;
200,000 junk files that sort before the real logs cannot use up the file cap (the cap is lowered
here, with the same shape: a disk that holds 200,001 files takes minutes to write and remove); a
job that hit a cap carries a row with `capped` set and the count of what was left out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import analyzer.io.walk as discover_module
from analyzer.cli import main
from analyzer.io import discover
from analyzer.io.walk import MAX_DEPTH

ROOT = Path(__file__).resolve().parents[1]
CASE_JOB = ROOT / "fixtures" / "cases" / "rec-watchdog-timeout-rank1-skipped" / "job"
CASE_LOG = CASE_JOB / "none_rvolrln4" / "attempt_0" / "0" / "stderr.log"
PRIORITY = tomllib.loads((ROOT / "grammars" / "input_priority.toml").read_text())
pytestmark = pytest.mark.timeout(120)


def analyze_json(target: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["analyze", str(target), "--format", "json"], catch_exceptions=False)
    assert result.exit_code in (0, 1) and "Traceback" not in result.output, result.output
    return result.exit_code, json.loads(result.stdout)


def verdict(report: dict) -> tuple[str, list[int]]:
    return report["verdict"]["category"], report["verdict"]["culprit_ranks"]


# --- depth ----------------------------------------------------------------------------------------


def _chain(top: Path, levels: int, file_at: dict[int, bytes]) -> None:
    """`levels` nested directories `d/d/d/...` under `top`, made through directory descriptors (no
    path grows past PATH_MAX, no recursion), with a file `rank<L>.log` at the levels in `file_at`."""
    fd = os.open(top, os.O_RDONLY)
    try:
        for level in range(1, levels + 1):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
            if level in file_at:
                out = os.open(f"rank{level}.log", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(out, file_at[level])
                os.close(out)
    finally:
        os.close(fd)


def _remove_chain(top: Path) -> None:
    """shutil.rmtree recurses once per level: remove the chain from the bottom, by descriptors."""
    fds = [os.open(top, os.O_RDONLY)]
    while "d" in os.listdir(fds[-1]):
        fds.append(os.open("d", os.O_RDONLY, dir_fd=fds[-1]))
    while len(fds) > 1:
        leaf = fds.pop()
        for name in os.listdir(leaf):
            os.unlink(name, dir_fd=leaf)
        os.close(leaf)
        os.rmdir("d", dir_fd=fds[-1])
    os.close(fds[0])


def _deep_job(top: Path, levels: int):
    job = top / "deep"
    job.mkdir()
    shutil.copyfile(CASE_LOG, job / "rank0.stderr.log")
    _chain(job, levels, {10: CASE_LOG.read_bytes(), levels - 10: CASE_LOG.read_bytes()})
    return job


def test_a_1500_level_tree_is_walked_without_recursion_and_the_cut_is_a_row(tmp_path):
    job = _deep_job(tmp_path, 1500)
    try:
        inputs = {i.path: i for i in discover(job)}
    finally:
        _remove_chain(job)
    assert inputs["/".join(["d"] * 10) + "/rank10.log"].format == "text"
    cut = [i for i in inputs.values() if i.capped]
    assert [(i.path, i.format, i.status, i.reason) for i in cut] == [
        ("/".join(["d"] * (MAX_DEPTH + 1)) + "/", "directory", "skipped",
         f"directory nesting deeper than {MAX_DEPTH} levels: not read")]
    assert not any("rank1490" in name for name in inputs)


def test_a_deep_tree_gives_a_report_listing_the_cut(tmp_path):
    # 200 levels: past the cap; the checkpoint audit reads the walk's listing, cut at the same depth.
    job = _deep_job(tmp_path, 200)
    try:
        code, report = analyze_json(job)
    finally:
        _remove_chain(job)
    assert code == 1
    inputs = {i["file"]: i for i in report["inputs"]}
    assert inputs["rank0.stderr.log"]["status"] == inputs["/".join(["d"] * 10) + "/rank10.log"]["status"] == "parsed"
    cut = [i for i in report["inputs"] if "directory nesting deeper than" in i["reason"]]
    assert [(i["file"], i["status"]) for i in cut] == [("/".join(["d"] * (MAX_DEPTH + 1)) + "/", "skipped")]
    assert not any("rank190" in name for name in inputs)


# --- the file cap ---------------------------------------------------------------------------------


def _junk_before_logs(job: Path, junk: int) -> None:
    junk_dir = job / "aaa-cache"
    junk_dir.mkdir(parents=True)
    for i in range(junk):
        (junk_dir / f"{i:06d}.log").write_text(f"cache entry {i}: hello world\n")
    shutil.copytree(CASE_JOB, job / "zzz-logs")


def test_junk_files_that_sort_first_do_not_cost_the_real_logs(tmp_path, monkeypatch):
    monkeypatch.setattr(discover_module, "MAX_FILES", 300)
    job = tmp_path / "job"
    _junk_before_logs(job, 600)
    _, reference = analyze_json(CASE_JOB)
    code, report = analyze_json(job)
    assert code == 1 and verdict(report) == verdict(reference)
    inputs = {i["file"]: i for i in report["inputs"]}
    assert inputs["zzz-logs/none_rvolrln4/attempt_0/1/stderr.log"]["status"] == "parsed"
    capped = [i for i in report["inputs"] if i["reason"].startswith("file cap")]
    assert [(i["status"], i["reason"]) for i in capped] == [("skipped", "file cap 300 reached: 304 files not read")]
    read_junk = [i for i in report["inputs"] if i["file"].startswith("aaa-cache/") and i["status"] != "skipped"]
    assert len(read_junk) == 296  # what the cap leaves after the logs goes to the rest, in path order


def test_a_capped_job_is_flagged_even_when_nothing_else_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(discover_module, "MAX_FILES", 5)
    for i in range(8):
        (tmp_path / f"r{i}.log").write_text("[rank0]:[W1130 14:57:21.464574780 Utils.hpp:137] Warning: tiny\n")
    rows = [i for i in discover(tmp_path) if i.capped]
    assert [(i.status, i.reason) for i in rows] == [("skipped", "file cap 5 reached: 3 files not read")]


def test_below_the_cap_nothing_is_ranked_or_flagged(tmp_path):
    shutil.copytree(CASE_JOB, tmp_path / "job")
    assert not any(i.capped for i in discover(tmp_path / "job"))


@pytest.mark.parametrize("row", PRIORITY["content"], ids=lambda r: r["pattern"][:40])
def test_every_content_marker_ranks_its_example_first(tmp_path, monkeypatch, row):
    assert re.search(row["pattern"].encode("latin-1"), row["example"].encode("latin-1"))
    monkeypatch.setattr(discover_module, "MAX_FILES", 1)
    (tmp_path / "a-junk.log").write_text("hello world\n")
    (tmp_path / "z-evidence.dat").write_bytes(row["example"].encode("latin-1"))
    read = [i.path for i in discover(tmp_path) if not i.capped]
    assert read == ["z-evidence.dat"]


@pytest.mark.parametrize("row", PRIORITY["name"], ids=lambda r: r["pattern"][:40])
def test_every_name_pattern_ranks_its_example_before_other_names(tmp_path, monkeypatch, row):
    assert re.search(row["pattern"], row["example"].lower())
    monkeypatch.setattr(discover_module, "MAX_FILES", 1)
    (tmp_path / "a-junk.dat").write_text("hello world\n")
    named = tmp_path / "z" / row["example"]
    named.parent.mkdir(parents=True)
    named.write_text("hello world\n")
    read = [i.path for i in discover(tmp_path) if not i.capped]
    assert read == [f"z/{row['example']}"]


def test_content_outranks_names(tmp_path, monkeypatch):
    monkeypatch.setattr(discover_module, "MAX_FILES", 1)
    (tmp_path / "rank0.stderr.log").write_text("hello world\n")
    (tmp_path / "notes.dat").write_bytes(CASE_LOG.read_bytes())
    assert [i.path for i in discover(tmp_path) if not i.capped] == ["notes.dat"]


# --- symlinks -------------------------------------------------------------------------------------


def test_a_single_file_that_links_out_of_its_directory_is_not_read(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.log").write_bytes(CASE_LOG.read_bytes())
    job = tmp_path / "job"
    job.mkdir()
    os.symlink(outside / "secret.log", job / "rank0.log")
    os.symlink("/etc/shadow", job / "model.pt")
    (item,) = discover(job / "rank0.log")
    assert item.status == "skipped" and "outside the job directory" in item.reason
    inside = {i.path: i for i in discover(job)}
    assert inside["model.pt"].status == "skipped" and "outside the job directory" in inside["model.pt"].reason


def test_the_walk_never_enters_a_symlinked_directory(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "rank5.log").write_bytes(CASE_LOG.read_bytes())
    job = tmp_path / "job"
    job.mkdir()
    (job / "rank0.log").write_bytes(CASE_LOG.read_bytes())
    os.symlink(outside, job / "more")
    os.symlink(job, job / "loop")
    inputs = {i.path: i for i in discover(job)}
    assert set(inputs) == {"rank0.log", "more", "loop"}
    assert inputs["more"].reason == inputs["loop"].reason == "symlink to a directory; not followed"
