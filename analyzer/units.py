"""Support for every stage: how a byte count is written in a summary, a table or a page (one spelling,
so an allocator's figures and a checkpoint's size read alike)."""

from __future__ import annotations


def byte_size(n: float | None) -> str:
    """A byte count as `1.50 GiB`, `12.00 MiB`, `512 B`; unknown is `?`."""
    if n is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
