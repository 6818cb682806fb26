"""The verdict categories, read once from `schema/categories.toml` (data, not code).

Every reader of the list takes it from here: the rule and known-issue loaders and the vocabularies
check the category a file names, the report model derives job.outcome and the JSON Schema's
`category` enum from it, and the tests select cases by it. A file that breaks the format is an
error naming the file, never a silently shorter list.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from analyzer.resources import data_dir

OUTCOMES = ("none", "crash", "hang", "slow")
_KEYS = {"id", "outcome", "hangs", "description"}


class CategoryError(ValueError):
    """The categories file is malformed; the message names the file and the entry."""


@dataclass(frozen=True)
class Category:
    id: str
    outcome: str  # job.outcome of a verdict of this category ("none": ok or unknown, from what was read)
    hangs: bool  # peers stay alive waiting in a collective: a recording of it is a hang recording
    description: str


@cache
def categories(path: Path | None = None) -> tuple[Category, ...]:
    """The categories in the file's order (the schema's enum order)."""
    path = path or data_dir("schema") / "categories.toml"
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("category", [])
    found = tuple(_category(path, index, entry) for index, entry in enumerate(entries))
    ids = [c.id for c in found]
    if len(set(ids)) != len(ids) or "none" not in ids:
        raise CategoryError(f"{path}: category ids must be unique and include 'none': {ids}")
    return found


def _category(path: Path, index: int, entry: dict) -> Category:
    where = f"{path}: category #{index + 1}"
    if set(entry) != _KEYS:
        raise CategoryError(f"{where}: keys must be {sorted(_KEYS)}, found {sorted(entry)}")
    if entry["outcome"] not in OUTCOMES or not isinstance(entry["hangs"], bool):
        raise CategoryError(f"{where}: outcome must be one of {OUTCOMES} and hangs a boolean")
    if not all(isinstance(entry[k], str) and entry[k] for k in ("id", "description")):
        raise CategoryError(f"{where}: id and description must be non-empty strings")
    return Category(entry["id"], entry["outcome"], entry["hangs"], entry["description"])


def category_ids() -> tuple[str, ...]:
    return tuple(c.id for c in categories())


def outcome_of(category: str) -> str:
    """crash, hang or slow for a failure category; an id outside the list is a crash (`other`)."""
    return next((c.outcome for c in categories() if c.id == category), "crash")


CATEGORIES = frozenset(category_ids())
