"""Cross-rank analyses (part of stage 4, detect) that a per-event pattern cannot express.

Each analysis is a function `(events, job) -> findings frame` registered here under the name that
catalogue rules cite in their `analysis = "..."` field. They read canonical event columns only,
use polars expressions over them, and return frames built with `analyzer.findings`.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

# Built by correlate (`JobFacts.context()`): every analysis takes it, so the analyses name it from here.
from analyzer.facts.correlate import JobContext

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
