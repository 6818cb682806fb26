"""Stage 3, correlate: a rank a line's own text opens with (`Rank 3: RuntimeError: ...`, `[Rank 3]: ...`,
`[global rank 3] ...`, `rank=3 | ...`, `local_rank=3: ...`), for lines whose wrapper prefixes named none.

Training scripts and frameworks label their own log lines with the writer's rank in words the line
layer's prefixes (`[rank3]:`, `[default3]:`, `[1,3]<stdout>:`) do not cover. Only a label at the very
start of the message, closed by `:` or `|` (or the brackets of `[global rank N]`), counts: `Rank 3 timed
out in monitoredBarrier` is written by another rank about rank 3, and a bare `[Rank N] ` is c10d's form,
a rank inside a process group (correlate reads it by the group); c10d's own lines are left to it.
A `local_rank` label fills the local rank, never the global one.
"""

from __future__ import annotations

import polars as pl

from analyzer.bounds import MAX_WORLD_SIZE

_RANK = r"(?:[Rr]ank|RANK)\s*[:=#]?\s*(\d{1,7})"
_LOCAL_RANK = r"(?:[Ll]ocal[ _]?(?:[Rr]ank|RANK)|LOCAL_RANK)\s*[:=#]?\s*(\d{1,7})"
# `Rank 3: `, `rank=3 | `, `[Rank 3]: `, `[global rank 3] `; not a bare `[Rank 3] `: that is c10d's form.
_GLOBAL = (rf"^\s*(?:[Gg]lobal[ _])?{_RANK}\s*[:|]\s*\S", rf"^\s*\[\s*(?:[Gg]lobal[ _])?{_RANK}\s*\]\s*:\s*\S",
           rf"^\s*\[\s*[Gg]lobal[ _]{_RANK}\s*\]\s*\S")
_LOCAL = (rf"^\s*{_LOCAL_RANK}\s*[:|]\s*\S", rf"^\s*\[\s*{_LOCAL_RANK}\s*\]\s*:?\s*\S")
# c10d's own lines: their `[Rank N]` is the process group's rank (correlate._ranks_from_default_pg).
_C10D_KINDS = r"^(?:watchdog|c10d|desync)\."


def ranks_from_labels(events: pl.DataFrame) -> pl.DataFrame:
    """Fill `rank` / `local_rank` from a rank label opening the message, where the line named none."""
    labelled = pl.col("message").fill_null("")
    own = ~pl.col("kind").fill_null("").str.contains(_C10D_KINDS)

    def number(patterns: tuple[str, ...]) -> pl.Expr:
        value = pl.coalesce(*[labelled.str.extract(p, 1) for p in patterns]).cast(pl.Int64, strict=False)
        return pl.when(own & value.is_between(0, MAX_WORLD_SIZE)).then(value)

    return events.with_columns(
        pl.coalesce(pl.col("rank"), number(_GLOBAL)).alias("rank"),
        pl.coalesce(pl.col("local_rank"), number(_LOCAL)).alias("local_rank"),
    )
