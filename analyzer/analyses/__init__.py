"""Cross-rank analyses (part of stage 4, detect) that a per-event pattern cannot express.

Each analysis is a function `(events, job) -> findings frame` registered here under the name that
catalogue rules cite in their `analysis = "..."` field. They read canonical event columns only,
use polars expressions over them, and return frames built with `analyzer.findings`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl


@dataclass(frozen=True)
class JobContext:
    """Job facts derived by correlate that analyses need."""

    world_size: int | None = None
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    rank_hosts: dict[int, str] = field(default_factory=dict)
    end_ts: object | None = None  # latest timestamp seen anywhere in the job
    root: str | None = None  # the analysed path (read-only), for analyses that inspect files themselves
    checkpoint_paths: tuple[str, ...] = ()  # extra checkpoint locations given with --checkpoint


Analysis = Callable[[pl.DataFrame, JobContext], pl.DataFrame]

ANALYSES: dict[str, Analysis] = {}


def register(name: str) -> Callable[[Analysis], Analysis]:
    def wrap(fn: Analysis) -> Analysis:
        ANALYSES[name] = fn
        return fn

    return wrap


def load_all() -> dict[str, Analysis]:
    """Import the analysis modules so that they register themselves."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    return ANALYSES
