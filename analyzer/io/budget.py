"""Stage 1, io (support): the memory budget under which an untrusted input builds Python objects.

Whatever a hostile file makes a loader do (unpickling, JSON decoding), it gets MEMORY_BUDGET_BYTES of
new address space: the kernel's limit (RLIMIT_AS, soft limit only), raised back as soon as the load
returns, so a failed allocation is a MemoryError in the load, never a dead process. It is applied
only around code that allocates through Python's allocator (the C unpickler, the JSON decoder): a
Rust library (polars) aborts on a failed allocation instead of raising. Declared in io because the
restricted unpickler (io.safepickle) loads under it; parse's time budget (parse.budget) sits beside it.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Iterator

MEMORY_BUDGET_BYTES = 512 << 20


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
