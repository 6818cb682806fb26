"""The finding frame: what detect produces and decide ranks.

A finding names a catalogue rule (whose file gives title, category, severity and remediation),
the ranks and hosts it implicates, a confidence, a one-line summary with the specifics, and the
`event_id`s of its evidence in the job's event frame. Named analyses return frames of this shape.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import polars as pl

FINDING_SCHEMA: dict[str, pl.DataType] = {
    "rule_id": pl.String,
    "ranks": pl.List(pl.Int64),
    "hosts": pl.List(pl.String),
    "confidence": pl.Float64,
    "summary": pl.String,
    "evidence": pl.List(pl.Int64),  # event_id values
    "first_event": pl.Int64,  # earliest evidence event_id, for ordering
}


def empty_findings() -> pl.DataFrame:
    return pl.DataFrame(schema=FINDING_SCHEMA)


def finding(
    rule_id: str,
    *,
    ranks: Iterable[int] = (),
    hosts: Iterable[str] = (),
    confidence: float,
    summary: str,
    evidence: Sequence[int] = (),
) -> dict:
    evidence = sorted({int(e) for e in evidence})
    return {
        "rule_id": rule_id,
        "ranks": sorted({int(r) for r in ranks}),
        "hosts": sorted({str(h) for h in hosts}),
        "confidence": round(float(min(max(confidence, 0.0), 1.0)), 3),
        "summary": summary,
        "evidence": evidence,
        "first_event": evidence[0] if evidence else None,
    }


def findings_frame(rows: Iterable[dict]) -> pl.DataFrame:
    rows = list(rows)
    if not rows:
        return empty_findings()
    return pl.DataFrame(rows, schema=FINDING_SCHEMA)


def concat_findings(frames: Iterable[pl.DataFrame]) -> pl.DataFrame:
    frames = [f for f in frames if f.height]
    return pl.concat(frames, how="vertical") if frames else empty_findings()
