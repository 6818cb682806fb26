"""Stage 6, render: the collective table (`postmortem collectives`) as plain text or JSON.

Plain fixed-width text, so it survives `| less` and `| grep`; the rows shown are bounded (a window
of sequence numbers x a bounded set of rank columns), whatever the size of the job.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses.collectives import MISMATCH, shown_ranks

CELL_WIDTH = 32
NOT_HELD = "."  # the rank's ring buffer no longer holds this seq (or it never reported it)
NEVER_CALLED = "-- never called --"
STATE_WORDS = {"completed": "done", "scheduled": "queued", "started": "running", "timeout": "TIMED OUT"}


def collective_document(table: pl.DataFrame, found: pl.DataFrame, *, last: int, rank_limit: int) -> dict:
    """The view as data: per process group the ranks shown, the first divergence, and the rows."""
    groups = []
    for pg in sorted(set(table["pg"].to_list())):
        rows = table.filter(pl.col("pg") == pg)
        diverged = found.filter(pl.col("pg") == pg)
        ranks = shown_ranks(rows, diverged, rank_limit)
        seqs = _window(sorted(set(rows["seq"].to_list())), diverged, last)
        cells = {(r["seq"], r["rank"]): r for r in rows.filter(pl.col("seq").is_in(seqs) & pl.col("rank").is_in(ranks)).to_dicts()}
        marks = {(d["seq"]): d for d in diverged.filter(pl.col("seq").is_in(seqs)).to_dicts()}
        first = diverged.filter(pl.col("first")).to_dicts()
        groups.append({
            "pg": pg,
            "ranks": ranks,
            "ranks_total": rows["rank"].n_unique(),
            "first_divergence": first[0] if first else None,
            "divergences": diverged.to_dicts(),
            "rows": [
                {"seq": seq, "divergence": marks.get(seq, {}).get("kind"),
                 "cells": {str(rank): _cell_record(cells.get((seq, rank)), seq, rank, diverged) for rank in ranks}}
                for seq in seqs
            ],
        })
    return {"process_groups": groups}


def render_collectives_text(document: dict) -> str:
    out: list[str] = []
    for group in document["process_groups"]:
        ranks = group["ranks"]
        hidden = group["ranks_total"] - len(ranks)
        out.append(f"process group {group['pg']}: {group['ranks_total']} rank(s)"
                   + (f", {len(ranks)} shown (--ranks to choose)" if hidden else ""))
        out.append(_first_divergence_line(group["first_divergence"]))
        out.append("    " + f"{'seq':>6}  " + "  ".join(f"{'rank ' + str(r):<{CELL_WIDTH}}" for r in ranks))
        for row in group["rows"]:
            mark = ">>" if group["first_divergence"] and row["seq"] == group["first_divergence"]["seq"] else (
                "! " if row["divergence"] else "  ")
            cells = "  ".join(f"{_cell_text(row['cells'][str(r)]):<{CELL_WIDTH}}" for r in ranks)
            out.append(f"  {mark}{row['seq']:>6}  {cells.rstrip()}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _first_divergence_line(first: dict | None) -> str:
    if first is None:
        return "  no divergence: every rank shown called the same collectives"
    who = ",".join(map(str, first["ranks"]))
    if first["kind"] != MISMATCH:
        return f"  first divergence at #{first['seq']}: rank(s) {who} never called it"
    if first["tied"]:
        return f"  first divergence at #{first['seq']}: ranks {who} call different collectives (no majority)"
    return f"  first divergence at #{first['seq']}: rank(s) {who} called something else than the others"


def _window(seqs: list[int], diverged: pl.DataFrame, last: int) -> list[int]:
    """The last `last` seqs, or, when the ranks diverge, a window opening just before the first divergence."""
    if diverged.height:
        first = diverged["seq"].min()
        before = [s for s in seqs if s < first][-3:]
        return (before + [s for s in seqs if s >= first])[:last]
    return seqs[-last:]


def _cell_record(cell: dict | None, seq: int, rank: int, diverged: pl.DataFrame) -> dict | None:
    if cell is not None:
        return {k: cell[k] for k in ("op", "numel_in", "numel_out", "dtype", "state", "src")}
    missing = diverged.filter((pl.col("seq") == seq) & (pl.col("kind") != MISMATCH) & pl.col("ranks").list.contains(rank))
    return {"never_called": True} if missing.height else None


def _cell_text(cell: dict | None) -> str:
    if cell is None:
        return NOT_HELD
    if cell.get("never_called"):
        return NEVER_CALLED
    size = "" if cell["numel_in"] is None else f" n={cell['numel_in']}"
    dtype = f" {cell['dtype']}" if cell["dtype"] else ""
    text = f"{cell['op']}{size}{dtype} {STATE_WORDS.get(cell['state'], cell['state'] or '')}".strip()
    return text if len(text) <= CELL_WIDTH else text[: CELL_WIDTH - 1] + "~"
