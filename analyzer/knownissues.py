"""Known bugs of the stack, by version: the table in `known_issues/`, loaded, validated and matched.

Part of stage 4 (detect) and of the `known-issues` command. Each entry of `known_issues/*.toml`
names the component versions it affects (`affected`: one version range per component, all of
which must hold; or `mismatch`: two components whose versions must be equal and are not), the
fixed-in version, the symptom it produces in a log (signature ids of `rules/` and/or regular
expressions; `context` patterns the host's lines must also show when the symptom alone is a
generic one, a hang), its verdict category, the remediation and its sources. Unknown keys, an
unknown component, category or signature, a range that does not parse, a pattern that does not
compile or an entry without its own test stacks are load errors naming the file and the entry.

Everything here is a pure function returning polars frames:

- `host_versions(events, host_facts)`: (host, component, version, event_ids) from the host facts;
- `affected(versions)`: (host, issue_id, versions) for every entry whose ranges all hold;
- `stack_versions(stack)`: the same frame for a stack given by hand (the CLI, tests);
- `markdown_table()`: the README table (`python -m analyzer.knownissues --markdown`).

Versions compare as up to four numeric components (`2.18.1`, `535.104.05`, `12.1`; a build
suffix such as `+cu121` or `-aws` is ignored), as one zero-padded string key in polars.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import polars as pl

from analyzer.resources import data_dir
from analyzer.categories import CATEGORIES
from analyzer.facts.hostfacts import HostFacts, host_facts, observations, unit_facts
from analyzer.rules import catalogue

# Component -> the host fact (analyzer.facts.hostfacts) that states its version.
COMPONENTS: dict[str, str] = {
    "nccl": "nccl_version",
    "nccl-cuda": "nccl_build",  # the CUDA an NCCL build was compiled for (`+cuda12.3`)
    "pytorch": "torch_version",
    "cuda-driver": "driver_version",  # the NVIDIA driver (535.104.05)
    "cuda-driver-api": "cuda_driver",  # the CUDA version the driver supports (cudaDriverVersion)
    "cuda-runtime": "cuda_runtime",  # the CUDA runtime the framework was built with / ships
    "fabric-manager": "fabric_manager",
    "aws-ofi-nccl": "aws_ofi_nccl",
    "deepspeed": "deepspeed_version",
}
FACT_COMPONENT = {fact: component for component, fact in COMPONENTS.items()}
LABELS = {
    "nccl": "NCCL", "nccl-cuda": "NCCL's CUDA build", "pytorch": "PyTorch", "cuda-driver": "NVIDIA driver",
    "cuda-driver-api": "driver CUDA version", "cuda-runtime": "CUDA runtime", "fabric-manager": "Fabric Manager",
    "aws-ofi-nccl": "aws-ofi-nccl", "deepspeed": "DeepSpeed",
}
NO_HOST = "(no host name)"  # lines whose host no source names

_ENTRY_KEYS = frozenset({
    "id", "component", "title", "affected", "mismatch", "fixed_in", "category", "confidence",
    "remediation", "sources", "symptom", "tests",
})
_SYMPTOM_KEYS = frozenset({"signatures", "patterns", "context"})
_TEST_KEYS = frozenset({"affected", "fixed", "lines"})
_ID = re.compile(r"^[a-z0-9][a-z0-9.\-]*$")
_RANGE = re.compile(r"^\s*(>=|<=|==|>|<)\s*v?(\d+(?:\.\d+){0,3})\s*$")
_KEY_WIDTH = 6
_KEY_PARTS = 4
_PAD = "." + ".".join(["0" * _KEY_WIDTH] * _KEY_PARTS)
_KEY_LEN = _KEY_PARTS * (_KEY_WIDTH + 1) - 1


class KnownIssueError(ValueError):
    """A known-issue file is malformed; the message names the file, the entry and the problem."""


@dataclass(frozen=True)
class Symptom:
    signatures: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()
    context: tuple[str, ...] = ()


@dataclass(frozen=True)
class KnownIssue:
    id: str
    component: str
    title: str
    affected: dict[str, str]  # component -> range (">=2.18.1,<2.18.3")
    mismatch: tuple[str, ...]  # two components whose versions must be equal
    fixed_in: str
    category: str
    confidence: float
    remediation: str
    sources: tuple[str, ...]
    symptom: Symptom
    tests: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def rule_id(self) -> str:
        """The catalogue rule a finding of this entry is reported under (one per verdict category)."""
        return "known-issue-" + self.category.replace("_", "-")

    def affected_text(self) -> str:
        parts = [f"{LABELS[c]} {spec.replace(',', ', ')}" for c, spec in self.affected.items()]
        if self.mismatch:
            parts.append(f"{LABELS[self.mismatch[0]]} != {LABELS[self.mismatch[1]]}")
        return "; ".join(parts)


# --- versions -----------------------------------------------------------------------------------


def version_key(version: str) -> str | None:
    """`2.18.1+cuda12.1` -> `000002.000018.000001.000000`: numeric order as string order."""
    match = re.search(r"\d+(?:\.\d+){0,3}", version)
    if match is None:
        return None
    parts = [p.zfill(_KEY_WIDTH)[-_KEY_WIDTH:] for p in match.group().split(".")]
    return (".".join(parts) + _PAD)[:_KEY_LEN]


def version_key_expr(column: pl.Expr) -> pl.Expr:
    """The polars form of `version_key` over a column of version strings."""
    parts = column.str.extract(r"(\d+(?:\.\d+){0,3})").str.split(".")
    padded = parts.list.eval(pl.element().str.zfill(_KEY_WIDTH).str.slice(-_KEY_WIDTH)).list.join(".")
    return (padded + pl.lit(_PAD)).str.slice(0, _KEY_LEN)


def parse_range(spec: str) -> tuple[str | None, bool, str | None, bool]:
    """`>=2.18.1,<2.18.3` -> (low key, low inclusive, high key, high inclusive); ValueError if bad."""
    low = high = None
    low_incl = high_incl = False
    for part in spec.split(","):
        match = _RANGE.match(part)
        if match is None:
            raise ValueError(f"version range part {part!r} is not one of >=, >, <=, <, == followed by a version")
        op, key = match.group(1), version_key(match.group(2))
        if op in (">=", ">", "=="):
            low, low_incl = key, op != ">"
        if op in ("<=", "<", "=="):
            high, high_incl = key, op != "<"
    if low is not None and high is not None and (low > high or (low == high and not (low_incl and high_incl))):
        raise ValueError(f"version range {spec!r} is empty")
    return low, low_incl, high, high_incl


# --- loading ------------------------------------------------------------------------------------


def _fail(path: Path, entry: str, problem: str) -> KnownIssueError:
    return KnownIssueError(f"{path.name}: {entry}: {problem}")


def _entry(path: Path, doc: dict, signatures: dict) -> KnownIssue:
    name = str(doc.get("id", "?"))
    unknown = set(doc) - _ENTRY_KEYS
    if unknown:
        raise _fail(path, name, f"unknown keys {sorted(unknown)}")
    for key in ("id", "component", "title", "fixed_in", "category", "remediation", "sources", "symptom", "tests"):
        if key not in doc:
            raise _fail(path, name, f"missing required key {key!r}")
    if not _ID.match(name):
        raise _fail(path, name, "id must be lower-case letters, digits, '.' and '-'")
    if doc["component"] not in COMPONENTS and doc["component"] != "compatibility":
        raise _fail(path, name, f"component {doc['component']!r} is not one of {sorted(COMPONENTS)} or 'compatibility'")
    if doc["category"] not in CATEGORIES or doc["category"] == "none":
        raise _fail(path, name, f"category {doc['category']!r} is not a verdict category")
    affected = dict(doc.get("affected", {}))
    mismatch = tuple(doc.get("mismatch", ()))
    if not affected and not mismatch:
        raise _fail(path, name, "needs `affected` version ranges or a `mismatch` pair")
    if mismatch and (len(mismatch) != 2 or not set(mismatch) <= set(COMPONENTS)):
        raise _fail(path, name, "mismatch must name two components")
    for component, spec in affected.items():
        if component not in COMPONENTS:
            raise _fail(path, name, f"affected component {component!r} is unknown")
        try:
            parse_range(spec)
        except ValueError as exc:
            raise _fail(path, name, str(exc)) from exc
    if version_key(str(doc["fixed_in"])) is None and doc["fixed_in"] != "none":
        raise _fail(path, name, "fixed_in must be a version (or 'none' for a compatibility rule)")
    sources = tuple(doc["sources"])
    if not sources or not all(s.startswith("https://") for s in sources):
        raise _fail(path, name, "sources must be a non-empty list of https:// links")
    symptom = _symptom(path, name, doc["symptom"], signatures)
    tests = dict(doc["tests"])
    if set(tests) - _TEST_KEYS or "affected" not in tests or "fixed" not in tests:
        raise _fail(path, name, "[tests] needs `affected` and `fixed` stacks (and optional `lines`)")
    for stack in (tests["affected"], tests["fixed"]):
        if not set(stack) <= set(COMPONENTS):
            raise _fail(path, name, f"test stack names an unknown component: {sorted(set(stack) - set(COMPONENTS))}")
    confidence = float(doc.get("confidence", 0.85))
    if not 0.0 < confidence <= 1.0:
        raise _fail(path, name, "confidence must be in (0, 1]")
    return KnownIssue(
        id=name, component=doc["component"], title=" ".join(doc["title"].split()), affected=affected, mismatch=mismatch,
        fixed_in=str(doc["fixed_in"]), category=doc["category"], confidence=confidence,
        remediation=" ".join(doc["remediation"].split()), sources=sources, symptom=symptom, tests=tests, path=path,
    )


def _symptom(path: Path, name: str, doc: dict, signatures: dict) -> Symptom:
    unknown = set(doc) - _SYMPTOM_KEYS
    if unknown:
        raise _fail(path, name, f"unknown [symptom] keys {sorted(unknown)}")
    symptom = Symptom(tuple(doc.get("signatures", ())), tuple(doc.get("patterns", ())), tuple(doc.get("context", ())))
    if not symptom.signatures and not symptom.patterns:
        raise _fail(path, name, "the symptom needs signatures or patterns")
    for rule_id in symptom.signatures:
        rule = signatures.get(rule_id)
        if rule is None:
            raise _fail(path, name, f"symptom signature {rule_id!r} is not in rules/")
        if rule.analysis is not None:
            raise _fail(path, name, f"symptom signature {rule_id!r} is an analysis, not a line pattern")
    generic = all(signatures[r].role == "symptom" or signatures[r].fallback for r in symptom.signatures)
    if generic and not symptom.patterns and not symptom.context:
        raise _fail(path, name, "a symptom made only of generic signatures (timeouts) needs `context` patterns")
    probe = pl.Series([""], dtype=pl.String)
    for pattern in (*symptom.patterns, *symptom.context):
        try:
            probe.str.contains(pattern)
        except Exception as exc:  # noqa: BLE001 - polars raises ComputeError for bad regexes
            raise _fail(path, name, f"pattern {pattern!r} does not compile: {exc}") from exc
    return symptom


@cache
def load(directory: str | None = None) -> tuple[KnownIssue, ...]:
    """Every entry of the table, validated; ids unique across files."""
    root = Path(directory) if directory else data_dir("known_issues")
    signatures = {rule.id: rule for rule in catalogue()}
    issues: list[KnownIssue] = []
    for path in sorted(root.glob("*.toml")):
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise KnownIssueError(f"{path.name}: not valid TOML: {exc}") from exc
        if set(doc) - {"issue"}:
            raise KnownIssueError(f"{path.name}: only [[issue]] tables are allowed, found {sorted(set(doc) - {'issue'})}")
        issues.extend(_entry(path, entry, signatures) for entry in doc.get("issue", []))
    ids = [issue.id for issue in issues]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise KnownIssueError(f"duplicate known-issue ids: {duplicates}")
    return tuple(issues)


def by_id() -> dict[str, KnownIssue]:
    return {issue.id: issue for issue in load()}


# --- matching -----------------------------------------------------------------------------------

VERSIONS_SCHEMA = {"host": pl.String, "component": pl.String, "version": pl.String, "event_ids": pl.List(pl.Int64)}


def _conditions(issues: tuple[KnownIssue, ...]) -> pl.DataFrame:
    rows = []
    for issue in issues:
        for component, spec in issue.affected.items():
            low, low_incl, high, high_incl = parse_range(spec)
            rows.append({"issue_id": issue.id, "component": component, "low": low, "low_incl": low_incl,
                         "high": high, "high_incl": high_incl, "needed": len(issue.affected)})
    schema = {"issue_id": pl.String, "component": pl.String, "low": pl.String, "low_incl": pl.Boolean,
              "high": pl.String, "high_incl": pl.Boolean, "needed": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def affected(versions: pl.DataFrame, issues: tuple[KnownIssue, ...] | None = None) -> pl.DataFrame:
    """(host, issue_id, versions, event_ids): the entries whose every condition holds on a host.
    `versions` is a frame of VERSIONS_SCHEMA; `versions` of the result reads `NCCL 2.18.1; ...`."""
    issues = load() if issues is None else issues
    schema = {"host": pl.String, "issue_id": pl.String, "versions": pl.String, "event_ids": pl.List(pl.Int64)}
    if versions.height == 0 or not issues:
        return pl.DataFrame(schema=schema)
    keyed = versions.with_columns(version_key_expr(pl.col("version")).alias("key")).filter(pl.col("key").is_not_null())
    key = pl.col("key")
    in_range = (
        (pl.col("low").is_null() | (key > pl.col("low")) | (pl.col("low_incl") & (key == pl.col("low"))))
        & (pl.col("high").is_null() | (key < pl.col("high")) | (pl.col("high_incl") & (key == pl.col("high"))))
    )
    label = pl.col("component").replace_strict(LABELS, default=pl.col("component"))
    ranged = (
        keyed.join(_conditions(issues), on="component", how="inner")
        .filter(in_range)
        .group_by("host", "issue_id")
        .agg(
            pl.col("component").n_unique().alias("held"), pl.col("needed").first(),
            (label + pl.lit(" ") + pl.col("version")).sort().str.join("; ").alias("versions"),
            pl.col("event_ids").list.explode(keep_nulls=False, empty_as_null=False).unique().sort().alias("event_ids"),
        )
        .filter(pl.col("held") == pl.col("needed"))
        .select(list(schema))
    )
    return pl.concat([ranged, _mismatches(keyed, issues)], how="vertical").sort("host", "issue_id")


def _mismatches(keyed: pl.DataFrame, issues: tuple[KnownIssue, ...]) -> pl.DataFrame:
    """Entries with a `mismatch` pair: both versions known on the host and not equal."""
    frames = []
    for issue in (i for i in issues if i.mismatch):  # a handful of compatibility entries, not log rows
        first, second = issue.mismatch
        left = keyed.filter(pl.col("component") == first).select("host", pl.col("version").alias("a"), pl.col("key").alias("ka"), pl.col("event_ids").alias("ea"))
        right = keyed.filter(pl.col("component") == second).select("host", pl.col("version").alias("b"), pl.col("key").alias("kb"), pl.col("event_ids").alias("eb"))
        frames.append(
            left.join(right, on="host", how="inner")
            .filter(pl.col("ka") != pl.col("kb"))
            .select(
                "host", pl.lit(issue.id).alias("issue_id"),
                (pl.lit(f"{LABELS[first]} ") + pl.col("a") + pl.lit(f"; {LABELS[second]} ") + pl.col("b")).alias("versions"),
                pl.concat_list("ea", "eb").list.unique().list.sort().alias("event_ids"),
            )
        )
    schema = {"host": pl.String, "issue_id": pl.String, "versions": pl.String, "event_ids": pl.List(pl.Int64)}
    return pl.concat(frames, how="vertical").unique(["host", "issue_id"]) if frames else pl.DataFrame(schema=schema)


def stack_versions(stack: dict[str, str], host: str = "stack") -> pl.DataFrame:
    """A stack given by hand ({component: version}) as a versions frame of one host."""
    rows = [{"host": host, "component": c, "version": v, "event_ids": []} for c, v in stack.items() if v]
    return pl.DataFrame(rows, schema=VERSIONS_SCHEMA)


def host_versions(events: pl.DataFrame, facts: HostFacts) -> pl.DataFrame:
    """(host, component, version, event_ids) of a job, from the host facts; lines whose host no
    source names count as one host, NO_HOST (a pasted log often names none)."""
    named = facts.hosts.select("host", "fact", "value", "event_ids")
    hostless = events.filter(pl.col("host").is_null())
    frames = [named]
    if hostless.height:
        unnamed = host_facts(unit_facts(observations(hostless.with_columns(pl.lit(NO_HOST).alias("host")))))
        frames.append(unnamed.select("host", "fact", "value", "event_ids"))
    facts = pl.concat(frames, how="vertical").filter(pl.col("fact").is_in(list(FACT_COMPONENT)))
    return (
        facts.with_columns(pl.col("value").str.split(" | "))
        .explode("value")
        .select(
            "host", pl.col("fact").replace_strict(FACT_COMPONENT).alias("component"),
            pl.col("value").alias("version"), pl.col("event_ids").cast(pl.List(pl.Int64)),
        )
        .filter(pl.col("version").is_not_null())
    )


def host_notes(events: pl.DataFrame, facts: HostFacts) -> pl.DataFrame:
    """(host, issue_id, component, versions, fixed_in, title, facts): every entry a host's versions
    fall in, symptom or not: the report's info-level note and the facts table's marks."""
    hits = affected(host_versions(events, facts))
    if hits.height == 0:
        return hits.select("host", "issue_id", "versions")
    issues = by_id()
    meta = pl.DataFrame(
        {
            "issue_id": list(issues),
            "fixed_in": [i.fixed_in for i in issues.values()],
            "title": [i.title for i in issues.values()],
            "facts": [sorted(COMPONENTS[c] for c in (*i.affected, *i.mismatch)) for i in issues.values()],
        }
    )
    return hits.join(meta, on="issue_id", how="left").drop("event_ids")


# --- the README table ---------------------------------------------------------------------------


def markdown_table(issues: tuple[KnownIssue, ...] | None = None) -> str:
    """One row per entry, in file order: the README's known-issues table."""
    issues = load() if issues is None else issues
    lines = ["| id | affects | fixed in | category | symptom | source |", "|---|---|---|---|---|---|"]
    for issue in issues:
        symptom = ", ".join([f"`{s}`" for s in issue.symptom.signatures] + (["line pattern"] if issue.symptom.patterns else []))
        sources = " ".join(f"[{n}]({url})" for n, url in enumerate(issue.sources, 1))
        cell = issue.affected_text().replace("|", "\\|")
        lines.append(f"| `{issue.id}` | {cell} | {issue.fixed_in} | {issue.category} | {symptom} | {sources} |")
    return "\n".join(lines) + "\n"

def notes_by_host(events: pl.DataFrame, facts: HostFacts) -> dict[str, list[dict]]:
    """Per host, the known-issue entries its versions fall in (the report's info-level note; a
    symptom that shows makes the entry a finding in detect). A lookup of versions in the table
    (`host_notes`), not a judgement of the run; the report's host facts carry them."""
    notes: dict[str, list[dict]] = {}
    for row in host_notes(events, facts).iter_rows(named=True):  # one row per (host, affected entry)
        notes.setdefault(row["host"], []).append(
            {"id": row["issue_id"], "versions": row["versions"], "fixed_in": row["fixed_in"], "title": row["title"],
             "facts": row["facts"], "severity": "info"}
        )
    return notes


def main(argv: list[str]) -> int:
    if argv != ["--markdown"]:
        print("usage: python -m analyzer.knownissues --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
