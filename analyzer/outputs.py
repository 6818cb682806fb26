"""Output paths of the commands, checked before any work (a night's scan, an analysis).

The command layer's one check that a report file can be written: `analyze` and `scan`/`fleet` call it
before they read anything, so a bad path fails at once with exit 2 rather than after the work.
"""

from __future__ import annotations

from pathlib import Path

from analyzer.exits import CannotAnalyse


def check_writable(path: Path, what: str) -> None:
    """Fail before any work when `path` cannot be written: a missing folder, a folder in its place, no
    permission. An existing file is opened for appending (nothing written); a new one is created and
    removed again, which also catches read-only file systems and root-squashed mounts."""
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise CannotAnalyse(f"cannot write the {what} to {path}: it is a directory")
    if not parent.is_dir():
        reason = "is not a directory" if parent.exists() else "does not exist"
        raise CannotAnalyse(f"cannot write the {what} to {path}: the folder {parent} {reason}")
    existed = path.exists()
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise CannotAnalyse(f"cannot write the {what} to {path}: {exc.strerror or exc}") from exc
    if not existed:
        path.unlink(missing_ok=True)
