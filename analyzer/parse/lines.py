"""Stage 2, parse (line layer): text chunks -> a frame of lines with wrapper prefixes peeled off.

One physical line can carry a collector timestamp, a launcher label (Slurm `N: `, pdsh `host: `,
MPI `[1,3]<stdout>:`, Ray `(Actor pid=N)`), torchrun's `[default0]:` tee prefix and PyTorch's
`[rankN]:` prefix before the payload. All of it is peeled with vectorised regexes; nothing here
loops over lines in Python.
"""

from __future__ import annotations

import io

import polars as pl

MAX_LINE_CHARS = 4096

_ANSI = r"\x1b\[[0-9;?]*[A-Za-z]|^\s*\[0m\s?"

# Wrapper layers in the order they stack, left to right. Each is optional.
_PREFIX = (
    r"^"
    r"(?:\s*(?P<collector_ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?)(?:\s+\|\s+\w+\s+\|)?\s+(?:\S+ \|\| )?)?"
    r"(?:\((?:[\w.]+ )?pid=(?P<ray_pid>\d+)(?:, ip=[\d.]+)?\)\s+)?"
    r"(?:\[\d+,(?P<mpi_rank>\d+)\]<std(?:out|err)>:)?"
    r"(?:\[(?P<bracket_rank>\d+)\]\s)?"
    r"(?:(?P<label_rank>\d{1,6}):\s)?"
    r"(?:\[(?P<acc_host>[\w.\-]+):(?P<acc_local>\d+)\]:\s*)?"
    r"(?:\[(?P<tee_role>[A-Za-z_]+?)(?P<tee_num>\d+)\]:)?"
    r"(?:\[rank(?P<torch_rank>\d+)\]:\s?)?"
)

# pdsh / DeepSpeed runner labels (`worker-1: `). Ambiguous with `ValueError: msg`, so a name must
# carry a digit or a hyphen, and the file-level share of such lines decides whether to trust it.
_HOST_LABEL = r"^(?P<label_host>[A-Za-z0-9][\w.\-]*[\d\-][\w.\-]*):\s"
_HOST_LABEL_MIN_SHARE = 0.3


def lines_frame_many(chunks: list[tuple[str, str, int]]) -> pl.DataFrame:
    """Lines of many (text, file, first_line) chunks, split in one call.

    Thousands of small per-rank files cost more in per-call overhead than in splitting, so their
    texts are joined and split once by polars' CSV reader (one column, no quoting: the fastest line
    splitter at hand, several times faster than `str.split` + `explode`); each line is mapped back
    to its chunk by the per-chunk line counts.
    """
    texts = [text if text.endswith("\n") else text + "\n" for text, _, _ in chunks]
    counts = [t.count("\n") for t in texts]
    joined = "".join(texts)
    if _COLUMN_SEPARATOR in joined:  # never in real logs; it would split a line into columns
        joined = joined.replace(_COLUMN_SEPARATOR, " ")
    split = pl.read_csv(
        io.BytesIO(joined.encode("utf-8", errors="replace")),
        has_header=False,
        separator=_COLUMN_SEPARATOR,
        quote_char=None,
        infer_schema=False,
        new_columns=["text"],
        raise_if_empty=False,
    )
    if split.height != sum(counts):  # the reader must yield exactly one row per line; if not, split in Python
        split = pl.DataFrame({"text": joined.split("\n")[:-1]}, schema={"text": pl.String})
    repeat = pl.Series(counts, dtype=pl.UInt32)
    starts = [0]
    for count in counts[:-1]:
        starts.append(starts[-1] + count)
    offsets = pl.Series([first - start for (_, _, first), start in zip(chunks, starts)], dtype=pl.Int64)
    return pl.DataFrame(
        {
            "line": offsets.repeat_by(repeat).explode() + pl.int_range(split.height, eager=True, dtype=pl.Int64),
            "text": split.get_column("text").fill_null("").str.strip_suffix("\r").str.slice(0, MAX_LINE_CHARS),
            "file": pl.Series([f for _, f, _ in chunks], dtype=pl.String).repeat_by(repeat).explode(),
        }
    )


_COLUMN_SEPARATOR = "\x1f"


def peel_prefixes(lines: pl.DataFrame) -> pl.DataFrame:
    """Add `body` (the payload) and the prefix-derived rank/host columns."""
    cleaned = pl.when(pl.col("text").str.contains(r"\x1b|\[0m", literal=False)).then(
        pl.col("text").str.replace_all(_ANSI, "")
    ).otherwise(pl.col("text"))
    frame = lines.with_columns(cleaned.alias("_clean"))
    frame = frame.with_columns(pl.col("_clean").str.extract_groups(_PREFIX).alias("_p"))
    frame = frame.unnest("_p")
    prefix_len = pl.col("_clean").str.extract(f"({_PREFIX})", 1).str.len_chars().fill_null(0)
    frame = frame.with_columns(pl.col("_clean").str.slice(prefix_len).alias("body"))
    frame = _peel_host_labels(frame)
    int_col = lambda name: pl.col(name).cast(pl.Int64, strict=False)  # noqa: E731
    tee_is_rank = pl.col("tee_role") == "rank"
    # A line that opens with PyTorch's `[rank3]: ` matches the tee group first (no look-ahead in
    # the regex engine to keep `rank` out of it), which leaves the space after the colon.
    frame = frame.with_columns(pl.when(tee_is_rank).then(pl.col("body").str.strip_prefix(" ")).otherwise(pl.col("body")).alias("body"))
    return frame.with_columns(
        pl.coalesce(
            int_col("torch_rank"),
            pl.when(tee_is_rank).then(int_col("tee_num")),
            int_col("mpi_rank"),
            int_col("bracket_rank"),
            int_col("label_rank"),
        ).alias("pfx_rank"),
        pl.coalesce(pl.when(~tee_is_rank).then(int_col("tee_num")), int_col("acc_local")).alias("pfx_local_rank"),
        pl.coalesce(pl.col("acc_host"), pl.col("label_host")).alias("pfx_host"),
        int_col("ray_pid").alias("pfx_pid"),
    ).drop(
        "_clean", "ray_pid", "mpi_rank", "bracket_rank", "label_rank", "acc_host", "acc_local",
        "tee_role", "tee_num", "torch_rank", "label_host",
    )


def _peel_host_labels(frame: pl.DataFrame) -> pl.DataFrame:
    """Trust `host: ` labels per file: a batch mixes files with and without a launcher's labels."""
    candidate = pl.col("body").str.extract(_HOST_LABEL, 1)
    frame = frame.with_columns(candidate.alias("label_host"))
    non_empty = (pl.col("body").str.len_chars() > 0).sum().over("file")
    labelled = pl.col("label_host").is_not_null().sum().over("file")
    distinct_names = pl.col("label_host").n_unique().over("file")
    trusted = (labelled >= non_empty * _HOST_LABEL_MIN_SHARE) & (non_empty > 0) & (distinct_names <= 4096)
    frame = frame.with_columns(pl.when(trusted).then(pl.col("label_host")).alias("label_host"))
    return frame.with_columns(
        pl.when(pl.col("label_host").is_not_null())
        .then(pl.col("body").str.slice(pl.col("label_host").str.len_chars() + 2))
        .otherwise(pl.col("body"))
        .alias("body")
    )
