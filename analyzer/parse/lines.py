"""Stage 2, parse (line layer): text chunks -> a frame of lines with wrapper prefixes peeled off.

One physical line can carry a collector timestamp, a launcher label (Slurm `N: `, pdsh `host: `,
MPI `[1,3]<stdout>:`, Ray `(Actor pid=N)`), torchrun's `[default0]:` tee prefix and PyTorch's
`[rankN]:` prefix before the payload. All of it is peeled with vectorised regexes. A line that
another process's record landed in (interleaved writers) is cut into logical lines; only those rare
lines, found by a vectorised test, are cut in Python.
"""

from __future__ import annotations

import io
import re

import polars as pl

from analyzer.io import InputFile, iter_text_chunks
from analyzer.parse.subsets import captured, spread

MAX_LINE_CHARS = 4096

_ANSI = r"\x1b\[[0-9;?]*[A-Za-z]|^\s*\[0m\s?"

# Wrapper layers in the order they stack, left to right. Each is optional.
_PREFIX = (
    r"^"
    # A collector's own clock, then its level column, `name || ` or the `host >> ` of a per-host stream (a
    # host name, as in a runner's labels below, carries a digit or a hyphen: `loss >> 0.3` is no host).
    r"(?:\s*(?P<collector_ts>\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?)(?:\s+\|\s+\w+\s+\|)?\s+"
    r"(?:\S+ \|\| |(?P<collector_host>[A-Za-z0-9][\w.\-]*[\d\-][\w.\-]*) >> )?)?"
    # syslog / journald short header (kern.log, /var/log/messages, `journalctl -k`): `Dec  2 10:43:35 host kernel: `,
    # `host tag[pid]: `; the tag must be `kernel` or carry a pid, so `Epoch 3: ...` is no header.
    r"(?:(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )?(?P<syslog_host>[\w.\-]+) (?:kernel|[\w.\-/]+\[\d+\]): )?"
    r"(?:\((?:[\w.]+ )?pid=(?P<ray_pid>\d+)(?:, ip=[\d.]+)?\)\s+)?"
    r"(?:\[(?:\d+,)?(?P<mpi_rank>\d+)\]<std(?:out|err)>:)?"  # Open MPI `[1,3]`, Horovod's Gloo driver `[3]`
    r"(?:\[(?P<bracket_rank>\d+)\]\s)?"
    r"(?:(?P<label_rank>\d{1,6}):\s)?"
    r"(?:\[(?P<acc_host>[\w.\-]+):(?P<acc_local>\d+)\]:\s*)?"
    r"(?:\[(?P<tee_role>[A-Za-z_]+?)(?P<tee_num>\d+)(?:\|\d+)?\]:)?"  # `[default0]:`, `[trainer0|0]:` (role|replica)
    r"(?:\[rank(?P<torch_rank>\d+)\]:\s?)?"
)

# pdsh / DeepSpeed runner labels (`worker-1: `). Ambiguous with `ValueError: msg`, so a name must
# carry a digit or a hyphen, and the file-level share of such lines decides whether to trust it.
_HOST_LABEL = r"^(?P<label_host>[A-Za-z0-9][\w.\-]*[\d\-][\w.\-]*):\s"
_HOST_LABEL_MIN_SHARE = 0.3
# Header words of RFC 822-style records (apt's history.log `Start-Date:` / `End-Date:`, `Content-Type:`) carry a
# hyphen too but are no host names.
_HEADER_WORD = r"^(?:[A-Z][a-z]+-)+[A-Z][a-z]+$"
# A shell prompt (`user@host:~$ nvidia-smi`, `[root@host dir]# cmd`, zsh's `user@host ~ % cmd`) names the
# machine whose output follows it in the same file: the host of the lines after it that name none. A conda or
# virtualenv prompt puts the environment's name first (`(base) user@host:/tmp$ ray start`).
_PROMPT_HOST = r"^(?:\([\w.\-]+\)\s)?\[?[a-z_][\w.\-]*@([A-Za-z0-9][\w.\-]*)(?::[^\s$#%]*|\s+[^\s$#%\]]+)?\]?\s?[$#%](?:\s|$)"


# Open MPI's process tags (`[host:pid] *** Process received signal ***`, `[host:pid] Read -1, ...`) and UCX's
# (`[host:pid :0:tid] Caught signal 11 (...)`) name the writer's host. Only read, not peeled: the tag is part
# of what those lines say. A C++ source location in brackets (`[socket.cpp:464] `) is no host.
_PROCESS_TAG = r"^\[([\w.\-]+):\d+(?: :\d+:\d+)?\] "
_SOURCE_FILE = r"\.(?:cpp|cc|cxx|c|h|hpp|cu|cuh|py)$"


def _process_tag_host() -> pl.Expr:
    host = pl.col("body").str.extract(_PROCESS_TAG, 1)
    return pl.when(host.str.contains(_SOURCE_FILE)).then(None).otherwise(host)


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
    files = [f for _, f, _ in chunks]
    # `_fid` numbers the files in order: a file's lines are contiguous, so per-file logic compares
    # neighbouring ids instead of grouping on the path strings.
    fids = pl.Series([f != g for f, g in zip(files, [None, *files])], dtype=pl.UInt32).cum_sum() - 1  # per chunk
    chunk = pl.int_range(len(files), eager=True, dtype=pl.UInt32).repeat_by(repeat).explode()  # per line
    return pl.DataFrame(
        {
            "line": offsets.gather(chunk) + pl.int_range(split.height, eager=True, dtype=pl.Int64),
            "text": _cleaned(split.get_column("text")),
            "file": pl.Series(files, dtype=pl.String).gather(chunk),
            "_fid": fids.gather(chunk),
        }
    )


def _cleaned(text: pl.Series) -> pl.Series:
    """A CRLF line loses its carriage return, a line past MAX_LINE_CHARS its tail: on the rows that
    need it only (a pass over every row would copy the whole batch's text)."""
    if text.null_count():
        text = text.fill_null("")
    needs = text.str.ends_with("\r") | (text.str.len_bytes() > MAX_LINE_CHARS)
    if not needs.any():
        return text
    rows = needs.arg_true()
    return text.scatter(rows, text.gather(rows).str.strip_suffix("\r").str.slice(0, MAX_LINE_CHARS))


_COLUMN_SEPARATOR = "\x1f"


def peel_prefixes(lines: pl.DataFrame, host_labels: bool = True) -> pl.DataFrame:
    """Add `body` (the payload) and the prefix-derived rank/host columns.

    `host_labels=False` leaves `host: ` heads in the payload (they are trusted per file, and a part
    cut out of a line is no file of its own: `split_interleaved`).
    """
    cleaned = pl.when(pl.col("text").str.contains(r"\x1b|\[0m", literal=False)).then(
        pl.col("text").str.replace_all(_ANSI, "")
    ).otherwise(pl.col("text"))
    frame = lines.with_columns(cleaned.alias("_clean"))
    clean = frame.get_column("_clean")
    body = clean.str.replace(_PREFIX, "").alias("body")
    frame = frame.with_columns(*_prefix_groups(clean, body), body)
    if host_labels:
        frame = _peel_host_labels(frame)
    else:
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("label_host"))
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
        pl.coalesce(
            pl.col("acc_host"), pl.col("label_host"), pl.col("syslog_host"), pl.col("collector_host"), _process_tag_host(),
            pl.col("body").str.extract(_PROMPT_HOST, 1).forward_fill().over("file"),
        ).alias("pfx_host"),
        int_col("ray_pid").alias("pfx_pid"),
    ).drop(
        "_clean", "ray_pid", "mpi_rank", "bracket_rank", "label_rank", "acc_host", "acc_local",
        "tee_role", "tee_num", "torch_rank", "label_host", "syslog_host", "collector_host",
    )


def read_peeled_lines(item: InputFile, max_lines: int, what: str) -> pl.DataFrame | None:
    """The lines of one whole text input, prefixes peeled (no host labels: a tool's own output), for
    parsers of a format whose files are short; None when it holds no text. The input is read in
    bounded chunks up to `max_lines`, and past them its reason says where `what` stopped being read."""
    pieces = []
    lines_read = 0
    for chunk in iter_text_chunks(item):
        pieces.append((chunk, item.path, lines_read + 1))
        lines_read += chunk.count("\n") + (0 if chunk.endswith("\n") else 1)
        if lines_read >= max_lines:
            item.reason = "; ".join(filter(None, [item.reason, f"{what} lines read up to line {max_lines}"]))
            break
    return peel_prefixes(lines_frame_many(pieces), host_labels=False) if pieces else None


def _prefix_groups(text: pl.Series, body: pl.Series) -> list[pl.Series]:
    """`_PREFIX`'s groups of each line: captured only on the lines that have a prefix (`body`, the
    line with `_PREFIX` cut off by a search, is shorter), since a group extraction costs ten times a
    search; a line without one has every group null (none can match empty)."""
    rows = (body.str.len_bytes() < text.str.len_bytes()).arg_true()
    return spread([(rows, captured(text, rows, _PREFIX))], text.len()).get_columns()


def _peel_host_labels(frame: pl.DataFrame) -> pl.DataFrame:
    """Trust `host: ` labels per file: a batch mixes files with and without a launcher's labels."""
    candidate = pl.col("body").str.extract(_HOST_LABEL, 1)
    candidate = pl.when(candidate.str.contains(_HEADER_WORD)).then(None).otherwise(candidate)
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


# --- interleaved writers ----------------------------------------------------------------------------
# Processes that share one file without line buffering splice a whole record into another's
# half-written line (`[rank0]:... Watchdog caught collective [rank1]:[E1130 ...] ... dump signal`,
# the rest of rank 0's line arriving on the next physical line). A record start inside a line's
# payload cuts the line into logical lines there. Each keeps the physical line number, so evidence
# still points at what a reader opens, and gets `part` 0, 1, ... in the order they were written.
#
# Record starts: torch's `[rankN]:` and torchrun's tee `[defaultN]:` (a lowercase role and a number:
# c10d's own `[Rank 0]`, `[Errno 2]` and `[0]` are text), an NCCL header up to its level
# (`host:pid:tid [dev] file.cc:N NCCL WARN`; a `host:pid` peer in a message has no such tail), and
# in a file whose lines carry srun labels, the `N: ` just before either. A start right after a quote
# (`"`, `'`, a backtick) is quoted text: an exception message, a source line, a README.
_WRAPPER = r"\[[a-z_]+\d+(?:\|\d+)?\]:"  # as `_PREFIX` reads the tee: `[trainer0|0]:` (role|replica)
_NCCL_TS = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\] "  # NCCL_DEBUG_TIMESTAMP_FORMAT's default
_NCCL_LEVEL = r" \[\d+\] (?:[\w/.\-]+\.(?:cc|cu|c|h|cpp|hpp):\d+ )?(?:\(\w+\) )?\**NCCL (?:INFO|WARN|TRACE|CALL|ERROR)\b"
_HOST = r"[\w.\-<>]"  # what classify's NCCL header accepts in a host name
_NCCL_HEADER = rf"{_HOST}+:\d+:\d+{_NCCL_LEVEL}"
_QUOTES = "\"'`"
# The vectorised test, on payloads holding a literal: a wrapper past the first character, or an
# NCCL header whose host name does not open the payload. Most hits, when there are any, are NCCL
# lines opening with a timestamp; the opening is stripped for a second test of those.
_SPLICE_LITERALS = ["]:", "NCCL "]
_SPLICE_INSIDE = rf"[^{_QUOTES}]{_WRAPPER}|[^\w.\-<>{_QUOTES}]{_NCCL_HEADER}"
_PAYLOAD_OPENING = rf"^\s*(?:{_NCCL_TS})?"
# The cut, vectorised: a mark before every record start (a chain of wrappers and what follows it is
# one start) and the character before it, which tells a start from a name's middle or a quote and
# goes back to the text before (`_writers`). No capture groups: the regex engine's fast path.
_MARK = "\x1f"  # never inside a line: `lines_frame_many` replaced it
_STARTS = rf"(?:{_WRAPPER})+(?:(?:{_NCCL_TS})?{_NCCL_HEADER})?|(?:{_NCCL_TS})?{_NCCL_HEADER}"
_MARK_STARTS = rf"[^{_QUOTES}](?:{_WRAPPER})+(?:(?:{_NCCL_TS})?{_NCCL_HEADER})?|[^\w.\-<>{_QUOTES}](?:{_NCCL_TS})?{_NCCL_HEADER}"
_MARK_LABELLED = rf"[^\d{_QUOTES}]\d{{1,6}}: (?:{_STARTS})|{_MARK_STARTS}"
_MARKED = _MARK + "${0}"
_LABELLED_LINE = r"^\d{1,6}: "
_LABEL_MIN_SHARE = 0.3  # as for host labels; the orphaned rests of spliced lines carry none
_NCCL_HOST_AT_START = rf"^\s*(?:{_NCCL_TS})?({_HOST}+):\d+:\d+{_NCCL_LEVEL}"
# The head of a part: its NCCL writer (host, pid:tid), if it is an NCCL record. The name's run of
# host characters is read whole (possessive: linear on a hostile line); `_junk_before_host` trims it.
_PART_HEAD = re.compile(
    rf"\s*(?P<label>\d{{1,6}}: )?(?P<wraps>(?:{_WRAPPER})*)(?P<ts>{_NCCL_TS})?(?:(?P<host>{_HOST}++):(?P<thread>\d+:\d+){_NCCL_LEVEL})?"
)
_OPENING_ONLY = re.compile(rf"\s*(?:{_NCCL_TS})?")
# A first writer cut inside its own NCCL header, just before the word after it (`n2:1:1 [0] NCCL I`
# + `n3:5:5 [0] NCCL WARN`): the head of that word runs into the second host's name.
_NCCL_HEAD_CUT = re.compile(
    rf"{_HOST}:\d+:\d+ \[\d+\] (?:[\w/.\-]+\.(?:cc|cu|c|h|cpp|hpp):\d+ )?(?:\(\w+\) )?\**(?:NCCL )?$"
)
_NCCL_WORDS = ("NCCL", "INFO", "WARN", "TRACE", "CALL", "ERROR")
_PEELED = ("collector_ts", "body", "pfx_rank", "pfx_local_rank", "pfx_host", "pfx_pid")


def split_interleaved(peeled: pl.DataFrame) -> pl.DataFrame:
    """Cut lines that carry another writer's record into logical lines; adds `part` (0 unless cut).

    Takes and returns `peel_prefixes` output, in the same order. The part before the first cut keeps
    the line's own prefixes; each later part is peeled on its own and takes the line's collector
    timestamp when it has none (the collector stamped the physical line).
    """
    part = pl.lit(0, dtype=pl.UInt32).alias("part")
    body = pl.col("body")
    flagged = peeled.filter(body.str.contains_any(_SPLICE_LITERALS)).filter(body.str.contains(_SPLICE_INSIDE))
    if flagged.height:
        flagged = flagged.filter(body.str.replace(_PAYLOAD_OPENING, "").str.contains(_SPLICE_INSIDE))
    if flagged.height == 0:
        return peeled.with_columns(part)
    indexed = peeled.with_row_index("_row")
    scope = indexed.filter(pl.col("file").is_in(flagged.get_column("file").unique().to_list()))
    labelled = (
        scope.group_by("file")
        .agg((pl.col("text").str.contains(_LABELLED_LINE).mean() >= _LABEL_MIN_SHARE).alias("labelled"))
    )
    known: dict[str, set[str]] = {}
    hosts = scope.select("file", body.str.extract(_NCCL_HOST_AT_START, 1).alias("host")).drop_nulls().unique()
    for file, host in hosts.iter_rows():
        known.setdefault(file, set()).add(host)
    marked = (
        scope.join(flagged.select("file", "line"), on=["file", "line"], how="semi")
        .join(labelled, on="file")
        .select(
            "_row", "file", "text",
            pl.when("labelled").then(body.str.replace_all(_MARK_LABELLED, _MARKED))
            .otherwise(body.str.replace_all(_MARK_STARTS, _MARKED)).alias("marked"),
        )
    )
    pieces: list[tuple[int, int, str, str]] = []  # (_row, part, text, body)
    for row, file, text, payload in marked.iter_rows():
        parts = _writers(payload.split(_MARK), known.get(file, set()))
        if len(parts) == 1:
            continue
        rest = len("".join(parts[1:]))
        clean = re.sub(_ANSI, "", text) if "\x1b" in text or "[0m" in text else text  # as peel_prefixes read it
        pieces.append((row, 0, clean[: len(clean) - rest], parts[0]))
        pieces.extend((row, i, piece, "") for i, piece in enumerate(parts[1:], start=1))
    if not pieces:
        return peeled.with_columns(part)
    cut = pl.DataFrame(
        pieces, schema={"_row": pl.UInt32, "part": pl.UInt32, "text": pl.String, "body": pl.String}, orient="row"
    )
    columns = ["_row", *peeled.columns, "part"]
    whole = indexed.filter(~pl.col("_row").is_in(cut.get_column("_row").unique().to_list())).with_columns(part)
    head = indexed.drop("text", "body").join(cut.filter(pl.col("part") == 0), on="_row")
    inherited = [c for c in peeled.columns if c not in (*_PEELED, "text", "line", "file")]
    tail = peel_prefixes(
        cut.filter(pl.col("part") > 0).drop("body").join(indexed.select("_row", "line", "file"), on="_row"),
        host_labels=False,  # a pdsh label is outermost: it never follows a spliced record's wrapper
    ).join(indexed.select("_row", *inherited, pl.col("collector_ts").alias("_line_ts")), on="_row")
    tail = tail.with_columns(pl.coalesce("collector_ts", "_line_ts").alias("collector_ts"))
    return pl.concat([f.select(columns) for f in (whole, head, tail)]).sort("_row", "part").drop("_row")


def _writers(parts: list[str], known_hosts: set[str]) -> list[str]:
    """The marked pieces of one payload, as the texts its writers wrote.

    Undoes the marks that are no second writer: one at the payload's opening (blanks or an NCCL
    timestamp before it), and an NCCL header of the thread whose record it lands in (one thread
    writes its lines whole; its own header again is no splice). Moves the head of a host-like run
    that belongs to the text before it (`_junk_before_host`).
    """
    for k in range(1, len(parts)):  # the character before each start is the text before's
        parts[k - 1], parts[k] = parts[k - 1] + parts[k][:1], parts[k][1:]
    if len(parts) > 1 and _OPENING_ONLY.fullmatch(parts[0]):
        parts = [parts[0] + parts[1], *parts[2:]]
    head = _PART_HEAD.match(parts[0])
    writer = (head["host"], head["thread"]) if head["host"] else None
    merged = [parts[0]]
    for piece in parts[1:]:
        head = _PART_HEAD.match(piece)
        if head["host"] is None:  # a wrapper (and whatever follows it)
            merged.append(piece)
            writer = None
            continue
        host = head["host"]
        if head.start("host") == 0:  # nothing delimits the name's head from the text before it
            junk = _junk_before_host(merged[-1], host, known_hosts)
            merged[-1], piece, host = merged[-1] + piece[:junk], piece[junk:], host[junk:]
        if (host, head["thread"]) == writer:
            merged[-1] += piece
        else:
            merged.append(piece)
        writer = (host, head["thread"])
    return merged


def _junk_before_host(before: str, run: str, known_hosts: set[str]) -> int:
    """How many leading characters of the host-like `run` are the tail of the text `before` it.

    A cut inside a word runs it into the second host's name (`collectivenode3`). A host that the
    file's own NCCL lines name settles it (the longest one ending the run); failing that, a first
    writer cut inside its own NCCL header leaves the head of the header's next word (`NCCL I`).
    """
    if run in known_hosts:
        return 0
    ending = [len(run) - len(host) for host in known_hosts if run.endswith(host)]
    if ending:
        return min(ending)
    if before.endswith(" ") and _NCCL_HEAD_CUT.search(before, max(0, len(before) - 1024)):
        longest = 0
        for word in _NCCL_WORDS:
            size = len(word)
            while size > longest and not (size < len(run) and run.startswith(word[:size])):
                size -= 1
            longest = max(longest, size)
        return longest
    return 0
