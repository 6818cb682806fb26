"""Stage 3, facts (checkpoint audit): can this job resume, and will it resume correctly?

Finds the checkpoints among what discovery listed of the job (`analyzer.io.Listing`: the job is
walked once, and nothing beside it is looked at) and at `--checkpoint` paths (listed by the same
walk), has each one read by `analyzer.parse.checkpoints` (complete and readable? which training
state?), and names the newest one to resume from. Formats: torch.save files (zip and legacy), torch.distributed.checkpoint
(DCP) directories, DeepSpeed tag directories (with `latest`), Hugging Face / Accelerate checkpoint
folders (safetensors with their index), per-rank shard files, and the leftovers of interrupted
saves. The result is one polars frame, one row per checkpoint (`CHECKPOINT_SCHEMA`), which the
`checkpoint_audit` analysis (analyzer/analyses/checkpoint.py) turns into findings and the report
lists under `checkpoints`.

The audit is made once, by `analyzer.facts.job_context`; the analysis and the report read its table.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

import polars as pl

from analyzer.bounds import rank_number
from analyzer.exits import INPUT_ERRORS
from analyzer.io import Listing, list_path
from analyzer.parse.checkpoints.files import sniff, torch_available
from analyzer.parse.checkpoints.layouts import (CHECKPOINT_SCHEMA, CHECKPOINT_SUFFIXES, DCP_METADATA, DCP_SHARD, DS_MODEL,
                                                DS_OPTIM, HF_INDEX, MEGATRON_TRACKER, Auditor, dcp_record,
                                                deepspeed_record, file_record, hf_record, latest_pointer, new_record,
                                                rank_group_record, step_from_name, temporary_record)

COMPONENTS = ("model", "optimizer", "lr_scheduler", "rng_python", "rng_numpy", "rng_torch", "rng_cuda",
              "data_position", "step", "grad_scaler")
# What an exact resume needs; rng_cuda only when the job ran on GPUs.
_EXACT_RESUME = ("model", "optimizer", "lr_scheduler", "rng_python", "rng_numpy", "rng_torch", "data_position", "step")

_SNIFFED_SUFFIXES = frozenset({".bin", ".pkl", ".pickle", ".distcp", ".model", ".state", ".zip", ""})
_TEMP_NAME = re.compile(r"(?i)(?:\.(?:tmp|temp|partial|part|incomplete|inprogress|writing)(?:[.\-_~][A-Za-z0-9]{1,16})?|~)$")
_TEMP_DIR = re.compile(r"(?i)^tmp[-_](?:checkpoint|ckpt)[-_]?\d+$")
_CHECKPOINT_WORD = re.compile(r"(?i)ckpt|checkpoint|model|optim|sched|rng|weights|state|step|epoch|\.pt|\.pth|\.bin|\.safetensors|\.distcp|\.metadata")
_HF_DIR = re.compile(r"^checkpoint[-_]\d+$")
_HF_MARKERS = re.compile(r"^(?:trainer_state\.json|random_states_\d+\.pkl|optimizer(?:_\d+)?\.bin|scheduler(?:_\d+)?\.bin"
                         r"|rng_state(?:_\d+)?\.pth)$")
_RANK_FILE = re.compile(r"(?i)^(.*?rank)[_\-]?(\d+)(\D.*)?$")

def _display(base: str, relative: str) -> str:
    if relative in ("", "."):
        return base or "."
    return f"{base.rstrip('/')}/{relative}" if base else relative


def _tree(listing: Listing) -> list[tuple[Path, list[str]]]:
    """(directory, its files) for every directory of the listing, in walk order. Special files are
    left out, and a link counts only when it names a file inside the listed root: `model.pt ->
    /etc/shadow` is never opened nor stat'ed."""
    root = listing.root
    real_root = _real(root)
    files_of: dict[str, list[str]] = {d: [] for d in listing.dirs}
    for rel in listing.files:
        parent, _, name = rel.rpartition("/")
        if parent in files_of and _auditable(listing, rel, real_root):
            files_of[parent].append(name)
    return [(root / d if d else root, files) for d, files in files_of.items()]


def _auditable(listing: Listing, rel: str, real_root: Path | None) -> bool:
    if rel in listing.special:
        return False
    if rel not in listing.links:
        return True
    target = _real(listing.root / rel)
    return real_root is not None and target is not None and target.is_relative_to(real_root) and target.is_file()


def _real(path: Path) -> Path | None:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # Python < 3.13 raises RuntimeError for a symlink loop
        return None


def _dir_kind(directory: Path, files: list[str]) -> str | None:
    kind = None
    if any(DCP_METADATA.match(f) or DCP_SHARD.match(f) or f.endswith(".metadata.tmp") for f in files):
        kind = "dcp"
    elif any(DS_MODEL.match(f) or DS_OPTIM.match(f) for f in files):
        kind = "deepspeed"
    elif _HF_DIR.match(directory.name) or any(_HF_MARKERS.match(f) or HF_INDEX.search(f) for f in files):
        kind = "hf"
    if _TEMP_DIR.match(directory.name) or (_TEMP_NAME.search(directory.name) and kind):
        return "temporary"  # a staging directory the save renames when it completes
    return kind


def _is_temporary_checkpoint(path: Path) -> bool:
    if not _TEMP_NAME.search(path.name):
        return False
    return bool(_CHECKPOINT_WORD.search(path.name)) or bool(sniff(path))


def _name_may_be_checkpoint(name: str) -> bool:
    suffix = os.path.splitext(name)[1].lower()
    return (suffix in CHECKPOINT_SUFFIXES or suffix in _SNIFFED_SUFFIXES or len(suffix) > 8
            or bool(_TEMP_NAME.search(name)))


def _single_candidate(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix in CHECKPOINT_SUFFIXES:
        return True
    if suffix not in _SNIFFED_SUFFIXES and len(suffix) <= 8:
        return False
    kind = sniff(path)
    if kind == "pickle":
        # A plain pickle is a checkpoint only by its name: Flight Recorder dumps are pickles too.
        return suffix in (".pkl", ".pickle", ".bin") and bool(_CHECKPOINT_WORD.search(path.stem))
    return bool(kind)


def _audit_listing(listing: Listing, base: str, named: bool, auditor: Auditor, seen: set[Path]) -> list[dict]:
    """The checkpoints of a listing: its directory tree, or its one file: audited as a checkpoint when
    `--checkpoint` names it, else only when it is one (a single log analysed is no checkpoint)."""
    root = listing.root
    if listing.dirs:
        return _audit_tree(root, _tree(listing), base, auditor, seen)
    if named:
        return [record for rel in listing.files for record in _audit_file(root / rel, base or rel, auditor, seen)]
    real_root = _real(root)
    files = [rel for rel in listing.files if _auditable(listing, rel, real_root)]
    return _loose_files(root, files, lambda path: _display(base, path.relative_to(root).as_posix()), auditor, seen)


def _audit_file(path: Path, label: str, auditor: Auditor, seen: set[Path]) -> list[dict]:
    if not path.is_file():  # a FIFO, a device, a dangling link or a link loop: nothing to audit
        return []
    real = path.resolve()
    if real in seen:
        return []
    seen.add(real)
    if _is_temporary_checkpoint(path):
        return [temporary_record(label, path, auditor)]
    record = file_record(label, path, auditor)
    return [record] if record else []


def _audit_tree(location: Path, tree: list[tuple[Path, list[str]]], base: str, auditor: Auditor,
                seen: set[Path]) -> list[dict]:
    records: list[dict] = []
    kinds = {d: _dir_kind(d, files) for d, files in tree}
    files_of = dict(tree)
    consumed: set[Path] = set()
    pointers: dict[Path, tuple[str, str]] = {}
    for directory, files in tree:
        pointer = latest_pointer(directory, files)
        if pointer:
            pointers[directory] = pointer

    def rel(path: Path) -> str:
        return _display(base, path.relative_to(location).as_posix())

    def unit_record(directory: Path) -> dict | None:
        kind = kinds[directory]
        files = files_of[directory]
        if kind == "dcp":
            return dcp_record(rel(directory), directory, files)
        if kind == "deepspeed":
            return deepspeed_record(rel(directory), directory, files, auditor)
        return None

    def directory_records(directory: Path, files: list[str]) -> list[dict]:
        real = directory.resolve()
        kind = kinds[directory]
        if kind is not None:
            seen.add(real)
        if kind == "temporary":
            consumed.update(d for d in kinds if d.is_relative_to(directory))
            return [temporary_record(rel(directory), directory, auditor)]
        if kind == "hf":
            children = [d for d in kinds if d.parent == directory and kinds[d] in ("dcp", "deepspeed")]
            consumed.update(children)
            nested = [r for r in (unit_record(d) for d in children) if r]
            return [hf_record(rel(directory), directory, files, nested, auditor),
                    *_temporaries(directory, files, rel, auditor)]
        if kind in ("dcp", "deepspeed"):
            return [r for r in (unit_record(directory),) if r] + _temporaries(directory, files, rel, auditor)
        return _loose_files(directory, files, rel, auditor, seen)

    for directory, files in tree:
        if directory in consumed or directory.resolve() in seen:
            continue
        try:
            records.extend(directory_records(directory, files))
        except INPUT_ERRORS as exc:  # one odd directory must not stop the audit of the others
            records.append(new_record(rel(directory), kinds[directory] or "unknown", readable=False,
                                   reason=f"could not audit: {type(exc).__name__}: {exc}"[:300]))
    records.extend(_pointer_records(pointers, kinds, records, rel))
    return records


def _temporaries(directory: Path, files: list[str], rel: Any, auditor: Auditor) -> list[dict]:
    return [temporary_record(rel(directory / f), directory / f, auditor) for f in files
            if not f.endswith(".metadata.tmp") and _is_temporary_checkpoint(directory / f)]


def _loose_files(directory: Path, files: list[str], rel: Any, auditor: Auditor, seen: set[Path]) -> list[dict]:
    """Files in an ordinary directory: leftovers, per-rank groups, single checkpoints."""
    records = []
    singles = []
    for f in files:
        if not _name_may_be_checkpoint(f):
            continue  # a log: decided from the name alone, without a syscall (job dirs hold many)
        path = directory / f
        temporary = _is_temporary_checkpoint(path)
        if not temporary and not _single_candidate(path):
            continue
        real = path.resolve()
        if real in seen:
            continue
        seen.add(real)
        if temporary:
            records.append(temporary_record(rel(path), path, auditor))
        else:
            singles.append(f)
    groups: dict[tuple[str, str], dict[int, str]] = {}
    for f in singles:
        match = _RANK_FILE.match(f)
        if match:
            rank = rank_number(match.group(2))  # `model_rank<30 digits>.pt` is no rank file
            if rank is not None:
                groups.setdefault((match.group(1), match.group(3) or ""), {})[rank] = f
    grouped = set()
    for pattern, members in sorted(groups.items()):
        if len(members) < 2:
            continue
        grouped.update(members.values())
        label = f"{pattern[0]}{{0..{max(members)}}}{pattern[1]}"
        records.append(rank_group_record(rel(directory / label), directory, members, pattern, auditor))
    for f in singles:
        if f not in grouped:
            record = file_record(rel(directory / f), directory / f, auditor)
            if record:
                records.append(record)
    return records


def _pointer_records(pointers: dict[Path, tuple[str, str]], kinds: dict[Path, str | None], records: list[dict],
                     rel: Any) -> list[dict]:
    """`latest` names the tag a resume loads: note it on that checkpoint, flag newer ones it does not
    name (the save may not have finished), and report a tag that does not exist."""
    extra = []
    by_path = {r["path"]: r for r in records}
    for directory, (tag, fmt) in pointers.items():
        target = directory / tag
        named = by_path.get(rel(target))
        if named is None and not target.exists():
            step, epoch = step_from_name(tag)
            extra.append(new_record(rel(target), fmt, step=step, epoch=epoch, readable=False, problem="shards_missing",
                                 reason=f"`{rel(directory / ('latest' if fmt == 'deepspeed' else MEGATRON_TRACKER))}` "
                                        f"names {tag}, which does not exist: a resume through it fails"))
            continue
        if named is not None:
            named["notes"] = "; ".join(filter(None, [named["notes"], f"named by {fmt}'s latest pointer"]))
        tag_step = named["step"] if named else step_from_name(tag)[0]
        for record in records:
            sibling = record is not named and str(PurePosixPath(record["path"]).parent) == rel(directory) \
                and record["format"] in ("deepspeed", "dcp", "megatron", "hf")
            if sibling and tag_step is not None and record["step"] is not None and record["step"] > tag_step:
                record["notes"] = "; ".join(filter(None, [record["notes"], f"newer than the latest pointer ({tag}): "
                                                                          "the save may not have finished"]))
    return extra


def audit(job: Listing | str | os.PathLike[str] | None, checkpoint_paths: Iterable[str] = (), *,
          world_size: int | None = None, expect_cuda: bool = False, use_torch: bool | None = None) -> pl.DataFrame:
    """Every checkpoint among what `job` lists (discovery's listing, or a path listed here by the
    same walk) and at `checkpoint_paths`, audited: one row each (`CHECKPOINT_SCHEMA`), newest first,
    with the newest resumable one marked. Nothing else is read: a checkpoint directory beside the
    job is audited only when a `checkpoint_paths` entry names it.

    `world_size` (when the logs tell it) checks per-rank files against the job's size;
    `expect_cuda` (the job ran on GPUs) makes CUDA RNG state part of an exact resume. `use_torch`
    None means: use torch.load(weights_only=True) when torch is installed.
    """
    auditor = Auditor(torch_available() if use_torch is None else use_torch, world_size)
    records: list[dict] = []
    seen: set[Path] = set()
    missing_paths = []
    for extra in checkpoint_paths:
        if not Path(extra).exists():
            missing_paths.append(new_record(str(extra), "missing", readable=False, problem="corrupt",
                                         reason="--checkpoint path does not exist"))
    for base, listing, named in _locations(job, checkpoint_paths):
        try:
            records.extend(_audit_listing(listing, base, named, auditor, seen))
        except OSError as exc:
            records.append(new_record(base or str(listing.root), "unknown", readable=False, problem="corrupt",
                                   reason=f"cannot read: {exc.strerror or exc}"))
    return _table(records + missing_paths, expect_cuda)


def _locations(job: Listing | str | os.PathLike[str] | None,
               checkpoint_paths: Iterable[str]) -> list[tuple[str, Listing, bool]]:
    """(label, listing, named by --checkpoint) for every --checkpoint path that exists, the last
    named first, then the job (label "": its paths are shown relative to it)."""
    found = [(str(extra), list_path(Path(extra)), True) for extra in reversed(tuple(checkpoint_paths))
             if Path(extra).exists() or Path(extra).is_symlink()]
    if job is not None:
        listing = job if isinstance(job, Listing) else list_path(Path(job))
        if listing.root is not None:  # standard input lists nothing on disk
            found.append(("", listing, False))
    return found


def _table(records: list[dict], expect_cuda: bool) -> pl.DataFrame:
    if not records:
        return pl.DataFrame(schema=CHECKPOINT_SCHEMA)
    for record in records:
        if not record["readable"] and not record["reason"]:
            record["reason"] = "unreadable"
    frame = pl.DataFrame(records, schema={**CHECKPOINT_SCHEMA, "_cuda": pl.Boolean})
    order = {name: i for i, name in enumerate(COMPONENTS)}
    needed = pl.when(pl.col("_cuda") | pl.lit(expect_cuda)).then(pl.lit([*_EXACT_RESUME, "rng_cuda"])) \
        .otherwise(pl.lit(list(_EXACT_RESUME)))
    by_order = pl.element().replace_strict(order, default=len(order), return_dtype=pl.Int64)
    frame = (
        frame.with_columns(
            pl.col("components").list.eval(pl.element().sort_by(by_order)),
            needed.list.set_difference(pl.col("components")).list.eval(pl.element().sort_by(by_order))
            .alias("missing_components"),
            (pl.col("readable") & pl.col("components").list.contains("model") & (pl.col("format") != "temporary"))
            .alias("resumable"),
        )
        .with_columns(
            (pl.col("resumable") & (pl.col("missing_components").list.len() == 0)).alias("exact_resume"),
        )
        .sort(["step", "epoch", "mtime", "path"], descending=[True, True, True, False], nulls_last=True,
              maintain_order=True)
        .with_row_index("_order")
    )
    # The one to resume from: the newest resumable training checkpoint; weights-only exports (no
    # optimizer state: a final model save, a raw state_dict) only when there is nothing else.
    best = (
        frame.filter("resumable")
        .sort([pl.col("components").list.contains("optimizer"), "step", "epoch", "mtime", "path"],
              descending=[True, True, True, True, False], nulls_last=True, maintain_order=True)
        .get_column("_order").head(1).to_list()
    )
    frame = frame.with_columns(pl.col("_order").is_in(best).alias("newest_resumable"))
    return frame.select(list(CHECKPOINT_SCHEMA))


def audit_job(events: pl.DataFrame, job: Any, listing: Listing) -> pl.DataFrame:
    """`audit` of discovery's listing with what the job's logs tell: --checkpoint paths, world size,
    GPU use."""
    gpu = bool(events.height) and bool(events.select((pl.col("source") == "nccl").any()).item())
    return audit(listing, job.checkpoint_paths, world_size=job.world_size, expect_cuda=gpu)


def report_records(frame: pl.DataFrame) -> list[dict]:
    """The table as JSON-ready dicts for the report's `checkpoints` key."""
    rows = frame.with_columns(pl.col("mtime").dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ")).to_dicts()
    return rows
