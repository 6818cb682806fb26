"""Shared leaf below every stage: how a set of ranks is written in prose.

Analyses name ranks in their summaries, the report assembler in its headline and the renderers in
their tables; all of them write `0,2-4,7` the same way, so the one spelling lives here, where each
of those stages may import it.
"""

from __future__ import annotations

from collections.abc import Iterable


def format_ranks(ranks: Iterable[int]) -> str:
    """`[0, 2, 3, 4, 7]` -> `0,2-4,7`."""
    spans: list[str] = []
    start = prev = None
    for r in sorted(set(ranks)):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        spans.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(spans)


def ranks_label(ranks: Iterable[int]) -> str:
    """`[0, 2, 3, 4, 7]` -> "ranks 0,2-4,7"; one rank -> "rank 5"."""
    ordered = sorted(set(ranks))
    return ("rank " if len(ordered) == 1 else "ranks ") + format_ranks(ordered)
