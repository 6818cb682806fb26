"""Detect (checkpoint audit): can this job resume from its checkpoints, and will it resume exactly?

`checkpoint_audit` reads the table of `analyzer.facts.checkpoint_audit.audit_job` (the checkpoints among
what discovery listed of the job and at --checkpoint paths) and emits one finding per
kind of trouble, each naming the checkpoints concerned and the newest one to resume from:

- `checkpoint-file-corrupt`: unreadable, truncated, bad CRC, empty;
- `checkpoint-shards-missing`: a sharded checkpoint lacks shards or metadata (ranks named for DCP);
- `checkpoint-unsafe-pickle`: a pickle names code; refused, nothing ran;
- `checkpoint-save-interrupted`: leftovers of a save under a temporary name;
- `checkpoint-resume-inexact`: the checkpoint to resume from lacks RNG / sampler / optimizer state;
- `checkpoint-broken-by-disk-error`: instead of the first two and leftovers when the logs report a
  failed write (the events the `disk-full-or-io-error` signature matches): the broken checkpoint
  is then a symptom of that disk error, which decide ranks as the cause.

Evidence is what the logs say about the same checkpoints: lines naming them, the failed load the
`checkpoint-unreadable` signature matches (for broken files and missing shards), the disk errors
(for the link). The files themselves are described in the summary and in the report's table.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame
from analyzer.rules import rules_by_id

RULE_CORRUPT = "checkpoint-file-corrupt"
RULE_SHARDS = "checkpoint-shards-missing"
RULE_UNSAFE = "checkpoint-unsafe-pickle"
RULE_INTERRUPTED = "checkpoint-save-interrupted"
RULE_INEXACT = "checkpoint-resume-inexact"
RULE_DISK = "checkpoint-broken-by-disk-error"
DISK_RULE = "disk-full-or-io-error"  # the pattern signature whose events explain a broken save
LOAD_FAILURE_RULE = "checkpoint-unreadable"  # the pattern signature of a failed load in the logs

_RULE_OF_PROBLEM = {"corrupt": RULE_CORRUPT, "shards_missing": RULE_SHARDS, "unsafe": RULE_UNSAFE,
                    "interrupted": RULE_INTERRUPTED}
_LINKED_TO_DISK = ("corrupt", "shards_missing", "interrupted")
MAX_NAMED = 3
MAX_EVIDENCE = 50
# A log line naming a checkpoint counts as evidence only for names specific enough to mean it.
_MIN_NAME_LENGTH = 6


@register("checkpoint_audit")
def checkpoint_audit(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    table = job.checkpoints
    if table is None or table.height == 0:
        return findings_frame([])
    disk_events = _disk_error_events(events)
    resume = _resume_advice(table)
    rows = []
    broken = table.filter(pl.col("problem").is_not_null())
    linked = broken.filter(pl.col("problem").is_in(_LINKED_TO_DISK)) if disk_events.height else broken.clear()
    if linked.height:
        rows.append(_disk_finding(linked, disk_events, events, resume))
    for problem, rule_id in _RULE_OF_PROBLEM.items():
        if linked.height and problem in _LINKED_TO_DISK:
            continue
        subset = broken.filter(pl.col("problem") == problem)
        if subset.height:
            rows.append(_problem_finding(rule_id, subset, events, job, resume, table))
    inexact = table.filter(pl.col("newest_resumable") & ~pl.col("exact_resume"))
    if inexact.height:
        exact = table.filter(pl.col("exact_resume")).head(1).to_dicts()  # the table is newest first
        rows.append(_inexact_finding(inexact.row(0, named=True), exact[0] if exact else None))
    return findings_frame(rows)


def _confidence(rule_id: str, default: float) -> float:
    rule = rules_by_id().get(rule_id)
    return rule.confidence if rule else default


def _label(row: dict) -> str:
    step = f" (step {row['step']})" if row["step"] is not None else ""
    return f"{row['path']}{step}"


def _resume_advice(table: pl.DataFrame) -> str:
    newest = table.filter(pl.col("newest_resumable"))
    if newest.height == 0:
        return "No complete, readable checkpoint with model weights is left to resume from"
    row = newest.row(0, named=True)
    exact = "" if row["exact_resume"] else f" (lacks {', '.join(row['missing_components'])})"
    return f"Resume from {_label(row)}, the newest complete and readable checkpoint{exact}"


def _named(subset: pl.DataFrame) -> str:
    rows = subset.head(MAX_NAMED).to_dicts()
    text = "; ".join(f"{_label(r)}: {r['reason']}" for r in rows)
    if subset.height > MAX_NAMED:
        text += f"; and {subset.height - MAX_NAMED} more"
    return text


def _mentions(events: pl.DataFrame, subset: pl.DataFrame) -> list[int]:
    """Log lines that name one of these checkpoints (a failed load, the save that was cut)."""
    if events.height == 0:
        return []
    names = sorted({PurePosixPath(p).name for p in subset.get_column("path").to_list()})
    hit = _names_any(pl.col("message").fill_null(""), names)
    return _one_per_line(events.filter(hit))


def _one_per_line(hits: pl.DataFrame) -> list[int]:
    """Evidence event ids, one per (file, line): a line can be several events (its record, its exception)."""
    return hits.unique(subset=["file", "line"], keep="first", maintain_order=True).get_column("event_id") \
        .head(MAX_EVIDENCE).to_list()


def _names_any(text: pl.Expr, names: list[str]) -> pl.Expr:
    specific = [n for n in names if len(n) >= _MIN_NAME_LENGTH]
    return pl.any_horizontal([text.str.contains(n, literal=True) for n in specific]) if specific else pl.lit(False)


def _disk_error_events(events: pl.DataFrame) -> pl.DataFrame:
    return _signature_events(events, DISK_RULE)


def _signature_events(events: pl.DataFrame, rule_id: str) -> pl.DataFrame:
    """The events a pattern signature matches (the same expression detect evaluates)."""
    rule = rules_by_id().get(rule_id)
    if rule is None or rule.analysis is not None or events.height == 0:
        return events.clear()
    return events.filter(rule.expression())


def _problem_finding(rule_id: str, subset: pl.DataFrame, events: pl.DataFrame, job: JobContext, resume: str,
                     table: pl.DataFrame) -> dict:
    ranks = sorted({r for rs in subset.get_column("missing_ranks").to_list() for r in rs})
    hosts = [job.rank_hosts[r] for r in ranks if r in job.rank_hosts]
    summary = _named(subset)
    if rule_id == RULE_UNSAFE:
        summary += ". Nothing was loaded or executed; do not load it with weights_only=False"
    elif rule_id == RULE_INTERRUPTED:
        newest = table.filter(pl.col("newest_resumable"))
        newer = newest.height and subset.filter(
            pl.col("mtime") > newest.get_column("mtime")[0]).height
        if newer:
            summary += ". The interrupted save is newer than the newest complete checkpoint"
    evidence = _mentions(events, subset)
    if rule_id in (RULE_CORRUPT, RULE_SHARDS):
        # The log's own failed load ("failed finding central directory", "zero checkpoints paths are
        # missing") is this broken checkpoint seen from the training script.
        failed_loads = _signature_events(events, LOAD_FAILURE_RULE).get_column("event_id").to_list()
        evidence = _one_per_line(events.filter(pl.col("event_id").is_in(sorted({*evidence, *failed_loads}))))
    return finding(
        rule_id,
        ranks=ranks,
        hosts=hosts,
        confidence=_confidence(rule_id, 0.9),
        summary=f"{summary}. {resume}",
        evidence=evidence,
    )


def _disk_finding(linked: pl.DataFrame, disk_events: pl.DataFrame, events: pl.DataFrame, resume: str) -> dict:
    first = disk_events.row(0, named=True)
    names = [PurePosixPath(p).name for p in linked.get_column("path").to_list()]
    # The failed write names the checkpoint or is a torch save: the link is direct, not a coincidence.
    message = pl.col("message").fill_null("")
    direct = disk_events.filter(
        _names_any(message, names) | message.str.contains(r"PytorchStreamWriter|save|checkpoint|ckpt")
    ).height
    base = _confidence(RULE_DISK, 0.85)
    cited = set(disk_events.get_column("event_id").to_list()) | set(_mentions(events, linked))
    evidence = _one_per_line(events.filter(pl.col("event_id").is_in(sorted(cited))))
    return finding(
        RULE_DISK,
        confidence=base if direct else base * 0.8,
        summary=f"{_named(linked)}. The logs report a failed write ({first['file']}:{first['line']}: "
                f"{(first['message'] or '')[:160]}): the save was cut by the disk. {resume}",
        evidence=evidence,
    )


def _inexact_finding(row: dict, exact: dict | None) -> dict:
    missing = row["missing_components"]
    effects = []
    if any(m.startswith("rng_") for m in missing):
        effects.append("random streams differ")
    if "data_position" in missing:
        effects.append("the data order restarts")
    if "optimizer" in missing or "lr_scheduler" in missing:
        effects.append("the optimizer / LR schedule restart")
    if "step" in missing:
        effects.append("the step count is unknown")
    alternative = f". {_label(exact)} is older but holds every component" if exact else ""
    return finding(
        RULE_INEXACT,
        confidence=_confidence(RULE_INEXACT, 0.9),
        summary=f"{_label(row)}, the newest complete and readable checkpoint, lacks {', '.join(missing)}: the run "
                f"resumes but not exactly where it stopped ({'; '.join(effects) or 'state differs'}; expect a jump "
                f"in the loss){alternative}",
    )
