"""Stage 2, parse: turn every discovered input into canonical events.

`parse_inputs` dispatches each input to the parser of its format and isolates failures: a file
that cannot be parsed (an exception of `analyzer.exits.INPUT_ERRORS`) is marked in the input table
with the reason, and the job goes on. Any other exception is a parser bug and propagates: an
analyzer fault must never pass for "this file held nothing".
"""

from __future__ import annotations

import polars as pl

from analyzer.io import InputFile
from analyzer.events import concat_events, empty_events
from analyzer.exits import INPUT_ERRORS
from analyzer.parse.budget import parse_within_budget


def _parse_error_json(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.structured import parse_error_json

    return parse_error_json(item)


def _parse_flight_recorder(item: InputFile, doc: object | None = None, total_entries: int | None = None, *, as_rows: bool = False):
    """A dump's events: a frame, or with `as_rows` its column lists (a pool worker builds one frame
    for its whole chunk of dumps)."""
    from analyzer.parse.flight_recorder import flight_recorder_rows, rows_frame

    rows, info = flight_recorder_rows(item, doc, total_entries)
    if info.get("status"):
        item.status = info["status"]
        item.reason = info.get("reason", "")
    if rows is None:
        return empty_events()
    return rows if as_rows else rows_frame([rows])


def _parse_pyspy_text(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.pyspy import parse_pyspy_text

    return parse_pyspy_text(item)


def _parse_gdb_text(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.gdb import parse_gdb_text

    # The stacks, and the lines as text too: a frame's symbol can be a line kind or vocabulary text
    # (ProcessGroupNCCL's workCleanupLoop, an NCCL call) that the signatures read.
    stacks = parse_gdb_text(item)
    if item.status != "pending":
        return stacks
    return concat_events([stacks, *_parse_text_batches([item])])


def _parse_pyspy_json(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.pyspy import parse_pyspy_json

    return parse_pyspy_json(item)


def _parse_capture_manifest(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.capture_manifest import parse_capture_manifest

    return parse_capture_manifest(item)


def _parse_pickle(item: InputFile, *, as_rows: bool = False):
    """A pickle is a CUDA memory snapshot or a Flight Recorder dump: decided by its content, which is
    unpickled once (unpickling is most of the cost of a dump, and a 16k-rank job has 16k of them).
    A large dump of a known layout is decoded in part: only the entries the analysis keeps."""
    from analyzer.parse.flight_recorder import ENTRIES_KEPT_PER_PG
    from analyzer.parse.fr_partial import load_recent_entries
    from analyzer.parse.memsnapshot import is_memory_snapshot, load_pickle, snapshot_events

    recent = load_recent_entries(item, ENTRIES_KEPT_PER_PG)
    if recent is not None:
        return _parse_flight_recorder(item, recent.doc, recent.total, as_rows=as_rows)
    try:
        doc = load_pickle(item)
    except INPUT_ERRORS:  # the Flight Recorder parser reads it again and says why, in its words
        doc = None
    if doc is not None and is_memory_snapshot(doc):
        item.format = "memory_snapshot"
        return snapshot_events(doc, file=item.path, rank=item.rank_hint)
    return _parse_flight_recorder(item, doc, as_rows=as_rows)


def _parse_kineto(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.kineto import parse_kineto

    return parse_kineto(item)


def _parse_nsys_sqlite(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.nsys import NotNsysExport, parse_nsys_sqlite

    try:
        return parse_nsys_sqlite(item)
    except NotNsysExport as exc:
        item.skip(str(exc))
        return empty_events()


def _parse_nsys_stats_csv(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.nsys import parse_nsys_stats_csv

    return parse_nsys_stats_csv(item)


TEXT_FORMATS = ("text", "text-utf16", "nccl_tests", "p2p_test")  # nccl-tests output holds NCCL_DEBUG lines too

def _parse_collect_env(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.collect_env import parse_collect_env

    return parse_collect_env(item)


def _parse_pip_listing(item: InputFile) -> pl.DataFrame:
    from analyzer.parse.collect_env import parse_pip_listing

    return parse_pip_listing(item)


PARSERS = {
    "error_json": _parse_error_json,
    "pickle": _parse_pickle,
    "flight_recorder_json": _parse_flight_recorder,
    "pyspy_text": _parse_pyspy_text,
    "pyspy_json": _parse_pyspy_json,
    "gdb_backtrace": _parse_gdb_text,
    "capture_manifest": _parse_capture_manifest,
    "kineto_trace": _parse_kineto,
    "nsys_sqlite": _parse_nsys_sqlite,
    "nsys_stats_csv": _parse_nsys_stats_csv,
    "collect_env": _parse_collect_env,
    "pip_freeze": _parse_pip_listing,
}

UNREAD_FORMATS = {
    "json": "JSON document of a kind this version does not read",
}


def parse_input(item: InputFile, parser=None) -> pl.DataFrame:
    """Events of one input; never raises for bad content (the reason lands on `item`). `parser`
    replaces the format's own (a pool worker's, which leaves a dump's events as rows)."""
    if item.status != "pending":
        return empty_events()
    if item.format in TEXT_FORMATS:
        return concat_events([*_parse_text_batches([item]), *_parse_nccl_tests([item]), *_parse_p2p_tests([item])])
    parser = parser or PARSERS.get(item.format)
    if parser is None:
        item.skip(UNREAD_FORMATS.get(item.format, f"format {item.format!r} is not read"))
        return empty_events()
    try:
        events = parse_within_budget(item, parser)  # over its time or memory budget: skipped, with the reason
    except INPUT_ERRORS as exc:  # a bad file must never abort the job
        item.skip(f"could not parse: {type(exc).__name__}: {exc}"[:500], status="error")
        return empty_events()
    if item.status == "pending":
        item.status = "partial" if item.unparsed_lines and not events.height else "parsed"
        if item.status == "partial":
            item.reason = "no line of a known format"
    if isinstance(events, pl.DataFrame):
        item.ranks = events.get_column("rank").drop_nulls().unique().sort().to_list() if events.height else []
    else:  # a dump's rows (flight_recorder.DumpRows)
        item.ranks = events.ranks
    return events


BATCH_BYTES = 32 << 20  # small files are parsed together: per-call overhead dominates at 16k ranks


def parse_inputs(items: list[InputFile]) -> pl.DataFrame:
    text_items = [i for i in items if i.status == "pending" and i.format in TEXT_FORMATS]
    # By identity: `in` on a list compares dataclasses field by field, O(n^2) at 100k files.
    chosen = {id(i) for i in text_items}
    others = [i for i in items if id(i) not in chosen]
    return concat_events([*_parse_text_batches(text_items), *_parse_nccl_tests(text_items), *_parse_p2p_tests(text_items),
                          *_parse_others(others)])


def _parse_nccl_tests(items: list[InputFile]) -> list[pl.DataFrame]:
    """nccl-tests result tables, after the text parser read the same files' log lines."""
    from analyzer.parse.nccltests import parse_nccl_tests

    return _parse_tables(items, "nccl_tests", parse_nccl_tests, "nccl-tests tables")


def _parse_p2p_tests(items: list[InputFile]) -> list[pl.DataFrame]:
    """The CUDA samples' p2p test matrices, after the text parser read the same files' lines."""
    from analyzer.parse.p2ptest import parse_p2p_test

    return _parse_tables(items, "p2p_test", parse_p2p_test, "p2p test matrices")


def _parse_tables(items: list[InputFile], fmt: str, parse, what: str) -> list[pl.DataFrame]:
    frames = []
    for item in (i for i in items if i.format == fmt and i.status != "error"):
        try:
            events, own = parse(item)
        except INPUT_ERRORS as exc:  # a bad table must never abort the job; its log lines were read
            item.status = "partial"
            item.reason = f"{what} not read: {type(exc).__name__}: {exc}"[:500]
            continue
        item.unparsed_lines = max(item.unparsed_lines - own, 0)  # its table lines are read, not unknown
        if item.status == "partial" and item.reason == "no line of a known format" and item.unparsed_lines < item.lines:
            item.status, item.reason = "parsed", ""
        frames.append(events)
    return frames


# --- Flight Recorder dumps in parallel ------------------------------------------------------------
# One dump per rank, each a pickle that is mostly unpickling (CPU-bound, under the GIL): at 16k ranks
# that is the bulk of a job's analysis, so many dumps are parsed in spawned worker processes. Below
# POOL_MIN_DUMPS a fresh interpreter importing polars costs more than it saves. Events keep the
# sequential order (a chunk is a run of consecutive dumps), so the report does not depend on the
# number of cores.
POOLED_FORMATS = ("pickle", "flight_recorder_json")
POOL_MIN_DUMPS = 256
POOL_MAX_CHUNK = 1024
FRAME_DUMPS = 128  # a worker turns the column lists of this many dumps into one frame at a time


def _parse_others(items: list[InputFile]) -> list[pl.DataFrame]:
    pooled = [i for i in items if i.status == "pending" and i.format in POOLED_FORMATS]
    workers = _pool_workers(len(pooled))
    if workers < 2:
        return [parse_input(item) for item in items]
    # Runs of consecutive pooled inputs, cut into chunks of about n / (4 x workers).
    size = max(1, min(POOL_MAX_CHUNK, -(-len(pooled) // (4 * workers))))
    units: list[InputFile | list[InputFile]] = []
    for item in items:
        if item.status == "pending" and item.format in POOLED_FORMATS:
            if units and isinstance(units[-1], list) and len(units[-1]) < size:
                units[-1].append(item)
            else:
                units.append([item])
        else:
            units.append(item)
    chunks = [u for u in units if isinstance(u, list)]
    results = _run_pool(chunks, workers)
    frames = []
    for unit in units:
        if not isinstance(unit, list):
            frames.append(parse_input(unit))
            continue
        result = results.get(id(unit))
        if result is None:  # the pool failed: this chunk is parsed here
            frames.extend(parse_input(item) for item in unit)
            continue
        events, states = result
        for item, (status, reason, fmt, ranks, lines, unparsed) in zip(unit, states):
            item.status, item.reason, item.format, item.ranks = status, reason, fmt, ranks
            item.lines, item.unparsed_lines = lines, unparsed
        frames.append(events)
    return frames


def _pool_workers(n_dumps: int) -> int:
    import multiprocessing
    import os

    if n_dumps < POOL_MIN_DUMPS or multiprocessing.parent_process() is not None:
        return 1  # few dumps, or already inside a worker (a `scan` job): no nested pools
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return min(cores, 8, -(-n_dumps // 64))


def _run_pool(chunks: list[list[InputFile]], workers: int) -> dict[int, tuple[pl.DataFrame, list[tuple]]]:
    """Parse chunks in `workers` spawned processes; a chunk whose worker failed is left out of the
    result (the caller parses it itself), so a broken pool costs time, never inputs."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    results: dict[int, tuple[pl.DataFrame, list[tuple]]] = {}
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [(id(chunk), pool.submit(_parse_chunk, chunk)) for chunk in chunks]
            for key, future in futures:
                try:
                    results[key] = future.result()
                except Exception:  # noqa: BLE001 - a dead worker, an unpicklable result: parse it here
                    # (a parser bug in the worker is raised again by the parse here, so it is not lost)
                    continue
    except (OSError, RuntimeError):  # no processes to be had (limits, sandbox): parse here
        pass
    return results


def _parse_chunk(items: list[InputFile]) -> tuple[pl.DataFrame, list[tuple]]:
    """Worker side: the chunk's events in order, one frame for all its dumps, and each input's
    resulting table fields."""
    from analyzer.parse.flight_recorder import rows_frame

    frames: list[pl.DataFrame] = []
    rows: list = []
    for item in items:
        parser = (lambda i: _parse_pickle(i, as_rows=True)) if item.format == "pickle" else None
        events = parse_input(item, parser)
        if isinstance(events, pl.DataFrame):
            if events.height:  # a memory snapshot or a JSON dump: after the dumps before it
                frames += [rows_frame(rows), events] if rows else [events]
                rows = []
        else:
            rows.append(events)
            if len(rows) == FRAME_DUMPS:  # Python lists of a whole chunk would slow every GC pass
                frames.append(rows_frame(rows))
                rows = []
    if rows:
        frames.append(rows_frame(rows))
    return concat_events(frames), [(i.status, i.reason, i.format, i.ranks, i.lines, i.unparsed_lines) for i in items]


def _parse_text_batches(items: list[InputFile]) -> list[pl.DataFrame]:
    """Read text inputs chunk by chunk into batches of about BATCH_BYTES and parse each batch at once
    (a large input's batches on two cores: `textpool.py`)."""
    if not items:
        return []  # importing the text parser compiles its vocabularies: seconds a dump-only job never needs
    from analyzer.parse.logtext import iter_pieces, year_hint_for
    from analyzer.parse.textpool import BatchParser, worker_wanted

    parser = BatchParser(parse_text_batch, worker_wanted(sum(i.size for i in items)))
    batch: list = []
    size = 0
    batches_of: dict[int, int] = {}  # by input: how many batches its pieces went into

    def flush() -> None:
        nonlocal batch, size
        if batch:
            parser.add(batch, year_hint_for(batch[0].item))
            for key in {id(p.item) for p in batch}:
                batches_of[key] = batches_of.get(key, 0) + 1
        batch, size = [], 0

    for item in items:
        try:
            for piece in iter_pieces(item):
                batch.append(piece)
                size += len(piece.text)
                if size >= BATCH_BYTES:
                    flush()
        except INPUT_ERRORS as exc:  # unreadable bytes (truncated gzip, bomb) fail this file only
            batch = [p for p in batch if p.item is not item]
            item.skip(f"could not read: {type(exc).__name__}: {exc}"[:500], status="error")
    flush()
    frames = parser.frames()
    for item in items:
        _finish(item)
    return _merged_across_batches(frames, [i.path for i in items if batches_of.get(id(i), 0) > 1])


def parse_text_batch(batch: list, year_hint: int) -> pl.DataFrame:
    from analyzer.parse.logtext import parse_text_pieces

    return _parse_batch(batch, parse_text_pieces, year_hint)


def _merged_across_batches(frames: list[pl.DataFrame], split_files: list[str]) -> list[pl.DataFrame]:
    """A file longer than a batch is aggregated batch by batch: its collapsed groups that a batch
    boundary cut are merged again, so its event count does not depend on where batches end."""
    if not split_files:
        return frames
    from analyzer.parse.repeats import merge_split_groups

    events = concat_events(frames)
    split = pl.col("file").is_in(split_files)
    return [events.filter(~split), merge_split_groups(events.filter(split))]


def _parse_batch(batch: list, parse, year_hint: int) -> pl.DataFrame:
    try:
        return parse(batch, year_hint)
    except INPUT_ERRORS as exc:  # a line the parser cannot take fails its batch's files, never the job
        by_item: dict[int, list] = {}
        for piece in batch:
            by_item.setdefault(id(piece.item), []).append(piece)
        if len(by_item) > 1:
            # One hostile line must not cost the other files of its batch: retry them one by one.
            return concat_events([_parse_batch(pieces, parse, year_hint) for pieces in by_item.values()])
        for piece in batch:
            piece.item.skip(f"could not parse: {type(exc).__name__}: {exc}"[:500], status="error")
        return empty_events()


def _finish(item: InputFile) -> None:
    if item.status == "pending":
        item.status = "parsed" if item.lines == 0 or item.unparsed_lines < item.lines else "partial"
        if item.status == "partial":
            item.reason = "no line of a known format"
