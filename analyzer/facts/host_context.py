"""Stage 3, correlate: the host a line above names, for the lines of its file that name none.

A shell prompt (`(base) ray@worker-7:/tmp$ ray start`), a `Host: X` / `SLURMD_NODENAME=X` line, an
`=== X ===` banner of a per-node collection script: each says which machine the output after it
comes from, up to the next such line. The text parser recognises them as `host.context` lines
(rows of grammars/line_kinds.toml, each with a `host` group); here the named host is carried down
the file's events (a forward fill per file in line order) onto those without a host of their own,
and the context lines themselves are dropped: they are no event of the job, only where its lines
were written. A host a line writes itself (an NCCL header, a launcher label) always wins.
"""

from __future__ import annotations

import re
from functools import cache

import polars as pl

from analyzer.parse.line_kinds import line_kinds

CONTEXT_KIND = "host.context"
# torchrun's failure table names the host by `socket.getfqdn()`, often `localhost`, and a prompt on a
# machine left unnamed says `user@localhost`: a loopback name is no machine, and ends a context.
LOOPBACK_NAMES = ["localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "127.0.0.1", "::1"]


class HostContextError(ValueError):
    """A `host.context` row of the line-kind registry has no `host` group to read the name from."""


@cache
def context_patterns() -> tuple[tuple[str, int], ...]:
    """(pattern, index of its `host` group) of every `host.context` row of the registry."""
    rows = []
    for row in line_kinds():
        if row.kind != CONTEXT_KIND:
            continue
        group = re.compile(row.pattern).groupindex.get("host")
        if group is None:
            raise HostContextError(f"line_kinds.toml: a {CONTEXT_KIND!r} row has no (?P<host>...) group: {row.pattern}")
        rows.append((row.pattern, group))
    return tuple(rows)


def hosts_from_context(events: pl.DataFrame) -> pl.DataFrame:
    """Events without a host take the host of the nearest context line above them in their file."""
    is_context = pl.col("kind") == CONTEXT_KIND
    if events.filter(is_context).height == 0:
        return events
    # From the line's own text: the host column may hold an earlier prompt's name, carried by the line layer.
    named = pl.coalesce(*[pl.col("message").str.extract(pattern, group) for pattern, group in context_patterns()])
    # "" marks a context line whose name is unusable (loopback): it ends the previous context.
    usable = pl.when(named.str.to_lowercase().is_in(LOOPBACK_NAMES)).then(pl.lit("")).otherwise(named.fill_null(""))
    context = pl.when(is_context).then(usable).forward_fill().over("file")
    return (
        events.sort("file", "line", nulls_last=True, maintain_order=True)
        .with_columns(pl.coalesce(pl.col("host"), pl.when(context != "").then(context)).alias("host"))
        .filter(~is_context)
    )
