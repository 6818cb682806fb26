"""Batch (file system): the one directory walk of the batch layer, iterative and bounded.

`walk` is `os.walk(topdown=True, followlinks=False)` without recursion: a 1,500-level tree costs a
list, not the interpreter's stack. Directories deeper than `max_depth` below the root are not
entered; the walk counts them (`Walk.too_deep`) so the caller can say what it left out. Like
`os.walk`, the consumer may prune `Level.dirs` in place to stop the descent below a directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

MAX_DEPTH = 64


@dataclass
class Level:
    path: str
    depth: int  # 0 for the root
    files: list[os.DirEntry]  # regular files and symlinks (never followed), sorted by name
    dirs: list[os.DirEntry]  # real directories (not symlinks), sorted by name; prune to skip


@dataclass
class Walk:
    root: str
    max_depth: int = MAX_DEPTH
    skip_hidden: bool = False  # names starting with "." (a `.trash/`, an editor's swap file)
    too_deep: list[str] = field(default_factory=list)
    unlistable: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[Level]:
        stack: list[tuple[str, int]] = [(self.root, 0)]
        while stack:
            path, depth = stack.pop()
            try:
                with os.scandir(path) as it:
                    entries = sorted((e for e in it if not (self.skip_hidden and e.name.startswith("."))),
                                     key=lambda e: e.name)
            except OSError:
                self.unlistable.append(path)
                continue
            files = [e for e in entries if e.is_symlink() or e.is_file(follow_symlinks=False)]
            dirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
            level = Level(path, depth, files, dirs)
            yield level
            if level.dirs and depth >= self.max_depth:
                self.too_deep.extend(d.path for d in level.dirs)
                continue
            stack.extend((d.path, depth + 1) for d in reversed(level.dirs))
