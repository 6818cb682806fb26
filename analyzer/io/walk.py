"""Stage 1, io (the walk): `discover` lists and classifies every input of a job.

Walks the directory read-only and iteratively (never following symlinks out of the root, never
deeper than MAX_DEPTH levels), or reads one file, or standard input (`-`); past MAX_FILES files it
reads the likeliest evidence first (grammars/input_priority.toml). Each file is expanded by
`analyzer.io.archives` and classified by `analyzer.io.sniff`.

`discover_job` hands on the inputs and the `Listing` of what the walk found on disk (directories,
files, links): the checkpoint audit reads that listing, so the job is walked once and nothing
outside it is looked at. `list_path` lists a `--checkpoint` path with the same walk. `Walk` is the
one directory walk of the package, which the batch scan (`analyzer.fleet`) walks its roots with too.
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
from analyzer.io.sniff import PICKLE_PROTOCOL_2_PLUS, apply_layout_hints, classify
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
    """Add every directory and non-directory under `root` to `tree` (relative paths); yields the
    rows for what the walk does not enter and why."""
    files = tree.files
    walk = Walk(root)
    for level in walk:
        tree.dirs.append(level.rel)
        for entry in level.entries:
            rel = f"{level.rel}/{entry.name}" if level.rel else entry.name
            if entry.is_symlink() and os.path.isdir(entry.path):
                yield InputFile(display_name(rel), status="skipped", reason="symlink to a directory; not followed")
            elif len(files) < MAX_LISTED:
                files.append(rel)
                _note_kind(entry, rel, tree)
            else:
                yield InputFile(display_name(rel), status="skipped", capped=True,
                                reason=f"listing cap {MAX_LISTED} reached: the rest of the tree not listed")
                break
        else:
            continue
        break  # the listing cap: nothing more is listed
    for rel, exc in walk.unlistable:
        yield InputFile(display_name(rel or str(root)) + "/", format="directory", status="error",
                        reason=f"cannot list directory: {exc.strerror or exc}")
    for rel in walk.too_deep:
        yield InputFile(display_name(rel) + "/", format="directory", status="skipped", capped=True,
                        reason=f"directory nesting deeper than {MAX_DEPTH} levels: not read")


@dataclass
class Level:
    """One directory of a `Walk`: its entries sorted by name, nothing followed or opened."""

    path: str  # the root joined with `rel` (the root itself for the root)
    rel: str  # relative to the root; "" for the root
    depth: int  # 0 for the root
    entries: list[os.DirEntry]  # everything that is not a real directory: files, links, special files
    dirs: list[os.DirEntry]  # real directories (not links to one); prune in place to skip their trees

    @property
    def files(self) -> list[os.DirEntry]:
        """The regular files and the links (never followed): what a batch scan looks at."""
        return [e for e in self.entries if e.is_symlink() or _is_regular(e)]


@dataclass
class Walk:
    """The one directory walk: `os.walk(topdown=True, followlinks=False)` without recursion (any depth
    costs a list, not the interpreter's stack), directories top-down, names sorted. Directories deeper
    than `max_depth` below the root are not entered (`too_deep`), nor those that cannot be listed
    (`unlistable`, with the error); both relative to the root. Like `os.walk`, the consumer may prune
    `Level.dirs` in place to stop the descent below a directory."""

    root: str | os.PathLike[str]
    max_depth: int = MAX_DEPTH
    skip_hidden: bool = False  # names starting with "." (a `.trash/`, an editor's swap file)
    too_deep: list[str] = field(default_factory=list)
    unlistable: list[tuple[str, OSError]] = field(default_factory=list)

    def __iter__(self) -> Iterator[Level]:
        root = os.fspath(self.root)
        stack: list[tuple[str, int]] = [("", 0)]
        while stack:
            rel, depth = stack.pop()
            level = self._level(os.path.join(root, rel) if rel else root, rel, depth)
            if level is None:
                continue
            yield level
            subdirs = [f"{rel}/{d.name}" if rel else d.name for d in level.dirs]
            if subdirs and depth >= self.max_depth:
                self.too_deep.extend(subdirs)
                continue
            stack.extend((sub, depth + 1) for sub in reversed(subdirs))

    def _level(self, path: str, rel: str, depth: int) -> Level | None:
        try:
            with os.scandir(path) as listing:
                entries = sorted((e for e in listing if not (self.skip_hidden and e.name.startswith("."))),
                                 key=lambda e: e.name)
        except OSError as exc:
            self.unlistable.append((rel, exc))
            return None
        dirs = [e for e in entries if _is_real_dir(e)]
        return Level(path, rel, depth, [e for e in entries if not _is_real_dir(e)], dirs)


def list_level(path: str | os.PathLike[str], *, skip_hidden: bool = False) -> Level | None:
    """The entries of one directory, as the walk lists them; None when it cannot be listed."""
    return next(iter(Walk(path, max_depth=0, skip_hidden=skip_hidden)), None)


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


def _is_regular(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


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
        size = _regular_size(full, real_root, item)  # one lstat (and one stat through a link)
        if size is None:
            yield item
            return
        item.size = size
        with open(full, "rb") as fh:
            magic = fh.read(PICKLE_HEAD_BYTES)
            if not (magic.startswith(PICKLE_PROTOCOL_2_PLUS) and len(magic) == PICKLE_HEAD_BYTES):
                magic += fh.read(SNIFF_BYTES - len(magic))
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


# A pickle's format is settled by its first bytes: every check of a head that opens with the pickle
# protocol (archive and codec magic, tar's header, the checkpoint signatures) reads its first 512
# bytes, so a job of 16k Flight Recorder dumps reads 4 KiB of each, not SNIFF_BYTES, to classify it.
PICKLE_HEAD_BYTES = 4 << 10
_NOT_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # what Path.is_file() reads as "not a file"


def _regular_size(full: Path, real_root: Path, item: InputFile) -> int | None:
    """The size of a regular file, or of the regular file a link inside the job points to; None
    (with `item` skipped and why) for anything else."""
    try:
        st = os.lstat(full)
    except OSError as exc:
        if exc.errno not in _NOT_THERE:
            raise
        item.skip("not a regular file")
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = full.resolve(strict=True)
        except FileNotFoundError:
            item.skip("dangling symlink: its target does not exist")
            return None
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop before Python 3.13
            if isinstance(exc, RuntimeError) or exc.errno == errno.ELOOP:
                item.skip("symlink loop; not followed")
            else:
                item.skip(f"unreadable symlink: {exc.strerror or exc}", status="error")
            return None
        if not target.is_relative_to(real_root):
            item.skip("symlink points outside the job directory; not followed")
            return None
        st = os.stat(full)
        if not stat.S_ISREG(st.st_mode):
            item.skip("symlink to something that is not a regular file")
            return None
    elif not stat.S_ISREG(st.st_mode):
        item.skip("not a regular file")
        return None
    return st.st_size
