"""What the restructuring put in one place stays there, read with `ast` over the analyzer package:

- the exit codes and `CannotAnalyse` are defined in `analyzer.exits` only (the library's contract,
  which the command line imports, never the other way round);
- the verdict categories are `schema/categories.toml` (`analyzer.categories`): no module spells out
  a list of them of its own;
- every field of the records one stage hands the next (inputs, listing, job facts, job context) is
  read by some module other than the one defining it: a field that is set and never read is dead.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from analyzer.categories import CATEGORIES
from analyzer.facts.correlate import JobContext, JobFacts
from analyzer.io import Discovery, InputFile, Listing

PACKAGE = Path(__file__).resolve().parents[1] / "analyzer"
EXIT_NAMES = {"EXIT_NOTHING_FOUND", "EXIT_FAILURE_FOUND", "EXIT_CANNOT_ANALYSE", "EXIT_INTERNAL_ERROR"}
HANDED_ON = (InputFile, Listing, Discovery, JobFacts, JobContext)
MIN_CATEGORY_LIST = 3  # a list this long of category ids is a second definition of them


def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE.parent)): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))}


def definitions(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the exit-code names it assigns and the `CannotAnalyse` class it defines."""
    found: dict[str, set[str]] = {}
    for where, tree in trees.items():
        for node in ast.walk(tree):
            names = set()
            if isinstance(node, ast.Assign):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)} & EXIT_NAMES
            elif isinstance(node, ast.ClassDef) and node.name == "CannotAnalyse":
                names = {node.name}
            if names:
                found.setdefault(where, set()).update(names)
    return found


def category_lists(trees: dict[str, ast.Module]) -> list[str]:
    """'module:line' of every literal list, tuple or set holding MIN_CATEGORY_LIST or more category ids."""
    found = []
    for where, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                ids = {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in CATEGORIES and e.value != "none"}
                if len(ids) >= MIN_CATEGORY_LIST:
                    found.append(f"{where}:{node.lineno}")
    return found


def unread_fields(trees: dict[str, ast.Module], records: tuple[type, ...]) -> list[str]:
    """'Record.field' for each public field no module but the record's own reads (`x.field` loaded)."""
    readers: dict[str, set[str]] = {}
    for where, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                readers.setdefault(node.attr, set()).add(where)
    dead = []
    for record in records:
        own = record.__module__.replace(".", "/") + ".py"
        for f in dataclasses.fields(record):
            if not f.name.startswith("_") and not readers.get(f.name, set()) - {own}:
                dead.append(f"{record.__name__}.{f.name}")
    return dead


def test_the_checks_find_what_they_look_for():
    trees = {"analyzer/x.py": ast.parse("EXIT_CANNOT_ANALYSE = 2\nclass CannotAnalyse(Exception): pass\n"
                                        "KINDS = ('shm_too_small', 'nccl_timeout', 'straggler')\nprint(item.seen)\n")}
    assert definitions(trees) == {"analyzer/x.py": {"EXIT_CANNOT_ANALYSE", "CannotAnalyse"}}
    assert category_lists(trees) == ["analyzer/x.py:3"]

    @dataclasses.dataclass
    class Record:
        seen: int = 0
        never: int = 0

    assert unread_fields(trees, (Record,)) == ["Record.never"]


def test_the_exit_contract_is_defined_once_in_the_library():
    assert definitions(modules()) == {"analyzer/exits.py": EXIT_NAMES | {"CannotAnalyse"}}


def test_no_module_lists_the_verdict_categories_itself():
    assert category_lists(modules()) == []


def test_every_field_a_stage_hands_on_is_read():
    assert unread_fields(modules(), HANDED_ON) == []
