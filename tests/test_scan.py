"""The batch scan: a night of 200 generated jobs, job discovery, the cache, bad jobs, the Ray engine."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import click
import polars as pl
import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from analyzer.api import analyze
from analyzer.cli import main
from analyzer.fleet.jobs import RULE_LOG_DIR, RULE_LOGS, RULE_TORCHRUN, find_jobs
from analyzer.fleet.rows import (
    STATUS_ANALYSED,
    STATUS_CANNOT_ANALYSE,
    STATUS_CRASHED,
    VOLATILE_COLUMNS,
    WORKER_DIED,
    JobSpec,
    analyse_job,
)
from analyzer.fleet.scan import read_scan, scan
from analyzer.fleet.store import Store, cache_key, engine_versions, fingerprint
from analyzer.fleet.view import fleet_view
from tests.jobgen import RECURRING, make_jobs, sources
from tests.scan_hooks import code_unchanged, versions_at_start  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[1]
NIGHT_JOBS = 200
VERDICT_FIELDS = ("category", "culprit_ranks", "culprit_hosts", "confidence", "rule_id")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """The generated night, and the jobs of it that are jobs: those whose source fixture holds a file
    the analyzer reads as a training log or dump (the others are checked on their own below)."""
    root = tmp_path_factory.mktemp("night")
    generated = make_jobs(root, NIGHT_JOBS)
    readable = {source for source in sources() if find_jobs([source]).paths()}
    return root, [job for job in generated if job.source in readable]


def test_a_fixture_that_is_no_job_is_one_analyze_reads_nothing_in():
    for source in sources():
        if not find_jobs([source]).paths():
            result = run("analyze", source)
            assert result.exit_code == 2 and "no training logs found" in result.output, source


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return tmp_path_factory.mktemp("scan-out")


@pytest.fixture(scope="module")
def first_scan(night, outputs):
    root, _ = night
    result = run("scan", root, "--out", outputs / "night.parquet", "--jsonl", outputs / "night.jsonl",
                 "--html", outputs / "night.html", "-j", 2)
    return result, pl.read_parquet(outputs / "night.parquet")


def by_job(rows: pl.DataFrame) -> dict[str, dict]:
    return {row["job"]: row for row in rows.iter_rows(named=True)}


def test_scan_writes_one_analysed_row_per_job(night, first_scan):
    _, jobs = night
    result, rows = first_scan
    assert result.exit_code == 1, result.output  # failures were identified
    assert f"{len(jobs)} jobs: {len(jobs)} analysed, 0 reused" in result.output
    assert f"found {len(jobs)} jobs under" in result.output
    assert rows.get_column("job").to_list() == sorted(str(j.path) for j in jobs)
    assert rows.get_column("status").unique().to_list() == [STATUS_ANALYSED]
    assert {"job", "category", "culprit_ranks", "culprit_hosts", "confidence", "error"} <= set(rows.columns)


def test_rows_equal_analyze_json_for_every_kind_of_job(night, first_scan):
    """One generated copy of every fixture, through `analyze --format json`."""
    _, jobs = night
    rows = by_job(first_scan[1])
    for generated in {job.source: job for job in reversed(jobs)}.values():  # the first copy of each source
        result = run("analyze", generated.path, "--format", "json")
        report = json.loads(result.output)
        row = rows[str(generated.path)]
        assert report["job"]["path"] == row["job"]
        assert {k: row[k] for k in VERDICT_FIELDS} == {k: report["verdict"][k] for k in VERDICT_FIELDS}, generated.source
        assert (row["verdict"], row["summary"], row["hosts"]) == (
            report["verdict"]["title"], report["verdict"]["summary"], report["job"]["hosts"])
        assert row["signatures"] == [f["rule_id"] for f in report["findings"]]
        assert row["error"] is None


def test_every_row_is_its_source_fixtures_verdict_with_hosts_renamed(night, first_scan):
    _, jobs = night
    rows = by_job(first_scan[1])
    source_verdicts = {src: analyze(src).report["verdict"] for src in {job.source for job in jobs}}
    for generated in jobs:
        want = source_verdicts[generated.source]
        row = rows[str(generated.path)]
        assert row["category"] == want["category"]
        assert row["culprit_ranks"] == want["culprit_ranks"]
        assert row["confidence"] == want["confidence"]
        assert row["culprit_hosts"] == sorted(generated.hosts.get(h, h) for h in want["culprit_hosts"])


def test_jsonl_holds_the_same_rows(outputs, first_scan):
    assert read_scan(outputs / "night.jsonl").equals(first_scan[1])


def test_fleet_view_names_the_two_recurring_hosts_first(first_scan):
    rows = first_scan[1]
    hosts = fleet_view(rows).hosts
    assert set(hosts.get_column("host").head(2).to_list()) == set(RECURRING)
    # The counts are those of the verdicts themselves: distinct failed jobs whose verdict implicates the host.
    failed = rows.filter((pl.col("status") == STATUS_ANALYSED) & (pl.col("category") != "none"))
    named = Counter(h for hs in failed.get_column("implicated_hosts").to_list() for h in hs)
    assert dict(zip(hosts.get_column("host"), hosts.get_column("failed_jobs"))) == dict(named)
    assert min(named[h] for h in RECURRING) > max(n for h, n in named.items() if h not in RECURRING)


def test_html_and_summary_show_the_recurring_hosts(outputs, first_scan):
    result, _ = first_scan
    page = (outputs / "night.html").read_text(encoding="utf-8")
    assert all(host in page for host in RECURRING)
    # Log text may quote a URL (CUDA's "download a new driver from http://..."): nothing is *loaded* from one.
    assert "<script" not in page and not re.search(r"""(?:src|href)\s*=\s*["']?\w+://""", page)
    summary = result.output[result.output.index("Repeat-offender hosts"):]
    assert summary.index(RECURRING[0]) < summary.index("n0") and summary.index(RECURRING[1]) < summary.index("n0")


def test_rescan_with_nothing_changed_reuses_every_row(night, outputs, first_scan):
    root, _ = night
    made_by = first_scan[1].select("analyzer_version", "analyzer_hash", "catalogue_hash").row(0, named=True)
    with code_unchanged(made_by):
        result = run("scan", root, "--out", outputs / "again.parquet", "--cache", outputs / "night.scan.db", "-j", 2)
        assert result.exit_code == 1
        assert f"{len(night[1])} jobs: 0 analysed, {len(night[1])} reused" in result.output
    assert pl.read_parquet(outputs / "again.parquet").equals(first_scan[1])


def test_ray_engine_gives_the_same_rows(night, outputs, first_scan):
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")

    root, _ = night
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = run("scan", root, "--out", outputs / "ray.parquet", "--engine", "ray", "--no-cache", "-q")
    finally:
        ray.shutdown()
    assert result.exit_code == 1, result.output
    ray_rows = pl.read_parquet(outputs / "ray.parquet")
    # analyzer_hash identifies the code: it differs only if the checkout was edited between the two scans.
    same = [c for c in ray_rows.columns if c not in (*VOLATILE_COLUMNS, "analyzer_hash")]
    made_by = first_scan[1].select("analyzer_version", "analyzer_hash", "catalogue_hash").row(0, named=True)
    with code_unchanged(made_by):
        assert_frame_equal(ray_rows.select(same), first_scan[1].select(same))


# ---------------------------------------------------------------------------------------------
# Which directories are jobs.
# ---------------------------------------------------------------------------------------------


LOG_LINE = "node-1:4021:4021 NCCL INFO NCCL version 2.21.5+cuda12.4\n"  # a line the text parser recognises


def _touch(path: Path, text: str = LOG_LINE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _found(root: Path, **kwargs) -> list[str]:
    return [Path(p).relative_to(root).as_posix() for p in find_jobs([root], **kwargs).paths()]


def test_job_discovery_rule(tmp_path):
    _touch(tmp_path / "slurm" / "slurm-123.out")  # holds a file
    _touch(tmp_path / "tr" / "run_ab12" / "attempt_0" / "0" / "stderr.log")  # wrapper of one torchrun run
    _touch(tmp_path / "two" / "run_a" / "attempt_0" / "0" / "stderr.log")  # two run dirs: each is a job
    _touch(tmp_path / "two" / "run_b" / "attempt_1" / "0" / "stderr.log")
    _touch(tmp_path / "deep" / "2024" / "01" / "job-7" / "rank0.log")  # containers are searched
    _touch(tmp_path / "deep" / "2024" / "01" / "job-7" / "sub" / "rank1.log")  # part of job-7
    _touch(tmp_path / ".trash" / "old" / "x.log")  # hidden: skipped
    (tmp_path / "empty").mkdir()  # holds nothing: not a job
    _touch(tmp_path / "docs" / "notes.txt", "what we ran tonight\n")  # no log line: not a job
    search = find_jobs([tmp_path])
    assert _found(tmp_path) == ["deep/2024/01/job-7", "slurm", "tr", "two/run_a", "two/run_b"]
    assert search.by_rule() == {RULE_LOGS: 2, RULE_LOG_DIR: 1, RULE_TORCHRUN: 2}
    assert search.not_jobs == [(str(tmp_path / "docs"), "notes.txt")]


def test_a_file_root_and_a_root_holding_files_are_jobs(tmp_path):
    log = _touch(tmp_path / "console.log")
    _touch(tmp_path / "child" / "more.log")
    assert find_jobs([log]).paths() == [str(log)]
    assert find_jobs([tmp_path]).paths() == [str(tmp_path)]


def test_scan_outputs_do_not_make_their_directory_a_job(tmp_path):
    _touch(tmp_path / "job-1" / "log.txt")
    out = tmp_path / "scan.parquet"
    _touch(out)
    assert find_jobs([tmp_path], exclude=[out]).paths() == [str(tmp_path / "job-1")]


def test_glob_and_manifest_override_the_rule(tmp_path):
    for name in ("a", "b", "c"):
        _touch(tmp_path / "jobs" / name / "logs" / "x.log")
    globbed = find_jobs([tmp_path / "jobs"], pattern="[ab]/logs").paths()
    assert globbed == [str(tmp_path / "jobs" / n / "logs") for n in "ab"]
    manifest = _touch(tmp_path / "list.txt", "# tonight\njobs/c\n\njobs/a/logs/x.log\n")
    listed = find_jobs([], manifest=manifest).paths()
    assert listed == [str(tmp_path / "jobs" / "a" / "logs" / "x.log"), str(tmp_path / "jobs" / "c")]


def test_missing_root_and_no_job_exit_two(tmp_path):
    assert run("scan", tmp_path / "nope", "--out", tmp_path / "s.parquet").exit_code == 2
    (tmp_path / "empty").mkdir()
    result = run("scan", tmp_path / "empty", "--out", tmp_path / "s.parquet")
    assert result.exit_code == 2 and "no job found" in result.output


# ---------------------------------------------------------------------------------------------
# The cache key.
# ---------------------------------------------------------------------------------------------


def test_fingerprint_follows_the_inputs(tmp_path):
    log = _touch(tmp_path / "job" / "log.txt", "alpha\n")
    stat = log.stat()
    base, base_content = fingerprint(str(tmp_path / "job")), fingerprint(str(tmp_path / "job"), content_hash=True)
    log.write_text("omega\n")  # same size; put the old mtime back: only a content hash sees it
    os.utime(log, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fingerprint(str(tmp_path / "job")) == base
    assert fingerprint(str(tmp_path / "job"), content_hash=True) != base_content
    _touch(tmp_path / "job" / "more.log")
    assert fingerprint(str(tmp_path / "job")) != base


def test_cache_key_covers_path_inputs_analyzer_and_catalogue():
    versions = engine_versions()
    key = cache_key("/j", "fp", versions)
    assert key != cache_key("/k", "fp", versions)
    assert key != cache_key("/j", "fp2", versions)
    for name in versions:
        assert key != cache_key("/j", "fp", {**versions, name: versions[name] + "x"})


def test_a_changed_job_is_analysed_again_and_the_rest_reused(tmp_path, versions_at_start):
    jobs = [str(j.path) for j in make_jobs(tmp_path / "night", 3)]
    cache = tmp_path / "scan.db"
    with code_unchanged(versions_at_start):
        first = scan(jobs, workers=1, store_path=cache)
        with open(Path(jobs[1]) / "log.txt", "a", encoding="utf-8") as fh:
            fh.write("one more line\n")
        again = scan(jobs, workers=1, store_path=cache)
        assert (first.analysed, again.analysed, again.reused) == (3, 1, 2)
    assert again.frame.drop(VOLATILE_COLUMNS, "fingerprint").equals(first.frame.drop(VOLATILE_COLUMNS, "fingerprint"))


# ---------------------------------------------------------------------------------------------
# A job that cannot be analysed, or that crashes the analyzer, is a row.
# ---------------------------------------------------------------------------------------------


def raising_task(spec: JobSpec) -> dict:
    """The real per-job function, except that a job named `boom` raises out of the task itself."""
    if Path(spec.job).name == "boom":
        raise RuntimeError("task blew up")
    return analyse_job(spec)


def dying_task(spec: JobSpec) -> dict:
    """The real per-job function, except that a job named `die` kills its worker process."""
    if Path(spec.job).name == "die":
        os._exit(3)
    return analyse_job(spec)


def test_unreadable_and_crashing_jobs_are_rows_not_an_aborted_scan(tmp_path):
    good = make_jobs(tmp_path / "night", 2)
    _touch(tmp_path / "binary" / "core").write_bytes(bytes(range(256)) * 400)
    _touch(tmp_path / "boom" / "log.txt")
    jobs = [*find_jobs([tmp_path]).paths(), str(tmp_path / "binary")]  # it holds no log: named explicitly
    result = scan(jobs, workers=1, task=raising_task)
    rows = by_job(result.frame)
    assert rows[str(tmp_path / "binary")]["status"] == STATUS_CANNOT_ANALYSE
    cli = run("analyze", tmp_path / "binary")
    assert cli.exit_code == 2 and rows[str(tmp_path / "binary")]["error"] in cli.output
    boom = rows[str(tmp_path / "boom")]
    assert boom["status"] == STATUS_CRASHED and boom["error"].startswith("RuntimeError: task blew up")
    assert boom["category"] is None
    assert all(rows[str(g.path)]["status"] == STATUS_ANALYSED for g in good)


def test_an_analyzer_exception_is_the_jobs_error(tmp_path, monkeypatch):
    import analyzer.api

    def broken(path, checkpoint_paths=()):
        raise KeyError("rank")

    monkeypatch.setattr(analyzer.api, "analyze", broken)
    row = analyse_job(JobSpec(str(tmp_path)))["row"]
    assert row["status"] == STATUS_CRASHED
    assert row["error"].startswith("KeyError: 'rank' (at test_scan.py:")


def test_a_worker_that_dies_costs_only_its_own_job(tmp_path):
    good = make_jobs(tmp_path / "night", 3)
    _touch(tmp_path / "die" / "log.txt")
    result = scan(find_jobs([tmp_path]).paths(), workers=2, task=dying_task)
    rows = by_job(result.frame)
    assert rows[str(tmp_path / "die")]["status"] == STATUS_CRASHED
    assert rows[str(tmp_path / "die")]["error"] == WORKER_DIED
    assert all(rows[str(g.path)]["status"] == STATUS_ANALYSED for g in good)


def test_scan_and_fleet_are_in_the_readme_with_every_option():
    from analyzer.cli.scan import fleet_command, scan_command

    readme = (ROOT / "README.md").read_text()
    for command in (scan_command, fleet_command):
        row = next(line for line in readme.splitlines() if line.startswith(f"| `postmortem {command.name} "))
        for option in (o for p in command.params if isinstance(p, click.Option) for o in p.opts if o.startswith("--")):
            assert option in row, (command.name, option)


def test_a_store_of_another_format_is_started_afresh_and_a_foreign_file_refused(tmp_path):
    import sqlite3

    from analyzer.fleet import ScanError

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE meta(name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('format', '1')")
        db.execute("CREATE TABLE results(job, key, status, limit_s, events_file, row, findings, saved_at)")
        db.execute("INSERT INTO results VALUES ('/j', 'k', 'analysed', NULL, NULL, '{}', '[]', 0)")
    store = Store(path)
    assert store.get("/j", "k", job_timeout=None, want_events=False) is None and store.finished() == 0
    store.close()
    (tmp_path / "c.json").write_text('{"format": 1, "entries": {}}')
    with pytest.raises(ScanError, match="not a scan store"):
        Store(tmp_path / "c.json")


def _chain(top: Path, levels: int) -> str:
    """`levels` nested directories under `top`, made one at a time (os.makedirs itself recurses)."""
    path = str(top)
    for _ in range(levels):
        path = os.path.join(path, "d")
        os.mkdir(path)
    return path


def _remove_chains(top: Path) -> None:
    """Remove a tree bottom-up without recursion (pytest's own clean-up, shutil.rmtree, recurses)."""
    directories, stack = [], [str(top)]
    while stack:
        directory = stack.pop()
        directories.append(directory)
        with os.scandir(directory) as it:
            for entry in it:
                stack.append(entry.path) if entry.is_dir(follow_symlinks=False) else os.unlink(entry.path)
    for directory in reversed(directories):
        os.rmdir(directory)


@pytest.fixture
def night_root(tmp_path):
    yield tmp_path / "night"
    _remove_chains(tmp_path / "night")


def test_a_tree_deeper_than_the_cap_is_counted_not_a_crash(night_root):
    deep = night_root / "job-1"
    _touch(deep / "rank0.log")
    (night_root / "deep").mkdir()
    _touch(Path(_chain(night_root / "deep", 1500)) / "lost.log")  # past the interpreter's recursion limit
    _touch(Path(_chain(deep, 1500)) / "x.log")  # inside a job: its fingerprint walks it
    search = find_jobs([night_root])
    assert search.paths() == [str(deep)] and search.too_deep == 1
    assert fingerprint(str(deep)) != fingerprint(str(night_root))
