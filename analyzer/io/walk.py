"""Stage 1, io (the walk): `discover` lists and classifies every input of a job.

Walks the directory read-only and iteratively (never following symlinks out of the root, never
deeper than MAX_DEPTH levels), or reads one file, or standard input (`-`); past MAX_FILES files it
reads the likeliest evidence first (grammars/input_priority.toml). Each file is expanded by
`analyzer.io.archives` and classified by `analyzer.io.sniff`.

`discover_job` hands on the inputs and the `Listing` of what the walk found on disk (directories,
files, links): the checkpoint audit reads that listing, so the job is walked once and nothing
outside it is looked at. `list_path` lists a `--checkpoint` path with the same walk.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from analyzer.io.archives import MAX_FILES, HeldBudget, stdin_inputs, unpack
from analyzer.io.inputs import SNIFF_BYTES, STDIN, DiscoveryError, InputFile, display_name
from analyzer.io.sniff import apply_layout_hints, classify
from analyzer.resources import data_dir

MAX_LISTED = 1_000_000  # directory entries listed; the file cap chooses among them
MAX_DEPTH = 64  # directory levels walked below the root
PRIORITY_SNIFF_BYTES = 4 << 10  # what the file cap reads of each file to rank it


@dataclass(frozen=True)
class Listing:
    """What the walk found on disk, every name relative to `root`, in walk order (directories
    top-down, names sorted). Nothing here was opened: a link is listed, not followed."""

    root: Path | None = None  # the directory walked, or a single file's directory; None: standard input
    dirs: tuple[str, ...] = ()  # the directories listed ("" is `root`); empty for a single file
    files: tuple[str, ...] = ()  # every entry that is not a directory
    links: frozenset[str] = frozenset()  # the files that are symbolic links
    special: frozenset[str] = frozenset()  # the files that are neither regular files nor links (FIFOs, devices)


@dataclass(frozen=True)
class Discovery:
    """What stage 1 hands on: every input, classified, and the listing it was read from."""

    inputs: list[InputFile]
    listing: Listing


@dataclass
class _TreeBuilder:
    dirs: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    links: set[str] = field(default_factory=set)
    special: set[str] = field(default_factory=set)

    def listing(self, root: Path) -> Listing:
        return Listing(root, tuple(self.dirs), tuple(self.files), frozenset(self.links), frozenset(self.special))


def discover(root: str | os.PathLike[str]) -> list[InputFile]:
    """List and classify every input under `root`: a directory, a single file or archive, or `-`
    (standard input)."""
    return discover_job(root).inputs


def discover_job(root: str | os.PathLike[str]) -> Discovery:
    """`discover`, with the listing of the tree it walked."""
    budget = HeldBudget()
    if str(root) == STDIN:
        return Discovery(_classified(stdin_inputs(budget)), Listing())
    root_path = Path(root)
    if not root_path.exists():
        raise DiscoveryError(f"no such file or directory: {root}")
    if not os.access(root_path, os.R_OK):
        raise DiscoveryError(f"permission denied: {root}")
    if root_path.is_file():
        inputs = _classified(_expand(root_path, display_name(root_path.name), root_path.parent.resolve(), budget))
        return Discovery(inputs, list_path(root_path))
    tree = _TreeBuilder()
    inputs = _classified(_walk(root_path, budget, tree))  # the walk fills `tree` as it goes
    return Discovery(inputs, tree.listing(root_path))


def list_path(path: Path) -> Listing:
    """The listing of a path alone, nothing opened: a directory walked as `discover` walks it, a
    file (or a link, or what is neither) as the one entry of its directory."""
    if path.is_dir():  # a link named on the command line is followed, as `discover` follows its root
        tree = _TreeBuilder()
        for _ in _list_tree(path, tree):
            pass  # the rows of what is not entered are discovery's to report
        return tree.listing(path)
    name = path.name
    links = frozenset({name}) if path.is_symlink() else frozenset()
    special = frozenset() if links or path.is_file() else frozenset({name})
    return Listing(path.parent, (), (name,), links, special)


def _classified(found: Iterator[InputFile]) -> list[InputFile]:
    """The inputs found, classified as found (a file's sniffed head is dropped before the next is
    read), in path order."""
    inputs = []
    for item in found:
        if item.status == "pending":
            classify(item)
        item._head = None
        apply_layout_hints(item)
        inputs.append(item)
    return sorted(inputs, key=lambda f: f.path)


# --- the directory walk ---------------------------------------------------------------------------


def _walk(root: Path, budget: HeldBudget, tree: _TreeBuilder) -> Iterator[InputFile]:
    real_root = root.resolve()
    yield from _list_tree(root, tree)
    files = tree.files
    if len(files) > MAX_FILES:
        files, left = _by_priority(root, files)
        yield InputFile(display_name(left[0]), status="skipped", capped=True,
                        reason=f"file cap {MAX_FILES} reached: {len(left)} files not read")
    for rel in files:
        yield from _expand(root / rel, display_name(rel), real_root, budget)


def _list_tree(root: Path, tree: _TreeBuilder) -> Iterator[InputFile]:
    """Add every directory and non-directory under `root` to `tree` (relative paths), walking
    iteratively so any depth costs no stack; yields the rows for what the walk does not enter and why."""
    files = tree.files
    stack = [("", 0)]
    while stack:
        rel_dir, depth = stack.pop()
        try:
            with os.scandir(root / rel_dir if rel_dir else root) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            yield InputFile(display_name(rel_dir or str(root)) + "/", format="directory", status="error",
                            reason=f"cannot list directory: {exc.strerror or exc}")
            continue
        tree.dirs.append(rel_dir)
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if _is_real_dir(entry):
                subdirs.append(rel)
            elif entry.is_symlink() and os.path.isdir(entry.path):
                yield InputFile(display_name(rel), status="skipped", reason="symlink to a directory; not followed")
            elif len(files) < MAX_LISTED:
                files.append(rel)
                _note_kind(entry, rel, tree)
            else:
                yield InputFile(display_name(rel), status="skipped", capped=True,
                                reason=f"listing cap {MAX_LISTED} reached: the rest of the tree not listed")
                return
        if depth >= MAX_DEPTH:
            for rel in subdirs:
                yield InputFile(display_name(rel) + "/", format="directory", status="skipped", capped=True,
                                reason=f"directory nesting deeper than {MAX_DEPTH} levels: not read")
        else:
            stack.extend((rel, depth + 1) for rel in reversed(subdirs))


def _note_kind(entry: os.DirEntry, rel: str, tree: _TreeBuilder) -> None:
    """Links and special files are noted from the directory entry's type, without a syscall."""
    try:
        if entry.is_symlink():
            tree.links.add(rel)
        elif not entry.is_file(follow_symlinks=False):
            tree.special.add(rel)
    except OSError:
        tree.special.add(rel)  # vanished or unreadable: nothing to audit, _expand says why


def _is_real_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False  # vanished or unreadable: _expand says which


def _by_priority(root: Path, files: list[str]) -> tuple[list[str], list[str]]:
    """The MAX_FILES files to read and the ones left, when there are more: files whose first bytes
    look like a training log, dump or trace first, then files named like one (grammars/input_priority.toml)."""
    ranked = sorted(files, key=lambda rel: (_evidence_rank(root / rel, rel), rel))
    return sorted(ranked[:MAX_FILES]), ranked[MAX_FILES:]


def _evidence_rank(path: Path, rel: str) -> int:
    """0: its content looks like evidence; 1: its name does; 2: neither. Only regular files are opened."""
    content, names = _priority_patterns()
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            with open(path, "rb") as fh:
                if content.search(fh.read(PRIORITY_SNIFF_BYTES)):
                    return 0
    except OSError:
        pass  # unreadable: _expand gives it its row if it is read
    return 1 if names.search(rel.lower()) else 2


@cache
def _priority_patterns() -> tuple[re.Pattern[bytes], re.Pattern[str]]:
    """grammars/input_priority.toml: the content markers and name patterns of likely evidence."""
    doc = tomllib.loads((data_dir("grammars") / "input_priority.toml").read_text(encoding="utf-8"))
    content = b"|".join(b"(?:" + row["pattern"].encode("latin-1") + b")" for row in doc["content"])
    names = "|".join(f"(?:{row['pattern']})" for row in doc["name"])
    return re.compile(content), re.compile(names)


# --- one file on disk -----------------------------------------------------------------------------


def _expand(full: Path, rel: str, real_root: Path, budget: HeldBudget) -> Iterator[InputFile]:
    item = InputFile(rel, _disk_path=full)
    try:
        if full.is_symlink():
            try:
                target = full.resolve(strict=True)
            except FileNotFoundError:
                item.skip("dangling symlink: its target does not exist")
                yield item
                return
            except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop before Python 3.13
                if isinstance(exc, RuntimeError) or exc.errno == errno.ELOOP:
                    item.skip("symlink loop; not followed")
                else:
                    item.skip(f"unreadable symlink: {exc.strerror or exc}", status="error")
                yield item
                return
            if not target.is_relative_to(real_root):
                item.skip("symlink points outside the job directory; not followed")
                yield item
                return
            if not target.is_file():
                item.skip("symlink to something that is not a regular file")
                yield item
                return
        if not full.is_file():
            item.skip("not a regular file")
            yield item
            return
        item.size = full.stat().st_size
        with open(full, "rb") as fh:
            magic = fh.read(SNIFF_BYTES)
    except OSError as exc:
        item.skip(f"unreadable: {exc.strerror or exc}", status="error")
        yield item
        return
    if item.size == 0:
        item.format = "empty"
        item.skip("empty file")
        yield item
        return
    yield from unpack(item, magic, 0, budget)
