"""The design limit of the text parser: what polars alone costs on a job directory, no analysis.

    python bench/ceiling.py JOB_DIR

Reads every file natively (`scan_csv`, one column, no quoting: no Python decode), keeps the lines
holding one of the parser's prefilter literals (the same `PREFILTER_PATTERNS`: its literals as
regex alternations) and extracts the NCCL and c10d header fields of the survivors. Prints one JSON line:
lines read, candidates, seconds. `bench/bench_analyze.py` runs it next to `analyze` on each job.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.parse.logtext import PREFILTER_PATTERNS, holds_any  # noqa: E402

NCCL_HEADER = r"(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:[\w/.\-]+:\d+ )?NCCL (?P<level>INFO|WARN) "
C10D_HEADER = r"\[(?P<c_level>[IWEF])(?P<c_md>\d{4}) (?P<c_time>[\d:.]+) (?P<c_src>[\w.]+):\d+\] "


def ceiling(job: Path) -> dict:
    start = time.perf_counter()
    paths = sorted(str(p) for p in job.rglob("*") if p.is_file())
    frame = pl.concat(
        [pl.scan_csv(p, has_header=False, separator="\x1f", quote_char=None, infer_schema=False,
                     new_columns=["text"], encoding="utf8-lossy", raise_if_empty=False) for p in paths]
    ).with_columns(pl.col("text").fill_null(""))
    survivors = frame.filter(holds_any(pl.col("text"), PREFILTER_PATTERNS)).select(
        pl.col("text").str.extract_groups(NCCL_HEADER).alias("nccl"),
        pl.col("text").str.extract_groups(C10D_HEADER).alias("c10d"),
    )
    lines, kept = pl.collect_all([frame.select(pl.len()), survivors])  # one scan feeds both
    return {"seconds": time.perf_counter() - start, "lines": lines.item(), "candidates": kept.height}


if __name__ == "__main__":
    print(json.dumps(ceiling(Path(sys.argv[1]))))
