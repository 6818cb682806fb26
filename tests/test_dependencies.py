"""The dependency contract: every module the analyzer imports is declared where its code path needs it.

A package installed by hand on a developer's machine hides an import the project forgot to declare;
this test reads the imports themselves, so the omission fails here rather than on a user's fresh venv.
Module-level imports must be core dependencies; an import inside a function (a lazily loaded optional
feature) may come from an extra instead.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# Import name -> distribution name, where they differ.
DISTRIBUTION_OF = {"yaml": "pyyaml", "zstd": "zstandard", "markdown_it": "markdown-it-py"}
# Optional modules used only behind `except ImportError` with a documented fallback.
GUARDED_OPTIONAL = {"numpy": "allowlists numpy RNG objects for torch.load(weights_only=True) when numpy is there"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


CORE = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
EXTRAS = {extra: {_name(r) for r in reqs} for extra, reqs in PYPROJECT["project"]["optional-dependencies"].items()}
PUBLISHED_OPTIONAL = set().union(*(names for extra, names in EXTRAS.items() if extra != "test"))


def _third_party_imports() -> list[tuple[str, int, str, bool]]:
    """(file, line, top-level module, imported at module level) for every non-stdlib, non-project import."""
    found = []
    for path in sorted((ROOT / "analyzer").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in ("analyzer", "__future__"):
                    continue
                found.append((str(path.relative_to(ROOT)), node.lineno, top, id(node) in top_level))
    return found


def test_module_level_imports_are_core_dependencies():
    undeclared = [(f, line, m) for f, line, m, at_top in _third_party_imports()
                  if at_top and DISTRIBUTION_OF.get(m, m).replace("_", "-") not in CORE]
    assert not undeclared, f"imported at module level but not in [project].dependencies: {undeclared}"


def test_lazy_imports_are_declared_somewhere_a_user_can_install():
    declared = CORE | PUBLISHED_OPTIONAL
    undeclared = [(f, line, m) for f, line, m, _ in _third_party_imports()
                  if DISTRIBUTION_OF.get(m, m).replace("_", "-") not in declared and m not in GUARDED_OPTIONAL]
    assert not undeclared, f"imported but declared in no published extra: {undeclared}"


def test_test_tooling_stays_out_of_the_published_dependencies():
    for tool in ("selenium", "build", "pytest", "hypothesis"):
        assert tool not in CORE and tool not in PUBLISHED_OPTIONAL, tool


def test_the_python_floor_admits_what_the_code_uses():
    floor = re.search(r">=\s*3\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert floor and int(floor.group(1)) >= 11, "analyzer imports tomllib (Python 3.11+)"
