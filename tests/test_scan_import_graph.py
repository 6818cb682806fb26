"""The import graph of the analyzer package, read with `ast`: no circle, and the command line is a leaf.

Every import counts, at module level or inside a function (a lazy import is still a dependency).
`from analyzer.x import y` is an edge to the module `analyzer.x.y` when that module exists, else to
`analyzer.x`. A name taken from an enclosing package (`from analyzer import __version__` in
`analyzer.api`) is no edge: Python begins every enclosing package before any module inside it.
"""

from __future__ import annotations

import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "analyzer"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    targets.add(child if child in modules else node.module)
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_among_analyzer_modules():
    assert find_cycle(import_graph()) is None


def in_command_line(module: str) -> bool:
    return module == "analyzer.cli" or module.startswith("analyzer.cli.")


def test_nothing_imports_the_command_line():
    graph = import_graph()
    assert [m for m, targets in graph.items() if not in_command_line(m) and any(map(in_command_line, targets))] == []
    assert {t for t in graph["analyzer.cli"] if in_command_line(t)} == {"analyzer.cli.scan", "analyzer.cli.capture",
                                                                   "analyzer.cli.consoles"}


def click_importers() -> set[str]:
    """Every analyzer module with an `import click` or `from click... import`, lazy ones included."""
    importers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            if any(name == "click" or name.startswith("click.") for name in names):
                importers.add(module_name(path))
    return importers


def test_only_the_command_line_defines_click_commands():
    assert click_importers() == {"analyzer.cli", "analyzer.cli.scan", "analyzer.cli.capture"}


# The fleet's own pages (the terminal summary, the HTML page) build on what the renderers share.
FLEET_PAGES = {"analyzer.fleet.page_text", "analyzer.fleet.page_html"}


def test_the_batch_engine_imports_no_command_line_and_no_renderer():
    graph = import_graph()
    for module in (m for m in graph if m == "analyzer.fleet" or m.startswith("analyzer.fleet.")):
        shown = FLEET_PAGES if module not in FLEET_PAGES else set()
        assert not {t for t in graph[module] if t.startswith("analyzer.cli") or t in shown}, module
        if module not in FLEET_PAGES:
            assert not {t for t in graph[module] if t.startswith("analyzer.render")}, module
