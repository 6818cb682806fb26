"""Batch (incremental): what makes a row reusable, and the store that keeps every finished row.

- **The key** of a row: the job path, a fingerprint of its inputs (every file's relative path, size
  and mtime, or its content hash with `content_hash=True`), the analyzer version, a hash of the
  analyzer's code (every module that can change a row: not the command line, capture, the fleet
  view or the renderers) and grammars, and a hash of the `rules/` catalogue. A row is stored under
  the versions of the process that made it, so a Ray node running other code never fills the store
  with rows this analyzer would not give.
- **The store** is one SQLite file in WAL mode, written by the scan's parent process one committed
  row at a time as each job finishes: a SIGKILL, an out-of-memory kill or a Slurm time limit loses
  at most the jobs that were running, and the next scan redoes only what has no row under its
  current key. Crashed rows are never stored (a re-run retries them); a timed-out row is reused
  only while the time limit is no longer than the one it ran out of; an analysed row is reused by
  a scan that wants events only if its events file is there.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from analyzer import __version__
from analyzer.fleet import ScanError
from analyzer.io.walk import Walk

STORE_FORMAT = "2"  # 1 was a JSON file written once at the end of a scan

# Modules that never change a row: the command line, live capture, the fleet view, the renderers.
_NOT_ROW_CODE = frozenset({"fleet/view.py"})
_NOT_ROW_DIRS = frozenset({"cli", "render", "capture", "_data"})


# ---------------------------------------------------------------------------------------------
# The key.
# ---------------------------------------------------------------------------------------------


def fingerprint(job: str, *, content_hash: bool = False) -> str:
    """A digest of the job's inputs: relative path, size and mtime (or content) of every file."""
    digest = hashlib.sha256()
    root = Path(job)
    if root.is_dir() and not root.is_symlink():
        walk = Walk(str(root))
        entries = sorted(Path(e.path) for level in walk for e in level.files)
        digest.update(f"deeper than {walk.max_depth}: {len(walk.too_deep)}\n".encode())
    else:
        entries = [root]
    for path in entries:
        rel = path.relative_to(root).as_posix() if path != root else path.name
        try:
            stat = path.lstat()
            mark = _file_digest(path) if content_hash and path.is_file() else str(stat.st_mtime_ns)
            digest.update(f"{rel}\0{stat.st_size}\0{mark}\n".encode("utf-8", "surrogateescape"))
        except OSError as exc:
            digest.update(f"{rel}\0unreadable {exc.errno}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()[:32]


def _file_digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@cache
def engine_versions() -> dict[str, str]:
    """The analyzer's identity as this process first saw it (a worker's: the code it has loaded)."""
    return current_versions()


def current_versions() -> dict[str, str]:
    """The analyzer's identity: version, a hash of its code and grammars, a hash of the catalogue."""
    from analyzer.resources import data_dir

    package = Path(__file__).resolve().parents[1]
    code = sorted(p for p in package.rglob("*.py") if not _outside_rows(p.relative_to(package)))
    grammars = sorted(data_dir("grammars").glob("*.lark"))
    rules = sorted(data_dir("rules").glob("*.toml"))
    return {
        "analyzer_version": __version__,
        "analyzer_hash": _tree_hash(code + grammars),
        "catalogue_hash": _tree_hash(rules),
    }


def _outside_rows(relative: Path) -> bool:
    return relative.as_posix() in _NOT_ROW_CODE or relative.parts[0] in _NOT_ROW_DIRS


def _tree_hash(paths: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_key(job: str, job_fingerprint: str, versions: dict[str, str]) -> str:
    parts = (job, job_fingerprint, versions["analyzer_version"], versions["analyzer_hash"], versions["catalogue_hash"])
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:32]


# ---------------------------------------------------------------------------------------------
# The store.
# ---------------------------------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results(
    job TEXT PRIMARY KEY,    -- the row's job (display form of the path)
    key TEXT NOT NULL,       -- cache_key under the versions of the process that made the row
    status TEXT NOT NULL,
    limit_s REAL,            -- the time limit a timed_out row ran out of
    events_file TEXT,        -- the job's events Parquet, when the scan wanted events
    row TEXT NOT NULL,       -- the jobs-table row, JSON
    findings TEXT NOT NULL,  -- the findings-table rows, JSON
    saved_at REAL NOT NULL
);
"""


class Store:
    """Finished rows by job, in SQLite (WAL). `Store(None)` keeps nothing (`--no-cache`)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._db: sqlite3.Connection | None = None
        if path is None:
            return
        try:
            self._db = sqlite3.connect(path, timeout=30, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a committed row survives any kill of this process (only power loss may drop the last ones).
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            self._check_format()
        except sqlite3.DatabaseError as exc:
            raise ScanError(f"{path}: not a scan store ({exc}); delete it or choose another --cache") from exc

    def _check_format(self) -> None:
        found = self._db.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        if found and found[0] == STORE_FORMAT:
            return
        # Another format's rows cannot be trusted under today's keys: start afresh.
        self._db.execute("DELETE FROM results")
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('format', ?)", (STORE_FORMAT,))

    @staticmethod
    def events_dir_for(path: Path) -> Path:
        """Where the jobs' events files of the store at `path` live (kept with it, reused with its rows)."""
        return path.with_name(path.name + ".events")

    def get(self, job: str, key: str, *, job_timeout: float | None, want_events: bool) -> dict | None:
        """The stored result of `job` if it was made under `key` and still answers this scan."""
        if self._db is None:
            return None
        found = self._db.execute(
            "SELECT status, limit_s, events_file, row, findings FROM results WHERE job = ? AND key = ?", (job, key)
        ).fetchone()
        if found is None:
            return None
        status, limit_s, events_file, row, findings = found
        if status == "timed_out" and (job_timeout is None or limit_s is None or job_timeout > limit_s):
            return None  # a longer limit gives it another chance
        if want_events and status == "analysed" and not (events_file and os.path.exists(events_file)):
            return None
        return {"row": json.loads(row), "findings": json.loads(findings), "events_file": events_file}

    def put(self, job: str, key: str, result: dict, *, limit_s: float | None, events_file: str | None) -> None:
        if self._db is None:
            return
        row = result["row"]
        previous = self._db.execute("SELECT events_file FROM results WHERE job = ?", (job,)).fetchone()
        self._db.execute(
            "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (job, key, row["status"], limit_s, events_file, json.dumps(row), json.dumps(result["findings"]), time.time()),
        )
        if previous and previous[0] and previous[0] != events_file:  # the job's events of an older row
            Path(previous[0]).unlink(missing_ok=True)

    def finished(self) -> int:
        """How many rows the store holds."""
        return 0 if self._db is None else self._db.execute("SELECT count(*) FROM results").fetchone()[0]

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def default_store_path(out: Path) -> Path:
    return out.with_name(out.stem + ".scan.db")
