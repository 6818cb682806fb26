"""What the restructuring put in one place stays there, read with `ast` over the analyzer package:

- the exit codes and `CannotAnalyse` are defined in `analyzer.exits` only (the library's contract,
  which the command line imports, never the other way round);
- the verdict categories are `schema/categories.toml` (`analyzer.categories`): no module spells out
  a list of them of its own;
- every field of the records one stage hands the next (inputs, listing, job facts, job context) is
  read by some module other than the one defining it: a field that is set and never read is dead;
- a public function or class is defined in one module (`format_ranks` lives in `analyzer.ranks`,
  not in detect with analyses reaching for it): a second definition of a name is a twin, unless
  `HOMONYMS` says why the two are different things;
- a helper is not named for the integer it returns (`_int`, `_int64`, `_int_or_none`): five such helpers
  were twins of `bounds.int64` or of one another, and the name hid which; one that does another job
  says which (`_snapshot_int`, `_message_int`);
- no module but `analyzer.ranks` chooses between "rank" and "ranks" by a count: `ranks_label` is the
  one way a set of ranks is named in prose (`format_ranks` the one way it is listed);
- no import inside a function dodges a circle: a lazy import of a module that, through module-level
  imports and detect's analysis registry (`analysis.load_all` imports every module of
  `analyzer.analyses`), reaches the importer back is a circle hidden from the import graph.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from analyzer.categories import CATEGORIES
from analyzer.facts.correlate import JobContext, JobFacts
from analyzer.io import Discovery, InputFile, Listing
from tests.test_scan_import_graph import module_name

PACKAGE = Path(__file__).resolve().parents[1] / "analyzer"
EXIT_NAMES = {"EXIT_NOTHING_FOUND", "EXIT_FAILURE_FOUND", "EXIT_CANNOT_ANALYSE", "EXIT_INTERNAL_ERROR"}
HANDED_ON = (InputFile, Listing, Discovery, JobFacts, JobContext)
MIN_CATEGORY_LIST = 3  # a list this long of category ids is a second definition of them
# Public names that two modules define for different things, each with why.
HOMONYMS = {
    "analyze": "api's entry point and cli's `postmortem analyze` command, a thin shell over it",
    "main": "the entry points of cli, knownissues (its CSV check) and report_schema (the schema writer)",
    "Job": "capture's live job on a node and the report's job record",
    "HostFacts": "hostfacts' computed facts of a host and the report's record of them",
    "findings_frame": "detect's findings frame and the fleet's table of findings over many jobs",
    "rows_frame": "Flight Recorder event columns and the fleet's job rows",
    "classify": "sniff's format of a file, parse's kind of a line and timeline_marks' class of an event",
}
# A helper named for the integer it returns, whatever it does to get it.
INT_HELPER = re.compile(r"_(?:int|int64|integer)(?:_or_none)?")
RANK_WORDS = {"rank", "rank ", "ranks", "ranks "}
RANKS_MODULE = "analyzer/ranks.py"
# A registry that imports the modules of a package when it is called: (registry, package).
REGISTRIES = (("analyzer.analyses", "analyzer.analyses."),)


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


def public_definitions(trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Public top-level function or class name -> the modules defining it, for names defined twice or more."""
    found: dict[str, list[str]] = {}
    for where, tree in trees.items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(where)
    return {name: where for name, where in found.items() if len(where) > 1}


def int_helpers(trees: dict[str, ast.Module]) -> list[str]:
    """'module:line name' of every function, at any depth, named `_int` or the like (INT_HELPER)."""
    return [f"{where}:{node.lineno} {node.name}" for where, tree in trees.items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and INT_HELPER.fullmatch(node.name)]


def _words(node: ast.IfExp) -> set[object]:
    return {b.value for b in (node.body, node.orelse) if isinstance(b, ast.Constant) and isinstance(b.value, str)}


def hand_written_rank_labels(trees: dict[str, ast.Module]) -> list[str]:
    """'module:line' of each "rank"/"ranks" chosen by a conditional outside `analyzer.ranks`: a conditional
    between the two words, or one (`'s' if ...`) right after an f-string's literal ending in "rank"."""
    found = []
    for where, tree in trees.items():
        if where == RANKS_MODULE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.IfExp) and _words(node) & RANK_WORDS:
                found.append(f"{where}:{node.lineno}")
            elif isinstance(node, ast.JoinedStr):
                for before, value in zip(node.values, node.values[1:]):
                    if (isinstance(before, ast.Constant) and str(before.value).endswith("rank")
                            and isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.IfExp)):
                        found.append(f"{where}:{node.lineno}")
    return sorted(found)


def _imported(node: ast.AST, known: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names} & known
    return set()


def import_edges(trees: dict[str, ast.Module]) -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """Module-level imports (with the registries' loads) by module, and every (importer, imported,
    line) import made inside a function."""
    names = {module_name(PACKAGE.parent / where): where for where in trees}
    known = set(names)
    eager: dict[str, set[str]] = {m: set() for m in names}
    lazy = []
    for module, where in names.items():
        tree = trees[where]
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
        for node in ast.walk(tree):
            for target in _imported(node, known) - {module}:
                if id(node) in inside:
                    lazy.append((module, target, node.lineno))
                elif not module.startswith(target + "."):
                    eager[module].add(target)
    for registry, prefix in REGISTRIES:
        eager.setdefault(registry, set()).update(m for m in names if m.startswith(prefix))
    return eager, lazy


def hidden_circles(trees: dict[str, ast.Module]) -> list[str]:
    """'importer:line -> imported' for each function-local import whose target reaches the importer back."""
    eager, lazy = import_edges(trees)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            module = todo.pop()
            if module == goal:
                return True
            if module not in seen:
                seen.add(module)
                todo.extend(eager.get(module, ()))
        return False

    return sorted(f"{importer}:{line} -> {imported}" for importer, imported, line in lazy if reaches(imported, importer))


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

    twice = {"analyzer/a.py": ast.parse("def format_ranks(r): pass\nclass _Private: pass\n"),
             "analyzer/b.py": ast.parse("def format_ranks(r): pass\nclass _Private: pass\n")}
    assert public_definitions(twice) == {"format_ranks": ["analyzer/a.py", "analyzer/b.py"]}
    # detect imports the analyses registry; an analysis reaching for detect inside a function hides the circle.
    dodged = {"analyzer/detect.py": ast.parse("from analyzer.analyses import load_all\ndef format_ranks(r): pass\n"),
              "analyzer/analyses/__init__.py": ast.parse("def load_all(): pass\n"),
              "analyzer/analyses/hang.py": ast.parse("def label(r):\n    from analyzer.detect import format_ranks\n"),
              "analyzer/analyses/stacks.py": ast.parse("def later():\n    from analyzer.analyses.hang import label\n")}
    assert hidden_circles(dodged) == ["analyzer.analyses.hang:2 -> analyzer.detect"]
    helpers = {"analyzer/a.py": ast.parse("def _int(v): pass\ndef outer():\n    def _int64_or_none(v): pass\n"
                                          "def _message_int(p): pass\ndef _int_column(v): pass\n")}
    assert int_helpers(helpers) == ["analyzer/a.py:1 _int", "analyzer/a.py:3 _int64_or_none"]
    labels = {"analyzer/a.py": ast.parse("a = ('rank ' if len(r) == 1 else 'ranks ') + format_ranks(r)\n"
                                         "b = f\"rank{'s' if len(r) > 1 else ''} {r}\"\n"
                                         "c = f\"{'were' if len(r) > 1 else 'was'} {ranks_label(r)}\"\n"),
              RANKS_MODULE: ast.parse("d = 'rank ' if len(r) == 1 else 'ranks '\n")}
    assert hand_written_rank_labels(labels) == ["analyzer/a.py:1", "analyzer/a.py:2"]


def test_the_exit_contract_is_defined_once_in_the_library():
    assert definitions(modules()) == {"analyzer/exits.py": EXIT_NAMES | {"CannotAnalyse"}}


def test_no_module_lists_the_verdict_categories_itself():
    assert category_lists(modules()) == []


def test_every_field_a_stage_hands_on_is_read():
    assert unread_fields(modules(), HANDED_ON) == []


def test_a_public_name_is_defined_once():
    twice = public_definitions(modules())
    assert {name: where for name, where in twice.items() if name not in HOMONYMS} == {}
    assert set(HOMONYMS) - set(twice) == set()  # a homonym gone leaves the list


def test_no_helper_is_named_for_the_integer_it_returns():
    assert int_helpers(modules()) == []


def test_ranks_are_named_in_prose_by_ranks_label_alone():
    assert hand_written_rank_labels(modules()) == []


def test_no_function_local_import_hides_a_circle():
    assert hidden_circles(modules()) == []


# --- one directory walker, one rank-from-name (issue 16) -------------------------------------------

WALK_MODULE = "analyzer/io/walk.py"
# Calls that list a directory tree. Modules other than the walk's that call one, each with why it is
# no second walker of a job's files.
LISTING_CALLS = {"scandir", "walk", "rglob", "listdir", "iterdir"}
LISTING_ELSEWHERE = {
    "analyzer/capture/processes.py": "os.listdir of /proc on a live node: the processes, not a job's files",
    "analyzer/fleet/store.py": "rglob of the analyzer's own package: the code hash of the engine identity",
}
RANK_NAME_MODULE = "analyzer/io/sniff.py"


def listing_calls(trees: dict[str, ast.Module]) -> list[str]:
    """'module:line call' of every call of a directory-listing function (`os.scandir(...)`, `p.rglob(...)`)."""
    found = []
    for where, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
                if name in LISTING_CALLS and not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                                                  and func.value.id == "ast"):
                    found.append(f"{where}:{node.lineno} {name}")
    return found


def rank_name_patterns(trees: dict[str, ast.Module]) -> list[str]:
    """'module:line' of every string constant holding the rank-in-a-file-name regex (`rank[_\\-.]?(\\d+)`)."""
    return [f"{where}:{node.lineno}" for where, tree in trees.items() for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "rank[_" in node.value and r"(\d+)" in node.value]


def test_the_walker_checks_find_a_second_walker_and_a_second_rank_pattern():
    trees = {"analyzer/x.py": ast.parse("import os\nfor e in os.scandir(p): pass\nq.rglob('*')\nRANK = r'rank[_\\-.]?(\\d+)'\n"
                                        "def rank_from_name(path): pass\n")}
    assert listing_calls(trees) == ["analyzer/x.py:2 scandir", "analyzer/x.py:3 rglob"]
    assert rank_name_patterns(trees) == ["analyzer/x.py:4"]


def test_one_directory_walker():
    calls = [c for c in listing_calls(modules()) if c.split(":")[0] not in {WALK_MODULE, *LISTING_ELSEWHERE}]
    assert calls == [], "a directory listing outside analyzer/io/walk.py: walk with analyzer.io.walk.Walk instead"
    assert any(c.startswith(WALK_MODULE) for c in listing_calls(modules()))


def test_one_rank_from_name():
    trees = modules()
    assert [w for w in public_definitions(trees).get("rank_from_name", [])] == []
    defined = [where for where, tree in trees.items() for node in tree.body
               if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") == "rank_from_name"]
    assert defined == [RANK_NAME_MODULE]
    assert [p.split(":")[0] for p in rank_name_patterns(trees)] == [RANK_NAME_MODULE]


UNPICKLER_MODULE = "analyzer/io/safepickle.py"


def unpickler_classes(trees: dict[str, ast.Module]) -> list[str]:
    """'module:line' of every class derived from `pickle.Unpickler` (or a bare `Unpickler`)."""
    return [f"{where}:{node.lineno}" for where, tree in trees.items() for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Attribute) and b.attr == "Unpickler") or (isinstance(b, ast.Name) and b.id == "Unpickler")
                for b in node.bases)]


def test_the_unpickler_check_finds_a_second_one():
    trees = {"analyzer/x.py": ast.parse("import pickle\nclass A(pickle.Unpickler): pass\nclass B(Unpickler): pass\nclass C: pass\n")}
    assert unpickler_classes(trees) == ["analyzer/x.py:2", "analyzer/x.py:3"]


def test_one_unpickler_for_untrusted_pickles():
    # Restricted (Flight Recorder, snapshots) and symbolic (checkpoints) are two modes of one class.
    assert [c.split(":")[0] for c in unpickler_classes(modules())] == [UNPICKLER_MODULE]
