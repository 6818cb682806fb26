"""Stage 4, detect (analysis "traceback_fragment"): a Python traceback whose exception line never came.

A traceback header (`Traceback (most recent call last):`) or a frame (`  File "x.py", line 12, in f`)
is printed only while an exception propagates; when the log ends before the exception line (an
excerpt cut short, a process killed while writing it, a buffer never flushed) the frames are the only
trace of the failure. Nothing names a cause, so the finding is the fallback `other`, naming the first
such line and the rank of its `[rankN]:` prefix: never a clean report for a job that failed.

A header or frame is a fragment when no exception line (`traceback.exception`) nor any error-level
line follows it in the same file and rank. Frames under logging's `Stack (most recent call last):`
(`stack_info=True`, a stack printed on purpose) are not.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

_HEADERS = ("traceback.start", "traceback.stack")
_TRACE_KINDS = (*_HEADERS, "traceback.frame")
MAX_EVIDENCE = 8


@register("traceback_fragment")
def traceback_fragment(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    fragments = fragment_lines(events)
    if fragments.height == 0:
        return findings_frame([])
    first = fragments.row(0, named=True)
    # The evidence is the first fragment's own traceback: its file and writer.
    same = fragments.filter((pl.col("file") == first["file"]) & pl.col("rank").eq_missing(first["rank"]))
    where = f"rank {first['rank']}" if first["rank"] is not None else first["file"]
    return findings_frame([finding(
        "python-traceback-without-exception",
        ranks=[first["rank"]] if first["rank"] is not None else [],
        hosts=[first["host"]] if first["host"] is not None else [],
        confidence=0.25,
        summary=(
            f"{where}: a Python traceback ({same.height} line{'s' if same.height != 1 else ''}) ends without its "
            f"exception line, from `{first['message'].strip()[:160]}`: the process failed there, but what "
            "was raised is not in the log"
        ),
        evidence=same.get_column("event_id").head(MAX_EVIDENCE).to_list(),
    )])


def fragment_lines(events: pl.DataFrame) -> pl.DataFrame:
    """The traceback headers and frames that no exception or error line follows in their file and
    rank, in file and line order (event_id, file, line, rank, host, message)."""
    closing = pl.col("kind").eq("traceback.exception") | pl.col("severity").is_in(["error", "fatal"])
    lines = events.filter(pl.col("kind").is_in(_TRACE_KINDS) | closing).filter(pl.col("file").is_not_null())
    if lines.filter(pl.col("kind").is_in(_TRACE_KINDS)).height == 0:
        return lines.clear().select("event_id", "file", "line", "rank", "host", "message")
    writer = ["file", "rank"]
    lines = lines.sort("file", "line").with_columns(
        # Exceptions or error lines at or after this one, in its file and rank (a reverse running count).
        closing.cast(pl.Int32).reverse().cum_sum().reverse().over(writer).alias("_closed_after"),
        pl.when(pl.col("kind").is_in(_HEADERS)).then(pl.col("kind")).forward_fill().over(writer).alias("_header"),
    )
    return lines.filter(
        pl.col("kind").is_in(_TRACE_KINDS)
        & (pl.col("_closed_after") == 0)
        & pl.col("_header").ne_missing("traceback.stack")
    ).select("event_id", "file", "line", "rank", "host", "message")
