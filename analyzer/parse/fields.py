"""Stage 2, parse (text logs): kept, aggregated lines -> canonical events.

The event columns (writer, source, severity, time), the fields cheap to pull with vectorised
regex (communicator init, exception names, exit codes, mismatch ranks), the grammar-parsed records
(`records.py`), and multi-line context found by row number over the batch's chosen lines
(tracebacks, `Last error:`, a wrapped WorkNCCL).
"""

from __future__ import annotations

import polars as pl

from analyzer.events import conform, empty_events
from analyzer.parse.classify import (
    KIND_SEVERITY,
    PY_EXCEPTION,
    VOCAB_KIND_PREFIX,
    with_timestamps,
    writer_columns,
)
from analyzer.parse.records import failure_table_entries, merge_wrapped_work, with_grammar_fields
from analyzer.parse.vocabulary import BENIGN

_TRACEBACK_LINE = r'^\s*(?:File ".*", line \d+|Traceback \(most recent call last\)|\^+\s*$|~*\^+~*\s*$)|^\s{2,}\S'

def to_events(kept: pl.DataFrame, lines: pl.DataFrame, year_hint: int) -> pl.DataFrame:
    if kept.height == 0:
        return empty_events()
    base = kept.with_columns(
        *writer_columns(),
        pl.col("nccl_dev").cast(pl.Int64, strict=False).alias("device"),
        pl.col("pfx_local_rank").alias("local_rank"),
        pl.when(pl.col("nccl_level").is_not_null())
        .then(pl.lit("nccl"))
        .when(pl.col("c_level").is_not_null() | pl.col("g_level").is_not_null())
        .then(pl.lit("c10d"))
        .when(pl.col("kind").str.starts_with("torchrun"))
        .then(pl.lit("torchrun"))
        .when(pl.col("kind").str.starts_with("traceback"))
        .then(pl.lit("python"))
        .when(pl.col("kind").str.contains(r"^(?:system|slurm|gpu)\."))
        .then(pl.lit("system"))
        .otherwise(pl.lit("text"))
        .alias("source"),
        _severity_expr().alias("severity"),
        pl.col("text").str.slice(0, 2000),
    )
    base = with_timestamps(base, year_hint)
    base = _with_regex_fields(base)
    base = with_grammar_fields(base)
    base = _with_context(base, lines)
    vocab = pl.col("kind").str.starts_with(VOCAB_KIND_PREFIX)
    # A vocabulary event carries the row's code (cudaErrorIllegalAddress, Xid 79, ...) and meaning.
    base = base.with_columns(
        pl.when(vocab).then(pl.col("vocab_code")).otherwise(pl.col("code")).alias("code"),
        pl.when(vocab).then(pl.col("vocab_id") + pl.lit(": ") + pl.col("vocab_meaning")).otherwise(pl.col("detail")).alias("detail"),
    )
    return conform(pl.concat([conform(base), failure_table_entries(base)]))

# What follows the marker of a last-error line on that line: XLA's `Last NCCL warning(error) log entry
# (may be unrelated) '...'.`, or PyTorch's `Last error: ...`. A bare `Last error:` has none: its text is
# the next line, an event of its own (and `nccl.error_raised`'s detail).
_LAST_ERROR_MARK = r"(?:^\s*Last error:|Last NCCL warning\(error\) log entry(?: \(may be unrelated\))?:?)\s*(.*)$"
_QUOTE_CLOSED = r"\S'\.?\s*$"


def _last_error_quote() -> pl.Expr:
    """The NCCL error a last-error line quotes. XLA's quote opens on its line and, hard-wrapped in a
    pasted or captured log, closes up to two lines further: those lines are joined on until it does."""
    inline = pl.col("message").str.extract(_LAST_ERROR_MARK, 1).str.strip_chars()
    opened = inline.str.starts_with("'") & ~inline.str.contains(_QUOTE_CLOSED)
    still_open = opened & ~pl.col("next1").fill_null("").str.contains(_QUOTE_CLOSED)
    return (
        pl.when(inline.fill_null("") == "")
        .then(pl.lit(None, dtype=pl.String))
        .when(still_open)
        .then(pl.concat_str([inline, pl.col("next1"), pl.col("next2")], separator=" ", ignore_nulls=True))
        .when(opened)
        .then(pl.concat_str([inline, pl.col("next1")], separator=" ", ignore_nulls=True))
        .otherwise(inline)
    )


def _severity_expr() -> pl.Expr:
    # A vocabulary hit is a failure; a line the benign vocabulary knows is informational, whatever its level.
    vocab = (
        pl.when(pl.col("vocab_category") == BENIGN)
        .then(pl.lit("info"))
        .when(pl.col("kind").str.starts_with(VOCAB_KIND_PREFIX))
        .then(pl.lit("error"))
    )
    by_kind = pl.col("kind").replace_strict(KIND_SEVERITY, default=None)
    by_level = pl.coalesce("c_level", "g_level").replace_strict(
        {"I": "info", "W": "warning", "E": "error", "F": "fatal"}, default=None
    )
    nccl_warn = pl.when(pl.col("nccl_level") == "WARN").then(pl.lit("warning"))
    return pl.coalesce(vocab, nccl_warn, by_level, by_kind, pl.lit("info"))


def _message_int(pattern: str, group: int = 1) -> pl.Expr:
    """The integer that `pattern`'s group captures in the message (null where it does not match)."""
    return pl.col("message").str.extract(pattern, group).cast(pl.Int64, strict=False)


def _with_regex_fields(frame: pl.DataFrame) -> pl.DataFrame:
    """Fields that are cheap to pull with vectorised regex (lines that scale with ranks x comms)."""
    kind = pl.col("kind")
    comm = kind == "nccl.comm_init"
    exc = kind == "traceback.exception"
    raised = kind == "nccl.error_raised"
    mismatch = kind == "c10d.fingerprint_mismatch"
    return frame.with_columns(
        pl.coalesce(
            pl.when(mismatch).then(_message_int(r"Rank (\d+) is running collective")),
            pl.when(kind == "ddp.unused_parameters").then(_message_int(r"for rank (\d+)")),
            pl.col("rank"),
        ).alias("rank"),
        pl.when(comm).then(_message_int(r" nr?anks (\d+)")).alias("nranks"),
        pl.when(comm).then(pl.col("message").str.extract(r"busId ([0-9a-fA-F]+)")).alias("peer"),
        pl.when(comm).then(_message_int(r"cudaDev (\d+)")).otherwise(pl.col("device")).alias("device"),
        pl.coalesce(
            pl.when(comm).then(pl.col("message").str.extract(r"comm (0x[0-9a-fA-F]+)")),
            pl.col("message").str.extract(r"\[(?:PG ID |PG )?(\d+)(?: PG GUID \d+)?(?:\s*\(([^)]*)\))? Rank \d+\]"),
        ).alias("pg"),
        pl.coalesce(
            pl.when(comm).then(_message_int(r" rank (\d+) nr?anks")),
            _message_int(r"\[(?:PG[^\]]*)?Rank (\d+)\]"),
        ).alias("pg_rank"),
        pl.coalesce(
            pl.when(exc).then(pl.col("message").str.extract(PY_EXCEPTION, 1)),
            pl.when(raised).then(pl.col("message").str.extract(r"(unhan\w*led system error|unhandled cuda error|internal error|invalid usage|invalid argument|remote process exited|ncclSystemError|ncclInternalError|ncclInvalidUsage|ncclUnhandledCudaError|ncclRemoteError)")),
            pl.when(kind == "torchrun.worker_failed").then(pl.col("message").str.extract(r"exitcode: (-?\d+)")),
            pl.when(kind == "nccl.env").then(pl.col("message").str.extract(r"(\w+) set by environment")),
        ).alias("code"),
        pl.when(kind == "torchrun.worker_failed").then(_message_int(r"exitcode: (-?\d+)")).alias("exitcode"),
        # `srun: error: <node>: task(s) <list>: ...` names the node whose tasks ended.
        pl.coalesce(pl.when(kind == "slurm.task_exit").then(pl.col("message").str.extract(r"^srun: error: ([^:\s]+): tasks? ")), pl.col("host")).alias("host"),
        pl.coalesce(
            pl.when(kind == "torchrun.worker_failed").then(_message_int(r"local_rank: (\d+)")),
            # DeepSpeed's launcher quotes the command line of the child that exited: its `--local_rank=N`.
            pl.when(pl.col("message").str.contains("exits with return code", literal=True)).then(_message_int(r"'--local_rank=(\d+)'")),
            pl.col("local_rank"),
        ).alias("local_rank"),
        pl.when(mismatch)
        .then(
            pl.concat_list(
                _message_int(r"Rank (\d+) is running collective"),
                _message_int(r"but Rank (\d+) is running collective"),
            ).list.drop_nulls()
        )
        .when(kind == "c10d.monitored_barrier")
        .then(pl.col("message").str.extract(r"Ranks? ([\d, ]+) failed to pass").str.extract_all(r"\d+").cast(pl.List(pl.Int64)))
        .when(kind == "desync.lagging")
        .then(_listed_ranks(r"\[([\d, ]+)\] (?:joined|finished|are the lagging)", r"rank (\d+) joined"))
        .when(kind == "frtrace.missing_ranks")
        .then(_listed_ranks(r"(?:missing ranks: |Missing ranks are )\{([\d, ]+)\}"))
        .when(kind == "frtrace.culprit")
        .then(pl.col("message").str.extract_all(r"Culprit rank \d+").list.eval(pl.element().str.extract(r"(\d+)").cast(pl.Int64)))
        .alias("ranks_ref"),
        pl.coalesce(
            pl.when(mismatch).then(_message_int(r"SequenceNumber=(\d+)")),
            pl.when(kind.is_in(["desync.report", "desync.lagging"])).then(_message_int(r"#(\d+)")),
        ).alias("seq"),
        pl.when(mismatch).then(pl.col("message").str.extract(r"OpType=(\w+)")).when(kind == "desync.report").then(
            pl.col("message").str.extract(r"Timeout at collective: (\w+)")
        ).alias("op"),
    )

def _listed_ranks(*patterns: str) -> pl.Expr:
    """The ranks of a `[1, 2]` / `{1, 2}` list (or one number) that the first matching pattern's group captures."""
    listed = pl.coalesce(*[pl.col("message").str.extract(pattern, 1) for pattern in patterns])
    return listed.str.extract_all(r"\d+").cast(pl.List(pl.Int64))


def _with_context(events: pl.DataFrame, lines: pl.DataFrame) -> pl.DataFrame:
    """Attach multi-line context to the lines that need it: tracebacks, `Last error:`, wrapped WorkNCCL.

    `lines` is the frame the events were classified from, and an event's `_at` its row there. The
    neighbours are found as row numbers over every line and their text gathered for the events only:
    no string column the size of the batch is copied.
    """
    stream = ["file", "pfx_rank", "pfx_host"]
    ctx = lines.select(*stream, "_at", pl.col("body").str.contains(_TRACEBACK_LINE).alias("tb"))
    ctx = ctx.with_columns(
        pl.col("tb").shift(1).over(stream).fill_null(False).alias("prev_tb"),
        *[pl.col("_at").shift(-k).over(stream).alias(f"_next{k}") for k in (1, 2, 3)],
    )
    ctx = ctx.with_columns((pl.col("tb") & ~pl.col("prev_tb")).cum_sum().over(stream).alias("block"))
    stripped = pl.col("body").str.strip_chars()
    stacks = (
        lines.select(*stream, "body")
        .filter(ctx.get_column("tb"))
        .with_columns(ctx.get_column("block").filter(ctx.get_column("tb")))
        .group_by([*stream, "block"])
        .agg(stripped.filter(stripped.str.len_chars() > 0).tail(40).str.join(" | ").alias("stack"))
    )
    near = ctx.select("prev_tb", "block", "_next1", "_next2", "_next3")[events.get_column("_at")]
    body = lines.get_column("body")
    nexts = pl.DataFrame({f"next{k}": body.gather(near.get_column(f"_next{k}")).str.strip_chars() for k in (1, 2, 3)})
    events = pl.concat([events, near.select("prev_tb", "block"), nexts], how="horizontal")
    events = events.join(stacks, on=[*stream, "block"], how="left", nulls_equal=True, maintain_order="left")
    last_error = pl.coalesce(
        *[
            pl.when(pl.col(n).str.starts_with("Last error:")).then(
                pl.when(pl.col(n).str.strip_prefix("Last error:").str.strip_chars().str.len_chars() > 0)
                .then(pl.col(n).str.strip_prefix("Last error:").str.strip_chars())
                .otherwise(pl.col(m))
            )
            for n, m in (("next1", "next2"), ("next2", "next3"))
        ]
    )
    last_error_quote = _last_error_quote()
    wrapped_work = pl.coalesce(
        *[pl.col(n).str.extract(r"(WorkNCCL\((?:[^()]|\(ms\))*\))") for n in ("next1", "next2")]
    )
    kind = pl.col("kind")
    events = events.with_columns(
        pl.when(pl.col("prev_tb")).then(pl.col("stack")).alias("stack"),
        last_error.alias("last_error"),
        wrapped_work.alias("next_work"),
    ).with_columns(
        pl.when(kind == "nccl.error_raised")
        .then(pl.col("last_error"))
        .when(kind == "nccl.last_error")
        .then(last_error_quote)
        .when(kind == "traceback.exception")
        .then(pl.col("stack"))
        # The WARN's source location tells which part of NCCL failed (`transport/nvls.cc:223`):
        # a generic `Cuda failure 999` from the NVLS transport is a fabric problem.
        .when(kind == "nccl.warn")
        .then(pl.col("body").str.extract(r"([\w/.\-]+\.(?:cc|cu|c|h|cpp|hpp):\d+) (?:\(\w+\) )?\**NCCL WARN"))
        .alias("detail")
    )
    return merge_wrapped_work(events)
