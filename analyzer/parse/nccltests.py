"""Stage 2, parse (nccl-tests / rccl-tests output): result tables, device lists and failure lines.

`all_reduce_perf`, `all_gather_perf`, `broadcast_perf`, ... print, per run, a header (`nThread 1
nGpus 8 minBytes ... validation: 1 graph: 0`, with `#` since 2019), the `# Using devices` block
(`#  Rank  0 Group  0 Pid 1234 on host device  0 [0000:07:00] NVIDIA H100 80GB HBM3`; older
layouts without Group or Pid, bus ids as `[0x07]`), a column header naming the columns of that
version (`size count type [redop] [root] time algbw busbw #wrong|error ...`, twice, with `i_min
i_max i_p99 i_cv%` per side under `-I 1` and a timestamp column under `-T`), one row per size,
`Out of bounds values : N OK|FAILED` and `Avg bus bandwidth : X`. Failures print `host: Test NCCL
failure common.cu:N 'unhandled system error / last error'`, `host: Test CUDA failure ...`, the
2017 `NCCL failure` / `Cuda failure` forms and the ` .. host pid N: Test failure` trace.

The lines are read with vectorised expressions: a run is the lines from one header to the next in
a file; the column header of a run (or, without one, the token count of each row) says where each
figure sits. `results_frame` turns the result events back into a typed frame (one row per result
row) for the bandwidth analysis and the report's curve. Events: `nccltests.run` (one per run, its
figures in `detail` as JSON), `nccltests.device` (one per device line: rank, pid, host, device),
`nccltests.result` (one per row, its figures in `detail` as JSON), `nccltests.out_of_bounds`
(a run's non-zero count), and failures as `nccl.error_raised` / `cuda.error` so that the
catalogue's NCCL and CUDA signatures read them like any other report of those errors.
"""

from __future__ import annotations

import polars as pl

from analyzer.io import InputFile
from analyzer.events import conform, empty_events
from analyzer.parse.lines import read_peeled_lines

_HEADER = (
    r"^#?\s*nThread (?P<nthread>\d+) nGpus (?P<ngpus>\d+) minBytes (?P<min_bytes>\d+) maxBytes (?P<max_bytes>\d+)"
    r" step: (?P<step>\d+)\((?P<step_kind>\w+)\) warmup iters: (?P<warmup>\d+)\s+iters: (?P<iters>\d+)"
    r"(?: agg iters: (?P<agg_iters>\d+))?.*?validation: (?P<validation>\d+)(?: graph: (?P<graph>\d+))?"
)
# The host is whatever sits between `on` and `device` (a redacted paste can hold a space in it).
# NCCL 1's own test programs (test/single/*_test.cu, one process) print `#   Rank  0 uses device  0 [0x05] <gpu>`.
_DEVICE = (
    r"^#?\s*Rank\s+(?P<rank>\d+)(?:\s+Group\s+\d+)?(?:\s+Pid\s+(?P<pid>\d+))?\s+(?:on\s+(?P<host>.*?)\s+device|uses device)\s+"
    r"(?P<device>\d+)\s+\[(?P<bus_id>[0-9A-Fa-fx:.]+)\]\s+(?P<gpu>.*?)\s*$"
)
# `size count type redop ...`; NCCL 1's tests and the first nccl-tests: `bytes N type op time algbw busbw res`.
_COLUMNS = r"^#\s+size\s+count\s+type\b|^#?\s+bytes\s+N\s+type\s+op\b"
_ROW = r"^\s*\d+\s+\d+\s+[A-Za-z]\w*\s+\S"
_OUT_OF_BOUNDS = r"^#?\s*Out of bounds values\s*:\s*(\d+)"
_AVG_BUSBW = r"^#?\s*Avg bus bandwidth\s*:\s*([0-9.eE+\-]+|nan|inf)"
_TEST_NAME = r"(?:Collective test starting:\s*|\b)(\w+)_perf\b"
_FAILURE = (
    r"^(?:(?P<host>[^\s:]+):\s+)?(?P<what>Test NCCL failure|Test CUDA failure|NCCL failure|Cuda failure)\s+"
    r"(?P<src>\S+:\d+)\s+'(?P<msg>.*)'\s*$"
)
_TRACE = r"^\s*\.\.\s+(?P<host>\S+)\s+pid\s+(?P<pid>\d+):\s+Test failure\s+(?P<src>\S+:\d+)"
# The table's own decoration: `#`, `#  (B)  (elements) ...`, the out-of-place / in-place line, `# Using devices`.
_DECOR = r"^#\s*(?:$|\(B\)|out-of-place|Using devices|Collective test|nccl-tests version)|^rccl-tests: Version|^\s*out-of-place\s+in-place"
_LITERALS = ("nThread", "Rank", "size", "bytes", "Out of bounds", "Avg bus", "failure", "_perf", "Collective test")
MAX_LINES = 2_000_000  # an nccl-tests output is a few hundred lines; a huge file is not read past this

_SIDE = ("time", "algbw", "busbw", "wrong")


def parse_nccl_tests(item: InputFile) -> tuple[pl.DataFrame, int]:
    """Events of one nccl-tests output and how many of its lines were the format's own."""
    lines = read_peeled_lines(item, MAX_LINES, "nccl-tests")
    return nccl_tests_events(lines) if lines is not None else (empty_events(), 0)


def nccl_tests_events(lines: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Events for the nccl-tests lines of a frame with `file`, `line`, `text`, `body` columns."""
    body = pl.col("body")
    decor = lines.filter(body.str.contains(_DECOR)).height
    frame = lines.filter(body.str.contains_any(list(_LITERALS)) | body.str.contains(_ROW)).select("file", "line", "text", "body")
    if frame.height == 0:
        return empty_events(), decor
    frame = frame.with_columns(
        body.str.contains(_HEADER).alias("_header"),
        body.str.contains(_DEVICE).alias("_device"),
        body.str.contains(_COLUMNS).alias("_columns"),
        body.str.contains(_ROW).alias("_row"),
        body.str.extract(_OUT_OF_BOUNDS, 1).cast(pl.Int64, strict=False).alias("_oob"),
        body.str.extract(_AVG_BUSBW, 1).cast(pl.Float64, strict=False).alias("_avg"),
        body.str.contains(_FAILURE).alias("_failure"),
        body.str.contains(_TRACE).alias("_trace"),
    )
    # A run: the lines from one header to the next (rows pasted without a header are run 0).
    frame = frame.with_columns(
        pl.col("_header").cum_sum().over("file").alias("run_no"),
        pl.when(~pl.col("_row")).then(body.str.extract(_TEST_NAME, 1)).forward_fill().over("file").alias("_test"),
    )
    frame = frame.with_columns(pl.concat_str(pl.col("file"), pl.lit("#"), pl.col("run_no")).alias("run"))
    frame = _with_layout(frame)
    own = frame.filter(
        pl.col("_header") | pl.col("_device") | pl.col("_columns") | pl.col("_row") | pl.col("_oob").is_not_null()
        | pl.col("_avg").is_not_null() | pl.col("_failure") | pl.col("_trace")
    ).height + decor
    parts = [_devices(frame), _results(frame), _runs(frame), _out_of_bounds(frame), _failures(frame)]
    parts = [p for p in parts if p.height]
    if not parts:
        return empty_events(), own
    return conform(pl.concat(parts, how="diagonal_relaxed").with_columns(pl.col("text").str.slice(0, 2000))), own


def _with_layout(frame: pl.DataFrame) -> pl.DataFrame:
    """Per run, from its column header: the leading columns present, the error column, the side width."""
    names = pl.when(pl.col("_columns")).then(pl.col("body").str.strip_prefix("#").str.extract_all(r"\S+"))
    frame = frame.with_columns(names.alias("_names")).with_columns(
        pl.col("_names").forward_fill().over("run").alias("_names")
    )
    names = pl.col("_names")
    return frame.with_columns(
        (names.list.contains("redop") | names.list.contains("op")).alias("_has_redop"),
        names.list.contains("root").alias("_has_root"),
        names.list.contains("i_min").alias("_per_iter"),
        (names.list.contains("#wrong") | names.list.contains("wrong")).alias("_counts_wrong"),
    )


def _devices(frame: pl.DataFrame) -> pl.DataFrame:
    rows = frame.filter(pl.col("_device")).with_columns(pl.col("body").str.extract_groups(_DEVICE).alias("d")).unnest("d")
    if rows.height == 0:
        return rows
    return rows.select(
        "file", "line", "text",
        pl.col("rank").cast(pl.Int64, strict=False), pl.col("pid").cast(pl.Int64, strict=False), pl.col("host").str.strip_chars(),
        pl.col("device").cast(pl.Int64, strict=False),
        pl.lit("nccltests").alias("source"), pl.lit("nccltests.device").alias("kind"), pl.lit("info").alias("severity"),
        pl.concat_str(pl.lit("rank "), "rank", pl.lit(" on "), "host", pl.lit(" device "), "device",
                      pl.lit(" ["), "bus_id", pl.lit("] "), "gpu").alias("message"),
        pl.col("gpu").alias("detail"),
        pl.col("run").alias("pg"),
    )


def _token(index: pl.Expr) -> pl.Expr:
    return pl.col("_tok").list.get(index, null_on_oob=True)


def _number(index: pl.Expr) -> pl.Expr:
    value = _token(index).cast(pl.Float64, strict=False)
    return pl.when(value.is_finite()).then(value)  # `nan`, `inf` (a broken timer) are no figures


def _results(frame: pl.DataFrame) -> pl.DataFrame:
    """One event per result row; the figures travel in `detail` as JSON."""
    # `mpirun --tag-output` tags each partial print: `-1[0]    1626.5 ...[0]    2302.3` (tags dropped).
    tokens = pl.col("body").str.replace_all(r"\[\d+\]", " ").str.extract_all(r"\S+")
    rows = frame.filter(pl.col("_row")).with_columns(tokens.alias("_tok"))
    if rows.height == 0:
        return rows
    n = pl.col("_tok").list.len()
    # Without a column header the token count says it: 3 leading columns plus 8 (or 16 with -I 1)
    # figures; one more is a redop (a word) or a root (a number), two more are both.
    width = pl.when(pl.col("_per_iter").fill_null(False)).then(8).otherwise(4)
    extra_guess = ((n - 3) % 4).clip(0, 2)
    third_is_number = _token(pl.lit(3)).str.contains(r"^-?\d+$").fill_null(False)
    has_redop = pl.coalesce(pl.col("_has_redop"), (extra_guess == 2) | ((extra_guess == 1) & ~third_is_number))
    has_root = pl.coalesce(pl.col("_has_root"), (extra_guess == 2) | ((extra_guess == 1) & third_is_number))
    rows = rows.with_columns(has_redop.alias("_r"), has_root.alias("_o"), width.alias("_w"))
    lead = 3 + pl.col("_r").cast(pl.Int32) + pl.col("_o").cast(pl.Int32)
    rows = rows.with_columns(lead.alias("_lead"))
    oop, ip = pl.col("_lead"), pl.col("_lead") + pl.col("_w")
    wrong_is_count = pl.coalesce(pl.col("_counts_wrong"), _token(oop + 3).str.contains(r"^-?\d+$"))
    figures = rows.select(
        "file", "line", "text", "run",
        _token(pl.lit(0)).cast(pl.Int64, strict=False).alias("size"),
        _token(pl.lit(1)).cast(pl.Int64, strict=False).alias("count"),
        _token(pl.lit(2)).alias("type"),
        pl.when(pl.col("_r")).then(_token(pl.lit(3))).alias("redop"),
        pl.when(pl.col("_o")).then(_token(pl.col("_lead") - 1).cast(pl.Int64, strict=False)).alias("root"),
        *[_number(oop + i).alias(f"oop_{name}") for i, name in enumerate(_SIDE[:3])],
        *[_number(ip + i).alias(f"ip_{name}") for i, name in enumerate(_SIDE[:3])],
        pl.when(wrong_is_count).then(_number(oop + 3)).alias("oop_wrong"),
        pl.when(wrong_is_count).then(_number(ip + 3)).alias("ip_wrong"),
        pl.when(~wrong_is_count).then(_number(oop + 3)).alias("oop_error"),
        pl.when(~wrong_is_count).then(_number(ip + 3)).alias("ip_error"),
    ).filter(pl.col("size").is_not_null() & pl.col("oop_busbw").is_not_null())
    if figures.height == 0:
        return figures
    wrong = (pl.col("oop_wrong").fill_null(0) + pl.col("ip_wrong").fill_null(0)).cast(pl.Int64, strict=False)
    detail = pl.struct(*RESULT_FIELDS).struct.json_encode()
    return figures.with_columns(
        pl.lit("nccltests").alias("source"), pl.lit("nccltests.result").alias("kind"),
        pl.when(wrong > 0).then(pl.lit("error")).otherwise(pl.lit("info")).alias("severity"),
        pl.concat_str(
            pl.col("size").cast(pl.String), pl.lit(" B: busbw "), pl.col("oop_busbw").cast(pl.String),
            pl.lit(" GB/s out-of-place, "), pl.col("ip_busbw").cast(pl.String).fill_null("?"), pl.lit(" GB/s in-place"),
            pl.when(wrong > 0).then(pl.concat_str(pl.lit(", "), wrong.cast(pl.String), pl.lit(" wrong elements"))).otherwise(pl.lit("")),
        ).alias("message"),
        detail.alias("detail"),
        pl.col("run").alias("pg"),
        pl.col("count").alias("numel_in"),
    )


RESULT_FIELDS = (
    "size", "count", "type", "redop", "root", "oop_time", "oop_algbw", "oop_busbw", "oop_wrong", "oop_error",
    "ip_time", "ip_algbw", "ip_busbw", "ip_wrong", "ip_error",
)
_RESULT_SCHEMA = pl.Struct({
    "size": pl.Int64, "count": pl.Int64, "type": pl.String, "redop": pl.String, "root": pl.Int64,
    "oop_time": pl.Float64, "oop_algbw": pl.Float64, "oop_busbw": pl.Float64, "oop_wrong": pl.Float64, "oop_error": pl.Float64,
    "ip_time": pl.Float64, "ip_algbw": pl.Float64, "ip_busbw": pl.Float64, "ip_wrong": pl.Float64, "ip_error": pl.Float64,
})
_RUN_SCHEMA = pl.Struct({
    "test": pl.String, "nthread": pl.Int64, "ngpus": pl.Int64, "min_bytes": pl.Int64, "max_bytes": pl.Int64,
    "iters": pl.Int64, "validation": pl.Int64, "graph": pl.Int64, "avg_busbw": pl.Float64, "out_of_bounds": pl.Int64,
    "columns": pl.Boolean,
})


def _runs(frame: pl.DataFrame) -> pl.DataFrame:
    """One event per run: the header's figures, the test, the summary lines' values."""
    per_run = frame.group_by("file", "run", maintain_order=True).agg(
        pl.col("line").filter(pl.col("_header")).first().alias("_hline"),
        pl.col("line").min().alias("_first"),
        pl.col("body").filter(pl.col("_header")).first().alias("_hbody"),
        pl.col("text").filter(pl.col("_header")).first().alias("_htext"),
        pl.col("text").first().alias("_ftext"),
        pl.col("_test").filter(pl.col("_header")).first().alias("_htest"),
        pl.col("_test").drop_nulls().last().alias("_ltest"),
        pl.col("_avg").drop_nulls().last().alias("avg_busbw"),
        pl.col("_oob").drop_nulls().last().alias("out_of_bounds"),
        pl.col("_row").any().alias("_rows"),
        pl.col("_columns").any().alias("columns"),  # the column header is printed once init is done
    ).filter(pl.col("_hline").is_not_null() | pl.col("_rows") | pl.col("columns"))
    if per_run.height == 0:
        return per_run
    header = pl.col("_hbody").str.extract_groups(_HEADER)
    per_run = per_run.with_columns(header.alias("h")).unnest("h")
    ints = ("nthread", "ngpus", "min_bytes", "max_bytes", "iters", "validation", "graph")
    per_run = per_run.with_columns(
        *[pl.col(c).cast(pl.Int64, strict=False) for c in ints],
        pl.coalesce("_htest", "_ltest").alias("test"),
    )
    detail = pl.struct(
        "test", *ints, "avg_busbw", "out_of_bounds", "columns",
    ).struct.json_encode()
    return per_run.select(
        "file",
        pl.coalesce("_hline", "_first").alias("line"),
        pl.coalesce("_htext", "_ftext").alias("text"),  # a pasted table without its header: its first line
        pl.lit("nccltests").alias("source"), pl.lit("nccltests.run").alias("kind"), pl.lit("info").alias("severity"),
        pl.concat_str(
            pl.col("test").fill_null("nccl-tests"), pl.lit(": nThread "), pl.col("nthread").cast(pl.String).fill_null("?"),
            pl.lit(" nGpus "), pl.col("ngpus").cast(pl.String).fill_null("?"),
            pl.lit(", sizes "), pl.col("min_bytes").cast(pl.String).fill_null("?"), pl.lit("-"), pl.col("max_bytes").cast(pl.String).fill_null("?"),
            pl.lit(" B, iters "), pl.col("iters").cast(pl.String).fill_null("?"),
            pl.lit(", validation "), pl.col("validation").cast(pl.String).fill_null("?"),
            pl.lit(", avg busbw "), pl.col("avg_busbw").cast(pl.String).fill_null("?"),
        ).alias("message"),
        detail.alias("detail"),
        pl.col("run").alias("pg"),
    )


def _out_of_bounds(frame: pl.DataFrame) -> pl.DataFrame:
    rows = frame.filter(pl.col("_oob") > 0)
    if rows.height == 0:
        return rows
    return rows.select(
        "file", "line", "text",
        pl.lit("nccltests").alias("source"), pl.lit("nccltests.out_of_bounds").alias("kind"), pl.lit("error").alias("severity"),
        pl.concat_str(pl.lit("Out of bounds values: "), pl.col("_oob").cast(pl.String), pl.lit(" (the test found wrong results)")).alias("message"),
        pl.col("run").alias("pg"),
    )


def _failures(frame: pl.DataFrame) -> pl.DataFrame:
    """`Test NCCL failure` as `nccl.error_raised`, `Test CUDA failure` as `cuda.error`; the run's trace lines name the pid."""
    rows = frame.filter(pl.col("_failure")).with_columns(pl.col("body").str.extract_groups(_FAILURE).alias("f")).unnest("f")
    if rows.height == 0:
        return rows
    traces = frame.filter(pl.col("_trace")).with_columns(pl.col("body").str.extract_groups(_TRACE).alias("t")).unnest("t")
    pids = traces.group_by("file", "host").agg(pl.col("pid").first().cast(pl.Int64, strict=False))
    rows = rows.join(pids, on=["file", "host"], how="left", nulls_equal=True) if pids.height else rows.with_columns(pl.lit(None, dtype=pl.Int64).alias("pid"))
    nccl = pl.col("what").str.contains("NCCL")
    # `unhandled system error / socket connect to ...`: the NCCL result, then (2.13+) its last error.
    result = pl.col("msg").str.split(" / ").list.first()
    last_error = pl.col("msg").str.split(" / ").list.slice(1).list.join(" / ")
    return rows.select(
        "file", "line", "text", "host", "pid",
        pl.lit("nccltests").alias("source"),
        pl.when(nccl).then(pl.lit("nccl.error_raised")).otherwise(pl.lit("cuda.error")).alias("kind"),
        pl.lit("error").alias("severity"),
        pl.concat_str(pl.col("what"), pl.lit(" "), pl.col("src"), pl.lit(": "), result).alias("message"),
        pl.when(last_error.str.len_chars() > 0).then(last_error).alias("detail"),
        pl.col("run").alias("pg"),
    )


def results_frame(events: pl.DataFrame) -> pl.DataFrame:
    """The result rows of a job's events as a typed frame: one row per result row, with its run and host."""
    rows = events.filter(pl.col("kind") == "nccltests.result")
    if rows.height == 0:
        return pl.DataFrame(schema={"event_id": pl.Int64, "run": pl.String, "file": pl.String, "host": pl.String,
                                    **dict(_RESULT_SCHEMA.to_schema())})
    return rows.select(
        "event_id", pl.col("pg").alias("run"), "file", "host",
        pl.col("detail").str.json_decode(_RESULT_SCHEMA).alias("r"),
    ).unnest("r")


def runs_frame(events: pl.DataFrame) -> pl.DataFrame:
    """One row per run: its figures, hosts, rank count and GPU names (from the device lines)."""
    runs = events.filter(pl.col("kind") == "nccltests.run").select(
        "event_id", pl.col("pg").alias("run"), "file", pl.col("host").alias("file_host"),
        pl.col("detail").str.json_decode(_RUN_SCHEMA).alias("r"),
    ).unnest("r")
    devices = events.filter(pl.col("kind") == "nccltests.device").group_by(pl.col("pg").alias("run")).agg(
        pl.col("host").drop_nulls().unique().sort().alias("hosts"),
        pl.col("rank").n_unique().alias("nranks"),
        pl.col("detail").drop_nulls().unique().sort().alias("gpus"),
    )
    runs = runs.join(devices, on="run", how="left")
    return runs.with_columns(
        pl.when(pl.col("hosts").list.len() > 0).then(pl.col("hosts"))
        .otherwise(pl.concat_list(pl.col("file_host")).list.drop_nulls()).alias("hosts"),
    )
