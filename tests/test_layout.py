"""The layout bounds of the analyzer package, read with `ast`: no module over 600 lines, no function
over 80 lines.

A function counts from its `def` line to its last line (its decorators, click's options for one, are
declarations beside it, not its body); a nested function counts inside its parent and on its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "analyzer"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# Modules over the bound on main that are another change's to split, each with the length it may
# not grow past. The test below fails once one is back under the bound, so the list cannot go stale.
KNOWN_LONG_MODULES: dict[str, int] = {}


def module_lines(root: Path) -> dict[str, int]:
    """Line count of every module under `root`, keyed by its path relative to `root`'s parent."""
    return {str(p.relative_to(root.parent)): len(p.read_text(encoding="utf-8").splitlines()) for p in sorted(root.rglob("*.py"))}


def long_functions(source: str, where: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'where:line name: N lines' for each function of `source` over `limit` lines."""
    out = []
    for node in ast.walk(ast.parse(source, filename=where)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{where}:{node.lineno} {node.name}: {n} lines")
    return out


def test_the_function_measure_names_a_long_function_and_a_long_nested_one():
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    nested = "\n".join(f"        y{i} = {i}" for i in range(80))
    source = f"@decorator\ndef long():\n{body}\n\ndef outer():\n    def inner():\n{nested}\n"
    # long: 80 lines from its def (the decorator does not count); outer holds inner's 81.
    assert long_functions(source, "m.py") == ["m.py:83 outer: 82 lines", "m.py:84 inner: 81 lines"]
    assert long_functions(source, "m.py", limit=79) == ["m.py:2 long: 80 lines", "m.py:83 outer: 82 lines", "m.py:84 inner: 81 lines"]


def test_the_module_measure_counts_lines(tmp_path):
    (tmp_path / "analyzer" / "sub").mkdir(parents=True)
    (tmp_path / "analyzer" / "sub" / "big.py").write_text("x = 1\n" * 11)
    (tmp_path / "analyzer" / "small.py").write_text("x = 1\n" * 10)
    assert module_lines(tmp_path / "analyzer") == {"analyzer/small.py": 10, "analyzer/sub/big.py": 11}


def test_every_package_is_measured():
    """Both bounds read every module below the package: the stages, fleet/, capture/ and render/ too."""
    packages = {p.parent.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("__init__.py")}
    measured = {Path(m).parent.as_posix() for m in module_lines(PACKAGE)}
    assert {"analyzer/fleet", "analyzer/capture", "analyzer/render", "analyzer/io", "analyzer/parse"} <= packages
    assert packages - measured == set()


def test_no_module_over_600_lines():
    lines = module_lines(PACKAGE)
    over = {m: n for m, n in lines.items() if n > MAX_MODULE_LINES and m not in KNOWN_LONG_MODULES}
    grown = {m: lines.get(m) for m, ceiling in KNOWN_LONG_MODULES.items() if (lines.get(m) or 0) > ceiling}
    assert over == {}
    assert grown == {}


def test_every_known_long_module_is_still_long():
    lines = module_lines(PACKAGE)
    assert {m for m in KNOWN_LONG_MODULES if (lines.get(m) or 0) <= MAX_MODULE_LINES} == set()


def test_no_function_over_80_lines():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert found == []
