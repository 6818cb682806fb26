"""Stage 2, parse (checkpoints: layouts): one record per checkpoint, from its files or its directory.

Directories that are one checkpoint (torch.distributed.checkpoint, a DeepSpeed tag, a Hugging
Face / Accelerate folder), groups of per-rank files, single files and the leftovers of interrupted
saves each become one record of `CHECKPOINT_SCHEMA`: is every shard there with its size, which
state it holds, its step. `Auditor` holds what one audit shares: torch availability, the CRC read
budget, the job's world size.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from analyzer.bounds import MAX_WORLD_SIZE, int64, rank_number
from analyzer.io.walk import Walk
from analyzer.parse.checkpoints.contents import EPOCH_KEYS, STEP_KEYS, TENSOR, summarize
from analyzer.parse.checkpoints.files import CRC_BYTES_PER_FILE, ZIP_MAGIC, FileAudit, audit_file, sniff
from analyzer.io.safepickle import Opaque
from analyzer.parse.checkpoints.symbolic import read_pickle_symbolically
from analyzer.ranks import ranks_label

CHECKPOINT_SCHEMA: dict[str, pl.DataType] = {
    "path": pl.String,  # relative to the job root ("../x" next to it); --checkpoint paths as given
    "format": pl.String,  # torch_zip, torch_legacy, pickle, safetensors, dcp, deepspeed, hf, rank_shards, temporary
    "step": pl.Int64,  # training step, from the content or else the name
    "epoch": pl.Float64,
    "mtime": pl.Datetime("us", "UTC"),  # newest file of the checkpoint
    "size_bytes": pl.Int64,
    "readable": pl.Boolean,  # every file opens, every record and shard is there with its size
    "problem": pl.String,  # null, corrupt, shards_missing, unsafe, interrupted
    "reason": pl.String,  # why it is not readable ("" when it is)
    "notes": pl.String,  # other remarks: checks skipped, globals torch would refuse, `latest` tag
    "checked_with": pl.String,  # torch.load(weights_only=True) or the structural check used
    "components": pl.List(pl.String),  # state present: model, optimizer, lr_scheduler, rng_*, data_position, step
    "missing_components": pl.List(pl.String),  # state an exact resume needs that is absent
    "shards_expected": pl.Int64,  # null for single files
    "shards_present": pl.Int64,
    "missing_shards": pl.List(pl.String),
    "missing_ranks": pl.List(pl.Int64),  # ranks whose shard is missing, where the layout names them
    "unsafe_globals": pl.List(pl.String),  # code the pickle names: refused
    "unknown_globals": pl.List(pl.String),  # classes outside torch's weights-only allowlist: not built
    "resumable": pl.Boolean,  # readable, complete, holds model weights
    "exact_resume": pl.Boolean,  # resumable and holds every component an exact resume needs
    "newest_resumable": pl.Boolean,
}

MAX_JSON_BYTES = 64 << 20
CRC_BYTES_PER_AUDIT = 16 << 30

CHECKPOINT_SUFFIXES = frozenset({".pt", ".pth", ".ckpt", ".safetensors"})
HF_INDEX = re.compile(r"\.(?:safetensors|bin)\.index\.json$")
_HF_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})(\.safetensors|\.bin)$")
DS_MODEL = re.compile(r"^(?:(bf16_)?zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
DS_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
DCP_METADATA = re.compile(r"^(?:__\d+)?\.metadata$")
DCP_SHARD = re.compile(r"^__(\d+)_(\d+)\.distcp$")
_STEP_IN_NAME = re.compile(r"(?i)(?<![a-z])(?:global_step|checkpoint|ckpt|step|iter(?:ation)?|it)[-_]?(\d+)")
_EPOCH_IN_NAME = re.compile(r"(?i)(?<![a-z])epoch[-_]?(\d+)")
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


@dataclass
class Auditor:
    """One audit run: torch availability, the CRC read budget, the job facts that shape verdicts."""

    use_torch: bool
    world_size: int | None = None
    crc_left: int = CRC_BYTES_PER_AUDIT

    def file(self, path: Path) -> FileAudit:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        inflated = max(size, _inflated_size(path))  # verifying a CRC reads the inflated bytes, not the file's
        verify = inflated <= CRC_BYTES_PER_FILE and inflated <= self.crc_left
        if verify:
            self.crc_left -= inflated
        return audit_file(path, use_torch=self.use_torch, verify_crc=verify)


def _inflated_size(path: Path) -> int:
    """The bytes a zip's members inflate to, by its central directory (0 for anything else)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != ZIP_MAGIC:
                return 0
        with zipfile.ZipFile(path) as archive:
            return sum(i.file_size for i in archive.infolist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError):
        return 0


def step_from_name(*names: str) -> tuple[int | None, float | None]:
    for name in names:
        match = _STEP_IN_NAME.search(name)
        if match:
            return int64(match.group(1)), None
    for name in names:
        match = _EPOCH_IN_NAME.search(name)
        if match:
            return None, float(match.group(1))
    return None, None


def _mtime(paths: Iterable[Path]) -> datetime | None:
    stamps = []
    for p in paths:
        try:
            stamps.append(p.stat().st_mtime)
        except OSError:
            continue
    return datetime.fromtimestamp(max(stamps), tz=timezone.utc) if stamps else None


def _size(paths: Iterable[Path]) -> int:
    total = 0
    for p in paths:
        try:
            total += p.stat().st_size
        except OSError:
            continue
    return total


def new_record(path: str, fmt: str, **values: Any) -> dict:
    record = {name: None for name in CHECKPOINT_SCHEMA}
    record.update(path=path, format=fmt, reason="", notes="", checked_with="structure", components=[],
                  missing_shards=[], missing_ranks=[], unsafe_globals=[], unknown_globals=[], readable=True,
                  _cuda=False)
    record.update(values)
    return record


def _merge(audits: list[FileAudit], record: dict) -> dict:
    """Fold member files into a directory's record: the first problem wins its reason."""
    order = {"unsafe": 0, "corrupt": 1, "shards_missing": 2, "interrupted": 3}
    worst = sorted((a for a in audits if not a.readable), key=lambda a: order.get(a.problem or "", 9))
    components = set(record["components"])
    notes = [record["notes"]] if record["notes"] else []
    for a in audits:
        components |= a.components
        notes.extend(n for n in a.notes if n not in notes)
        record["_cuda"] = record["_cuda"] or a.cuda
        if record["step"] is None and a.step is not None:
            record["step"] = a.step
        if record["epoch"] is None and a.epoch is not None:
            record["epoch"] = a.epoch
    record["components"] = sorted(components)
    record["notes"] = "; ".join(notes)
    record["unsafe_globals"] = sorted({g for a in audits for g in a.unsafe})
    record["unknown_globals"] = sorted({g for a in audits for g in a.unknown})
    if worst:
        record["readable"] = False
        record["problem"] = record.get("problem") or worst[0].problem
        record["reason"] = "; ".join(filter(None, [record["reason"], *[r for r in dict.fromkeys(a.reason for a in worst[:3])]]))
    return record


def file_record(display: str, path: Path, auditor: Auditor) -> dict | None:
    audit = auditor.file(path)
    if not audit.format:
        return None
    step, epoch = step_from_name(path.stem, path.parent.name)
    checked = audit.checked_with
    record = new_record(display, audit.format,
                     step=step, epoch=epoch, mtime=_mtime([path]), size_bytes=audit.size, checked_with=checked)
    record = _merge([audit], record)
    if audit.step is not None:
        record["step"] = audit.step
    if audit.epoch is not None:
        record["epoch"] = audit.epoch
    return record


def _staged_files(directory: Path) -> list[Path]:
    """The regular files under an interrupted save's staging directory, through the one walk (links
    are not followed: a link's target is not part of the save)."""
    return [Path(level.path) / entry.name for level in Walk(directory)
            for entry in level.entries if entry.is_file(follow_symlinks=False)]


def temporary_record(display: str, path: Path, auditor: Auditor) -> dict:
    """A leftover of an interrupted save: never resumable; its content is described when readable."""
    files = _staged_files(path) if path.is_dir() else [path]
    step, epoch = step_from_name(path.name, path.parent.name)
    what = ("a staging directory the trainer renames when the save completes" if path.is_dir()
            else "a file saved under a temporary name and renamed when complete")
    reason = f"leftover of an interrupted save: {what}; it never got its final name"
    content = [] if path.is_dir() else [auditor.file(path)]
    broken = [a for a in content if a.format and not a.readable]
    if broken:
        reason += f"; its content is incomplete too ({broken[0].reason})"
    return new_record(display, "temporary", step=step, epoch=epoch, mtime=_mtime(files), size_bytes=_size(files),
                   readable=False, problem="unsafe" if any(a.problem == "unsafe" for a in broken) else "interrupted",
                   reason=reason, components=sorted({c for a in content for c in a.components}),
                   unsafe_globals=sorted({g for a in content for g in a.unsafe}))


def dcp_record(display: str, directory: Path, files: list[str]) -> dict:
    """torch.distributed.checkpoint: `.metadata` (written last, by the coordinator) lists every item's
    shard file, offset and length; every listed file must exist and be long enough."""
    paths = [directory / f for f in files]
    step, epoch = step_from_name(directory.name, directory.parent.name)
    record = new_record(display, "dcp", step=step, epoch=epoch, mtime=_mtime(paths), size_bytes=_size(paths),
                     checked_with="structure (.metadata against the shard files)")
    present = {f: (directory / f).stat().st_size for f in files if DCP_SHARD.match(f)}
    metadata = sorted(f for f in files if DCP_METADATA.match(f))
    leftovers = sorted(f for f in files if f.endswith(".metadata.tmp"))
    if not metadata:
        record.update(readable=False, problem="shards_missing", shards_present=len(present),
                      reason="no .metadata: the save did not finish (DCP writes .metadata last, after every rank's shards)"
                             + ("; .metadata.tmp left behind: interrupted while writing it" if leftovers else ""))
        return record
    if leftovers:
        record["notes"] = f"{leftovers[0]} left behind: a later save into this directory was interrupted"
    with open(directory / metadata[0], "rb") as fh:
        pickled = read_pickle_symbolically(fh)
    if pickled.unsafe:
        record.update(readable=False, problem="unsafe", unsafe_globals=pickled.unsafe,
                      reason=f"refused: {metadata[0]} names {', '.join(pickled.unsafe[:4])}, code no checkpoint "
                             "metadata needs (possibly malicious); nothing was executed")
        return record
    state = pickled.obj.state if isinstance(pickled.obj, Opaque) else None
    if pickled.error or not isinstance(state, dict):
        record.update(readable=False, problem="corrupt",
                      reason=f"{metadata[0]} is unreadable: {pickled.error or 'not DCP metadata'}")
        return record
    storage = state.get("storage_data") or {}
    where: dict[str, tuple[str, int, int]] = {}
    need: dict[str, int] = {}
    for index, info in storage.items() if isinstance(storage, dict) else ():
        fields = info.state if isinstance(info, Opaque) and isinstance(info.state, dict) else {}
        relative, offset, length = fields.get("relative_path"), fields.get("offset"), fields.get("length")
        if not isinstance(relative, str) or not isinstance(offset, int) or not isinstance(length, int):
            continue
        need[relative] = max(need.get(relative, 0), offset + length)
        fqn = index.state.get("fqn") if isinstance(index, Opaque) and isinstance(index.state, dict) else None
        if isinstance(fqn, str):
            where.setdefault(fqn, (relative, offset, length))
    missing = sorted(f for f in need if f not in present)
    short = sorted(f for f in need if f in present and present[f] < need[f])
    extra = sorted(set(present) - set(need))
    ranks = sorted({r for f in missing + short if (m := DCP_SHARD.match(f)) and (r := rank_number(m.group(1))) is not None})
    record.update(shards_expected=len(need), shards_present=len(need) - len(missing) - len(short),
                  missing_shards=missing + short, missing_ranks=ranks)
    if extra:
        record["notes"] = "; ".join(filter(None, [record["notes"], f"{len(extra)} shard file(s) not listed in .metadata "
                                                                  f"(left from another save): {', '.join(extra[:3])}"]))
    problems = []
    if missing:
        problems.append(f"{len(missing)} of {len(need)} shard files listed in .metadata are missing: "
                        f"{', '.join(missing[:5])}" + (f" ({ranks_label(ranks)})" if ranks else ""))
    if short:
        problems.append(f"{len(short)} shard file(s) shorter than .metadata says: "
                        + ", ".join(f"{f} ({present[f]} of {need[f]} bytes)" for f in short[:5]))
    if problems:
        record.update(readable=False, problem="shards_missing", reason="; ".join(problems))
    tree = _dcp_tree(state)
    contents = summarize(tree, "")
    record["components"] = sorted(contents.components)
    for fqn, (relative, offset, length) in where.items():
        leaf = fqn.rsplit(".", 1)[-1].lower()
        if fqn.count(".") > 1 or relative not in present or length > (1 << 20) or present[relative] < offset + length:
            continue
        if leaf in STEP_KEYS or leaf in EPOCH_KEYS:
            value = _small_torch_value(directory / relative, offset, length)
            if isinstance(value, int) and not isinstance(value, bool):
                if leaf in STEP_KEYS:
                    record["step"] = value
                    record["components"] = sorted({*record["components"], "step"})
                else:
                    record["epoch"] = float(value)
    return record


def _dcp_tree(state: dict) -> dict:
    """Nest DCP's flat item names back into the state dict's shape (leaves: tensor or bytes marker)."""
    items = state.get("state_dict_metadata") or {}
    planner = state.get("planner_data") if isinstance(state.get("planner_data"), dict) else {}
    tree: dict = {}
    for fqn, meta in items.items() if isinstance(items, dict) else ():
        path = planner.get(fqn)
        parts = [str(p) for p in path] if isinstance(path, tuple) and path else str(fqn).split(".")
        node = tree
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                break
            node = child
        else:
            is_tensor = isinstance(meta, Opaque) and meta.qualname.endswith("TensorStorageMetadata")
            node[parts[-1]] = TENSOR if is_tensor else b"<bytes>"
    return tree


def _small_torch_value(path: Path, offset: int, length: int) -> Any:
    """A small non-tensor DCP item (a torch.save'd int such as `step`), read symbolically."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            blob = fh.read(length)
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            pickled = read_pickle_symbolically(archive.read(name), limit=1 << 20)
    except (OSError, zipfile.BadZipFile, StopIteration, ValueError, EOFError):
        return None
    return None if pickled.error or pickled.unsafe else pickled.obj


def deepspeed_record(display: str, directory: Path, files: list[str], auditor: Auditor) -> dict:
    """A DeepSpeed tag directory: model states per model-parallel rank, ZeRO optimizer partitions per
    data-parallel rank; how many there must be comes from the model states (dp/mp world size)."""
    members = sorted(f for f in files if f.endswith(".pt"))
    audits = {f: auditor.file(directory / f) for f in members}
    step, epoch = step_from_name(directory.name, directory.parent.name)
    record = new_record(display, "deepspeed", step=step, epoch=epoch, mtime=_mtime(directory / f for f in members),
                     size_bytes=_size(directory / f for f in members))
    record = _merge(list(audits.values()), record)
    scalars: dict[str, int] = {}
    for a in audits.values():
        for k, v in a.scalars:
            scalars.setdefault(k, v)
    models = {f: DS_MODEL.match(f) for f in members if DS_MODEL.match(f)}
    optims = {f: DS_OPTIM.match(f) for f in members if DS_OPTIM.match(f)}
    # Shard numbers and sizes past any real job (`mp_rank_<30 digits>`) count as no number.
    mp_seen = [r for r in (rank_number(m.group(3)) for m in (*models.values(), *optims.values())) if r is not None]
    dp_seen = [r for r in (rank_number(m.group(2)) for m in (*optims.values(), *models.values()) if m.group(2)) if r is not None]
    mp = scalars.get("mp_world_size") or (max(mp_seen) + 1 if mp_seen else 1)
    dp = scalars.get("dp_world_size") or scalars.get("partition_count") or (max(dp_seen) + 1 if dp_seen else 1)
    if not scalars.get("dp_world_size") and not scalars.get("partition_count") and auditor.world_size:
        dp = max(dp, auditor.world_size // max(mp, 1))
    if mp * dp > MAX_WORLD_SIZE:  # each value is plausible, not their product: fall back to the files present
        mp, dp = (max(mp_seen) + 1 if mp_seen else 1), (max(dp_seen) + 1 if dp_seen else 1)
    expected: list[str] = []
    zero3 = any(m.group(2) for m in models.values())
    if zero3:
        expected += [f"zero_pp_rank_{d}_mp_rank_{m:02d}_model_states.pt" for m in range(mp) for d in range(dp)]
    else:
        expected += [f"mp_rank_{m:02d}_model_states.pt" for m in range(mp)]
    if optims:
        bf16 = "bf16_" if any(m.group(1) for m in optims.values()) else ""
        expected += [f"{bf16}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt" for m in range(mp) for d in range(dp)]
    missing = [f for f in expected if f not in audits]
    record.update(shards_expected=len(expected), shards_present=len(expected) - len(missing), missing_shards=missing,
                  checked_with=_checked(audits.values()))
    if missing:
        record.update(readable=False, problem=record["problem"] or "shards_missing")
        source = "dp_world_size in the model states" if scalars.get("dp_world_size") else "the shard numbering"
        record["reason"] = "; ".join(filter(None, [
            f"{len(missing)} of {len(expected)} DeepSpeed shard files are missing (expected from {source}: "
            f"dp={dp}, mp={mp}): {', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}. Typical cause: "
            "each node saved its own shards to a local disk", record["reason"]]))
    return record


def _checked(audits: Iterable[FileAudit]) -> str:
    methods = sorted({a.checked_with for a in audits})
    return " + ".join(methods) if methods else "structure"


def hf_record(display: str, directory: Path, files: list[str], nested: list[dict], auditor: Auditor) -> dict:
    """A Hugging Face Trainer / Accelerate checkpoint folder: model files (sharded with an index),
    optimizer, scheduler, per-process RNG files, trainer_state.json (step; the Trainer skips the
    batches it already consumed on resume, so the data position follows from global_step)."""
    step, epoch = step_from_name(directory.name)
    members = [f for f in files if _hf_member(directory / f, f)]
    audits = {f: auditor.file(directory / f) for f in members}
    audits = {f: a for f, a in audits.items() if a.format}
    all_paths = [directory / f for f in files]
    record = new_record(display, "hf", step=step, epoch=epoch, mtime=_mtime(all_paths), size_bytes=_size(all_paths))
    record = _merge(list(audits.values()), record)
    record["checked_with"] = _checked(audits.values())
    components = set(record["components"])
    expected: dict[str, frozenset[str]] = {}  # shard file -> tensors the index maps to it
    for index in (f for f in files if HF_INDEX.search(f)):
        weight_map = _read_json(directory / index).get("weight_map")
        if isinstance(weight_map, dict):
            by_file: dict[str, set[str]] = {}
            for tensor, shard in weight_map.items():
                by_file.setdefault(str(shard), set()).add(str(tensor))
            expected.update({k: frozenset(v) for k, v in by_file.items()})
    for f in files:
        match = _HF_SHARD.match(f)
        if match:
            total = int(match.group(3))
            for n in range(1, total + 1):
                expected.setdefault(f"{match.group(1)}-{n:05d}-of-{match.group(3)}{match.group(4)}", frozenset())
    missing = sorted(f for f in expected if f not in files)
    inconsistent = sorted(f for f, tensors in expected.items()
                          if f in audits and audits[f].format == "safetensors" and audits[f].readable
                          and not tensors <= audits[f].tensor_names)
    if expected:
        record.update(shards_expected=len(expected), shards_present=len(expected) - len(missing), missing_shards=missing)
    problems = []
    if missing:
        problems.append(f"{len(missing)} of {len(expected)} model shard files named by the index are missing: "
                        f"{', '.join(missing[:4])}")
    if inconsistent:
        problems.append(f"shard(s) lack tensors the index maps to them: {', '.join(inconsistent[:3])}")
    if problems:
        record.update(readable=False, problem=record["problem"] or "shards_missing",
                      reason="; ".join(filter(None, [*problems, record["reason"]])))
    state = _read_json(directory / "trainer_state.json") if "trainer_state.json" in files else {}
    if isinstance(state.get("global_step"), int):
        record["step"] = state["global_step"]
        components |= {"step", "data_position"}
    if isinstance(state.get("epoch"), (int, float)):
        record["epoch"] = float(state["epoch"])
    rng_files = [f for f in files if re.match(r"^(?:rng_state(?:_\d+)?\.pth|random_states_\d+\.pkl)$", f)]
    if auditor.world_size and 0 < len(rng_files) < auditor.world_size and len(rng_files) > 1:
        record["notes"] = "; ".join(filter(None, [record["notes"], f"RNG files for {len(rng_files)} of "
                                                                  f"{auditor.world_size} processes"]))
    for sub in nested:
        components |= set(sub["components"])
        record["_cuda"] = record["_cuda"] or sub["_cuda"]
        record["size_bytes"] = (record["size_bytes"] or 0) + (sub["size_bytes"] or 0)
        if sub["mtime"] and (record["mtime"] is None or sub["mtime"] > record["mtime"]):
            record["mtime"] = sub["mtime"]
        if not sub["readable"]:
            record.update(readable=False, problem=record["problem"] or sub["problem"])
            record["reason"] = "; ".join(filter(None, [record["reason"], f"{sub['path']}: {sub['reason']}"]))
        for key in ("missing_shards", "missing_ranks", "unsafe_globals", "unknown_globals"):
            record[key] = sorted({*record[key], *sub[key]})
        if sub["shards_expected"] is not None:
            record["shards_expected"] = (record["shards_expected"] or 0) + sub["shards_expected"]
            record["shards_present"] = (record["shards_present"] or 0) + (sub["shards_present"] or 0)
        if record["step"] is None:
            record["step"] = sub["step"]
    record["components"] = sorted(components)
    return record


def _hf_member(path: Path, name: str) -> bool:
    suffix = path.suffix.lower()
    if suffix in CHECKPOINT_SUFFIXES:
        return True
    return suffix in (".bin", ".pkl") and bool(sniff(path))


def _read_json(path: Path) -> dict:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            return {}
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def rank_group_record(display: str, directory: Path, members: dict[int, str], pattern: tuple[str, str],
                       auditor: Auditor) -> dict:
    """Files one per rank (`model_rank0.pt` ...): every rank from 0 to the highest must be there."""
    audits = [auditor.file(directory / f) for f in members.values()]
    step, epoch = step_from_name(*members.values(), directory.name)
    paths = [directory / f for f in members.values()]
    expected = max(members) + 1
    missing_ranks = sorted(set(range(expected)) - set(members))
    record = new_record(display, "rank_shards", step=step, epoch=epoch, mtime=_mtime(paths), size_bytes=_size(paths),
                     shards_expected=expected, shards_present=len(members), missing_ranks=missing_ranks,
                     missing_shards=[f"{pattern[0]}{r}{pattern[1]}" for r in missing_ranks])
    record = _merge(audits, record)
    record["checked_with"] = _checked(audits)
    if auditor.world_size and auditor.world_size > expected:
        record["notes"] = "; ".join(filter(None, [record["notes"], f"the job ran {auditor.world_size} ranks; files "
                                                                  f"exist for ranks 0-{expected - 1} only"]))
    if missing_ranks:
        record.update(readable=False, problem=record["problem"] or "shards_missing")
        record["reason"] = "; ".join(filter(None, [f"per-rank files missing for rank(s) {', '.join(map(str, missing_ranks[:8]))}",
                                                   record["reason"]]))
    return record


def latest_pointer(directory: Path, files: list[str]) -> tuple[str, str] | None:
    """A 'latest' pointer: DeepSpeed's `latest` (a tag) or Megatron's iteration tracker."""
    for name, fmt in (("latest", "deepspeed"), (MEGATRON_TRACKER, "megatron")):
        if name not in files:
            continue
        try:
            text = (directory / name).read_text(encoding="utf-8", errors="replace")[:256].strip()
        except OSError:
            continue
        if fmt == "megatron":
            text = "release" if text == "release" else (f"iter_{int(text):07d}" if text.isdigit() else "")
        if text and "/" not in text and text not in (".", ".."):
            return text, fmt
    return None
