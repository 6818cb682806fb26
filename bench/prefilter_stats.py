"""Which prefilter literals make a job's lines candidates, per line kind and vocabulary file.

    python bench/prefilter_stats.py JOB_DIR [--top 20]

The text prefilter (analyzer/parse/logtext.py) keeps a line for classification when it holds one of
the literals of the line kinds, the node-state blocks and the vocabularies, or matches a kind's
screen. Every candidate costs the per-line cleanup, the header captures and the kinds' regexes, so a
literal that healthy lines hold (`.py:` in every Python logging line) multiplies the cost of a run:
this prints, for the job, the share of lines that are candidates and, per owner (a line kind, a
vocabulary file, the node-state blocks, the screens), how many lines hold one of its literals and how
many it alone makes candidates (those are what dropping or screening it would save). Issue 19: run it
when `bench_analyze.py`'s `cand %` column grows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.parse.classify import LINE_KINDS  # noqa: E402
from analyzer.parse.logtext import PREFILTER_LITERALS, PREFILTER_PATTERNS, PREFILTER_SCREENS, holds_any  # noqa: E402
from analyzer.parse.nodestate import NODE_STATE_START_LITERALS  # noqa: E402
from analyzer.parse.vocabulary import vocabulary  # noqa: E402


def owners() -> pl.DataFrame:
    """(literal, owner) of every prefilter literal."""
    vocab = vocabulary()
    files = vocab.literals.join(vocab.rows.select("row", "file"), on="row").select("literal", pl.col("file").alias("owner"))
    kinds = [(lit, k.kind) for k in LINE_KINDS if not k.screen for lit in k.literals if lit in PREFILTER_LITERALS]
    state = [(lit, "node-state blocks") for lit in NODE_STATE_START_LITERALS]
    return pl.concat([files, pl.DataFrame(kinds + state, schema={"literal": pl.String, "owner": pl.String}, orient="row")]).unique()


def stats(job: Path) -> tuple[int, int, pl.DataFrame]:
    paths = sorted(str(p) for p in job.rglob("*") if p.is_file())
    lines = pl.concat(
        [pl.scan_csv(p, has_header=False, separator="\x1f", quote_char=None, infer_schema=False, new_columns=["text"],
                     encoding="utf8-lossy", raise_if_empty=False) for p in paths]
    ).select(pl.col("text").fill_null("")).collect().with_row_index("_l")
    cand = lines.filter(holds_any(pl.col("text"), PREFILTER_PATTERNS))
    screened = [(pl.col("text").str.contains(s), k.kind) for k in LINE_KINDS if k.screen for s in (k.screen,) if s in PREFILTER_SCREENS]
    held = cand.select("_l", pl.col("text").str.extract_many(list(PREFILTER_LITERALS), overlapping=True).alias("literal"))
    pairs = held.explode("literal").drop_nulls().join(owners(), on="literal").select("_l", "owner")
    pairs = pl.concat([pairs, *[cand.filter(flag).select("_l", pl.lit(f"{kind} (screen)").alias("owner")) for flag, kind in screened]])
    pairs = pairs.unique()
    alone = pairs.group_by("_l").agg(pl.col("owner").first(), pl.len().alias("n")).filter(pl.col("n") == 1)
    table = (
        pairs.group_by("owner").agg(pl.len().alias("lines holding"))
        .join(alone.group_by("owner").agg(pl.len().alias("alone")), on="owner", how="left")
        .fill_null(0).sort(["alone", "lines holding"], descending=True)
    )
    return lines.height, cand.height, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", type=Path)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    total, candidates, table = stats(args.job)
    print(f"{total:,d} lines, {candidates:,d} candidates ({100 * candidates / max(total, 1):.1f}%)")
    print("owner | lines holding | alone")
    for owner, holding, alone in table.head(args.top).iter_rows():
        print(f"{owner} | {holding:,d} | {alone:,d}")


if __name__ == "__main__":
    main()
