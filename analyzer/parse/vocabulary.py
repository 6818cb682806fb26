"""Stage 2 support (parse): the vocabularies, `vocabularies/*.csv`, loaded and validated once, and their hits.

Each row is one message a component can print (a CUDA error, an NCCL result or WARN text, an Xid,
an ibverbs completion status, a c10d or nccl-tests failure line, a kernel or nvidia-smi line), as a
literal or a regex, mapped to a verdict category with its meaning, remediation, source, versions
and a test line. Rows of category `none` are the benign list: lines healthy runs print although
they read like failures.

Matching is vectorised and cheap: every row has prefilter literals (the literal itself, or those
derived from its regex), one Aho-Corasick pass finds which literals each candidate line holds, and
only the regexes of rows sharing a found literal run, each only on the lines holding it.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import polars as pl

from analyzer.parse.literals import required_literals_of
from analyzer.resources import data_dir
from analyzer.categories import CATEGORIES

COLUMNS = ("id", "component", "match", "pattern", "code", "message", "category", "meaning", "remediation", "source", "versions", "test_line")
_REQUIRED = ("id", "component", "match", "pattern", "code", "category", "meaning", "remediation", "source", "versions", "test_line")
BENIGN = "none"
# Which hit a line keeps when several rows match it: the benign list first (its rows are narrow: the
# exact message healthy runs print), then a specific category, then rows that know the message but
# map it to `other`; longer prefilter literals first.
_CLASS = {BENIGN: 0, "other": 2}
_SPECIFIC = 1


class VocabularyError(ValueError):
    """A vocabulary file is malformed; the message names the file, the row id and the field."""


@dataclass(frozen=True)
class Vocabulary:
    rows: pl.DataFrame  # one row an entry: COLUMNS plus `row` (index) and `rank` (hit precedence)
    literals: pl.DataFrame  # (literal, row): the prefilter literals of every row

    @property
    def prefilter(self) -> tuple[str, ...]:
        return tuple(self.literals.get_column("literal").unique().sort().to_list())


@cache
def vocabulary(directory: str | None = None) -> Vocabulary:
    root = Path(directory) if directory else data_dir("vocabularies")
    records: list[dict] = []
    for path in sorted(root.glob("*.csv")):
        records.extend(_read(path))
    if not records:
        raise VocabularyError(f"{root}: no vocabulary rows found")
    duplicates = sorted(i for i, n in Counter(r["id"] for r in records).items() if n > 1)
    if duplicates:
        raise VocabularyError(f"duplicate vocabulary ids: {duplicates[:5]}")
    derived = _derived_literals(records)
    literal_rows: list[tuple[str, int]] = []
    for index, record in enumerate(records):
        record["row"] = index
        lits = _prefilter(record, derived)
        record["rank"] = _CLASS.get(record["category"], _SPECIFIC) * 1000 - min(max(len(x) for x in lits), 999)
        literal_rows.extend((lit, index) for lit in lits)
    rows = pl.DataFrame(records, schema={**{c: pl.String for c in COLUMNS}, "file": pl.String, "row": pl.Int64, "rank": pl.Int64})
    literals = pl.DataFrame(literal_rows, schema={"literal": pl.String, "row": pl.Int64}, orient="row")
    return Vocabulary(rows, literals)


def _read(path: Path) -> list[dict]:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            if tuple(reader.fieldnames or ()) != COLUMNS:
                raise VocabularyError(f"{path.name}: columns must be {','.join(COLUMNS)}")
            rows = [dict(row, file=path.name) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise VocabularyError(f"{path.name}: cannot be read: {exc}") from exc
    for row in rows:
        _check_row(row)
    return rows


def _check_row(row: dict) -> None:
    where = f"{row['file']}: row {row.get('id') or '?'!r}"
    for key in _REQUIRED:
        if not (row.get(key) or "").strip():
            raise VocabularyError(f"{where}: field {key!r} is empty")
    if row["match"] not in ("literal", "regex"):
        raise VocabularyError(f"{where}: match {row['match']!r} must be 'literal' or 'regex'")
    if row["category"] not in CATEGORIES:
        raise VocabularyError(f"{where}: category {row['category']!r} is not a verdict category {sorted(CATEGORIES)}")


def _derived_literals(records: list[dict]) -> dict[str, frozenset[str] | None]:
    """The prefilter literals of every regex row's pattern (cached: `required_literals_of`)."""
    regexes = [r for r in records if r["match"] == "regex"]
    try:
        return required_literals_of(r["pattern"] for r in regexes)
    except re.error:
        for row in regexes:  # name the row whose pattern does not compile
            try:
                re.compile(row["pattern"])
            except re.error as exc:
                raise VocabularyError(f"{row['file']}: row {row['id']!r}: pattern does not compile: {exc}") from exc
        raise


def _prefilter(row: dict, derived: dict[str, frozenset[str] | None]) -> tuple[str, ...]:
    if row["match"] == "literal":
        return (row["pattern"],)
    derived = derived[row["pattern"]]
    if not derived:
        raise VocabularyError(f"{row['file']}: row {row['id']!r}: no prefilter literal can be derived from the pattern; make it name a fixed text")
    return tuple(sorted(derived))


def check_test_lines(vocab: Vocabulary) -> None:
    """Every row's regex compiles in polars' engine too, and matches its own test line.

    Run by the tests (tests/test_vocabulary.py), not at every load: it compiles every regex.
    """
    rows = vocab.rows
    try:
        ok = rows.select(_row_matches(pl.col("test_line"), pl.col("match"), pl.col("pattern")).alias("ok")).get_column("ok")
    except Exception:  # noqa: BLE001 - polars' ComputeError names no row: find it
        for row in rows.iter_rows(named=True):
            try:
                pl.Series([""]).str.contains(row["pattern"], literal=row["match"] == "literal")
            except Exception as exc:  # noqa: BLE001
                raise VocabularyError(f"{row['file']}: row {row['id']!r}: pattern does not compile in polars: {exc}") from exc
        raise
    failing = rows.filter(~ok).select("file", "id").rows()
    if failing:
        raise VocabularyError(f"{failing[0][0]}: row {failing[0][1]!r}: the test line does not match the pattern ({len(failing)} rows fail)")


def _row_matches(text: pl.Expr, match: pl.Expr, pattern: pl.Expr) -> pl.Expr:
    literal = text.str.contains(pattern, literal=True)
    regex = text.str.contains(pattern)
    return pl.when(match == "literal").then(literal).otherwise(regex).fill_null(False)


HIT_COLUMNS = {"vocab_id": pl.String, "vocab_code": pl.String, "vocab_category": pl.String, "vocab_meaning": pl.String}


def with_hits(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """`frame` plus the best vocabulary hit of each line's `column` (null where none matches)."""
    vocab = vocabulary()
    if frame.height == 0:
        return frame.with_columns(*[pl.lit(None, dtype=t).alias(n) for n, t in HIT_COLUMNS.items()])
    lines = frame.select(pl.col(column).alias("_t")).with_row_index("_vi")
    prefilter = list(vocab.prefilter)
    found = (
        lines.filter(pl.col("_t").str.contains_any(prefilter))
        .with_columns(pl.col("_t").str.extract_many(prefilter, overlapping=True).alias("literal"))
        .explode("literal")
        .unique(["_vi", "literal"])
        .join(vocab.literals, on="literal")
        .unique(["_vi", "row"])
        .join(vocab.rows.select("row", "match", "pattern", "rank", "id", "code", "category", "meaning"), on="row")
    )
    hits = (
        found.filter(_row_matches(pl.col("_t"), pl.col("match"), pl.col("pattern")))
        .sort("_vi", "rank", "row")
        .group_by("_vi", maintain_order=True)
        .first()
        .select(
            "_vi",
            pl.col("id").alias("vocab_id"),
            pl.col("code").alias("vocab_code"),
            pl.col("category").alias("vocab_category"),
            pl.col("meaning").alias("vocab_meaning"),
        )
    )
    return frame.with_row_index("_vi").join(hits, on="_vi", how="left").sort("_vi").drop("_vi")
