"""Stage 3, facts: what the job is, derived once from parse's events and handed to detect.

`correlate` merges the events of every input into one job (ranks, hosts, world size, time span,
conflicts) and builds the `JobContext` detect reads; `hostfacts` the per-host facts (versions,
plugins, environment, GPUs) with the cells that differ; `gpus` the physical GPU of each rank;
`checkpoint_audit` the table of the job's checkpoints. Each is computed here, once, and travels in
the context: no analysis and no renderer computes a fact again.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from analyzer.exits import INPUT_ERRORS
from analyzer.facts.checkpoint_audit import audit_job
from analyzer.facts.correlate import JobContext, JobFacts, correlate
from analyzer.facts.hostfacts import derive_host_facts
from analyzer.io import Listing

__all__ = ["JobContext", "JobFacts", "correlate", "job_context"]


def job_context(events: pl.DataFrame, facts: JobFacts, listing: Listing = Listing(),
                checkpoint_paths: tuple[str, ...] = ()) -> JobContext:
    """What detect is handed: correlate's job facts, the per-host facts and the checkpoint audit
    (of discovery's `listing` and the --checkpoint paths), each derived here once. An audit that
    cannot read its files costs only the audit: the reason travels in `checkpoint_problem` and the
    report lists it."""
    context = facts.context(events, checkpoint_paths=checkpoint_paths, host_facts=derive_host_facts(events))
    try:
        return replace(context, checkpoints=audit_job(events, context, listing))
    except INPUT_ERRORS as exc:
        return replace(context, checkpoint_problem=f"checkpoint audit failed: {type(exc).__name__}: {exc}")
