"""Stage 6, report: the typed report model, from which the JSON document and its JSON Schema come.

The report is built as these frozen dataclasses (analyzer/api.py assembles them from the decided
findings and the job facts); `document(report)` is the JSON document (`Analysis.report`, what
`--format json` writes, what the renderers read), and `analyzer.report_schema.json_schema()` is its
JSON Schema, committed as `schema/report.schema.json` (`python -m analyzer.report_schema`
writes it; a test fails when the committed file is not current). One definition of every key,
so the document and the schema cannot drift.

A field's `Meta` (in `Annotated[...]`) says what the schema says beside its type: a description,
bounds, the minor version that added the key (`since`: optional to readers of older documents),
and how the document writes it (`omit_none`: left out when None; `flatten`: a dict whose items are
keys of the enclosing object). Field order is key order. Lists are values built once and never
changed after; the dataclasses are frozen so nothing downstream reassigns a key.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from functools import cache
from types import UnionType
from typing import Annotated, Literal, Union, get_args, get_origin, get_type_hints

from analyzer.severities import Severity

SCHEMA_VERSION = "1.3"  # 1.1: optional job.host_facts and checkpoints; 1.2: inputs[].capped;
# 1.3: job.world_size_source/_stated, job.time_span, job.facts_conflicts, verdict.culprit_gpus
SCHEMA_ID = f"https://postmortem.local/schema/report-{SCHEMA_VERSION}.json"


@dataclass(frozen=True)
class Meta:
    description: str = ""
    since: str | None = None  # minor version that added the key: not required (older documents lack it)
    required: bool = True
    minimum: float | None = None
    maximum: float | None = None
    pattern: str | None = None
    omit_none: bool = False
    flatten: bool = False


@dataclass(frozen=True)
class Enum:
    """A string whose values are listed in `$defs/<name>` (read from data when the schema is made)."""

    name: str


Category = Annotated[str, Enum("category")]
Component = Annotated[str, Enum("checkpoint_component")]
Count = Annotated[int, Meta(minimum=0)]
Confidence = Annotated[float, Meta(minimum=0, maximum=1)]
OPTIONAL = Meta(required=False)
Fact = Annotated[str | None, OPTIONAL]


def shared(name: str):
    """Mark a dataclass as a `$defs` entry referenced where used (several places share it)."""

    def mark(cls):
        cls.__schema_def__ = name
        return cls

    return mark


# --- evidence, findings, verdict ----------------------------------------------------------------


@shared("evidence")
@dataclass(frozen=True)
class Evidence:
    file: str
    line: Count
    rank: int | None
    text: str


@dataclass(frozen=True)
class Finding:
    rule_id: str
    category: Category
    severity: Severity
    title: str
    summary: str
    ranks: list[int]
    hosts: list[str]
    confidence: Confidence
    caused_by: list[str]
    evidence: list[Evidence]
    remediation: str


@dataclass(frozen=True)
class CulpritGpu:
    host: str | None
    gpu: str | None
    bus_id: Annotated[str | None, Meta("dddd:bb:dd.f (nccl-tests: dddd:bb:dd)")]
    uuid: str | None
    logical_device: int | None
    rank: int | None
    source: str


@dataclass(frozen=True)
class Verdict:
    category: Category
    title: str
    summary: str
    culprit_ranks: list[int]
    culprit_hosts: list[str]
    confidence: Confidence
    rule_id: str | None
    evidence: list[Evidence]
    culprit_gpus: Annotated[list[CulpritGpu], Meta(
        "the culprits' physical GPUs: each culprit rank's device (without culprit ranks: the devices on the verdict's"
        " evidence lines from a culprit host). `gpu` is the physical index where known (NCCL nvmlDev, CUDA_VISIBLE_DEVICES,"
        " nvidia-smi), else the PCI bus id; `source` says which lines identified it, or is `logical only` when only the"
        " process's own device index is known (`gpu` null).", since="1.3")]


# --- job facts --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeSpan:
    start: str
    end: str
    start_source: str
    end_source: str
    files_timed: Count
    files_untimed: Count


@dataclass(frozen=True)
class RankFacts:
    """One process of a host whose facts disagree with the host's other processes."""

    rank: int | None
    pid: int | None
    facts: Annotated[dict[str, str | None], Meta(flatten=True)]
    env: Annotated[dict[str, str] | None, Meta(required=False, omit_none=True)] = None


@dataclass(frozen=True)
class KnownIssueNote:
    id: str
    versions: str
    fixed_in: str
    title: str
    facts: list[str]
    severity: Severity


@dataclass(frozen=True)
class HostFacts:
    host: str
    ranks: list[int]
    addresses: list[str]
    nccl_version: Fact
    nccl_build: Fact
    net_plugin: Fact
    network: Fact
    nics: Fact
    transports: Fact
    cuda_driver: Fact
    driver_version: Fact
    torch_version: Fact
    cuda_runtime: Fact
    cudnn_version: Fact
    fabric_manager: Fact
    aws_ofi_nccl: Fact
    deepspeed_version: Fact
    gpu_model: Fact
    gpu_memory: Fact
    env: dict[str, str]
    duplicate_name: Annotated[bool, Meta(
        "processes under this host name report different addresses on one interface: several machines share the name")]
    differs: list[str]
    per_rank: list[RankFacts]
    known_issues: Annotated[list[KnownIssueNote], Meta(
        "known issues of the versions this host runs (an info-level note; a symptom that shows makes one a finding)",
        required=False)]


@dataclass(frozen=True)
class Job:
    path: str
    world_size: Annotated[int | None, Meta(minimum=1)]
    world_size_source: Annotated[str | None, Meta(
        "the line or event that states world_size (`NCCL comm init nranks 2 (console.log:25)`), or `inferred from the"
        " ranks seen ...` when no line states it (then world_size is a lower bound)", since="1.3")]
    world_size_stated: Annotated[bool, Meta(
        "a line or event states world_size (false: inferred from the ranks seen)", since="1.3")]
    time_span: Annotated[TimeSpan | None, Meta(
        "first and last timestamp over every timestamped event, with the line bounding each end and how its time was"
        " read (`file:line (ts_source)`); files none of whose events carry a time do not bound it. Null when no event"
        " has a time.", since="1.3")]
    facts_conflicts: Annotated[list[str], Meta(
        "job facts whose sources contradict each other (world size stated differently, a rank past the stated size),"
        " each naming the sources; such a fact is not shown as plain fact", since="1.3")]
    ranks: list[Count]
    hosts: list[str]
    outcome: Annotated[Literal["crash", "hang", "slow", "ok", "unknown"], Meta(
        "crash, hang, slow: from the verdict's category (schema/categories.toml). ok: no failure found and nothing was"
        " left unread. unknown: no failure found, but a cap left inputs unread (capped) or an input could not be read"
        " (status error), or no event was read; the verdict's summary names them. An analyzer fault (exit 3) and a job"
        " that cannot be analysed (exit 2, e.g. no training logs found) produce no document at all, so no outcome"
        " stands for them.")]
    host_facts: Annotated[list[HostFacts], Meta(
        "one record per host: what it ran on (null where no line said), its NCCL_*/TORCH_* variables, `differs` naming"
        " the cells that differ across hosts (fact names, `env.NAME`), `per_rank` the ranks of the host that disagree"
        " among themselves.", since="1.1")]


# --- inputs, checkpoints, the document ----------------------------------------------------------


@dataclass(frozen=True)
class InputRecord:
    file: str
    format: str
    ranks: list[int]
    lines: Count
    unparsed_lines: Count
    status: Literal["parsed", "partial", "skipped", "error"]
    reason: str
    capped: Annotated[bool, Meta(
        "a cap (file count, depth, member size, memory) left this input, or the inputs this row stands for, wholly or"
        " partly unread", since="1.2")]



@dataclass(frozen=True)
class Checkpoint:
    path: str
    format: str
    step: int | None
    epoch: Annotated[float | None, OPTIONAL]
    mtime: Annotated[str | None, OPTIONAL]
    size_bytes: Annotated[int | None, Meta(minimum=0, required=False)]
    readable: bool
    problem: Annotated[Literal["corrupt", "shards_missing", "unsafe", "interrupted"] | None, OPTIONAL]
    reason: str
    notes: Annotated[str, OPTIONAL]
    checked_with: Annotated[str, OPTIONAL]
    components: list[Component]
    missing_components: list[Component]
    shards_expected: Annotated[int | None, Meta(minimum=0)]
    shards_present: Annotated[int | None, Meta(minimum=0)]
    missing_shards: Annotated[list[str], OPTIONAL]
    missing_ranks: Annotated[list[int], OPTIONAL]
    unsafe_globals: Annotated[list[str], OPTIONAL]
    unknown_globals: Annotated[list[str], OPTIONAL]
    resumable: bool
    exact_resume: bool
    newest_resumable: bool


@dataclass(frozen=True)
class Report:
    schema_version: Annotated[str, Meta(pattern=r"^1\.[0-9]+$")]
    analyzer_version: Annotated[str, OPTIONAL]
    job: Job
    verdict: Verdict
    findings: list[Finding]
    inputs: list[InputRecord]
    problems: Annotated[list[str], OPTIONAL]
    checkpoints: Annotated[list[Checkpoint] | None, Meta(
        "every checkpoint found in or next to the job and at --checkpoint paths, newest first; at most one has"
        " newest_resumable true (absent when the audit could not run: `problems` says why).", since="1.1",
        omit_none=True)] = None


# --- the document: the model as JSON values, and back --------------------------------------------


def document(value: object) -> object:
    """The JSON value of a model object: dataclasses become objects with their keys in field order."""
    if is_dataclass(value):
        out: dict = {}
        for name, meta in field_meta(type(value)):
            item = getattr(value, name)
            if meta.omit_none and item is None:
                continue
            if meta.flatten:
                out.update({key: document(v) for key, v in item.items()})
            else:
                out[name] = document(item)
        return out
    if isinstance(value, (list, tuple)):
        return [document(v) for v in value]
    if isinstance(value, dict):
        return {key: document(v) for key, v in value.items()}
    return value


@cache
def hints(cls: type) -> dict[str, object]:
    """The fields' resolved types, Annotated metadata kept."""
    return get_type_hints(cls, include_extras=True)


def field_meta(cls: type) -> list[tuple[str, Meta]]:
    """Each field's name and Meta (the default Meta where its type carries none)."""
    return [(f.name, meta_of(hints(cls)[f.name])) for f in fields(cls)]


def meta_of(hint: object) -> Meta:
    return next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Meta)), Meta())


class ReportModelError(TypeError):
    """A record does not fit the model (a key it lacks or does not know): the stage that made it drifted."""


def from_record(cls: type, data: dict) -> object:
    """The model object of a JSON-shaped dict (records of the facts stage, or a whole document);
    a key outside the model is an error, not silently dropped (a flattened field takes the rest)."""
    names = {f.name for f in fields(cls)}
    flat = next((name for name, meta in field_meta(cls) if meta.flatten), None)
    unknown = set(data) - names
    if unknown and flat is None:
        raise ReportModelError(f"{cls.__name__}: keys outside the report model: {sorted(unknown)}")
    values = {name: _value(hints(cls)[name], data[name]) for name in names & set(data) if name != flat}
    if flat is not None:
        values[flat] = {key: data[key] for key in data if key not in names}
    try:
        return cls(**values)
    except TypeError as exc:  # a key the model requires is missing
        raise ReportModelError(f"{cls.__name__}: {exc}") from exc


def _value(hint: object, value: object) -> object:
    base = strip(hint)
    if value is None:
        return None
    if get_origin(base) in (Union, UnionType):
        base = strip(next(a for a in get_args(base) if a is not type(None)))
    if is_dataclass(base) and isinstance(value, dict):
        return from_record(base, value)
    if get_origin(base) is list:
        item = strip(get_args(base)[0])
        return [from_record(item, v) if is_dataclass(item) else v for v in value]
    return value


def strip(hint: object) -> object:
    """The type inside Annotated[...]."""
    return get_args(hint)[0] if get_origin(hint) is Annotated else hint

