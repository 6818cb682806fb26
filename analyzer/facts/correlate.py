"""Stage 3, correlate: attribute every event to a rank and host, and derive the job's facts.

Sources of truth, strongest first: PyTorch/launcher prefixes on the line, a rank label opening
the line's text (`Rank 3: ...`, facts.rank_labels), NCCL `comm ... rank R nranks N` lines joined to
their `host:pid` prefix, per-rank file layout (torchrun's `attempt_N/<local_rank>/` and
rank-numbered file names), a file whose events all name one rank, and c10d's `[Rank N]` where it is
the default process group's. Hosts: the line's own, its rank's, the nearest prompt or `Host: X` line
above it in its file (facts.host_context), its file's or directory's only host. Job facts: world size,
ranks, hosts, rank -> host map, the time span; the derived ones say which line or event they come
from, and sources that contradict each other are listed in `conflicts`, not settled silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from analyzer.bounds import MAX_WORLD_SIZE, rank_number
from analyzer.events import empty_events
from analyzer.facts.host_context import LOOPBACK_NAMES, hosts_from_context
from analyzer.facts.hostfacts import HostFacts, derive_host_facts
from analyzer.facts.rank_labels import ranks_from_labels
from analyzer.io import InputFile
from analyzer.parse.classify import VOCAB_KIND_PREFIX

# Columns that count ranks: a value past MAX_WORLD_SIZE (a `rank 10^18` line, `nranks 100000000`)
# is an invalid value on its line, so no later stage sizes a range, a set or a matrix by it.
_RANK_COLUMNS = ("rank", "local_rank", "pg_rank", "nranks")


@dataclass(frozen=True)
class JobContext:
    """Job facts derived by correlate that analyses need (what stage 3 hands detect)."""

    world_size: int | None = None
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    rank_hosts: dict[int, str] = field(default_factory=dict)
    end_ts: object | None = None  # latest timestamp seen anywhere in the job
    checkpoint_paths: tuple[str, ...] = ()  # extra checkpoint locations given with --checkpoint
    # The per-host facts (facts.hostfacts), derived once for the analyses and the report.
    host_facts: HostFacts = field(default_factory=lambda: derive_host_facts(empty_events()))
    checkpoints: pl.DataFrame | None = None  # the checkpoint audit's table; None: not audited
    checkpoint_problem: str | None = None  # why the audit could not be made, when it could not


@dataclass
class JobFacts:
    world_size: int | None = None
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    rank_hosts: dict[int, str] = field(default_factory=dict)
    # Where world_size comes from: the line that states it, or "inferred from the ranks seen".
    world_size_source: str | None = None
    world_size_stated: bool = False
    # Earliest and latest timestamped event, and the lines that bound them (see _time_span).
    time_span: dict | None = None
    conflicts: list[str] = field(default_factory=list)

    def context(self, events: pl.DataFrame, checkpoint_paths: tuple[str, ...] = (),
                host_facts: HostFacts | None = None) -> JobContext:
        """The context without the checkpoint audit (analyzer.facts.job_context adds it)."""
        end = events.get_column("ts").max() if events.height else None
        return JobContext(
            world_size=self.world_size,
            ranks=tuple(self.ranks),
            hosts=tuple(self.hosts),
            rank_hosts=dict(self.rank_hosts),
            end_ts=end,
            checkpoint_paths=checkpoint_paths,
            host_facts=derive_host_facts(events) if host_facts is None else host_facts,
        )


def correlate(events: pl.DataFrame, inputs: list[InputFile]) -> tuple[pl.DataFrame, JobFacts]:
    events = _plausible_ranks(events)
    events = ranks_from_labels(events)  # `Rank 3: ...` opening a line: the line's own word before its file's
    events = _apply_file_hints(events, inputs)
    events = _ranks_from_local_ranks(events)
    events, size_conflicts = _uncorroborated_sizes(events)
    events = _ranks_from_pids(events)
    events = _ranks_from_single_rank_files(events)
    events = _ranks_from_default_pg(events)
    events = _vocabulary_ranks_from_their_lines(events)
    events, rank_conflicts = _uncorroborated_rank(events)
    events = _hosts_from_ranks(events)
    events = hosts_from_context(events)  # a prompt or `Host: X` line above names the host of what follows
    events = _hosts_from_files(events)
    # Joins do not keep row order; event ids must be stable for deterministic reports.
    events = events.sort(["file", "line", "kind"], nulls_last=True, maintain_order=True)
    events = events.with_row_index("event_id").with_columns(pl.col("event_id").cast(pl.Int64))
    facts = _facts(events)
    facts.conflicts[:0] = size_conflicts + rank_conflicts
    return events, facts


def _plausible_ranks(events: pl.DataFrame) -> pl.DataFrame:
    def plausible(value: pl.Expr) -> pl.Expr:
        return pl.when(value.is_between(0, MAX_WORLD_SIZE)).then(value)

    return events.with_columns(
        *[plausible(pl.col(name)).alias(name) for name in _RANK_COLUMNS],
        pl.col("ranks_ref").list.eval(pl.element().filter(pl.element().is_between(0, MAX_WORLD_SIZE))),
    )


# --- world size: a value one source claims against what the others agree on is not used -----------
#
# Every size statement counts once per independent source: one process of a log (`host:pid`), or
# one file (a Flight Recorder dump, a trace). A process states several sizes (its sub-communicators
# are smaller than the world), so what a source says the world is, is the largest it states.

_WORLD_KINDS = ("nccl.comm_init", "fr.pg_status")  # the statements the world size is taken from


def _size_sources(events: pl.DataFrame) -> pl.DataFrame:
    """One row per size some source states as its largest: nranks, sources, at (first line), file (its file)."""
    return (
        events.filter(pl.col("kind").is_in(_WORLD_KINDS) & pl.col("nranks").is_not_null())
        .sort("file", "line")
        .group_by("kind", "file", "host", "pid", maintain_order=True)
        .agg(pl.col("nranks").max(), _where().sort_by("nranks", descending=True).first().alias("at"))
        .group_by("nranks")
        .agg(pl.len().alias("sources"), pl.col("at").sort().first(), pl.col("file").sort_by("at").first())
        .sort("nranks", descending=True)
    )


def _uncorroborated_sizes(events: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """The largest size stated, when a single source states it while at least two others agree on a
    smaller one that no rank named elsewhere reaches (an `nranks 1000000` line in a job of two; a rank
    its own file names corroborates nothing), is a contradiction, not the world size: it is listed in
    the conflicts and made an invalid value on its line (so the world communicator is not looked for by
    it either). Repeated while it holds."""
    sizes = _size_sources(events)
    rejected: list[int] = []
    conflicts: list[str] = []
    for largest, sources, at, file in sizes.iter_rows():  # a row per distinct size stated: a handful
        rest = sizes.filter(~pl.col("nranks").is_in([*rejected, largest])).sort(["sources", "nranks"], descending=True)
        if sources > 1 or rest.height == 0:
            break
        agreed, agreeing, agreed_at, _ = rest.row(0)
        seen = events.filter(pl.col("file") != file).get_column("rank").max()
        if agreeing < 2 or (seen is not None and seen >= agreed):
            break
        rejected.append(largest)
        # Not "world size: ...": the size is settled by the agreeing sources, the header shows it as a fact.
        conflicts.append(f"uncorroborated size: nranks {largest} is stated by one source only ({at}) against nranks "
                         f"{agreed} stated by {agreeing} sources ({agreed_at}); not used")
    if not rejected:
        return events, []
    stated = pl.col("kind").is_in(_WORLD_KINDS) & pl.col("nranks").is_in(rejected)
    return events.with_columns(pl.when(stated).then(None).otherwise(pl.col("nranks")).alias("nranks")), conflicts


def _uncorroborated_rank(events: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """A rank at or past a world size that two or more sources state, when it is the only such rank
    and one file alone names it (a `[Rank 999999]` line in a job of two), is a contradiction: listed
    in the conflicts, and the rank is made an invalid value on its lines, so it sizes nothing and is
    no culprit."""
    sizes = _size_sources(events)
    if sizes.height == 0 or sizes.item(0, "sources") < 2:
        return events, []
    world, sources, stated_at, _ = sizes.row(0)
    past = (
        events.filter(pl.col("rank") >= world)
        .sort("file", "line")
        .group_by("rank")
        .agg(pl.col("file").n_unique().alias("files"), _where().first().alias("at"))
    )
    if past.height != 1 or past.item(0, "files") != 1:
        return events, []
    rank, at = past.item(0, "rank"), past.item(0, "at")
    conflict = (f"uncorroborated rank: rank {rank} is named in one file only ({at}), past nranks {world} stated by "
                f"{sources} sources ({stated_at}); not used")
    return events.with_columns(pl.when(pl.col("rank") == rank).then(None).otherwise(pl.col("rank")).alias("rank")), [conflict]


def _apply_file_hints(events: pl.DataFrame, inputs: list[InputFile]) -> pl.DataFrame:
    # A name such as `rank<30 digits>.log` gives no hint: the number is not a rank.
    hints = pl.DataFrame(
        {
            "file": [i.path for i in inputs],
            "hint_rank": [rank_number(i.rank_hint) for i in inputs],
            "hint_local": [rank_number(i.local_rank_hint) for i in inputs],
        },
        schema={"file": pl.String, "hint_rank": pl.Int64, "hint_local": pl.Int64},
    )
    return (
        events.join(hints, on="file", how="left")
        .with_columns(
            pl.coalesce("rank", "hint_rank").alias("rank"),
            pl.coalesce("local_rank", "hint_local").alias("local_rank"),
        )
        .drop("hint_rank", "hint_local")
    )


def _ranks_from_local_ranks(events: pl.DataFrame) -> pl.DataFrame:
    """A line that names only its local rank (torchrun's `[default1]:` tee prefix on a line printed before
    the process group gave it a `[rank1]:` one, its `attempt_0/1/` log directory) is rank local + offset, a
    node's ranks being its first rank plus the local rank. The offset is the one that the file's lines
    naming both agree on; failing that, in a job of one host, the one all the job's such lines agree on
    (the launcher's failure table, `rank : 1 (local_rank: 1)`, pairs them too). Where lines disagree (a
    console shared by nodes) or name no pair, nothing is guessed."""
    both = events.filter(pl.col("rank").is_not_null() & pl.col("local_rank").is_not_null())
    if both.height == 0:
        return events
    offset = pl.col("rank") - pl.col("local_rank")
    per_file = (
        both.group_by("file").agg(offset.unique().alias("offsets"))
        .filter(pl.col("offsets").list.len() == 1)
        .select("file", pl.col("offsets").list.first().alias("file_offset"))
    )
    job_offsets = both.select(offset.unique()).to_series()
    one_host = events.get_column("host").drop_nulls().n_unique() <= 1
    job_offset = job_offsets.item(0) if job_offsets.len() == 1 and one_host else None
    return (
        events.join(per_file, on="file", how="left")
        .with_columns(
            pl.coalesce("rank", pl.col("local_rank") + pl.coalesce("file_offset", pl.lit(job_offset, pl.Int64))).alias("rank")
        )
        .drop("file_offset")
    )


def _ranks_from_pids(events: pl.DataFrame) -> pl.DataFrame:
    """NCCL lines carry host:pid but no rank; the world communicator's init line links the two."""
    world = events.filter(pl.col("kind") == "nccl.comm_init").get_column("nranks").max()
    known = events.filter(pl.col("pid").is_not_null() & pl.col("rank").is_not_null())
    if world is not None:
        comm = events.filter((pl.col("kind") == "nccl.comm_init") & (pl.col("nranks") == world)).with_columns(
            pl.col("pg_rank").alias("rank")
        )
        known = pl.concat([comm, known.filter(pl.col("kind") != "nccl.comm_init")])
    pid_map = (
        known.group_by("host", "pid")
        .agg(pl.col("rank").mode().sort().first().alias("pid_rank"))
        .filter(pl.col("pid_rank").is_not_null())
    )
    return (
        events.join(pid_map, on=["host", "pid"], how="left", nulls_equal=True)
        .with_columns(pl.coalesce("rank", "pid_rank").alias("rank"))
        .drop("pid_rank")
    )


def _ranks_from_single_rank_files(events: pl.DataFrame) -> pl.DataFrame:
    """A file written by one process (one pid at most) whose events name one rank is that rank's."""
    per_file = (
        events.group_by("file")
        .agg(
            pl.col("rank").drop_nulls().n_unique().alias("n"),
            pl.col("pid").drop_nulls().n_unique().alias("pids"),
            pl.col("rank").drop_nulls().first().alias("file_rank"),
        )
        .filter((pl.col("n") == 1) & (pl.col("pids") <= 1))
        .select("file", "file_rank")
    )
    return (
        events.join(per_file, on="file", how="left")
        .with_columns(pl.coalesce("rank", "file_rank").alias("rank"))
        .drop("file_rank")
    )


# c10d's own lines: watchdog timeouts and aborts, pg_status and dump notices, DETAIL reports, desync reports.
_C10D_KINDS = r"^(?:watchdog|c10d|desync)\."


def _ranks_from_default_pg(events: pl.DataFrame) -> pl.DataFrame:
    """An unprefixed c10d line names its rank inside its process group (`[Rank N]` before torch 2.2,
    `[PG 0 Rank N]`, `[PG ID 0 PG GUID 0(default_pg) Rank N]` after); in the default group (PG 0)
    that is the global rank. A sub-group's `[PG 3 Rank 1]` is not. The pre-2.2 `[Rank N]` names no
    group: it is taken as the default group's only when nothing in the job shows another group (a
    non-default PG in any c10d or Flight Recorder line, or NCCL communicators of several sizes).
    Runs after the file-level attributions so that one visible rank's line does not claim a shared
    console's other lines."""
    c10d = pl.col("kind").fill_null("").str.contains(_C10D_KINDS)
    candidate = pl.col("rank").is_null() & pl.col("pg_rank").is_not_null() & c10d
    if events.filter(candidate).height == 0:
        return events
    pg_family = c10d | pl.col("kind").fill_null("").str.starts_with("fr.")
    other_groups = events.filter(pg_family & pl.col("pg").is_not_null() & (pl.col("pg").str.extract(r"^\s*(\d+)") != "0")).height > 0
    comm_sizes = events.filter(pl.col("kind") == "nccl.comm_init").get_column("nranks").drop_nulls().n_unique()
    unnamed_is_default = not other_groups and comm_sizes <= 1
    in_default = (pl.col("pg").str.extract(r"^\s*(\d+)") == "0") | (pl.col("pg").is_null() & pl.lit(unnamed_is_default))
    return events.with_columns(
        pl.when(candidate & in_default.fill_null(False)).then(pl.col("pg_rank")).otherwise(pl.col("rank")).alias("rank")
    )


def _vocabulary_ranks_from_their_lines(events: pl.DataFrame) -> pl.DataFrame:
    """A vocabulary event is a second reading of a line that has its own event: the writer is the
    same, so the rank its own kind was given (`[Rank 0] Watchdog caught ...` in the default group) is
    the vocabulary event's too. Matched by text as well as line: a record spliced into another
    writer's line is a part of its own (tests/test_hostile_inputs.py)."""
    vocab = pl.col("kind").fill_null("").str.starts_with(VOCAB_KIND_PREFIX)
    if events.filter(vocab & pl.col("rank").is_null()).height == 0:
        return events
    line_rank = (
        events.filter(~vocab & pl.col("rank").is_not_null() & pl.col("line").is_not_null())
        .group_by("file", "line", "text")
        .agg(pl.col("rank").unique().alias("_ranks"))
        .filter(pl.col("_ranks").list.len() == 1)
        .select("file", "line", "text", pl.col("_ranks").list.first().alias("_line_rank"))
    )
    return (
        events.join(line_rank, on=["file", "line", "text"], how="left")
        .with_columns(pl.when(vocab).then(pl.coalesce("rank", "_line_rank")).otherwise(pl.col("rank")).alias("rank"))
        .drop("_line_rank")
    )


def _hosts_from_ranks(events: pl.DataFrame) -> pl.DataFrame:
    """Events without a host (or with a loopback name) take the host their rank's other events name."""
    # torchrun's failure table names the host by `socket.getfqdn()`, often `localhost` where NCCL's
    # `gethostname()` gives the machine's name: a loopback name is no second machine.
    is_loopback = pl.col("host").str.to_lowercase().is_in(LOOPBACK_NAMES)
    rank_host = (
        events.filter(pl.col("rank").is_not_null() & pl.col("host").is_not_null() & ~is_loopback)
        .group_by("rank")
        .agg(pl.col("host").mode().sort().first().alias("rank_host"))
    )
    return (
        events.join(rank_host, on="rank", how="left")
        .with_columns(
            pl.when(pl.col("host").is_null() | (is_loopback & pl.col("rank_host").is_not_null()))
            .then(pl.col("rank_host"))
            .otherwise(pl.col("host"))
            .alias("host")
        )
        .drop("rank_host")
    )


_HOST_PARTS_MAX = 16  # a longer name is never looked for in a path


def _parts(name: pl.Expr) -> pl.Expr:
    """A path's or host name's parts between separators."""
    return name.str.extract_all(r"[^/._\-]+")


def _hosts_from_files(events: pl.DataFrame) -> pl.DataFrame:
    """A host-less line (an nvidia-smi table, a print) belongs to its file's only host, else to the
    only host of its directory (a capture's `node.nvidia-smi-q.txt` beside its manifest), else to
    the host that names the file's directory or file name (`node-a/nvidia-smi.txt`)."""
    if events.filter(pl.col("host").is_null()).height == 0:
        return events
    with_host = events.filter(pl.col("host").is_not_null())
    file_host = (
        with_host.group_by("file")
        .agg(pl.col("host").unique().alias("hosts"))
        .filter(pl.col("hosts").list.len() == 1)
        .select("file", pl.col("hosts").list.first().alias("file_host"))
    )
    directory = pl.col("file").str.replace(r"[^/]*$", "")
    dir_host = (
        with_host.group_by(directory.alias("directory"))
        .agg(pl.col("host").unique().alias("hosts"))
        .filter(pl.col("hosts").list.len() == 1)
        .select("directory", pl.col("hosts").list.first().alias("dir_host"))
    )
    # A known host named whole in the path: a run of its separated parts (`/ . _ -`), so that
    # `node-a/...`, `node-a.log` and `node-a-ps.txt` name node-a, and `node-10-ps.txt` not node-1.
    known = with_host.select(pl.col("host").unique().alias("path_host")).with_columns(_parts(pl.col("path_host")).list.join("/").alias("_run"))
    longest = min(known.select(pl.col("_run").str.count_matches("/").max()).item() or 0, _HOST_PARTS_MAX - 1)
    files = events.filter(pl.col("host").is_null()).select("file").unique()
    parts = files.with_columns(_parts(pl.col("file")).alias("_part")).explode("_part")
    runs = pl.concat([
        parts.select("file", pl.concat_str([pl.col("_part").shift(-k).over("file") for k in range(width + 1)], separator="/").alias("_run"))
        for width in range(longest + 1)
    ]).drop_nulls()
    path_host = (
        runs.join(known, on="_run", how="inner")
        .group_by("file")
        .agg(pl.col("path_host").unique().alias("hosts"))
        .filter(pl.col("hosts").list.len() == 1)
        .select("file", pl.col("hosts").list.first().alias("path_host"))
    )
    return (
        events.with_columns(directory.alias("directory"))
        .join(file_host, on="file", how="left")
        .join(dir_host, on="directory", how="left")
        .join(path_host, on="file", how="left")
        .with_columns(pl.coalesce("host", "file_host", "dir_host", "path_host").alias("host"))
        .drop("directory", "file_host", "dir_host", "path_host")
    )


def _facts(events: pl.DataFrame) -> JobFacts:
    ranks = sorted(events.get_column("rank").drop_nulls().unique().to_list())
    hosts = sorted(events.get_column("host").drop_nulls().unique().to_list())
    nranks = events.filter(pl.col("kind").is_in(["nccl.comm_init", "fr.pg_status"])).get_column("nranks").max()
    world = max(x for x in (nranks, (max(ranks) + 1) if ranks else None) if x is not None) if (nranks or ranks) else None
    rank_hosts = dict(
        events.filter(pl.col("rank").is_not_null() & pl.col("host").is_not_null())
        .group_by("rank")
        .agg(pl.col("host").mode().sort().first())
        .iter_rows()
    )
    world_source, stated, conflicts = _world_size_source(events, world, ranks)
    return JobFacts(
        world_size=world,
        world_size_source=world_source,
        world_size_stated=stated,
        time_span=_time_span(events),
        conflicts=conflicts,
        ranks=ranks,
        hosts=hosts,
        rank_hosts={int(k): v for k, v in rank_hosts.items()},
    )


# Lines and events that state the job's size, by what says it (strongest first).
_SIZE_STATEMENTS = {"nccl.comm_init": "NCCL comm init nranks", "fr.pg_status": "Flight Recorder pg_status nranks",
                    "trace.rank": "trace distributedInfo world_size"}


def _where() -> pl.Expr:
    return pl.format("{}:{}", "file", "line")


def _world_size_source(events: pl.DataFrame, world: int | None, ranks: list[int]) -> tuple[str | None, bool, list[str]]:
    """Which statement gave the world size (the largest size each kind of line states: NCCL
    sub-communicators are smaller than the world), else that it is inferred from the ranks seen;
    statements that disagree, or a rank at or past the stated size, are conflicts."""
    if world is None:
        return None, False, []
    statements = (
        events.filter(pl.col("kind").is_in(list(_SIZE_STATEMENTS)) & pl.col("nranks").is_not_null())
        .sort("event_id")
        .filter(pl.col("nranks") == pl.col("nranks").max().over("kind"))
        .group_by("kind", maintain_order=True)
        .agg(pl.col("nranks").first(), _where().first().alias("at"))
    )
    said = {kind: (n, at) for kind, n, at in statements.iter_rows()}
    label = {kind: f"{_SIZE_STATEMENTS[kind]} {n} ({at})" for kind, (n, at) in said.items()}
    conflicts = []
    if len({n for n, _ in said.values()}) > 1:
        conflicts.append("world size: " + "; ".join(label[k] for k in _SIZE_STATEMENTS if k in said) + " disagree")
    stated = max((n for n, _ in said.values()), default=None)
    if stated is not None and ranks and max(ranks) >= stated:
        at = events.filter(pl.col("rank") == max(ranks)).sort("event_id").select(_where()).item(0, 0)
        conflicts.append(f"world size: rank {max(ranks)} is seen ({at}) but the largest size stated is {stated}")
    source = next((label[k] for k in _SIZE_STATEMENTS if said.get(k, (None,))[0] == world), None)
    if source is not None:
        return source, True, conflicts
    return f"inferred from the ranks seen ({len(ranks)} rank(s), highest {max(ranks)}); no line states the size", False, conflicts


def _time_span(events: pl.DataFrame) -> dict | None:
    """First and last timestamp over every timestamped event (all files, all formats), with the
    line that bounds each end and how its time was read; the files none of whose events carry a
    time do not bound it, and are counted."""
    # Only the columns read here: the sorts below would otherwise copy every column of every event.
    timed = events.select("ts", "event_id", "file", "line", "ts_source", "source").filter(pl.col("ts").is_not_null())
    if timed.height == 0:
        return None
    first = timed.sort("ts", "event_id").row(0, named=True)
    last = timed.sort(["ts", "event_id"], descending=[True, False]).row(0, named=True)
    files = events.get_column("file").drop_nulls().unique()
    untimed = sorted(set(files.to_list()) - set(timed.get_column("file").drop_nulls().unique().to_list()))

    def bound(row: dict) -> str:
        return f"{row['file']}:{row['line']} ({row['ts_source'] or row['source'] or 'time'})"

    return {
        "start": first["ts"].isoformat(),
        "end": last["ts"].isoformat(),
        "start_source": bound(first),
        "end_source": bound(last),
        "files_timed": len(files) - len(untimed),
        "files_untimed": len(untimed),
    }
