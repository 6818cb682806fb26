"""Synthetic Flight Recorder dump sets built from a real dump, for tests and benchmarks.

The template is a real PyTorch 2.11 / NCCL 2.28.9 dump recorded in this repository
(`fixtures/recorded/hang_uneven_data/job/fr/nccl_trace_rank_0`, format version "2.10"): its
top-level keys, `pg_config` / `pg_status` layout and entry dicts (with every field PyTorch writes:
`record_id`, `pg_id`, `process_group` tuple, `collective_seq_id`, `p2p_seq_id`, `op_id`,
`profiling_name`, sizes, dtypes, `state`, `retired`, thread, timestamps, `frames`) are copied, and
only the values that tell one rank and one collective from another are changed.

One training step is the template's own steady-state step: its last completed step of DDP
(two gradient-bucket all_reduces from the autograd thread without frames, then the loss
all_reduce from the main thread with its Python frames). A dump is a full ring buffer of
`entries` such entries (TORCH_FR_BUFFER_SIZE=2000 by default) ending in the hang:

- healthy ranks have enqueued the whole stuck step (`scheduled`), everything older `completed`;
- `culprit_mode="behind"`: the culprit never reached the stuck step (all its entries completed,
  last enqueued = the seq before the stall): it is absent from the collective;
- `culprit_mode="barrier"`: at the stuck seq the culprit called `barrier()`
  (`nccl:all_reduce_barrier`, 1 element) while the others issued the gradient all_reduce;
- `missing`: ranks whose dump file is not written at all (a rank that died, a node that hung);
- `side_group`: ranks that also run one extra collective per step in a second process group (a
  pipeline/tensor-parallel style subgroup). Their ring buffers then cover fewer steps and their
  `record_id`s run ahead of the other ranks': exactly what real jobs with several process groups
  look like.

`write_dump_set` pickles one file per rank, named `nccl_trace_rank_<R>` like
TORCH_NCCL_DEBUG_INFO_TEMP_FILE's default prefix: with Python's pickler (`writer="python"`, the
benchmark's default), or with `torch_pickle`, which lays the bytes out as PyTorch's C++ pickler
does in the recorded dumps (`writer="torch"`). `version` writes the layout of an older FR format
version (FORMATS.md 5.5: the keys each version lacks are left out or renamed).
"""

from __future__ import annotations

import copy
import pickle
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = REPO / "fixtures" / "recorded" / "hang_uneven_data" / "job" / "fr" / "nccl_trace_rank_0"
PICKLE_PROTOCOL = 2  # what the C++ recorder writes (the template opens with b"\x80\x02")
STEP_MS = 180  # wall time of one synthetic training step
T0_NS = 1_796_057_000_000_000_000


def load_template(path: Path = TEMPLATE) -> dict:
    """The real dump (recorded by this project, so trusted: plain pickle is fine here)."""
    return pickle.loads(path.read_bytes())


def template_step(doc: dict) -> list[dict]:
    """The last completed training step of the template: the entries from the last completed loss
    all_reduce (an entry with Python frames) back to the previous one."""
    completed = [e for e in doc["entries"] if e["state"] == "completed"]
    with_frames = [i for i, e in enumerate(completed) if e["frames"]]
    if len(with_frames) < 2:
        raise ValueError(f"{TEMPLATE}: no two completed steps to take a step pattern from")
    step = completed[with_frames[-2] + 1 : with_frames[-1] + 1]
    if len(step) < 2 or step[0]["frames"]:
        raise ValueError(f"{TEMPLATE}: the last step does not start with gradient buckets")
    return step


def side_entry(doc: dict) -> dict:
    """A small main-thread broadcast of the template (a metadata broadcast), for the side group."""
    for entry in doc["entries"]:
        if entry["profiling_name"].endswith(":broadcast") and entry["frames"]:
            return entry
    raise ValueError(f"{TEMPLATE}: no broadcast entry to take a side-group entry from")


@dataclass
class DumpSetSpec:
    world: int
    entries: int = 2000  # ring buffer size (TORCH_FR_BUFFER_SIZE)
    steps: int = 800  # steps run before the hang (more than the buffer holds: it has wrapped)
    culprit: int | None = None
    culprit_mode: str = "behind"  # "behind" | "barrier"
    missing: tuple[int, ...] = ()
    side_group: tuple[int, ...] = ()  # ranks of process group "1" (one extra entry per step)
    timeout_ms: int = 600_000
    vary_timestamps: bool = True
    version: str = "2.10"  # FR format version written (FORMATS.md 5.5)
    writer: str = "python"  # "python": pickle.dumps; "torch": torch_pickle (the C++ pickler's layout)


class DumpFactory:
    """Builds rank dumps for one spec; the template is read once."""

    def __init__(self, spec: DumpSetSpec, template: dict | None = None):
        self.spec = spec
        self.doc = template if template is not None else load_template()
        self.step = template_step(self.doc)
        self.side = side_entry(self.doc)
        if spec.culprit is not None and spec.culprit_mode not in ("behind", "barrier"):
            raise ValueError(f"culprit_mode {spec.culprit_mode!r}")
        if spec.version not in VERSION_LAYOUTS or spec.writer not in WRITERS:
            raise ValueError(f"version {spec.version!r} / writer {spec.writer!r}")
        ranks_text = str(list(range(spec.world)))
        self.pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": ranks_text}}
        if spec.side_group:
            self.pg_config["1"] = {"name": "1", "desc": "undefined", "ranks": str(sorted(spec.side_group))}

    VARIANTS = 64

    def variant(self, rank: int) -> int:
        return rank % self.VARIANTS

    def dump_key(self, rank: int) -> tuple:
        """Ranks with equal keys get equal dumps (the rank itself is only in the file name)."""
        special = rank == self.spec.culprit
        return (self.variant(rank), rank in self.spec.side_group, rank if special else None)

    @property
    def stall_seq(self) -> int:
        """The seq the healthy ranks wait in: the first collective of step `steps + 1`."""
        return len(self.step) * self.spec.steps + 1

    def dump(self, rank: int) -> dict:
        spec, per_step = self.spec, len(self.step)
        in_side = rank in spec.side_group
        stuck_step = spec.steps + 1
        # The steps this rank has entries for: every finished step, plus the stuck step on ranks
        # that reached it. Its records: per_step (+1 in the side group) per step, in order.
        reached = stuck_step if not (rank == spec.culprit and spec.culprit_mode == "behind") else spec.steps
        records: list[tuple[int, dict, str, int, str]] = []  # (step, entry template, pg, seq, state)
        side_seq = 0
        for step in range(1, reached + 1):
            stuck = step == stuck_step
            for index, entry in enumerate(self.step):
                seq = (step - 1) * per_step + index + 1
                template = entry
                if stuck and index == 0 and rank == spec.culprit and spec.culprit_mode == "barrier":
                    template = self._barrier(entry)
                records.append((step, template, "0", seq, "scheduled" if stuck else "completed"))
                if stuck and template is not entry:
                    break  # after its barrier the culprit enqueues nothing more
            if in_side and not stuck:
                side_seq += 1
                records.append((step, self.side, "1", side_seq, "completed"))
        kept = records[-spec.entries :]
        first_record = len(records) - len(kept)
        # Per-rank variation (timing skew, autograd thread name) depends on `variant(rank)` only, so
        # that big sets can reuse the bytes of equal dumps (see `write_dump_set`).
        variant = self.variant(rank)
        skew_ns = variant * 15_625 if spec.vary_timestamps else 0
        entries = []
        for offset, (step, template, pg, seq, state) in enumerate(kept):
            entry = copy.copy(template)
            # Real dumps (pickled by the C++ recorder) share identical frame dicts between entries but
            # build every list anew; do the same so that unpickling costs what a real dump costs.
            entry["input_sizes"] = [list(shape) for shape in template["input_sizes"]]
            entry["output_sizes"] = [list(shape) for shape in template["output_sizes"]]
            entry["input_dtypes"] = list(template["input_dtypes"])
            entry["output_dtypes"] = list(template["output_dtypes"])
            entry["frames"] = list(template["frames"])
            created = T0_NS + step * STEP_MS * 1_000_000 + offset % 8 * 50_000 + skew_ns
            entry.update(
                record_id=first_record + offset,
                pg_id=int(pg),
                process_group=(pg, self.pg_config[pg]["desc"]),
                collective_seq_id=seq,
                op_id=seq,
                state=state,
                retired=state == "completed",
                timeout_ms=spec.timeout_ms,
                time_created_ns=created,
                time_discovered_started_ns=None,
                time_discovered_completed_ns=created + 40_000_000 if state == "completed" else None,
                thread_id=str(140_000_000_000_000 + variant * 64 + (0 if template["frames"] else 1)),
                thread_name=("python" if template["frames"] else f"pt_autograd_{variant % 8}"),
            )
            entries.append(entry)
        status = {"0": self._status(records, "0")}
        if in_side:
            status["1"] = self._status(records, "1")
        return as_version({
            "version": self.doc["version"],
            "comm_lib_version": self.doc.get("comm_lib_version"),
            "pg_config": self.pg_config if in_side else {"0": self.pg_config["0"]},
            "pg_status": status,
            "entries": entries,
        }, spec.version)

    def _barrier(self, bucket: dict) -> dict:
        barrier = copy.copy(bucket)
        frames = next((e["frames"] for e in self.doc["entries"] if e["profiling_name"].endswith("all_reduce_barrier")), None)
        barrier.update(
            profiling_name=bucket["profiling_name"].split(":", 1)[0] + ":all_reduce_barrier",
            input_sizes=[[1]],
            output_sizes=[[1]],
            frames=frames or [{"filename": "torch/distributed/distributed_c10d.py", "line": 5030, "name": "barrier"}],
        )
        return barrier

    @staticmethod
    def _status(records: list[tuple], pg: str) -> dict:
        seqs = [seq for _, _, p, seq, _ in records if p == pg]
        done = [seq for _, _, p, seq, state in records if p == pg and state == "completed"]
        return {
            "last_enqueued_collective": max(seqs, default=-1),
            "last_started_collective": -1,
            "last_completed_collective": max(done, default=-1),
        }


# FR version -> (top-level key of the NCCL version or None, entry keys it lacks, entry keys renamed).
VERSION_LAYOUTS: dict[str, tuple[str | None, tuple[str, ...], dict[str, str]]] = {
    "2.10": ("comm_lib_version", (), {}),
    "2.9": ("nccl_version", ("thread_id", "thread_name"), {}),
    "2.5": (None, ("thread_id", "thread_name"), {}),
    "2.3": (None, ("thread_id", "thread_name", "timeout_ms", "is_p2p"), {}),
    "1.5": (None, ("thread_id", "thread_name", "timeout_ms", "is_p2p", "process_group", "p2p_seq_id"),
            {"collective_seq_id": "seq_id"}),
}


def as_version(doc: dict, version: str) -> dict:
    """`doc` (written as FR 2.10) in the layout of FR `version`."""
    if version == "2.10":
        return doc
    comm_key, dropped, renamed = VERSION_LAYOUTS[version]
    out = {"version": version}
    if comm_key is not None:
        out[comm_key] = doc["comm_lib_version"]
    out["pg_config"] = doc["pg_config"]
    if not version.startswith("1."):
        out["pg_status"] = doc["pg_status"]
    out["entries"] = [{renamed.get(k, k): v for k, v in e.items() if k not in dropped} for e in doc["entries"]]
    return out


def torch_pickle(obj: object) -> bytes:
    """Protocol-2 bytes laid out as PyTorch's C++ pickler writes a Flight Recorder dump (see the
    recorded dumps): every string memoized by value at its first use, dicts and lists opened with
    MARK even when empty, and a container memoized (BINPUT after it) only when it is shared."""
    seen: dict[int, int] = {}

    def count(value: object) -> None:
        if isinstance(value, (dict, list, tuple)):
            seen[id(value)] = seen.get(id(value), 0) + 1
            if seen[id(value)] == 1:  # the contents of a shared container are written once
                for item in (value.values() if isinstance(value, dict) else value):
                    count(item)

    count(obj)
    out = bytearray(b"\x80\x02")
    strings: dict[str, int] = {}
    containers: dict[int, int] = {}
    memo = [0]

    def put() -> int:
        index = memo[0]
        memo[0] += 1
        out.extend(b"q" + bytes((index,)) if index < 256 else b"r" + struct.pack("<I", index))
        return index

    def get(index: int) -> None:
        out.extend(b"h" + bytes((index,)) if index < 256 else b"j" + struct.pack("<I", index))

    def push(value: object, top: bool = False) -> None:
        shared = isinstance(value, (dict, list)) and (seen.get(id(value), 0) > 1 or top)
        if shared and id(value) in containers:
            get(containers[id(value)])
            return
        if value is None:
            out.extend(b"N")
        elif value is True or value is False:
            out.extend(b"\x88" if value else b"\x89")
        elif isinstance(value, int):
            if 0 <= value < 256:
                out.extend(b"K" + bytes((value,)))
            elif 0 <= value < 65536:
                out.extend(b"M" + struct.pack("<H", value))
            elif -(2**31) <= value < 2**31:
                out.extend(b"J" + struct.pack("<i", value))
            else:
                out.extend(b"\x8a\x08" + struct.pack("<q", value))
        elif isinstance(value, float):
            out.extend(b"G" + struct.pack(">d", value))
        elif isinstance(value, str):
            if value in strings:
                get(strings[value])
            else:
                encoded = value.encode("utf-8", "surrogatepass")
                out.extend(b"X" + struct.pack("<I", len(encoded)) + encoded)
                strings[value] = put()
        elif isinstance(value, tuple):
            if len(value) <= 3:
                for item in value:
                    push(item)
                out.extend((b")", b"\x85", b"\x86", b"\x87")[len(value)])
            else:
                out.extend(b"(")
                for item in value:
                    push(item)
                out.extend(b"t")
        elif isinstance(value, list):
            out.extend(b"](")
            for item in value:
                push(item)
            out.extend(b"e")
        elif isinstance(value, dict):
            out.extend(b"}(")
            for key, item in value.items():
                push(key)
                push(item)
            out.extend(b"u")
        else:
            raise TypeError(f"torch_pickle: {type(value).__name__}")
        if shared:
            containers[id(value)] = put()

    push(obj, top=True)
    out.extend(b".")
    return bytes(out)


WRITERS = {"python": lambda doc: pickle.dumps(doc, protocol=PICKLE_PROTOCOL), "torch": torch_pickle}


def dump_name(rank: int) -> str:
    return f"nccl_trace_rank_{rank}"


def write_dump_set(directory: Path, spec: DumpSetSpec, ranks: Iterable[int] | None = None, template: dict | None = None) -> list[Path]:
    """Pickle one dump per rank of `spec` (except `spec.missing`) into `directory`.

    Equal dumps (same `dump_key`) are pickled once and their bytes written again: a 16k-rank set
    then takes disk time, not 16k pickling runs.
    """
    directory.mkdir(parents=True, exist_ok=True)
    factory = DumpFactory(spec, template)
    cache: dict[tuple, bytes] = {}
    written = []
    for rank in ranks if ranks is not None else range(spec.world):
        if rank in spec.missing:
            continue
        key = factory.dump_key(rank)
        data = cache.get(key)
        if data is None:
            data = cache[key] = WRITERS[spec.writer](factory.dump(rank))
        path = directory / dump_name(rank)
        path.write_bytes(data)
        written.append(path)
    return written
