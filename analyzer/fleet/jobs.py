"""Batch (which directories are jobs): decided by what the files hold, not by there being files.

A job is the directory that holds the logs of one run. Each ROOT is walked top-down with discovery's
walk (`analyzer.io.walk.Walk`: iterative, depth-capped, symlinks never followed; here names starting
with `.` are skipped), and the first rule that holds decides:

1. a ROOT that is a file (a log, a `.gz`, a `.tar`) is one job;
2. a directory whose own files include a training log or dump is a job, with everything below it.
   A file is one when discover's sniffing gives it a format the parse stage has a parser for (a
   Flight Recorder dump, a trace, py-spy output, a capture manifest, ...), or it is text whose head
   holds at least one line the text parser recognises (NCCL, c10d, torchrun, a Python traceback,
   a training step...). A README, notes or a config file does not make its folder a job;
3. a directory holding torchrun `attempt_<N>/` directories (a torchrun run directory) is a job, and
   so is a directory whose only entry is such a run directory (the usual `--log-dir JOB` holding
   `<run_id>/attempt_0/`), which then names the job;
4. any other directory is searched.

The search says how many jobs each rule found, which files it read and found not to be logs, and
which jobs hold subdirectories that would be jobs of their own (several runs filed under one job
directory: they are analysed as one job, which may be wrong). `--glob PATTERN` (matched under each
ROOT) or `--manifest FILE` (one path per line, relative to the manifest's directory, `#` comments)
replace the rules with an explicit list. The scan's own output files are never read.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from analyzer.fleet import ScanError
from analyzer.io.walk import Walk, list_level

RULE_FILE_ROOT = "a ROOT that is a file"
RULE_LOGS = "directories holding training logs or dumps"
RULE_TORCHRUN = "torchrun run directories (attempt_N/)"
RULE_LOG_DIR = "directories holding one torchrun run directory"
RULE_GLOB = "paths matching --glob"
RULE_MANIFEST = "paths listed in --manifest"

MAX_SNIFFED_PER_DIR = 256  # files sniffed in one directory before it is judged to hold no log
MAX_NESTED_CHECKED = 64  # subdirectories of a job checked for being jobs of their own
MAX_NOTED = 20  # names kept of each kind of note

_ATTEMPT_DIR = re.compile(r"attempt_\d+")


@dataclass
class JobSearch:
    jobs: dict[str, str] = field(default_factory=dict)  # absolute path -> the rule that made it a job
    # Directories holding files none of which is a log, that are not jobs: (directory, first such file);
    # the first MAX_NOTED of them, and how many in all.
    not_jobs: list[tuple[str, str]] = field(default_factory=list)
    not_jobs_count: int = 0
    nested: dict[str, list[str]] = field(default_factory=dict)  # job -> subdirectories that look like jobs
    too_deep: int = 0  # directories deeper than the walk's cap, not searched
    unlistable: list[str] = field(default_factory=list)

    def paths(self) -> list[str]:
        return sorted(self.jobs)

    def by_rule(self) -> Counter[str]:
        return Counter(self.jobs.values())


def find_jobs(
    roots: Sequence[str | os.PathLike[str]],
    *,
    pattern: str | None = None,
    manifest: str | os.PathLike[str] | None = None,
    exclude: Iterable[str | os.PathLike[str]] = (),
) -> JobSearch:
    """The jobs under `roots` (rules in the module docstring), each with the rule that found it."""
    excluded = {os.path.abspath(p) for p in exclude}
    search = JobSearch()
    if manifest is not None:
        for path in _read_manifest(Path(manifest)):
            search.jobs[os.path.abspath(path)] = RULE_MANIFEST
    for root in roots:
        root_path = Path(root)
        if not root_path.exists():
            raise ScanError(f"no such file or directory: {root}")
        if pattern:
            for path in sorted(root_path.glob(pattern)):
                if not path.name.startswith("."):
                    search.jobs[os.path.abspath(path)] = RULE_GLOB
        elif not root_path.is_dir():
            search.jobs[os.path.abspath(root_path)] = RULE_FILE_ROOT
        else:
            _search(root_path, excluded, search)
    for path in excluded & set(search.jobs):
        del search.jobs[path]
    return search


def _read_manifest(manifest: Path) -> list[str]:
    try:
        text = manifest.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScanError(f"cannot read the manifest {manifest}: {exc}") from exc
    base = manifest.resolve().parent
    lines = (line.strip() for line in text.splitlines())
    return [str(base / line) for line in lines if line and not line.startswith("#")]


def _search(root: Path, excluded: set[str], search: JobSearch) -> None:
    walk = Walk(str(root), skip_hidden=True)
    for level in walk:
        rule = _job_rule(level.files, level.dirs, excluded, search)
        if rule is None:
            continue
        job = os.path.abspath(level.path)
        search.jobs[job] = rule
        nested = _nested_jobs(level.dirs, excluded) if rule == RULE_LOGS else []
        if len(nested) > 1:
            search.nested[job] = nested
        level.dirs.clear()  # everything below a job belongs to it
    search.too_deep += len(walk.too_deep)
    search.unlistable.extend(os.path.join(root, rel) if rel else str(root) for rel, _ in walk.unlistable)


def _job_rule(files: list[os.DirEntry], dirs: list[os.DirEntry], excluded: set[str],
              search: JobSearch | None) -> str | None:
    """The rule that makes a directory with these entries a job, or None. `search` collects the
    directories whose files are not logs (None: only asking)."""
    candidates = [f for f in files if os.path.abspath(f.path) not in excluded]
    if any(holds_training_log(entry.path) for entry in candidates[:MAX_SNIFFED_PER_DIR]):
        return RULE_LOGS
    if any(_ATTEMPT_DIR.fullmatch(d.name) for d in dirs):
        return RULE_TORCHRUN
    if len(dirs) == 1 and _is_torchrun_run_dir(dirs[0].path):
        return RULE_LOG_DIR
    if candidates and search is not None:
        search.not_jobs_count += 1
        if len(search.not_jobs) < MAX_NOTED:
            search.not_jobs.append((os.path.dirname(candidates[0].path), candidates[0].name))
    return None


def _nested_jobs(dirs: list[os.DirEntry], excluded: set[str]) -> list[str]:
    """Subdirectories of a job that would be jobs on their own (their own files, or torchrun runs)."""
    found = []
    for directory in dirs[:MAX_NESTED_CHECKED]:
        if _ATTEMPT_DIR.fullmatch(directory.name):
            continue  # a torchrun attempt is part of its run, not a run of its own
        level = list_level(directory.path, skip_hidden=True)
        if level is not None and _job_rule(level.files, level.dirs, excluded, None) is not None:
            found.append(directory.name)
    return found


def _is_torchrun_run_dir(path: str) -> bool:
    level = list_level(path)
    return level is not None and any(_ATTEMPT_DIR.fullmatch(d.name) for d in level.dirs)


def holds_training_log(path: str) -> bool:
    """True when the file (or a member of the archive) is a training log or dump, by content."""
    from analyzer.io import DiscoveryError, discover
    from analyzer.exits import INPUT_ERRORS
    from analyzer.parse import PARSERS, TEXT_FORMATS

    try:
        items = discover(path)
    except (DiscoveryError, *INPUT_ERRORS):
        return False
    for item in items:
        if item.status in ("skipped", "error"):
            continue
        if item.format in PARSERS or (item.format in TEXT_FORMATS and _head_has_log_lines(item)):
            return True
    return False


def _head_has_log_lines(item) -> bool:
    """Whether the text parser recognises any line of the file's first SNIFF_BYTES."""
    from analyzer.io import SNIFF_BYTES
    from analyzer.exits import INPUT_ERRORS
    from analyzer.parse.logtext import TextPiece, parse_text_pieces

    if item.format != "text":
        return True  # UTF-16 text: discover found it to be text; no prose is written in UTF-16 on Linux
    try:
        head = item.read_head(SNIFF_BYTES)
    except INPUT_ERRORS:
        return False
    text = head.decode("utf-8", errors="replace")
    if len(head) == SNIFF_BYTES and "\n" in text:
        text = text[: text.rfind("\n") + 1]  # a cut last line is not judged
    try:
        events = parse_text_pieces([TextPiece(item, text, 1, last_piece=False)], datetime.now(timezone.utc).year)
    except INPUT_ERRORS:
        return False
    return events.height > 0
