"""Stage 4, detect (support): how analyses name a set of ranks in a finding's summary."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def ranks_label(ranks: Iterable[int]) -> str:
    """`[0, 2, 3, 4, 7]` -> "ranks 0,2-4,7"; one rank -> "rank 5"."""
    ordered = sorted(set(ranks))
    prefix = "rank " if len(ordered) == 1 else "ranks "
    return prefix + compress_ranks(ordered)


def compress_ranks(ranks: Sequence[int]) -> str:
    """Sorted unique ints -> "0,2-63" (runs collapsed)."""
    from analyzer.detect import format_ranks  # detect imports the analysis registry at load time

    return format_ranks(list(ranks))

