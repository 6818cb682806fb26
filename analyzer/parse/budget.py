"""Stage 2, parse (support): the resource budget one input is parsed under.

Defence in depth behind the parsers' own caps: whatever a hostile file makes a parser do, it gets
MEMORY_BUDGET_BYTES of new address space for the loads that build Python objects from its bytes
(unpickling, JSON) and TIME_BUDGET_S of wall time, checked where the parsers loop (SQLite's
progress handler, trace blocks). A file over budget becomes an input row `skipped: exceeded the
N s / N MB budget` and the analysis goes on.

Everything stays in this process: `analyze` starts no process of its own (tests/test_no_network.py),
and the limit on address space is the kernel's (RLIMIT_AS), raised back as soon as the load
returns, so a failed allocation is a MemoryError in the load, never a dead process. It is applied
only around code that allocates through Python's allocator (the C unpickler, the JSON decoder):
a Rust library (polars) aborts on a failed allocation instead of raising.
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Iterator

import polars as pl

from analyzer.io import InputFile
from analyzer.events import empty_events

MEMORY_BUDGET_BYTES = 512 << 20
TIME_BUDGET_S = 60.0
_deadline: list[float] = []  # the current input's deadline (monotonic), innermost last


class BudgetExceeded(Exception):
    """An input needed more time or memory than its budget; `str()` says which, as the row's reason."""


def memory_budget_text() -> str:
    return f"exceeded the {MEMORY_BUDGET_BYTES >> 20} MB budget"


@contextlib.contextmanager
def address_space(extra: int | None = None) -> Iterator[None]:
    """At most `extra` (default MEMORY_BUDGET_BYTES) more bytes of address space inside the block
    (RLIMIT_AS, soft limit only).

    Raises BudgetExceeded for a MemoryError inside the block. Where the limit cannot be read or set
    (not Linux, a lower hard limit), the block runs with whatever limit there is.
    """
    extra = MEMORY_BUDGET_BYTES if extra is None else extra
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as fh:
            mapped = int(fh.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, AttributeError):
        soft = hard = None
    limit = None
    if soft is not None:
        limit = min([mapped + extra, *(x for x in (soft, hard) if x != resource.RLIM_INFINITY)])
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        except (OSError, ValueError):
            limit = None
    try:
        yield
    except MemoryError as exc:
        raise BudgetExceeded(memory_budget_text()) from exc
    finally:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


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
