"""Stage 2, parse (Flight Recorder support): process-group membership as the dumps state it.

A dump's `pg_config` lists each process group's global ranks, in PG-rank order, as a JSON string
or a list; every dump of a job repeats the same strings, so their parse is cached. Field values are
bounded text (a hostile dump's name may be any length or any object).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import lru_cache

from analyzer.bounds import MAX_WORLD_SIZE, bounded_str, int64, rank_number


def field_text(value: object) -> str | None:
    if type(value) is str and len(value) <= 1024:
        return value
    return None if value is None else bounded_str(value, 1024)


def pg_members(pg_config: Mapping) -> dict[str, tuple[int, ...]]:
    members: dict[str, tuple[int, ...]] = {}
    for key, config in pg_config.items():
        if not isinstance(config, Mapping):
            continue
        ranks = config.get("ranks")
        if isinstance(ranks, str):
            parsed = _parse_ranks(ranks)  # every dump of a job repeats the same strings: cached
        elif isinstance(ranks, (list, tuple)):
            parsed = tuple(r for r in (rank_number(x) for x in ranks[:MAX_WORLD_SIZE]) if r is not None)
        else:
            continue
        members[field_text(config.get("name", key))] = parsed
        members.setdefault(field_text(key), parsed)
    return members


@lru_cache(maxsize=256)
def _parse_ranks(text: str) -> tuple[int, ...]:
    """`"[0, 1, ...]"` -> the ranks. At 16k ranks every dump carries the same 16k-element strings."""
    try:
        values = json.loads(text)
    except ValueError:
        values = re.findall(r"-?\d+", text)
    if not isinstance(values, list):
        return ()
    return tuple(r for r in (rank_number(x) for x in values[:MAX_WORLD_SIZE]) if r is not None)


# PG rank by global rank, per member tuple. `_parse_ranks` hands every dump of a job the same tuple
# object: found by identity first, since hashing a 16k-element tuple costs more than the rest of a
# lookup (the tuple is held here, so its id stays its own).
_BY_IDENTITY: dict[int, tuple[tuple[int, ...], dict[int, int]]] = {}


def _index_map(ranks: tuple[int, ...]) -> dict[int, int]:
    held = _BY_IDENTITY.get(id(ranks))
    if held is None or held[0] is not ranks:
        if len(_BY_IDENTITY) >= 256:
            _BY_IDENTITY.clear()
        held = _BY_IDENTITY[id(ranks)] = (ranks, _index_map_of(ranks))
    return held[1]


@lru_cache(maxsize=256)
def _index_map_of(ranks: tuple[int, ...]) -> dict[int, int]:
    return {g: i for i, g in enumerate(ranks)}


def pg_rank_of(ranks: tuple[int, ...] | None, rank: int | None) -> int | None:
    """The rank's index in the PG (its PG rank); global ranks are listed in PG-rank order."""
    if not ranks or rank is None:
        return None
    if len(ranks) <= 64:
        return ranks.index(rank) if rank in ranks else None
    return _index_map(ranks).get(rank)


def pg_sort_key(name: str | None) -> tuple[int, int, str]:
    number = int64(name) if name and name.isdigit() else None
    return (0, number, "") if number is not None else (1, 0, name or "")


def ranks_text(ranks: tuple[int, ...]) -> str:
    if len(ranks) <= 16:
        return "[" + ", ".join(map(str, ranks)) + "]"
    return f"[{ranks[0]}, {ranks[1]}, ... {ranks[-1]}] ({len(ranks)} ranks)"
