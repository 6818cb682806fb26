"""Support for every stage: the caps that keep one hostile value from sizing an allocation or a loop.

An input may hold any number (a 30-digit rank, `time_created_ns=2**70`, `nranks 100000000`), any
object graph (a pickled list that holds itself twice per level: 600 bytes whose `str()` is 2**64
characters long) and names of any length. These helpers turn such values into invalid ones (None)
or into text of a bounded length that says what it cut, so parsers stay linear in their input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# The largest job believed: ranks, world sizes and rank lists beyond it are invalid values. Real
# jobs reach ~10^5 GPUs; a rank past this is a corrupt or hostile line, never a place to allocate up to.
MAX_WORLD_SIZE = 1 << 20
MAX_DIGITS = 40  # a number written with more digits is not parsed at all (int() of 10^6 digits is quadratic)
MAX_NAME_CHARS = 1024  # a file or member name as it enters the report
MAX_TEXT_CHARS = 4096  # one rendered value (a stack, a shape list, a message)
_ELIDED = "…"


class DecompressionLimit(Exception):
    """A compressed input or archive passed a size or ratio cap (a bomb, or more than is read).

    Raised by io's readers; declared here, below every stage, because `analyzer.exits` lists it among
    the input's errors.
    """


def int64(value: Any) -> int | None:
    """`value` as an int when it is an integer (or an integral numeric string) within int64, else None."""
    if type(value) is int:
        return value if INT64_MIN <= value <= INT64_MAX else None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() and INT64_MIN <= value <= INT64_MAX else None
    if isinstance(value, str | bytes):
        text = value.strip()
        if not text or len(text) > MAX_DIGITS:
            return None
        try:
            number = int(text)
        except ValueError:
            return None
        return number if INT64_MIN <= number <= INT64_MAX else None
    if isinstance(value, int):  # an int subclass
        return int64(int(value))
    return None


def rank_number(value: Any) -> int | None:
    """A rank (or world size) when it is a plausible one: 0 <= value < MAX_WORLD_SIZE (world sizes: <=)."""
    number = int64(value)
    return number if number is not None and 0 <= number <= MAX_WORLD_SIZE else None


def cap_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}{_ELIDED}[{len(text) - limit} more characters cut]"


def bounded_str(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """str() of a decoded value (containers of scalars) within `limit` characters, in time linear in `limit`.

    A list shared at every level of a pickle renders as 2**depth characters with plain str(): this
    walks the value with a budget, so a shared or self-referencing graph stops at the budget.
    """
    if isinstance(value, str):
        return cap_text(value, limit)
    if value is None or isinstance(value, bool | float) or (type(value) is int and -10**18 < value < 10**18):
        return str(value)
    out: list[str] = []
    budget = [limit]
    _render(value, out, budget, set(), 0)
    text = "".join(out)
    if budget[0] < 0:
        return text[:limit] + f"{_ELIDED}[cut at {limit} characters]"
    return text


def _emit(piece: str, out: list[str], budget: list[int]) -> bool:
    out.append(piece[: budget[0] + 1])
    budget[0] -= len(piece)
    return budget[0] >= 0


MAX_RENDER_DEPTH = 32


def _render(value: Any, out: list[str], budget: list[int], active: set[int], depth: int) -> bool:
    """Append value's text; False once the budget is spent. `active` holds the containers being
    rendered (a cycle prints `[...]`); below MAX_RENDER_DEPTH levels a container prints `[…]`."""
    if budget[0] < 0:
        return False
    if isinstance(value, str):
        return _emit(repr(value[: budget[0] + 2]), out, budget)
    if isinstance(value, int) and not isinstance(value, bool):
        return _emit(str(value) if -10**18 < value < 10**18 else f"<{value.bit_length()}-bit integer>", out, budget)
    if isinstance(value, list | tuple | set | frozenset | Mapping):
        if id(value) in active:
            return _emit("[...]", out, budget)
        if depth >= MAX_RENDER_DEPTH:
            return _emit("[…]", out, budget)
        active.add(id(value))
        try:
            if isinstance(value, Mapping):
                opening, closing = "{", "}"
                items = value.items()
            else:
                opening, closing = ("[", "]") if isinstance(value, list) else ("(", ")") if isinstance(value, tuple) else ("{", "}")
                items = value
            if not _emit(opening, out, budget):
                return False
            for index, item in enumerate(items):
                if index and not _emit(", ", out, budget):
                    return False
                if isinstance(value, Mapping):
                    key, val = item
                    if not (_render(key, out, budget, active, depth + 1) and _emit(": ", out, budget) and _render(val, out, budget, active, depth + 1)):
                        return False
                elif not _render(item, out, budget, active, depth + 1):
                    return False
            return _emit(closing, out, budget)
        finally:
            active.discard(id(value))
    if isinstance(value, bytes | bytearray):
        return _emit(repr(bytes(value[:64])) + ("…" if len(value) > 64 else ""), out, budget)
    return _emit(cap_text(str(value), max(budget[0], 0) + 1), out, budget)
