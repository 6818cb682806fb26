"""Stage 6, render (shared by the HTML and terminal reports): the per-host facts table, folded,
and the checkpoint audit's rows.

The report's `job.host_facts` holds one record per host with `differs` naming the cells that
differ from what most hosts have (correlate decides that; this module never re-judges a value).
Here that list becomes a table a reader can take in at 4,096 hosts:

- columns: every fact that some host has, in `analyzer.facts.hostfacts.FACTS` order; an `NCCL_*` /
  `TORCH_*` variable only when it is marked on some host, its ranks disagree on it, or a finding
  names it (the others are summarised: alike everywhere, or set per host by design);
- rows: hosts whose shown facts are identical fold into one row ("N hosts alike" for the
  unmarked majority) once a group has `fold_min` hosts, their names compacted
  (`gpu-[00000-00511]`); a host with a marked cell, a duplicate name, ranks that disagree or named
  as a culprit by the verdict keeps its own row unless it is one of many identical ones, and those
  rows come first;
- per column, the majority value (or the even split) that a marked cell's tooltip states. On an
  even split of two values `differs` names both sides; when a drift finding names the hosts of
  one side (the analyses break such ties: the older version, the smaller card), only that side
  is marked (`_odd_side`).

Pure Python over the report's records (one per host, never per log line), deterministic.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace

from analyzer.facts.hostfacts import ENV_PREFIX, FACTS
from analyzer.ranks import format_ranks

FOLD_MIN = 4  # identical hosts folded into one row from this many on
MAX_ROWS = 200  # rows of the table; the hosts beyond are named in one compact list
MAX_NAMES_CHARS = 2000  # of one compact host list
MAX_CULPRIT_ROWS = 16  # verdict culprit hosts kept on their own rows (more: folded like the others)
MAX_PER_RANK = 16  # disagreeing ranks listed under one host
MAX_SPLIT_VALUES = 4  # values named in a tied column's tooltip

LABELS = {
    "ranks": "ranks",
    "addresses": "addresses",
    "nccl_version": "NCCL",
    "nccl_build": "NCCL build",
    "net_plugin": "net plugin",
    "network": "network",
    "nics": "NICs",
    "transports": "transports",
    "cuda_driver": "CUDA (driver)",
    "driver_version": "NVIDIA driver",
    "torch_version": "PyTorch",
    "cuda_runtime": "CUDA runtime",
    "cudnn_version": "cuDNN",
    "fabric_manager": "Fabric Manager",
    "aws_ofi_nccl": "aws-ofi-nccl",
    "deepspeed_version": "DeepSpeed",
    "gpu_model": "GPU",
    "gpu_memory": "GPU memory",
}
VARIES = object()  # a folded row's cell whose hosts hold different values (an identity column)


@dataclass(frozen=True)
class Column:
    key: str  # "ranks", "addresses", a fact name, or "env.NAME" (as `differs` names it)
    label: str
    identity: bool  # differs from host to host by nature: not part of what folds hosts together
    majority: str | None = None  # the value most hosts share; None on a tie or for identity columns
    split: tuple[tuple[str, int], ...] = ()  # (value, hosts), most common first, for the tooltip
    hosts_with_value: int = 0
    odd: str | None = None  # on an even split of two values, the side a finding names as the odd one
    odd_by: str = ""  # that finding's rule id

    def split_text(self) -> str:
        shown = "; ".join(f"{value} on {n} host{'s' if n != 1 else ''}" for value, n in self.split[:MAX_SPLIT_VALUES])
        return shown + (f"; {len(self.split) - MAX_SPLIT_VALUES} more values" if len(self.split) > MAX_SPLIT_VALUES else "")

    def note(self) -> str:
        """What a marked cell of this column differs from."""
        if self.identity:
            return ""
        if self.majority is not None:
            count = dict(self.split).get(self.majority, 0)
            return f"most hosts have {self.majority} ({count} of {self.hosts_with_value})"
        if self.odd is not None:
            return f"the hosts split evenly ({self.split_text()}) and finding {self.odd_by} names this side as the odd one"
        return f"no majority value: {self.split_text()}"

    def other_side_note(self) -> str:
        """The tooltip of an unmarked cell on the side of an even split that a finding did not name."""
        return f"the hosts split evenly ({self.split_text()}); finding {self.odd_by} names the {self.odd} side as the odd one"


@dataclass(frozen=True)
class Row:
    hosts: tuple[str, ...]
    names: str  # the hosts, compacted
    cells: dict  # column key -> str, None (not stated) or VARIES
    marked: frozenset[str]  # column keys of cells that differ
    ranks: tuple[int, ...]
    other_side: frozenset[str] = frozenset()  # keys of even splits a finding resolved to the other side
    duplicate_name: bool = False
    culprit: bool = False
    alike: bool = False  # the folded majority: nothing marked
    per_rank: tuple[dict, ...] = ()
    per_rank_more: int = 0
    known: tuple[dict, ...] = ()  # the known-issue entries the row's versions fall in (job.host_facts)

    @property
    def folded(self) -> bool:
        return len(self.hosts) > 1

    @property
    def flagged(self) -> bool:
        return bool(self.marked) or self.duplicate_name or bool(self.per_rank) or self.culprit

    def known_for(self, key: str) -> list[dict]:
        """The known issues of the version in this row's cell `key`: the cell is marked as an
        affected version (a mark of its own, apart from `marked`, which means "differs")."""
        return [note for note in self.known if key in (note.get("facts") or ())]


@dataclass(frozen=True)
class HostTable:
    columns: list[Column]
    rows: list[Row]
    hosts: int
    differing_hosts: int  # hosts with a marked cell or a duplicate name
    common_env: list[tuple[str, str, int]] = field(default_factory=list)  # (NAME, value, hosts) alike everywhere
    per_host_env: list[str] = field(default_factory=list)  # variables set per host by design, not shown
    omitted: tuple[str, ...] = ()  # hosts beyond MAX_ROWS rows
    omitted_names: str = ""

    @property
    def marked(self) -> bool:
        return self.differing_hosts > 0

    def column(self, key: str) -> Column:
        return next(c for c in self.columns if c.key == key)


def compact_hosts(names, max_chars: int = MAX_NAMES_CHARS) -> str:
    """`gpu-00000 ... gpu-00511, node-a` -> `gpu-[00000-00511], node-a` (numbers of one width
    and one prefix/suffix collapse into ranges); cut at `max_chars` with the count left over."""
    groups: dict[tuple[str, str, int], list[int]] = {}
    plain: list[str] = []
    order: dict[tuple[str, str, int] | str, str] = {}
    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)(\D*)", name)
        if match is None:
            plain.append(name)
            order.setdefault(name, name)
            continue
        key = (match.group(1), match.group(3), len(match.group(2)))
        groups.setdefault(key, []).append(int(match.group(2)))
        order.setdefault(key, name)
    parts: list[tuple[str, str, int]] = []  # (sort key, text, names in it)
    for key, numbers in groups.items():
        prefix, suffix, width = key
        numbers = sorted(set(numbers))
        if len(numbers) == 1:
            parts.append((order[key], f"{prefix}{numbers[0]:0{width}d}{suffix}", 1))
            continue
        spans: list[str] = []
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            spans.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
            if n is not None:
                start = prev = n
        parts.append((order[key], f"{prefix}[{','.join(spans)}]{suffix}", len(numbers)))
    parts.extend((name, name, 1) for name in dict.fromkeys(plain))
    parts.sort(key=lambda part: part[0])
    out: list[str] = []
    used = 0
    shown = 0
    total = sum(n for _, _, n in parts)
    for _, text, n in parts:
        if out and used + len(text) + 2 > max_chars:
            break
        out.append(text)
        used += len(text) + 2
        shown += n
    text = ", ".join(out)
    if shown < total:
        text += f" and {total - shown} more"
    return text


def _value(record: dict, key: str):
    if key == "ranks":
        return record.get("ranks") or []
    if key == "addresses":
        return ", ".join(record.get("addresses") or []) or None
    if key.startswith(ENV_PREFIX):
        return (record.get("env") or {}).get(key[len(ENV_PREFIX):])
    return record.get(key)


def _named_by_findings(names: list[str], findings: list[dict]) -> set[str]:
    text = "\n".join(f"{f.get('title', '')}\n{f.get('summary', '')}" for f in findings)
    return {name for name in names if name in text and re.search(rf"(?<![A-Z0-9_]){re.escape(name)}(?![A-Z0-9_])", text)}


def _mentions(text: str, word: str) -> bool:
    """`word` appears in `text` as a whole token (`2.27.7` in "2.27.7 on node-b", not in "12.27.71")."""
    return len(word) >= 2 and word in text and re.search(rf"(?<![\w.]){re.escape(word)}(?!\w|\.\w)", text) is not None


def _odd_side(key: str, split: tuple, records: list[dict], findings: list[dict]) -> tuple[str, str] | None:
    """On an even split of two values, the value a finding names as the odd one, and its rule id.

    Correlate marks both sides of an even split (nothing in the facts says which is right); the
    drift analyses break such ties by a fact-specific order (the older version, the host without
    the plugin, the smaller card) and name the hosts of the odd side. A finding counts for this
    column when it names some but not all hosts, every host it names that has this fact holds one
    and the same value, and its text states that value (and, for a variable, its name). Two
    findings naming different sides resolve nothing."""
    if len(split) != 2 or split[0][1] != split[1][1]:
        return None
    value_of = {r["host"]: _value(r, key) for r in records}
    env_name = key[len(ENV_PREFIX):] if key.startswith(ENV_PREFIX) else None
    picks: dict[str, str] = {}
    for f in findings:
        hosts = set(f.get("hosts") or ()) & value_of.keys()
        named = {value_of[h] for h in hosts if value_of[h] not in (None, "")}
        if len(named) != 1 or len(hosts) == len(value_of):
            continue
        (value,) = named
        text = f"{f.get('title', '')}\n{f.get('summary', '')}"
        if _mentions(text, value) and (env_name is None or _mentions(text, env_name)):
            picks.setdefault(value, f["rule_id"])
    return next(iter(picks.items())) if len(picks) == 1 else None


def _columns(records: list[dict], findings: list[dict]) -> tuple[list[Column], list[tuple[str, str, int]], list[str]]:
    marked = {key for r in records for key in r.get("differs") or ()}
    env_names = sorted({name for r in records for name in (r.get("env") or {})})
    rank_env = {name for r in records for p in r.get("per_rank") or () for name in (p.get("env") or {})}
    named = _named_by_findings(env_names, findings)
    columns: list[Column] = []
    if any(r.get("ranks") for r in records):
        columns.append(Column("ranks", LABELS["ranks"], identity=True))
    if any(r.get("addresses") for r in records):
        columns.append(Column("addresses", LABELS["addresses"], identity=True))
    keys = [name for name, _ in FACTS if any(r.get(name) not in (None, "") for r in records)]
    common_env: list[tuple[str, str, int]] = []
    per_host_env: list[str] = []
    for name in env_names:
        key = ENV_PREFIX + name
        values = Counter(v for r in records if (v := _value(r, key)) is not None)
        if key in marked or name in rank_env or name in named:
            keys.append(key)
        elif len(values) == 1:
            (value, n), = values.items()
            common_env.append((name, value, n))
        else:
            per_host_env.append(name)  # differs from host to host and correlate marks none of it
    for key in keys:
        counts = Counter(v for r in records if (v := _value(r, key)) not in (None, ""))
        split = tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
        # An env variable shown because a finding names it, never marked although its values
        # differ, is set per host by design (NCCL_HOSTID): it must not keep hosts apart.
        identity = key.startswith(ENV_PREFIX) and key not in marked and len(split) > 1 and key[len(ENV_PREFIX):] not in rank_env
        top = split[0][1] if split else 0
        leaders = [value for value, n in split if n == top]
        odd = None if identity or key not in marked else _odd_side(key, split, records, findings)
        columns.append(Column(
            key=key,
            label=LABELS.get(key, key[len(ENV_PREFIX):] if key.startswith(ENV_PREFIX) else key),
            identity=identity,
            majority=leaders[0] if len(leaders) == 1 and not identity else None,
            split=split,
            hosts_with_value=sum(counts.values()),
            odd=odd[0] if odd else None,
            odd_by=odd[1] if odd else "",
        ))
    return columns, common_env, per_host_env


def _per_rank(record: dict) -> tuple[tuple[dict, ...], int]:
    entries = record.get("per_rank") or []
    return tuple(entries[:MAX_PER_RANK]), max(0, len(entries) - MAX_PER_RANK)


def per_rank_text(entry: dict) -> str:
    """`rank 0 pid 646: nccl_version=2.28.9, NCCL_HOSTID=drift-node0` (unescaped)."""
    who = " ".join(p for p in (f"rank {entry['rank']}" if entry.get("rank") is not None else "",
                               f"pid {entry['pid']}" if entry.get("pid") is not None else "") if p)
    facts = [f"{k}={v}" for k, v in sorted(entry.items()) if k not in ("rank", "pid", "env")]
    facts += [f"{k}={v}" for k, v in sorted((entry.get("env") or {}).items())]
    return f"{who or 'a process'}: {', '.join(facts)}"


def host_table(report: dict, *, fold_min: int = FOLD_MIN, max_rows: int = MAX_ROWS) -> HostTable | None:
    """The table for `report["job"]["host_facts"]`, or None when the report has no host facts."""
    records = report.get("job", {}).get("host_facts") or []
    if not records:
        return None
    columns, common_env, per_host_env = _columns(records, report.get("findings") or [])
    resolved = [c for c in columns if c.odd is not None]

    def marks(record: dict) -> frozenset[str]:
        """`differs`, less the cells on the side of an even split that a finding did not name."""
        keys = set(record.get("differs") or ())
        for column in resolved:
            if column.key in keys and _value(record, column.key) != column.odd:
                keys.discard(column.key)
        return frozenset(keys)

    culprits = set(report.get("verdict", {}).get("culprit_hosts") or [])
    if len(culprits) > MAX_CULPRIT_ROWS:
        culprits = set()  # a verdict naming that many hosts says nothing about one of them
    folding = [c.key for c in columns if not c.identity]
    groups: dict[tuple, list[dict]] = {}
    singles: list[dict] = []
    for record in records:
        if record.get("duplicate_name") or record.get("per_rank") or record["host"] in culprits:
            singles.append(record)
            continue
        signature = (tuple(_value(record, key) for key in folding), tuple(sorted(marks(record))))
        groups.setdefault(signature, []).append(record)
    rows: list[Row] = []
    for record in singles:
        rows.append(_row([record], columns, culprits, marks(record)))
    for members in groups.values():
        if len(members) >= fold_min:
            rows.append(_row(members, columns, culprits, marks(members[0])))
        else:
            rows.extend(_row([record], columns, culprits, marks(record)) for record in members)
    alike = [i for i, row in enumerate(rows) if row.folded and not row.flagged]
    if alike:
        biggest = max(alike, key=lambda i: (len(rows[i].hosts), -i))
        rows[biggest] = replace(rows[biggest], alike=True)
    rows.sort(key=lambda row: (not row.flagged, row.folded, row.hosts[0]))
    omitted: tuple[str, ...] = ()
    if len(rows) > max_rows:
        omitted = tuple(sorted(host for row in rows[max_rows:] for host in row.hosts))
        rows = rows[:max_rows]
    differing = sum(1 for r in records if marks(r) or r.get("duplicate_name"))
    return HostTable(
        columns=columns,
        rows=rows,
        hosts=len(records),
        differing_hosts=differing,
        common_env=common_env,
        per_host_env=per_host_env,
        omitted=omitted,
        omitted_names=compact_hosts(omitted) if omitted else "",
    )


def _row(members: list[dict], columns: list[Column], culprits: set[str], marked: frozenset[str]) -> Row:
    first = members[0]
    cells: dict = {}
    for column in columns:
        if column.key == "ranks":
            continue
        values = {_value(m, column.key) for m in members}
        cells[column.key] = values.pop() if len(values) == 1 else VARIES
    ranks = sorted({rank for m in members for rank in m.get("ranks") or ()})
    per_rank, more = _per_rank(first) if len(members) == 1 else ((), 0)
    hosts = tuple(m["host"] for m in members)
    return Row(
        hosts=hosts,
        names=compact_hosts(hosts),
        cells=cells,
        marked=marked,
        other_side=frozenset(first.get("differs") or ()) - marked,
        ranks=tuple(ranks),
        duplicate_name=bool(first.get("duplicate_name")),
        culprit=any(h in culprits for h in hosts),
        per_rank=per_rank,
        per_rank_more=more,
        known=tuple(first.get("known_issues") or ()),
    )


def known_issue_notes(report: dict) -> list[str]:
    """One line per (known-issue entry, hosts whose versions it affects): the report's info-level
    notes (`job.host_facts[].known_issues`), unescaped."""
    hosts_of: dict[str, list[str]] = {}
    notes: dict[str, dict] = {}
    for record in report.get("job", {}).get("host_facts") or []:
        for note in record.get("known_issues") or ():
            hosts_of.setdefault(note["id"], []).append(record["host"])
            notes.setdefault(note["id"], note)
    return [f"{notes[i]['id']}: {notes[i]['title']} ({notes[i]['versions']}; fixed in {notes[i]['fixed_in']}) "
            f"on {compact_hosts(hosts, 200)}" for i, hosts in sorted(hosts_of.items())]


def cell_note(table: HostTable, row: Row, key: str) -> str:
    """Why a marked cell is marked (it differs, and/or a known issue affects its version), for its
    tooltip (unescaped)."""
    known = row.known_for(key)
    notes = [_differs_note(table, row, key)] if key in row.marked or not known else []
    if known:
        issues = "; ".join(f"{n['id']} ({n['title']}; fixed in {n['fixed_in']})" for n in known[:4])
        more = f"; {len(known) - 4} more" if len(known) > 4 else ""
        notes.append(f"known issue{'s' if len(known) > 1 else ''} of this version: {issues}{more}")
    return "\n".join(notes)


def _differs_note(table: HostTable, row: Row, key: str) -> str:
    if key == "addresses" and row.duplicate_name:
        return ("several machines use this host name: its processes report different addresses on one interface")
    notes = []
    fact = key[len(ENV_PREFIX):] if key.startswith(ENV_PREFIX) else key
    if any(fact in entry or fact in (entry.get("env") or {}) for entry in row.per_rank):
        notes.append("this host's ranks disagree (listed under the row)")
    column_note = table.column(key).note() if any(c.key == key for c in table.columns) else ""
    if column_note:
        notes.append(column_note)
    return "differs: " + "; ".join(notes) if notes else "differs from the other hosts"


# --- checkpoints ------------------------------------------------------------------------------------


def checkpoint_parts(c: dict, *, checked_with: bool = True) -> tuple[str, str, str]:
    """(readable, complete, resume) texts of one checkpoint record, unescaped (both renderers)."""
    if c.get("readable"):
        readable = "yes" + (f" ({c['checked_with']})" if checked_with and c.get("checked_with") else "")
    else:
        readable = f"no: {c['reason']}" if c.get("reason") else "no" + (f" ({c['problem']})" if c.get("problem") else "")
    if c.get("unsafe_globals"):
        readable += f"; refused, the pickle names code: {', '.join(c['unsafe_globals'][:8])}"
    if c.get("notes"):
        readable += f"; {c['notes']}"
    complete = []
    if c.get("shards_expected") is not None:
        complete.append(f"{c.get('shards_present') or 0} of {c['shards_expected']} shards")
    if c.get("missing_shards"):
        shards = c["missing_shards"]
        complete.append("missing " + ", ".join(shards[:8]) + (f" and {len(shards) - 8} more" if len(shards) > 8 else ""))
    if c.get("missing_ranks"):
        complete.append(f"rank(s) {format_ranks(c['missing_ranks'])} lack their shard")
    if c.get("readable") or c.get("shards_expected") is not None:
        if c.get("exact_resume"):
            complete.append("every component an exact resume needs")
        elif c.get("missing_components"):
            complete.append("lacks " + ", ".join(c["missing_components"]))
    elif not c.get("readable"):
        complete.append("unknown: unreadable")
    if c.get("newest_resumable"):
        resume = "newest resumable" + (" (exact)" if c.get("exact_resume") else "")
    elif c.get("resumable"):
        resume = "yes" + (" (exact)" if c.get("exact_resume") else "")
    elif c.get("readable") and "model" not in (c.get("components") or []):
        resume = "no (no model weights)"
    else:
        resume = "no"
    return readable, "; ".join(complete), resume
