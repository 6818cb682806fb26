"""Stage order of the analyzer package: no module imports a module of a later stage.

The stages are docs/ARCHITECTURE.md's: io -> parse -> correlate/facts -> detect -> decide -> report ->
render, with the batch and live layers and the command line on top, and a few leaf modules that
every stage shares below them all. Each module's stage is the longest entry of `STAGE_OF` that is
its name or a package above it; every module must have one. The import graph is
`tests/test_scan_import_graph.py`'s (every import, lazy ones included).
"""

from __future__ import annotations

from tests.test_scan_import_graph import import_graph

STAGES = ("common", "io", "parse", "facts", "detect", "decide", "report", "render", "top")

STAGE_OF = {
    # Shared leaves: caps, the exit contract and input errors, the event model, the verdict
    # categories, where the data directories are, the findings frame's shape.
    "analyzer.bounds": "common",
    "analyzer.exits": "common",
    "analyzer.events": "common",
    "analyzer.categories": "common",
    "analyzer.severities": "common",
    "analyzer.resources": "common",
    "analyzer.findings": "common",
    "analyzer.ranks": "common",  # how a set of ranks is written, for analyses, the report and renderers
    "analyzer.units": "common",  # how a byte count is written, for parsers, analyses and renderers
    "analyzer.io": "io",
    "analyzer.parse": "parse",
    "analyzer.facts": "facts",
    "analyzer.rules": "detect",
    "analyzer.detect": "detect",
    "analyzer.analyses": "detect",
    "analyzer.knownissues": "detect",  # matched like a signature, by the known_issues analysis
    "analyzer.ruletests": "detect",  # runs each rule's inline cases through parse, correlate and detect
    "analyzer.decide": "decide",
    "analyzer.report": "report",
    "analyzer.report_schema": "report",
    "analyzer.api": "report",  # runs stages 1-5 on one job and assembles the report
    "analyzer": "report",  # the package re-exports api's entry points
    "analyzer.render": "render",
    "analyzer.fleet": "top",
    "analyzer.capture": "top",
    "analyzer.outputs": "top",  # the command layer's check of output paths
    "analyzer.cli": "top",  # the command line: the package's modules define every click command
}

# Imports that reach a later stage on main and are another change's to remove: (importer, imported)
# with why. test_every_known_exception_is_still_needed fails once one is gone, so none goes stale.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def stage_of(module: str) -> str:
    """The stage of `module`: its own entry or the nearest package's (the bare package only for itself)."""
    for prefix in sorted(STAGE_OF, key=len, reverse=True):
        if module == prefix or (prefix != "analyzer" and module.startswith(prefix + ".")):
            return STAGE_OF[prefix]
    raise KeyError(f"{module} has no stage in STAGE_OF")


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a module of a later stage."""
    rank = {stage: i for i, stage in enumerate(STAGES)}
    return {
        (importer, imported)
        for importer, targets in graph.items()
        for imported in targets
        if rank[stage_of(imported)] > rank[stage_of(importer)]
    }


def test_the_stage_of_a_module_is_its_nearest_entry():
    assert stage_of("analyzer.parse.checkpoints.files") == "parse"
    assert stage_of("analyzer.cli.scan") == "top"
    assert stage_of("analyzer") == "report"


def test_the_checker_finds_an_upward_import():
    graph = {"analyzer.parse.logtext": {"analyzer.events", "analyzer.render.text"}, "analyzer.render.text": {"analyzer.detect"}}
    assert upward_imports(graph) == {("analyzer.parse.logtext", "analyzer.render.text")}


def test_every_module_has_a_stage():
    missing = []
    for module in import_graph():
        try:
            stage_of(module)
        except KeyError:
            missing.append(module)
    assert missing == []


def test_no_module_imports_a_later_stage():
    assert upward_imports(import_graph()) - set(KNOWN_EXCEPTIONS) == set()


def test_every_known_exception_is_still_needed():
    assert set(KNOWN_EXCEPTIONS) - upward_imports(import_graph()) == set()
