"""Stage 2, parse (text logs): the batches of a large text input parsed on two cores.

The main process reads the inputs and cuts them into batches exactly as it does alone; a batch
goes to one spawned worker process while the worker is free, and is parsed here otherwise, and the
results are taken in batch order. So the events are those of a sequential parse: no batch boundary
moves, and a slow or busy worker only means this process parses more. A worker costs an
interpreter start and the registries' build (a few CPU seconds), so below POOL_MIN_TEXT_BYTES of
text, or inside a worker already (a `scan` job), everything stays in this process.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace

import polars as pl

POOL_MIN_TEXT_BYTES = 256 << 20
_IN_FLIGHT = 1  # batches queued at the worker beyond the one it parses: bounds the text held here

ParseBatch = Callable[[list, int], pl.DataFrame]  # (pieces, year hint) -> events


def worker_wanted(text_bytes: int) -> bool:
    if text_bytes < POOL_MIN_TEXT_BYTES or multiprocessing.parent_process() is not None:
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores >= 2


class BatchParser:
    """Parses batches in order, here or in one worker; `frames()` returns their events in order."""

    def __init__(self, parse_batch: ParseBatch, use_worker: bool) -> None:
        self._parse = parse_batch
        self._pool: ProcessPoolExecutor | None = None
        if use_worker:
            try:
                self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            except (OSError, RuntimeError):  # no processes to be had (limits, sandbox): parse here
                self._pool = None
        self._results: list[pl.DataFrame | tuple[Future, list, int]] = []

    def add(self, batch: list, year_hint: int) -> None:
        if self._pool is not None and self._worker_free():
            try:
                future = self._pool.submit(parse_in_worker, _shipped(batch), year_hint)
                self._results.append((future, batch, year_hint))
                return
            except RuntimeError:  # the pool broke: parse here from now on
                self._pool = None
        self._results.append(self._parse(batch, year_hint))

    def _worker_free(self) -> bool:
        pending = sum(1 for r in self._results if isinstance(r, tuple) and not r[0].done())
        return pending <= _IN_FLIGHT

    def frames(self) -> list[pl.DataFrame]:
        frames = []
        for result in self._results:
            if isinstance(result, pl.DataFrame):
                frames.append(result)
                continue
            future, batch, year_hint = result
            try:
                events, states = future.result()
            except Exception:  # noqa: BLE001 - a dead worker, an unpicklable result: parse it here
                frames.append(self._parse(batch, year_hint))
                continue
            for item, (lines, unparsed, skipped) in zip(_items_of(batch), states):
                item.lines += lines
                item.unparsed_lines += unparsed
                if skipped:
                    item.status, item.reason = skipped
            frames.append(events)
        if self._pool is not None:
            self._pool.shutdown()
        self._results = []
        return frames


def parse_in_worker(batch: list, year_hint: int) -> tuple[pl.DataFrame, list[tuple]]:
    """Worker side: the batch's events, and per input (in first-piece order) the lines it added and,
    if the parse failed it, its new status and reason (else None: the main process's stand)."""
    from analyzer.parse import parse_text_batch

    items = _items_of(batch)
    before = [(i.lines, i.unparsed_lines, i.status, i.reason) for i in items]
    events = parse_text_batch(batch, year_hint)
    return events, [
        (i.lines - n, i.unparsed_lines - u, (i.status, i.reason) if (i.status, i.reason) != (s, r) else None)
        for i, (n, u, s, r) in zip(items, before)
    ]


def _items_of(batch: list) -> list:
    return list({id(p.item): p.item for p in batch}.values())


def _shipped(batch: list) -> list:
    """The batch as sent to the worker: its inputs without the bytes they hold (already read)."""
    light = {id(i): replace(i, _payload=None, _held=None, _head=None) for i in _items_of(batch)}
    return [replace(p, item=light[id(p.item)]) for p in batch]
