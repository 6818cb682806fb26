"""Stage 2, parse (support): the resource budget one input is parsed under.

Defence in depth behind the parsers' own caps: whatever a hostile file makes a parser do, it gets
TIME_BUDGET_S of wall time, checked where the parsers loop (SQLite's progress handler, trace blocks),
and io.budget's memory budget for the loads that build Python objects from its bytes. A file over
either becomes an input row `skipped: exceeded the N s / N MB budget` and the analysis goes on.
Everything stays in this process: `analyze` starts no process of its own (tests/test_no_network.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import polars as pl

from analyzer.io import InputFile
from analyzer.events import empty_events
from analyzer.io.budget import BudgetExceeded, memory_budget_text

TIME_BUDGET_S = 60.0
_deadline: list[float] = []  # the current input's deadline (monotonic), innermost last


def check_time() -> None:
    """Raise BudgetExceeded when the input being parsed is past its time budget (cheap: call it in loops)."""
    if _deadline and time.monotonic() > _deadline[-1]:
        raise BudgetExceeded(f"exceeded the {TIME_BUDGET_S:.0f} s budget")


def time_left() -> float | None:
    return max(0.0, _deadline[-1] - time.monotonic()) if _deadline else None


def parse_within_budget(item: InputFile, parse: Callable[[InputFile], pl.DataFrame]) -> pl.DataFrame:
    """`parse(item)` under the time budget; over any budget, the input is skipped with the reason."""
    _deadline.append(time.monotonic() + TIME_BUDGET_S)
    try:
        return parse(item)
    except BudgetExceeded as exc:
        item.skip(str(exc))
        return empty_events()
    except MemoryError:
        item.skip(memory_budget_text())
        return empty_events()
    finally:
        _deadline.pop()
