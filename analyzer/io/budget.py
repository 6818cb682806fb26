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
import errno
import resource
from collections.abc import Iterator

MEMORY_BUDGET_BYTES = 512 << 20
_ACTIVE_LIMITS: list[int] = []  # the limits address_space blocks set, innermost last

# How a refused allocation reads when the code that met it is not Python's allocator: the dynamic
# loader mapping a library imported late, a thread whose stack cannot be mapped.
_REFUSED_ALLOCATION_WORDS = ("failed to map segment", "cannot allocate memory", "can't start new thread",
                             "memory allocation of")


class BudgetExceeded(Exception):
    """An input needed more time or memory than its budget; `str()` says which, as the row's reason."""


def memory_budget_text() -> str:
    return f"exceeded the {MEMORY_BUDGET_BYTES >> 20} MB budget"


@contextlib.contextmanager
def address_space(extra: int | None = None) -> Iterator[None]:
    """At most `extra` (default MEMORY_BUDGET_BYTES) more bytes of address space inside the block
    (RLIMIT_AS, soft limit only).

    Raises BudgetExceeded for a MemoryError inside the block when this block's limit is the one that
    refused it; under a tighter limit set by an enclosing block, the MemoryError is the enclosing
    budget's and goes up unchanged. Where the limit cannot be read or set (not Linux, a lower hard
    limit), the block runs with whatever limit there is.
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
    binding = limit is not None and (soft == resource.RLIM_INFINITY or limit < soft)
    if limit is not None:
        _ACTIVE_LIMITS.append(limit)
    try:
        yield
    except MemoryError as exc:
        if not binding:
            raise
        raise BudgetExceeded(memory_budget_text()) from exc
    finally:
        if limit is not None:
            _ACTIVE_LIMITS.pop()
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def budget_active() -> bool:
    """Whether code runs inside an address_space block that set a limit."""
    return bool(_ACTIVE_LIMITS)


def is_refused_allocation(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, is an allocation an address-space limit refused,
    in whichever words the library that met it uses: MemoryError, ENOMEM, a loader or thread failure
    worded as memory, a Rust library's panic (pyo3 raises PanicException; Rust's allocator cannot
    return an error, so under a limit its panics are the limit's)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _reads_as_refused_allocation(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _reads_as_refused_allocation(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "PanicException":
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ENOMEM:
        return True
    text = str(exc).lower()
    return isinstance(exc, (ImportError, OSError, RuntimeError)) and any(w in text for w in _REFUSED_ALLOCATION_WORDS)
