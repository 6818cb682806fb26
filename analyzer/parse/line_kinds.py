"""Stage 2 support (parse): the line-kind registry, `grammars/line_kinds.toml`, loaded and validated once.

A new kind of line is a row of data, not code: its regex, severity, header family and example
lines; optionally `collapse`, the part of its message that varies between lines saying one thing
(NCCL's channel number), so that such lines are aggregated into one event. The Aho-Corasick
prefilter literals are derived from the regex (`literals.py`) or, when a
row declares them, checked to cover it; a row whose literals are common in healthy logs names a
`screen` instead, a piece of its pattern the raw line must match (`literals.is_piece` checks it is
one); a row that cannot be prefiltered safely fails to load,
naming the file, the kind and the field. The registry's order is the match order (first wins).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import polars as pl

from analyzer.parse.literals import covers, is_piece, required_literals
from analyzer.resources import data_dir
from analyzer.severities import SEVERITIES

FAMILIES = frozenset({"nccl", "nccl_warn"})
# An NCCL WARN line is recognised by its header, whose level word is spelled `WARN` (classify._NCCL).
FAMILY_LITERALS = {"nccl_warn": ("WARN",)}
_KEYS = frozenset({"kind", "severity", "family", "pattern", "literals", "prefilter", "generic", "collapse", "screen", "examples"})
_REQUIRED = ("kind", "severity", "pattern", "examples")


class LineKindError(ValueError):
    """The registry file is malformed; the message names the file, the kind and the field."""


@dataclass(frozen=True)
class LineKind:
    kind: str
    severity: str
    pattern: str
    family: str | None = None  # "nccl", "nccl_warn", or None (any line)
    literals: tuple[str, ...] = ()  # the prefilter: a line without any of these never reaches `pattern`
    examples: tuple[str, ...] = ()
    neighbour_only: bool = False  # reaches the regex only as the line before a prefilter candidate
    # Catch-all failure wording: not applied to a line whose header gives it a level (NCCL, c10d,
    # glog), nor to a line the benign vocabulary (category `none`) knows.
    generic: bool = False
    # A regex over the message: the part that differs between lines of one connection (`Channel 03/1`).
    # Lines equal once it is removed are one event per writer and communicator (repeats.collapse_repeats).
    collapse: str | None = None
    # A piece of `pattern` that a raw line must match to be a candidate, in place of `literals` in the
    # text prefilter (they still gate the regex in classify): for kinds whose literals are common.
    screen: str | None = None


@cache
def line_kinds(path: str | None = None) -> tuple[LineKind, ...]:
    source = Path(path) if path else data_dir("grammars") / "line_kinds.toml"
    try:
        doc = tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise LineKindError(f"{source.name}: cannot be read as TOML: {exc}") from exc
    rows = doc.get("kind")
    if not isinstance(rows, list) or not rows or not set(doc) <= {"kind", "emitted"}:
        raise LineKindError(f"{source.name}: expected [[kind]] tables and an `emitted` list")
    return tuple(_row(source.name, i, row) for i, row in enumerate(rows, start=1))


@cache
def known_kinds(path: str | None = None) -> frozenset[str]:
    """Every event kind a rule may name: the registry's line kinds and the kinds other parsers emit."""
    source = Path(path) if path else data_dir("grammars") / "line_kinds.toml"
    emitted = tomllib.loads(source.read_text(encoding="utf-8")).get("emitted", [])
    return frozenset(k.kind for k in line_kinds(path)) | frozenset(emitted)


def _row(name: str, index: int, row: dict) -> LineKind:
    where = f"{name}: kind #{index} {row.get('kind', '?')!r}"
    unknown = set(row) - _KEYS
    if unknown:
        raise LineKindError(f"{where}: unknown fields {sorted(unknown)}")
    for key in _REQUIRED:
        if key not in row:
            raise LineKindError(f"{where}: missing field {key!r}")
    if row["severity"] not in SEVERITIES:
        raise LineKindError(f"{where}: severity {row['severity']!r} is not one of {sorted(SEVERITIES)}")
    family = row.get("family")
    if family is not None and family not in FAMILIES:
        raise LineKindError(f"{where}: family {family!r} is not one of {sorted(FAMILIES)}")
    pattern = row["pattern"]
    _check_compiles(where, pattern)
    if row.get("prefilter") not in (None, "neighbour"):
        raise LineKindError(f"{where}: prefilter {row['prefilter']!r} must be \"neighbour\" or absent")
    neighbour = row.get("prefilter") == "neighbour"
    examples = tuple(row["examples"])
    if not examples or not all(isinstance(e, str) and e for e in examples):
        raise LineKindError(f"{where}: examples must be a non-empty list of lines")
    if not isinstance(row.get("generic", False), bool):
        raise LineKindError(f"{where}: generic must be true or false")
    literals = _literals(where, row, family, neighbour)
    collapse = _collapse(where, row.get("collapse"))
    screen = _screen(where, row.get("screen"), pattern, examples, neighbour)
    return LineKind(
        row["kind"], row["severity"], pattern, family, literals, examples, neighbour, bool(row.get("generic", False)), collapse,
        screen,
    )


def _collapse(where: str, collapse: object) -> str | None:
    if collapse is None:
        return None
    if not isinstance(collapse, str) or not collapse:
        raise LineKindError(f"{where}: collapse must be a non-empty regex")
    _check_compiles(where, collapse, "collapse")
    return collapse


def _screen(where: str, screen: object, pattern: str, examples: tuple[str, ...], neighbour: bool) -> str | None:
    if screen is None:
        return None
    if neighbour:
        raise LineKindError(f"{where}: a neighbour-only kind has no screen")
    if not isinstance(screen, str) or not screen:
        raise LineKindError(f"{where}: screen must be a non-empty regex")
    _check_compiles(where, screen, "screen")
    if not is_piece(screen, pattern):
        raise LineKindError(
            f"{where}: screen {screen!r} is not consecutive items of the pattern free of anchors and look-arounds "
            "(a line the pattern matches might not match it)"
        )
    missed = [e for e in examples if not re.search(screen, e)]
    if missed:
        raise LineKindError(f"{where}: screen does not match the example {missed[0]!r}")
    return screen


def _literals(where: str, row: dict, family: str | None, neighbour: bool) -> tuple[str, ...]:
    declared = tuple(row.get("literals", ()))
    if neighbour:
        if declared:
            raise LineKindError(f"{where}: a neighbour-only kind declares no literals")
        return ()
    if family in FAMILY_LITERALS:
        return FAMILY_LITERALS[family] + declared
    if declared:
        if not all(isinstance(x, str) and x for x in declared):
            raise LineKindError(f"{where}: literals must be non-empty strings")
        if not covers(declared, row["pattern"]):
            raise LineKindError(f"{where}: literals {list(declared)} do not cover the pattern (a matching line may hold none of them)")
        return declared
    derived = required_literals(row["pattern"])
    if not derived:
        raise LineKindError(f"{where}: no prefilter literal can be derived from the pattern; declare covering literals")
    return tuple(sorted(derived))


def _check_compiles(where: str, pattern: str, field: str = "pattern") -> None:
    # Both engines: the literal derivation reads Python's parse tree, polars (Rust regex) runs it.
    try:
        re.compile(pattern)
        pl.Series([""], dtype=pl.String).str.contains(pattern)
    except Exception as exc:  # noqa: BLE001 - re.error or polars' ComputeError
        raise LineKindError(f"{where}: {field} does not compile: {exc}") from exc
