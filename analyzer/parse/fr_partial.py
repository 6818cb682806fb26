"""Stage 2, parse (support): decode only the part of a Flight Recorder pickle the analysis keeps.

A full ring buffer is thousands of entries, of which `flight_recorder._recent_per_pg` keeps the
newest ENTRIES_KEPT_PER_PG of each process group; unpickling the rest is most of a dump's cost at
16k ranks. Here one restricted load (`analyzer.io.safepickle`: every global refused, the same
memory budget) reads the pickle with its middle entries cut out: the header and the first
entries (they define the memo: keys, strings and shared frame dicts the later entries refer to),
then the newest entries and everything after them. The first PREFIX_STEPS[0] entries are tried
first; a tail that refers to a memo entry they do not define (a stack or an op name first written
later) fails that load, and the next step tries more of them. Entries are found by their
byte signature: every entry dict of a protocol-2 dump (PyTorch's C++ pickler, or Python's) opens
with EMPTY_DICT, an optional memo PUT, MARK and a memo GET of its first key.

Any surprise gives None and the caller does the full load: another protocol or layout, a version
whose entries are not the 2.x dicts, a signature that cannot be placed, a memo reference into the
cut-out part (the loader refuses it), any load error, and a result that fails the checks below.
What is checked proves the cut is at entry boundaries and loses nothing the analysis reads:

* the entries decoded are dicts, as many as signatures were cut at (a signature inside a string or
  a number where the cut is searched for leaves one entry short), and their `record_id`s run
  without a gap on each side of the cut, so the first and last ids give the number of entries in
  the buffer;
* each entry's process group is written as GETs of the `process_group` key, the group's name and
  its desc, then TUPLE2; those byte patterns, counted over the list, must add up to that number, so
  every cut-out entry belongs to a group that was decoded (an entry of another group, or one gap
  in the record ids, and the sum is off); and every group with entries cut out keeps its newest
  `keep` entries in the tail (else the tail is widened once, to the oldest of those entries).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from analyzer.io import InputFile
from analyzer.io.safepickle import load_bounded, restricted_unpickler

# First entries decoded for the memo, tried in turn: the first few define what a steady training
# loop's entries refer to; more cover a loop of many distinct collectives and stacks.
PREFIX_STEPS = (8, 32)
MIN_BYTES = 64 << 10  # smaller dumps hold a few hundred entries at most: the full load is cheap
MAX_BYTES = 64 << 20  # read whole into memory (real dumps are a few MB; larger ones stream in full)
# The FR layouts whose entries carry `record_id` and a (name, desc) `process_group`: PyTorch's `version_val`
# from 2.2 (PyTorch 2.4) to 2.10 (2.10/2.11); flight_recorder.py says where the versions are defined.
KNOWN_VERSIONS = frozenset({"2.2", "2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10"})

_PROTOCOL_2 = b"\x80\x02"
_ENTRIES_KEY = b"X\x07\x00\x00\x00entries"  # BINUNICODE 'entries'
_PG_KEY = "process_group"
_PG_KEY_BYTES = b"X\x0d\x00\x00\x00process_group"  # BINUNICODE 'process_group'


@dataclass
class RecentEntries:
    """A dump's header with the entries the analysis keeps (and the first ones); `total`: all entries."""

    doc: dict
    total: int
    prefix: int  # the first entries decoded (for the memo); the rest of `doc["entries"]` is the tail


@dataclass
class _Layout:
    start: int  # offset of the first entry
    mark: bytes  # MARK + GET of the first key: the fixed part of every later entry's signature
    put: bool  # entry dicts are memoized (Python's pickler): a PUT sits between EMPTY_DICT and MARK
    first_matches: bool  # the first entry's own first key is a GET (defined before the list)


def load_recent_entries(item: InputFile, keep: int) -> RecentEntries | None:
    """The newest `keep` entries per process group of a large protocol-2 dump, or None (full load)."""
    if item.size < MIN_BYTES or item.size > MAX_BYTES or item.format != "pickle":
        return None
    try:
        try:
            data = item.read_all(item.size)  # sized to the file: a 64 MB read buffer costs more than the read
        except ValueError:  # more bytes than its size: a compressed dump
            data = item.read_all(MAX_BYTES)
    except (OSError, ValueError, EOFError):
        return None  # the full load reads it again and says why
    return decode_recent(data, keep)


def decode_recent(data: bytes, keep: int) -> RecentEntries | None:
    """See the module docstring; None on any surprise."""
    if data[:2] != _PROTOCOL_2:
        return None
    layout = _layout(data)
    if layout is None:
        return None
    tail = _entry_from_end(data, layout, keep)
    for prefix in PREFIX_STEPS:
        cut = _nth_entry(data, layout, prefix)
        if cut is None or tail is None or tail <= cut:
            return None  # too few entries to be worth cutting (or no signature where one should be)
        result = _load_checked(data, layout, prefix, cut, tail, keep, keep, may_widen=True)
        if isinstance(result, int):  # a group with entries cut out has too few in the tail: widen once
            in_tail = data.count(layout.mark, result)
            result = _load_checked(data, layout, prefix, cut, result, keep, in_tail, may_widen=False)
        if isinstance(result, RecentEntries):
            return result
    return None


# --- locating entries ------------------------------------------------------------------------------


def _layout(data: bytes) -> _Layout | None:
    """Where the entries list starts and how its entries open, from the bytes around its first entry."""
    at = data.find(_ENTRIES_KEY)
    while at != -1:
        list_at = _after_put(data, at + len(_ENTRIES_KEY))
        if data[list_at : list_at + 1] == b"]":
            mark_at = _after_put(data, list_at + 1)
            if data[mark_at : mark_at + 1] == b"(":
                return _first_entry(data, mark_at + 1)
        at = data.find(_ENTRIES_KEY, at + 1)
    return None


def _first_entry(data: bytes, start: int) -> _Layout | None:
    if data[start : start + 1] != b"}":
        return None
    mark_at = _after_put(data, start + 1)
    if data[mark_at : mark_at + 1] != b"(":
        return None
    key_at = mark_at + 1
    op = data[key_at : key_at + 1]
    if op in (b"h", b"j"):  # the first key was already memoized: the first entry has the signature too
        index = _memo_index(data, key_at)
        first_matches = True
    elif op == b"X":
        length = int.from_bytes(data[key_at + 1 : key_at + 5], "little")
        put_at = key_at + 5 + length
        if data[put_at : put_at + 1] not in (b"q", b"r"):
            return None  # a key that is not memoized: later entries repeat it, no GET to look for
        index = _memo_index(data, put_at)
        first_matches = False
    else:
        return None
    return _Layout(start=start, mark=b"(" + _get(index), put=mark_at != start + 1, first_matches=first_matches)


def _after_put(data: bytes, at: int) -> int:
    """Offset after an optional BINPUT/LONG_BINPUT at `at`."""
    op = data[at : at + 1]
    return at + 2 if op == b"q" else at + 5 if op == b"r" else at


def _memo_index(data: bytes, at: int) -> int:
    """The index of the memo opcode (BINGET/BINPUT: 1 byte; LONG_BINGET/LONG_BINPUT: 4) at `at`."""
    if data[at : at + 1] in (b"h", b"q"):
        return data[at + 1]
    return int.from_bytes(data[at + 1 : at + 5], "little")


def _get(index: int) -> bytes:
    """The GET opcode both PyTorch's and Python's picklers write for memo `index`."""
    return b"h" + bytes((index,)) if index < 256 else b"j" + index.to_bytes(4, "little")


def _entry_head(data: bytes, mark_at: int, layout: _Layout) -> int | None:
    """The offset of the EMPTY_DICT that opens the entry whose signature MARK is at `mark_at`."""
    if not layout.put:
        return mark_at - 1 if data[mark_at - 1 : mark_at] == b"}" else None
    if data[mark_at - 6 : mark_at - 4] == b"}r":
        return mark_at - 6
    if data[mark_at - 3 : mark_at - 1] == b"}q":
        return mark_at - 3
    return None


def _nth_entry(data: bytes, layout: _Layout, n: int) -> int | None:
    """The offset of entry `n` (0-based) counting signatures from the start of the list."""
    at = layout.start
    for _ in range(n + 1 if layout.first_matches else n):
        at = data.find(layout.mark, at + 1)
        if at == -1:
            return None
    return _entry_head(data, at, layout)


def _entry_from_end(data: bytes, layout: _Layout, n: int) -> int | None:
    """The offset of the `n`-th entry from the end of the list (1 = the last)."""
    at = len(data)
    for _ in range(n):
        at = data.rfind(layout.mark, layout.start, at)
        if at == -1:
            return None
    return _entry_head(data, at, layout)


def _entry_before(data: bytes, layout: _Layout, offset: int) -> int | None:
    """The offset of the entry that holds byte `offset`."""
    at = data.rfind(layout.mark, layout.start, offset)
    return None if at == -1 else _entry_head(data, at, layout)


# --- the load and its checks ---------------------------------------------------------------------


def _load_checked(
    data: bytes, layout: _Layout, prefix: int, cut: int, tail: int, keep: int, in_tail: int, *, may_widen: bool
) -> RecentEntries | int | None:
    """One restricted load of the bytes before `cut` (`prefix` entries) and from `tail` on (`in_tail` signatures), and
    its checks: the result when the cut is proven lossless, the offset of a wider tail when a
    process group needs more entries than the tail holds, None on anything else."""
    if tail <= cut:
        return None
    stream = io.BufferedReader(io.BytesIO(data[:cut] + data[tail:]), buffer_size=1 << 20)
    unpickler = restricted_unpickler(stream)
    try:
        doc = load_bounded(unpickler)
    except Exception:  # noqa: BLE001 - refused, corrupt, over budget: the full load says which
        return None
    if type(doc) is not dict:
        return None
    entries = doc.get("entries")
    if doc.get("version") not in KNOWN_VERSIONS or type(entries) is not list:
        return None
    if len(entries) != prefix + in_tail or not all(type(e) is dict for e in entries):
        return None  # a signature that was no entry head, or entries that are not dicts
    ids = [e.get("record_id") for e in entries]
    if not all(type(i) is int for i in ids) or not (_consecutive(ids[:prefix]) and _consecutive(ids[prefix:])):
        return None
    total = ids[-1] - ids[0] + 1
    groups = _groups(data, layout, unpickler, entries, prefix, total, cut, tail, keep)
    if groups is None:
        return None  # the cut-out entries are not all accounted for
    widen = [_entry_before(data, layout, oldest) for cut_out, kept, oldest in groups if cut_out and kept < keep]
    if not widen:
        return RecentEntries(doc=doc, total=total, prefix=prefix)
    if None in widen or not may_widen:
        return None  # no entry head to widen to, or already widened once
    return min(widen)


def _consecutive(ids: list[int]) -> bool:
    return all(b == a + 1 for a, b in zip(ids, ids[1:]))


def _groups(
    data: bytes, layout: _Layout, unpickler, entries: list[dict], prefix: int, total: int, cut: int, tail: int, keep: int
) -> list[tuple[int, int, int]] | None:
    """Per process group name of the decoded entries: (entries cut out, entries decoded in the tail,
    offset of the oldest group bytes a tail of `keep` entries of the group would need); None unless
    the groups' byte patterns in the cut-out bytes account for every entry the record ids say is there."""
    groups = [_pg_of(e) for e in entries]
    if None in groups:
        return None
    patterns = _group_patterns(data, layout, unpickler, set(groups), groups[0], cut)
    if patterns is None:
        return None
    tail_groups = groups[prefix:]
    per_name: dict[str, list[int]] = {}
    counted = 0
    for group, pattern in patterns.items():
        cut_out = data.count(pattern, cut, tail)
        counted += cut_out
        oldest = _oldest_needed(data, pattern, cut, keep) if cut_out else len(data)
        totals = per_name.setdefault(group[0], [0, 0, len(data)])
        totals[0] += cut_out
        totals[1] += tail_groups.count(group)
        totals[2] = min(totals[2], oldest)
    if counted != total - len(entries):
        return None
    return [(cut_out, in_tail, oldest) for cut_out, in_tail, oldest in per_name.values()]


def _group_patterns(
    data: bytes, layout: _Layout, unpickler, groups: set[tuple[str, str]], first: tuple[str, str], cut: int
) -> dict[tuple[str, str], bytes] | None:
    """The bytes each (name, desc) group is written as in an entry: GET of the `process_group` key,
    GETs of the name and the desc, TUPLE2 (how both picklers write a tuple of memoized strings).

    The first entry writes the key itself, and its group's GETs follow: read there, that is the one
    pattern of a dump with one group. Other groups take their strings' memo indices from the memo.
    """
    at = data.find(_PG_KEY_BYTES, layout.start, cut)
    if at == -1:
        return None
    put_at = at + len(_PG_KEY_BYTES)
    if data[put_at : put_at + 1] not in (b"q", b"r"):
        return None
    key = _get(_memo_index(data, put_at))
    name_at = _after_put(data, put_at)
    desc_at = _after_get(data, name_at)
    end = _after_get(data, desc_at)
    if groups == {first} and None not in (desc_at, end) and data[end : end + 1] == b"\x86":
        return {first: key + data[name_at:end + 1]}
    wanted = {text for group in groups for text in group}
    indices: dict[str, int] = {}
    for index, value in unpickler.memo.copy().items():
        if type(value) is str and value in wanted:
            if value in indices:
                return None  # a string memoized twice: one byte pattern cannot count its entries
            indices[value] = index
    if not wanted <= indices.keys():
        return None
    return {group: key + _get(indices[group[0]]) + _get(indices[group[1]]) + b"\x86" for group in groups}


def _after_get(data: bytes, at: int | None) -> int | None:
    """Offset after a BINGET/LONG_BINGET at `at`, None when there is none."""
    op = None if at is None else data[at : at + 1]
    return at + 2 if op == b"h" else at + 5 if op == b"j" else None


def _oldest_needed(data: bytes, pattern: bytes, cut: int, keep: int) -> int:
    """The offset of the group's `keep`-th newest occurrence after `cut` (or its oldest one there)."""
    at = len(data)
    for _ in range(keep):
        found = data.rfind(pattern, cut, at)
        if found == -1:
            break
        at = found
    return at


def _pg_of(entry: dict) -> tuple[str, str] | None:
    group = entry.get(_PG_KEY)
    if type(group) is tuple and len(group) == 2 and type(group[0]) is str and type(group[1]) is str:
        return group
    return None
