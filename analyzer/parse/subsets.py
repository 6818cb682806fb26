"""Stage 2 support (parse): a costly expression computed on some rows of a frame only.

polars evaluates both branches of `when/then` on every row, so a capture that only a tenth of the
lines need would still run on all of them. Instead the rows that need it are gathered, computed
on, and spread back into place (`spread`), null on the others.
"""

from __future__ import annotations

import polars as pl


def spread(parts: list[tuple[pl.Series, pl.DataFrame]], height: int) -> pl.DataFrame:
    """A frame of `height` rows from `parts`, each (the row numbers it holds, its rows in that order),
    the row numbers of different parts disjoint; null where no part holds the row. All parts have
    the same columns."""
    values = pl.concat([frame for _, frame in parts], how="vertical")
    position = pl.Series(dtype=pl.UInt32).extend_constant(None, height)
    offset = 0
    for rows, frame in parts:
        if frame.height:  # one integer scatter per part; the columns are gathered once
            position = position.scatter(rows, pl.int_range(offset, offset + frame.height, eager=True, dtype=pl.UInt32))
            offset += frame.height
    return values.select(pl.all().gather(position))


def captured(text: pl.Series, rows: pl.Series, pattern: str) -> pl.DataFrame:
    """`pattern`'s named groups on the given rows of `text` (row numbers), in their order."""
    return text.gather(rows).to_frame("_t").select(pl.col("_t").str.extract_groups(pattern).alias("_g")).unnest("_g")
