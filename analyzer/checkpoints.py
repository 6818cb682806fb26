"""Checkpoint audit (stage 4, detect, support): can this job resume, and will it resume correctly?

Finds the checkpoints in (and next to) a job directory and at `--checkpoint` paths, checks that
each one is complete and readable, lists the training state it holds, and names the newest one to
resume from. Formats: torch.save files (zip and legacy), torch.distributed.checkpoint (DCP)
directories, DeepSpeed tag directories (with `latest`), Hugging Face / Accelerate checkpoint
folders (safetensors with their index), per-rank shard files, and the leftovers of interrupted
saves. The result is one polars frame, one row per checkpoint (`CHECKPOINT_SCHEMA`).

Nothing in a checkpoint is ever executed. Pickles are read by a symbolic unpickler: each global a
pickle names becomes an inert placeholder that records the name and its arguments, so the
structure (keys, tensors, storage references) is visible without importing or calling anything.
A pickle that names code (os.system, eval, subprocess, ...) is refused. When torch is installed, a
file whose pickle names only what torch's weights-only loader admits is also loaded with
`torch.load(weights_only=True, mmap=True)`; without torch the checks are structural (zip central
directory, CRCs, storage records against the pickle's references) and the record says so.

Per-file results are cached by (path, size, mtime, ctime, inode), so the report and the analysis
can both call `audit` on the same job and the files are read once.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import re
import struct
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import lru_cache
from itertools import islice
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import polars as pl

from analyzer.bounds import MAX_WORLD_SIZE, bounded_str, int64, rank_number
from analyzer.parse.budget import BudgetExceeded, address_space
from analyzer.safepickle import CorruptPickleError, load_bounded

from analyzer.exits import INPUT_ERRORS

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

COMPONENTS = ("model", "optimizer", "lr_scheduler", "rng_python", "rng_numpy", "rng_torch", "rng_cuda",
              "data_position", "step", "grad_scaler")
# What an exact resume needs; rng_cuda only when the job ran on GPUs.
_EXACT_RESUME = ("model", "optimizer", "lr_scheduler", "rng_python", "rng_numpy", "rng_torch", "data_position", "step")

# Caps that keep one hostile or huge checkpoint from exhausting the machine or the time budget.
MAX_WALK_FILES = 200_000
MAX_PICKLE_BYTES = 512 << 20
MAX_JSON_BYTES = 64 << 20
CRC_BYTES_PER_FILE = 4 << 30  # CRCs of larger files are not verified (sizes still are)
CRC_BYTES_PER_AUDIT = 16 << 30
TORCH_LEGACY_LOAD_BYTES = 1 << 30  # legacy files cannot be mmapped: torch.load reads them whole
TRUNCATION_SCAN_BYTES = 1 << 30
_WALK_NODES = 200_000  # nodes of one unpickled object examined for components
_WALK_DEPTH = 6

_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_HEAD = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # pickled _LEGACY_MAGIC
_SAFETENSORS_HEAD = re.compile(rb"^[\s\S]{4}\x00\x00\x00\x00\{\"", re.DOTALL)
_PICKLE_PROTO = re.compile(rb"^\x80[\x02-\x05]")

# --------------------------------------------------------------------------------------------
# Globals a pickle may name. Mirrors torch's weights-only allowlist (torch/_weights_only_unpickler.py)
# plus the numpy objects of `np.random.get_state()`, so the verdict does not depend on torch being
# installed.
_ALLOWED_GLOBALS = frozenset({
    "collections.OrderedDict", "collections.Counter", "torch.nn.parameter.Parameter", "torch.serialization._get_layout",
    "torch.Size", "torch.Tensor", "torch.device", "_codecs.encode", "builtins.bytearray", "builtins.set",
    "builtins.complex", "torch._tensor._rebuild_from_type_v2",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
})
_ALLOWED_PATTERN = re.compile(
    r"^(?:torch\._utils\._rebuild_\w+"
    r"|torch\.(?:cuda\.)?\w*Storage|torch\.storage\.(?:Typed|Untyped)Storage"
    r"|torch\.(?:cuda\.)?\w+Tensor"
    r"|torch\.(?:u?int\d+|float\d+\w*|bfloat16|half|double|float|long|int|short|bool|cfloat|cdouble|chalf"
    r"|complex\d+|q(?:u?int)\d+\w*|bits\w+)"
    r"|torch\.per_(?:tensor|channel)_\w+"
    r"|numpy\.dtypes\.\w+DType)$"
)
# Names no checkpoint needs and every pickle exploit uses: the file is refused, never loaded. Only
# callables that run code, touch files or the network, or reach attributes (getattr, operator: a
# GLOBAL can resolve to a module, and an attribute getter turns any module into `os.system`).
# Classes that legitimate checkpoints pickle (DTensor, DeviceMesh, Generator, user dataclasses)
# are "unknown", never "unsafe": a false alarm of malice is costly.
_UNSAFE_MODULES = frozenset({
    "os", "posix", "nt", "subprocess", "_posixsubprocess", "sys", "importlib", "runpy", "socket", "shutil", "pty",
    "code", "codeop", "ctypes", "_ctypes", "cffi", "pickle", "_pickle", "cPickle", "marshal", "types", "webbrowser",
    "multiprocessing", "asyncio", "signal", "pdb", "bdb", "timeit", "trace", "profile", "cProfile", "pydoc",
    "platform", "commands", "popen2", "urllib", "urllib2", "urllib3", "http", "ftplib", "smtplib", "telnetlib",
    "requests", "tempfile", "zipimport", "threading", "_thread", "dill", "joblib", "shelve", "sqlite3", "zipfile",
    "tarfile", "gc", "site", "venv", "ensurepip", "pip", "setuptools", "distutils", "pexpect", "paramiko", "fabric",
    "yaml", "jinja2", "operator", "_operator", "pkgutil", "inspect",
})
# Functions that resolve a name to any object or run a process, whatever module holds them
# (`torch.utils.collect_env.run(cmd)`, `pkgutil.resolve_name("os:system")`, a project's `run_command`):
# no checkpoint pickles a call of one. Classes (CamelCase) are never matched by these.
_UNSAFE_CALLABLE = re.compile(
    r"^(?:run|run_\w+|\w+_run|system|popen\w*|spawn\w*|exec\w*|eval\w*|call|check_call|check_output|getoutput|"
    r"getstatusoutput|resolve_name|resolve|locate|import_module|import_string|load_module|find_spec|get_attr|"
    r"attrgetter|methodcaller|dynamic_import|import_\w+)$")
_UNSAFE_NAMES = {
    "builtins": frozenset({"eval", "exec", "execfile", "compile", "getattr", "setattr", "delattr", "__import__",
                           "open", "file", "input", "raw_input", "breakpoint", "globals", "locals", "vars", "apply",
                           "reload", "exit", "quit", "help", "memoryview", "__build_class__"}),
    "io": frozenset({"open", "open_code", "FileIO"}),
}
_UNSAFE_NAMES["__builtin__"] = _UNSAFE_NAMES["builtins"]
_UNSAFE_NAMES["_io"] = _UNSAFE_NAMES["io"]
_UNSAFE_TORCH = re.compile(r"^torch\.(?:load|hub\.|jit\.(?:load|_load)|package\.|utils\.cpp_extension\.|utils\.collect_env\."
                           r"|serialization\.load|_dynamo\.|_inductor\.|distributed\.rpc\.)")


def classify_global(qualname: str) -> str:
    """'allowed' (torch's weights-only set), 'unsafe' (code: refuse the file) or 'unknown' (a class)."""
    if qualname in _ALLOWED_GLOBALS or _ALLOWED_PATTERN.match(qualname):
        return "allowed"
    module, _, name = qualname.rpartition(".")
    root = module.split(".", 1)[0]
    if root in _UNSAFE_MODULES or _UNSAFE_TORCH.match(qualname) or name in _UNSAFE_NAMES.get(module, ()) \
            or _UNSAFE_CALLABLE.match(name):
        return "unsafe"
    return "unknown"


# --------------------------------------------------------------------------------------------
# Symbolic unpickling: build the structure, call nothing.


class _Opaque:
    """Stands for an object a pickle asked a global to build; the global was never imported or called.

    Subclassed once per global name (`qualname`). REDUCE/NEWOBJ record their arguments here, BUILD
    records the state, SETITEMS/APPENDS on it (OrderedDict, defaultdict, list subclasses) record
    the items: everything the pickle said, nothing it would have run.
    """

    __slots__ = ("args", "kwargs", "state", "items", "pairs")
    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> _Opaque:
        self = object.__new__(cls)
        self.args, self.kwargs, self.state, self.items, self.pairs = args, kwargs, None, [], []
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # arguments were recorded by __new__
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.pairs.append((key, value))

    def append(self, value: Any) -> None:
        self.items.append(value)

    def extend(self, values: Iterable[Any]) -> None:
        self.items.extend(values)

    def __call__(self, *args: Any, **kwargs: Any) -> _Opaque:
        # A call on a placeholder (a gadget chain such as getattr(x, "y")(...)) stays symbolic.
        return _opaque_class(self.qualname + "()")(*args, **kwargs)


def _opaque_class(qualname: str) -> type[_Opaque]:
    return type("Opaque", (_Opaque,), {"__slots__": (), "qualname": qualname})


@dataclass(frozen=True)
class _Ref:
    """A persistent id: torch's pointer from the pickle to a storage record."""

    pid: Any


class _SymbolicUnpickler(pickle.Unpickler):
    """The C unpickler with `find_class` returning placeholders and persistent ids recorded.

    GLOBAL, STACK_GLOBAL, INST and the EXT opcodes all resolve names through find_class, and
    REDUCE/NEWOBJ/OBJ can only call what find_class returned, so no object outside this module is
    ever reached: the load builds dicts, lists, tuples, scalars and placeholders only.
    """

    def __init__(self, file: BinaryIO):
        super().__init__(file, encoding="latin1")
        self.globals: list[str] = []
        self.refs: list[Any] = []
        self._classes: dict[str, type[_Opaque]] = {}

    def find_class(self, module: str, name: str) -> type[_Opaque]:  # noqa: D102 - see class docstring
        qualname = f"{module}.{name}"
        if qualname not in self._classes:
            self.globals.append(qualname)
            self._classes[qualname] = _opaque_class(qualname)
        return self._classes[qualname]

    def persistent_load(self, pid: Any) -> _Ref:  # noqa: D102
        self.refs.append(pid)
        return _Ref(pid)


@dataclass
class _Pickled:
    obj: Any = None
    globals: tuple[str, ...] = ()
    refs: list[Any] = field(default_factory=list)
    error: str | None = None  # why the load stopped: truncated or corrupt

    @property
    def unsafe(self) -> list[str]:
        return sorted(g for g in self.globals if classify_global(g) == "unsafe")

    @property
    def unknown(self) -> list[str]:
        return sorted(g for g in self.globals if classify_global(g) == "unknown")


class _CappedReader:
    """A read-only view of a binary stream that reports EOF after `limit` bytes (no peek: the
    unpickler then reads exactly up to its STOP opcode, leaving the stream positioned after it)."""

    def __init__(self, raw: BinaryIO, limit: int):
        self._raw, self._left = raw, limit

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._raw.read(n)
        self._left -= len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readline(self, limit: int = -1) -> bytes:
        out = bytearray()
        while self._left > 0 and (limit < 0 or len(out) < limit):
            ch = self.read(1)
            if not ch:
                break
            out += ch
            if ch == b"\n":
                break
        return bytes(out)


def read_pickle_symbolically(source: bytes | BinaryIO, limit: int = MAX_PICKLE_BYTES) -> _Pickled:
    """Unpickle without calling anything: globals become `_Opaque` placeholders (see module doc)."""
    if isinstance(source, bytes):
        if len(source) > limit:
            return _Pickled(error=f"pickle of {len(source)} bytes exceeds the {limit}-byte limit")
        stream: Any = io.BytesIO(source)
    else:
        stream = _CappedReader(source, limit)
    unpickler = _SymbolicUnpickler(stream)
    try:
        obj = load_bounded(unpickler)  # safepickle's loading path: the same memory budget and failures
    except (CorruptPickleError, BudgetExceeded) as exc:
        text = str(exc)
        if isinstance(exc, BudgetExceeded):
            error = f"pickle {text}"
        elif "truncated" in text or "ran out of input" in text.lower():
            error = f"unexpected EOF: {text}"
        else:
            error = text
        return _Pickled(None, tuple(unpickler.globals), unpickler.refs, error[:300])
    return _Pickled(obj, tuple(unpickler.globals), unpickler.refs)


# --------------------------------------------------------------------------------------------
# What state an unpickled object holds.

_TENSOR_BUILDERS = re.compile(r"^torch\.(?:_utils\._rebuild_\w+|_tensor\._rebuild_from_type_v2|nn\.parameter\.Parameter|Tensor)$")
_TOKEN_SPLIT = re.compile(r"[^a-z0-9]+")
_MODEL_TOKENS = frozenset({"model", "models", "module", "net", "network", "weights", "params", "parameters", "ema"})
_DATA_EXACT = frozenset({"loader", "iterator", "data_state", "dataset_state", "batch_idx", "batch_index", "data_iter",
                         "data_iterator", "skip_batches", "dl_state_dict", "data_position"})
_DATA_PARTS = ("sampler", "dataloader", "data_loader", "consumed", "samples_seen", "batch_progress")
_STEP_KEYS = frozenset({"step", "global_step", "global_steps", "iteration", "iter", "iters", "steps", "num_updates",
                        "completed_steps", "train_step", "curr_step", "current_step", "num_steps", "trained_steps"})
_EPOCH_KEYS = frozenset({"epoch", "epochs", "current_epoch", "cur_epoch"})
_SCALER_KEYS = frozenset({"scaler", "grad_scaler", "amp", "loss_scaler", "amp_scaler"})
_RNG_CONTEXT = ("rng", "random", "seed")
_SUBTREE_COMPONENTS = frozenset({"model", "optimizer", "lr_scheduler", "rng_python", "rng_numpy", "rng_torch",
                                 "rng_cuda", "data_position", "grad_scaler"})
_CONFIG_TOKENS = frozenset({"config", "cfg", "args", "hparams", "hyper", "conf", "settings", "options", "opts"})
_SCALARS = frozenset({"dp_world_size", "mp_world_size", "world_size", "partition_count", "zero_stage",
                      "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size"})


class _TensorLeaf:
    """Marks a tensor in a tree built from metadata (DCP) rather than from a pickle."""


_TENSOR = _TensorLeaf()


@dataclass
class Contents:
    """What one checkpoint file (or DCP metadata tree) holds."""

    components: set[str] = field(default_factory=set)
    step: int | None = None
    epoch: float | None = None
    scalars: dict[str, int] = field(default_factory=dict)
    tensors: int = 0
    cuda: bool = False


def _tokens(key: str) -> tuple[str, ...]:
    return tuple(t for t in _TOKEN_SPLIT.split(key.lower()) if t)


def _is_tensor(value: Any) -> bool:
    return value is _TENSOR or (isinstance(value, _Opaque) and bool(_TENSOR_BUILDERS.match(value.qualname)))


_MAX_CHILDREN = 10_000  # children of one container looked at; a state dict's keys are in its first ones
_MAX_KEY_CHARS = 256


def _key(key: Any) -> str:
    """A child's key as bounded text: keys may be tuples shared at every level, or 100 MB strings."""
    return key if type(key) is str and len(key) <= _MAX_KEY_CHARS else bounded_str(key, _MAX_KEY_CHARS)


def _children(value: Any) -> list[tuple[str, Any]]:
    """Named children of a container or placeholder (OrderedDict items, a dataclass's state), the
    first _MAX_CHILDREN of them."""
    if isinstance(value, dict):
        return [(_key(k), v) for k, v in islice(value.items(), _MAX_CHILDREN)]
    if isinstance(value, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(islice(value, _MAX_CHILDREN))]
    if isinstance(value, _Opaque) and not _is_tensor(value):
        named = [(_key(k), v) for k, v in islice(value.pairs, _MAX_CHILDREN)]
        state = value.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):  # (dict, slots)
            first = dict(islice(state[0].items(), _MAX_CHILDREN)) if isinstance(state[0], dict) else {}
            state = {**first, **dict(islice(state[1].items(), _MAX_CHILDREN))}
        if isinstance(state, dict):
            named += [(_key(k), v) for k, v in islice(state.items(), _MAX_CHILDREN) if k != "_metadata"]
        named += [(str(i), v) for i, v in enumerate(islice(value.items, _MAX_CHILDREN))]
        if not named and isinstance(value.args, tuple):  # e.g. defaultdict(list) then items, or a namedtuple
            named = [(str(i), v) for i, v in enumerate(value.args[:_MAX_CHILDREN]) if not isinstance(v, type)]
        return named[:_MAX_CHILDREN]
    return []


def _empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, (dict, list, tuple, set, str, bytes)):
        return len(value) == 0
    if isinstance(value, _Opaque) and not _is_tensor(value):
        return not _children(value) and not value.args
    return False


def _has_tensor(value: Any, budget: int = 5_000) -> bool:
    stack = [value]
    seen: set[int] = set()  # a container that holds itself (or one shared at every level) is looked into once
    while stack and budget > 0:
        budget -= 1
        node = stack.pop()
        if _is_tensor(node):
            return True
        if id(node) not in seen:
            seen.add(id(node))
            stack.extend(v for _, v in _children(node)[:budget])
    return False


def _rng_by_value(value: Any) -> str | None:
    """State objects recognisable by shape alone: random.getstate(), np.random.get_state()."""
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], int) and isinstance(value[1], tuple) \
            and len(value[1]) == 625:
        return "rng_python"
    if isinstance(value, tuple) and value and value[0] == "MT19937":
        return "rng_numpy"
    if isinstance(value, dict) and "bit_generator" in value and "state" in value:
        return "rng_numpy"
    return None


def _is_container(value: Any) -> bool:
    return isinstance(value, (dict, list, tuple)) or (isinstance(value, _Opaque) and not _is_tensor(value))


def _component_of(key: str, value: Any, ancestors: tuple[str, ...]) -> str | None:
    """The component a keyed value is, from its key, its ancestors' keys and its shape; None if none.

    Values under a configuration (`ds_config`, `args`, `hparams`) are settings, not state: the
    `optimizer` entry of a DeepSpeed config names the optimizer, it does not hold its state. Only a
    consumed-samples counter there counts (Megatron keeps it in `args`).
    """
    tokens = _tokens(key)
    token_set = set(tokens)
    joined = "_".join(tokens)
    in_config = bool(set(ancestors) & _CONFIG_TOKENS)
    is_data = joined in _DATA_EXACT or any(part in joined for part in _DATA_PARTS)
    if in_config:
        return "data_position" if is_data and isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, dict) or (isinstance(value, _Opaque) and not _is_tensor(value)):
        keys = {str(k) for k, _ in _children(value)}
        if {"state", "param_groups"} <= keys:
            return "optimizer"
        if {"base_lrs", "last_epoch"} <= keys:
            return "lr_scheduler"
    by_value = _rng_by_value(value)
    if by_value:
        return by_value
    context = any(c in t for t in (*tokens, *ancestors) for c in _RNG_CONTEXT)
    if context and "tracker" not in token_set and (_is_container(value) or _is_tensor(value) or isinstance(value, bytes)):
        if token_set & {"cuda", "gpu"}:
            return "rng_cuda"
        if token_set & {"numpy", "np"}:
            return "rng_numpy"
        if token_set & {"torch", "cpu"}:
            return "rng_torch"
        if token_set & {"python", "py"} or (token_set & {"random"} and not token_set & {"seed", "seeds"}):
            return "rng_python"
    if is_data and (_is_container(value) or (isinstance(value, int) and not isinstance(value, bool))):
        return "data_position"
    if not _is_container(value):
        return None
    if any(t.startswith("optim") for t in tokens) or "opt" in token_set:
        return "optimizer"
    if any("sched" in t for t in tokens):
        return "lr_scheduler"
    if joined in _SCALER_KEYS:
        return "grad_scaler"
    if token_set & _MODEL_TOKENS and _has_tensor(value):
        return "model"
    return None


def summarize(obj: Any, name: str = "", refs: Iterable[Any] = ()) -> Contents:
    """Walk an unpickled (symbolic) object: which components, step, epoch and scalars it holds.

    `name` is the file's stem (`optimizer`, `rng_state`, `mp_rank_00_model_states`): a file named
    after a component counts as that component, and an RNG file gives its keys their context.
    """
    found = Contents()
    found.cuda = any(isinstance(p, tuple) and len(p) > 3 and str(p[3]).startswith("cuda") for p in refs)
    root_tokens = _tokens(name)
    stack: list[tuple[tuple[str, ...], Any]] = [((), obj)]
    weights = 0  # tensors outside every recognised subtree
    budget = _WALK_NODES
    expanded: set[int] = set()  # each container's children are pushed once: a dict that holds itself ends
    while stack and budget > 0:
        budget -= 1
        path, value = stack.pop()
        if path:
            if _empty(value):
                continue
            key = path[-1]
            ancestors = tuple(t for p in (name, *path[:-1]) for t in _tokens(p))
            component = _component_of(key, value, ancestors)
            if component:
                found.components.add(component)
                if component in _SUBTREE_COMPONENTS:
                    found.tensors += _has_tensor(value)
                    continue
            if _is_tensor(value):
                found.tensors += 1
                weights += 1
                continue
            lowered = key.lower()
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            in_config = bool(set(ancestors) & _CONFIG_TOKENS)
            if len(path) <= 2 and number and not in_config:
                if lowered in _STEP_KEYS and int64(value) is not None and isinstance(value, int) and found.step is None:
                    found.step = value
                    found.components.add("step")
                elif lowered in _EPOCH_KEYS and found.epoch is None and value < 1e9:
                    found.epoch = float(value)
                    found.components.add("step")
            if len(path) <= 3 and lowered in _SCALARS:
                # World sizes and partition counts past any real job (`dp_world_size=3e8`) are not believed.
                first = value[0] if isinstance(value, list) and value else value  # ZeRO's partition_count: one per group
                if rank_number(first) is not None and not isinstance(first, float):
                    found.scalars.setdefault(lowered, int(first))
        elif _is_tensor(value):
            found.tensors += 1
            weights += 1
            continue
        if len(path) < _WALK_DEPTH and id(value) not in expanded:
            expanded.add(id(value))
            stack.extend((path + (k,), v) for k, v in reversed(_children(value)[:budget]))
    if weights:
        found.components.add("model")
    if obj is not None and not _empty(obj) and name:
        # The file's own name: optimizer.pt, scheduler.bin, sampler.bin, pytorch_model.bin.
        hinted = _component_of(name, obj, ())
        if hinted in ("optimizer", "lr_scheduler", "data_position", "grad_scaler", "model"):
            found.components.add(hinted)
        elif any(t.startswith("optim") for t in root_tokens):
            found.components.add("optimizer")
    return found


# --------------------------------------------------------------------------------------------
# One file.

_STORAGE_ELEMENT_BYTES = {
    "Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "QInt8": 1, "QUInt8": 1, "QInt32": 4, "QUInt4x2": 1,
    "QUInt2x4": 1, "Untyped": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
}


def _element_bytes(storage_type: Any) -> int | None:
    qualname = getattr(storage_type, "qualname", "")
    match = re.search(r"\.(\w+?)Storage$", qualname)
    return _STORAGE_ELEMENT_BYTES.get(match.group(1)) if match else None


@dataclass(frozen=True)
class FileAudit:
    """The audit of one file; `format == ""` means it is not a checkpoint after all."""

    format: str
    size: int
    mtime: float
    readable: bool
    reason: str = ""
    notes: tuple[str, ...] = ()
    checked_with: str = "structure"
    components: frozenset[str] = frozenset()
    step: int | None = None
    epoch: float | None = None
    scalars: tuple[tuple[str, int], ...] = ()
    tensor_names: frozenset[str] = frozenset()  # safetensors header entries, for index consistency
    cuda: bool = False
    unsafe: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    problem: str | None = None  # corrupt, unsafe


def _torch_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError, AttributeError):  # sys.modules["torch"] = None reads as absent
        return False


def _content_audit(fmt: str, size: int, mtime: float, pickled: _Pickled, name: str, *, notes: list[str],
                   checked_with: str) -> FileAudit:
    """Shared tail of the pickle-based formats: refuse unsafe globals, summarise the content."""
    unsafe, unknown = pickled.unsafe, pickled.unknown
    if unsafe:
        return FileAudit(fmt, size, mtime, False,
                         f"refused: the pickle names {', '.join(unsafe[:4])}, code no checkpoint needs (possibly "
                         "malicious); nothing was loaded or executed",
                         tuple(notes), "symbolic unpickler (refused)", unsafe=tuple(unsafe), unknown=tuple(unknown),
                         problem="unsafe")
    if pickled.error:
        return FileAudit(fmt, size, mtime, False, pickled.error, tuple(notes), checked_with, unknown=tuple(unknown),
                         problem="corrupt")
    contents = summarize(pickled.obj, name, pickled.refs)
    if unknown:
        notes.append(f"holds objects of {len(unknown)} class(es) outside torch's weights-only allowlist "
                     f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}): read without building them; "
                     "torch.load(weights_only=True) will refuse this file unless they are allowlisted")
    return FileAudit(fmt, size, mtime, True, "", tuple(notes), checked_with, frozenset(contents.components),
                     contents.step, contents.epoch, tuple(sorted(contents.scalars.items())), cuda=contents.cuda,
                     unknown=tuple(unknown))


def _torch_load_check(path: Path, *, mmap: bool) -> tuple[str | None, str | None]:
    """torch.load(weights_only=True) the file (numpy RNG objects allowlisted); (failure, refusal)."""
    import warnings

    import torch

    safe: list[Any] = []
    try:
        import numpy as np

        core = getattr(np, "_core", None) or np.core
        safe = [core.multiarray._reconstruct, np.ndarray, np.dtype]
        safe += [getattr(np.dtypes, n) for n in dir(getattr(np, "dtypes", object)) if n.endswith("DType")]
    except (ImportError, AttributeError):
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.serialization.safe_globals(safe):
                loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        del loaded
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "Weights only load failed" in text or "Unsupported global" in text:
            detail = re.search(r"Unsupported (?:global|operand)[^.\n]*", text)
            return None, detail.group(0) if detail else "weights-only loader refused a global"
        return f"torch.load failed: {text.splitlines()[0][:240]}", None
    except Exception as exc:  # noqa: BLE001 - whatever torch raises, the file did not load
        first = (str(exc).splitlines() or [""])[0]
        return f"torch.load failed: {type(exc).__name__}: {first[:240]}", None
    return None, None


def _audit_torch_zip(path: Path, size: int, mtime: float, *, use_torch: bool, verify_crc: bool) -> FileAudit:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        return _truncated_zip_audit(path, size, mtime, exc)
    with archive:
        names = archive.namelist()
        pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") <= 1]
        if not pkl:
            return FileAudit("", size, mtime, False)  # a zip that is not a torch.save file (logs, TorchScript)
        prefix = pkl[0][: -len("data.pkl")]
        notes: list[str] = []
        overlapping = _overlapping_members(archive.infolist())
        if overlapping:
            # torch.save writes each member once; entries sharing bytes are a zip bomb (20,000 names
            # for one deflated member inflate terabytes), never a checkpoint.
            return FileAudit("torch_zip", size, mtime, False,
                             f"{overlapping} central-directory entries overlap other members' bytes: a crafted zip, "
                             "not a torch.save file; not inflated", problem="corrupt")
        inflated = sum(i.file_size for i in archive.infolist())
        if verify_crc and inflated > CRC_BYTES_PER_FILE:  # the CRC budget counts inflated bytes, not the file's
            verify_crc = False
        if verify_crc:
            try:
                bad = archive.testzip()
            except (zipfile.BadZipFile, EOFError, OSError, zlib.error, ValueError) as exc:
                return FileAudit("torch_zip", size, mtime, False, f"unreadable member: {exc}", problem="corrupt")
            if bad:
                return FileAudit("torch_zip", size, mtime, False,
                                 f"bad CRC in member {bad}: its bytes changed after the save (disk or copy error)",
                                 problem="corrupt")
        else:
            notes.append("CRCs not verified (over the read budget); sizes checked")
        info = archive.getinfo(pkl[0])
        if info.file_size > MAX_PICKLE_BYTES:
            return FileAudit("torch_zip", size, mtime, False, f"data.pkl is {info.file_size} bytes, over the limit",
                             problem="corrupt")
        pickled = read_pickle_symbolically(archive.read(pkl[0]))
        audit = _content_audit("torch_zip", size, mtime, pickled, path.stem, notes=notes,
                               checked_with=_structural(use_torch))
        if not audit.readable:
            return audit
        if prefix + "version" not in names:
            return replace(audit, readable=False, reason="no version record: the archive is incomplete",
                           problem="corrupt")
        missing = _missing_storages(pickled.refs, lambda key: _zip_size(archive, f"{prefix}data/{key}"))
        if missing:
            return replace(audit, readable=False, reason=missing, problem="corrupt")
    return _maybe_torch_load(path, audit, use_torch=use_torch, mmap=True)


def _overlapping_members(infos: list[zipfile.ZipInfo]) -> int:
    """How many members start inside another member's bytes (local header + compressed data)."""
    spans = sorted((i.header_offset, i.header_offset + 30 + len(i.orig_filename.encode("utf-8", "replace")) + i.compress_size)
                   for i in infos)
    overlapping, end = 0, -1
    for start, stop in spans:
        if start < end:
            overlapping += 1
        end = max(end, stop)
    return overlapping


def _structural(use_torch: bool) -> str:
    """What a pickle-based file was checked with before (or instead of) torch.load."""
    if use_torch:
        return "structure"
    return "structure (torch not used)" if _torch_available() else "structure (torch not installed)"


def _zip_size(archive: zipfile.ZipFile, name: str) -> int | None:
    try:
        return archive.getinfo(name).file_size
    except KeyError:
        return None


def _missing_storages(refs: list[Any], size_of: Any) -> str:
    """Check every storage the pickle references against its record; '' when all are whole."""
    absent, short = [], []
    for pid in refs:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            continue
        key, numel = str(pid[2]), pid[4]
        have = size_of(key)
        if have is None:
            absent.append(key)
            continue
        per = _element_bytes(pid[1])
        if per and isinstance(numel, int) and have < numel * per:
            short.append(f"{key} ({have} of {numel * per} bytes)")
    if absent:
        return f"{len(absent)} tensor storage record(s) referenced by data.pkl are missing: data/{', data/'.join(absent[:5])}"
    if short:
        return f"tensor storage record(s) shorter than their tensors: {', '.join(short[:5])}"
    return ""


def _maybe_torch_load(path: Path, audit: FileAudit, *, use_torch: bool, mmap: bool) -> FileAudit:
    if not use_torch:
        return audit
    if audit.unknown:
        return replace(audit, checked_with="structure (torch.load skipped: classes outside the allowlist)")
    if not mmap and audit.size > TORCH_LEGACY_LOAD_BYTES:
        return replace(audit, checked_with="structure (torch.load skipped: legacy file too large to read whole)")
    failure, refusal = _torch_load_check(path, mmap=mmap)
    if failure:
        return replace(audit, readable=False, reason=failure, checked_with="torch.load(weights_only=True)",
                       problem="corrupt")
    if refusal:
        return replace(audit, notes=audit.notes + (f"torch.load(weights_only=True) refused it ({refusal}); not "
                                                    "corruption, structure checked instead",),
                       checked_with="structure (torch weights-only refused)")
    return replace(audit, checked_with="torch.load(weights_only=True)")


def _truncated_zip_audit(path: Path, size: int, mtime: float, exc: Exception) -> FileAudit:
    """No central directory: say where the file ends, from the local headers torch wrote in order."""
    with open(path, "rb") as fh:
        head = fh.read(min(size, MAX_PICKLE_BYTES + 4096))
    if len(head) < 30 or not head.startswith(_ZIP_MAGIC):
        return FileAudit("torch_zip", size, mtime, False, f"not a readable zip: {exc}", problem="corrupt")
    name_len, extra_len = struct.unpack_from("<HH", head, 26)
    first = head[30 : 30 + name_len].decode("utf-8", "replace")
    if not first.endswith("data.pkl"):
        if path.suffix.lower() not in (".pt", ".pth", ".ckpt", ".bin", ".tmp"):
            return FileAudit("", size, mtime, False)  # a broken zip of something else
        return FileAudit("torch_zip", size, mtime, False,
                         f"truncated or corrupt zip (no central directory; {exc}); file is {size} bytes",
                         problem="corrupt")
    prefix = first[: -len("data.pkl")]
    pickled = read_pickle_symbolically(head[30 + name_len + extra_len :])
    if pickled.unsafe:
        return _content_audit("torch_zip", size, mtime, pickled, path.stem, notes=[], checked_with="structure")
    if pickled.error:
        return FileAudit("torch_zip", size, mtime, False,
                         f"truncated: the file ends at {size} bytes inside data.pkl ({pickled.error}); no central "
                         "directory: the save was cut off", problem="corrupt")
    storages = [p for p in pickled.refs if isinstance(p, tuple) and len(p) >= 3 and p[0] == "storage"]
    started = _members_started(path, prefix.encode(), size)
    written = sum(1 for n in started if n.startswith(prefix + "data/"))
    last = started[-1] if started else first
    return FileAudit(
        "torch_zip", size, mtime, False,
        f"truncated: no zip central directory; the file ends at {size} bytes inside member '{last}' "
        f"({written} of {len(storages)} tensor storages started): the save was cut off",
        problem="corrupt",
    )


def _members_started(path: Path, prefix: bytes, size: int) -> list[str]:
    """Names of the zip members whose local header made it to disk (scan capped)."""
    names: list[str] = []
    pattern = re.compile(re.escape(_ZIP_MAGIC) + rb"[\s\S]{22}([\s\S]{2})[\s\S]{2}(" + re.escape(prefix) + rb"[\x20-\x7e]{1,200})")
    carry, offset = b"", 0
    with open(path, "rb") as fh:
        while offset < min(size, TRUNCATION_SCAN_BYTES):
            block = fh.read(16 << 20)
            if not block:
                break
            data = carry + block
            for match in pattern.finditer(data):
                (length,) = struct.unpack("<H", match.group(1))
                name = match.group(2)[:length].decode("ascii", "replace")
                if len(match.group(2)) >= length and (not names or names[-1] != name):
                    names.append(name)
            carry = data[-300:]
            offset += len(block)
    return names


def _audit_legacy(path: Path, size: int, mtime: float, *, use_torch: bool) -> FileAudit:
    """torch.save(..., _use_new_zipfile_serialization=False): magic, protocol, sys info, object, keys, storages."""
    checked = _structural(use_torch)
    with open(path, "rb") as fh:
        parts = []
        for what in ("magic number", "protocol version", "system info"):
            part = read_pickle_symbolically(fh)
            if part.error:
                return FileAudit("torch_legacy", size, mtime, False, f"unexpected EOF in the {what} header: {part.error}",
                                 problem="corrupt")
            parts.append(part.obj)
        if parts[0] != _LEGACY_MAGIC:
            return FileAudit("", size, mtime, False)
        body = read_pickle_symbolically(fh)
        audit = _content_audit("torch_legacy", size, mtime, body, path.stem, notes=[], checked_with=checked)
        if audit.problem == "corrupt":
            return replace(audit, reason=f"truncated: the file ends at {size} bytes inside the pickled object "
                                         f"({body.error}): the save was cut off")
        if not audit.readable:
            return audit
        keys_part = read_pickle_symbolically(fh)
        if keys_part.error or not isinstance(keys_part.obj, list):
            return replace(audit, readable=False, problem="corrupt",
                           reason=f"truncated: the file ends before the storage list ({keys_part.error or 'not a list'})")
        types = {str(p[2]): p[1] for p in body.refs if isinstance(p, tuple) and len(p) >= 5 and p[0] == "storage"}
        position = fh.tell()
        for index, key in enumerate(keys_part.obj):
            if position + 8 > size:
                return replace(audit, readable=False, problem="corrupt",
                               reason=f"unexpected EOF: the file ends at {size} bytes before storage {index + 1} of "
                                      f"{len(keys_part.obj)}: the save was cut off")
            fh.seek(position)
            (numel,) = struct.unpack("<q", fh.read(8))
            per = _element_bytes(types.get(str(key))) or 1
            position += 8 + numel * per
            if position > size:
                return replace(audit, readable=False, problem="corrupt",
                               reason=f"unexpected EOF: storage {index + 1} of {len(keys_part.obj)} needs bytes up to "
                                      f"{position}, the file ends at {size}: the save was cut off")
    return _maybe_torch_load(path, audit, use_torch=use_torch, mmap=False)


def _audit_plain_pickle(path: Path, size: int, mtime: float) -> FileAudit:
    with open(path, "rb") as fh:
        pickled = read_pickle_symbolically(fh)
    return _content_audit("pickle", size, mtime, pickled, path.stem, notes=[], checked_with="symbolic unpickler")


_SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "U32": 4, "U64": 8, "C64": 8, "C128": 16,
}


def _audit_safetensors(path: Path, size: int, mtime: float) -> FileAudit:
    """8-byte header length, JSON header, then the tensor bytes the header's offsets describe."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            return FileAudit("safetensors", size, mtime, False, f"truncated: {size} bytes, no header", problem="corrupt")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > min(size, 100 << 20):
            return FileAudit("safetensors", size, mtime, False,
                             f"truncated or corrupt: header length {header_len} exceeds the file ({size} bytes)",
                             problem="corrupt")
        try:
            with address_space():  # a 100 MB header of `[[],[],...]` would build GBs of lists
                header = json.loads(fh.read(header_len))
        except (ValueError, UnicodeDecodeError, BudgetExceeded) as exc:
            return FileAudit("safetensors", size, mtime, False, f"corrupt header: {exc}", problem="corrupt")
    if not isinstance(header, dict):
        return FileAudit("safetensors", size, mtime, False, "corrupt header: not a JSON object", problem="corrupt")
    end, bad = 0, []
    names = set()
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = spec["data_offsets"]
            numel = _numel(spec["shape"])
            per = _SAFETENSORS_DTYPE_BYTES.get(spec["dtype"])
        except (KeyError, TypeError, ValueError):
            bad.append(name)
            continue
        if per is not None and stop - begin != numel * per:
            bad.append(name)
        end = max(end, stop)
        names.add(name)
    if bad:
        return FileAudit("safetensors", size, mtime, False, f"corrupt header: bad entries for {', '.join(sorted(bad)[:3])}",
                         problem="corrupt")
    expected = 8 + header_len + end
    if size < expected:
        return FileAudit("safetensors", size, mtime, False,
                         f"truncated: the header describes {expected} bytes, the file has {size}: the save was cut off",
                         problem="corrupt", tensor_names=frozenset(names))
    notes = ("safetensors carry no checksums; sizes and offsets checked",)
    components = frozenset({"model"}) if names else frozenset()
    hinted = summarize({}, path.stem).components  # optimizer.safetensors and the like
    if names and hinted & {"optimizer"}:
        components = frozenset({"optimizer"})
    return FileAudit("safetensors", size, mtime, True, "", notes, "structure (safetensors header)", components,
                     tensor_names=frozenset(names))


def _numel(shape: Any) -> int:
    """Elements of a safetensors shape: a list of at most 16 int64 dims (`math.prod` of 64 dims of
    4,000 digits each never ends); anything else raises ValueError, a bad entry."""
    if not isinstance(shape, list) or len(shape) > 16 or not all(type(d) is int and 0 <= d < 1 << 63 for d in shape):
        raise ValueError("not a shape")
    return math.prod(shape)


def sniff(path: Path) -> str:
    """The checkpoint format a file's first bytes show: torch_zip, torch_legacy, pickle, safetensors or ''."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return ""
    if head.startswith(_ZIP_MAGIC):
        return "torch_zip"
    if head.startswith(_LEGACY_HEAD) or (len(head) < len(_LEGACY_HEAD) and _LEGACY_HEAD.startswith(head)):
        return "torch_legacy"
    if _SAFETENSORS_HEAD.match(head):
        return "safetensors"
    if _PICKLE_PROTO.match(head):
        return "pickle"
    return ""


@lru_cache(maxsize=4096)
def _audit_file_cached(real: str, size: int, mtime_ns: int, ctime_ns: int, inode: int, use_torch: bool,
                       verify_crc: bool) -> FileAudit:
    del ctime_ns, inode  # part of the cache key only: a rewritten file is audited again
    path = Path(real)
    mtime = mtime_ns / 1e9
    if size == 0:
        return FileAudit("empty", 0, mtime, False, "empty file (0 bytes): the save wrote nothing", problem="corrupt")
    try:
        kind = sniff(path)
        if kind == "torch_zip":
            return _audit_torch_zip(path, size, mtime, use_torch=use_torch, verify_crc=verify_crc)
        if kind == "torch_legacy":
            return _audit_legacy(path, size, mtime, use_torch=use_torch)
        if kind == "safetensors":
            return _audit_safetensors(path, size, mtime)
        if kind == "pickle":
            return _audit_plain_pickle(path, size, mtime)
    except OSError as exc:
        return FileAudit("unknown", size, mtime, False, f"cannot read: {exc.strerror or exc}", problem="corrupt")
    except INPUT_ERRORS as exc:  # one malformed file must not stop the audit of the others
        return FileAudit("unknown", size, mtime, False, f"could not be read: {type(exc).__name__}: {exc}"[:300],
                         problem="corrupt")
    return FileAudit("unknown", size, mtime, False,
                     "not a checkpoint format this version reads (neither zip, pickle nor safetensors): "
                     "overwritten or corrupt", problem="corrupt")


def audit_file(path: Path, *, use_torch: bool | None = None, verify_crc: bool = True) -> FileAudit:
    """Audit one file (cached by path and stat)."""
    try:
        st = path.stat()
    except OSError as exc:
        return FileAudit("missing", 0, 0.0, False, f"cannot stat: {exc.strerror or exc}", problem="corrupt")
    torch_ok = _torch_available() if use_torch is None else use_torch
    return _audit_file_cached(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, torch_ok,
                              verify_crc)


# --------------------------------------------------------------------------------------------
# Finding checkpoints: directories that are one checkpoint (DCP, DeepSpeed tag, HF folder), groups
# of per-rank files, single files, and leftovers of interrupted saves.

_CHECKPOINT_SUFFIXES = frozenset({".pt", ".pth", ".ckpt", ".safetensors"})
_SNIFFED_SUFFIXES = frozenset({".bin", ".pkl", ".pickle", ".distcp", ".model", ".state", ".zip", ""})
_TEMP_NAME = re.compile(r"(?i)(?:\.(?:tmp|temp|partial|part|incomplete|inprogress|writing)(?:[.\-_~][A-Za-z0-9]{1,16})?|~)$")
_TEMP_DIR = re.compile(r"(?i)^tmp[-_](?:checkpoint|ckpt)[-_]?\d+$")
_CHECKPOINT_WORD = re.compile(r"(?i)ckpt|checkpoint|model|optim|sched|rng|weights|state|step|epoch|\.pt|\.pth|\.bin|\.safetensors|\.distcp|\.metadata")
_SIBLING_DIR = re.compile(r"(?i)^(?:checkpoints?|ckpts?|ckpt[-_].*|checkpoint[-_].*|saved?[-_]?models?|weights|outputs?)$")
_CHECKPOINT_DIR_WORD = re.compile(r"checkpoints?|ckpts?|outputs?|weights|saved?[-_]?models?")
_HF_DIR = re.compile(r"^checkpoint[-_]\d+$")
_HF_INDEX = re.compile(r"\.(?:safetensors|bin)\.index\.json$")
_HF_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})(\.safetensors|\.bin)$")
_HF_MARKERS = re.compile(r"^(?:trainer_state\.json|random_states_\d+\.pkl|optimizer(?:_\d+)?\.bin|scheduler(?:_\d+)?\.bin"
                         r"|rng_state(?:_\d+)?\.pth)$")
_DS_MODEL = re.compile(r"^(?:(bf16_)?zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
_DS_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_DCP_METADATA = re.compile(r"^(?:__\d+)?\.metadata$")
_DCP_SHARD = re.compile(r"^__(\d+)_(\d+)\.distcp$")
_RANK_FILE = re.compile(r"(?i)^(.*?rank)[_\-]?(\d+)(\D.*)?$")
_STEP_IN_NAME = re.compile(r"(?i)(?<![a-z])(?:global_step|checkpoint|ckpt|step|iter(?:ation)?|it)[-_]?(\d+)")
_EPOCH_IN_NAME = re.compile(r"(?i)(?<![a-z])epoch[-_]?(\d+)")
_MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


@dataclass
class _Auditor:
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
            if fh.read(4) != _ZIP_MAGIC:
                return 0
        with zipfile.ZipFile(path) as archive:
            return sum(i.file_size for i in archive.infolist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError):
        return 0


def _step_from_name(*names: str) -> tuple[int | None, float | None]:
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


def _record(path: str, fmt: str, **values: Any) -> dict:
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


def _file_record(display: str, path: Path, auditor: _Auditor) -> dict | None:
    audit = auditor.file(path)
    if not audit.format:
        return None
    step, epoch = _step_from_name(path.stem, path.parent.name)
    checked = audit.checked_with
    record = _record(display, audit.format,
                     step=step, epoch=epoch, mtime=_mtime([path]), size_bytes=audit.size, checked_with=checked)
    record = _merge([audit], record)
    if audit.step is not None:
        record["step"] = audit.step
    if audit.epoch is not None:
        record["epoch"] = audit.epoch
    return record


def _temporary_record(display: str, path: Path, auditor: _Auditor) -> dict:
    """A leftover of an interrupted save: never resumable; its content is described when readable."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    step, epoch = _step_from_name(path.name, path.parent.name)
    what = ("a staging directory the trainer renames when the save completes" if path.is_dir()
            else "a file saved under a temporary name and renamed when complete")
    reason = f"leftover of an interrupted save: {what}; it never got its final name"
    content = [] if path.is_dir() else [auditor.file(path)]
    broken = [a for a in content if a.format and not a.readable]
    if broken:
        reason += f"; its content is incomplete too ({broken[0].reason})"
    return _record(display, "temporary", step=step, epoch=epoch, mtime=_mtime(files), size_bytes=_size(files),
                   readable=False, problem="unsafe" if any(a.problem == "unsafe" for a in broken) else "interrupted",
                   reason=reason, components=sorted({c for a in content for c in a.components}),
                   unsafe_globals=sorted({g for a in content for g in a.unsafe}))


def _dcp_record(display: str, directory: Path, files: list[str]) -> dict:
    """torch.distributed.checkpoint: `.metadata` (written last, by the coordinator) lists every item's
    shard file, offset and length; every listed file must exist and be long enough."""
    paths = [directory / f for f in files]
    step, epoch = _step_from_name(directory.name, directory.parent.name)
    record = _record(display, "dcp", step=step, epoch=epoch, mtime=_mtime(paths), size_bytes=_size(paths),
                     checked_with="structure (.metadata against the shard files)")
    present = {f: (directory / f).stat().st_size for f in files if _DCP_SHARD.match(f)}
    metadata = sorted(f for f in files if _DCP_METADATA.match(f))
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
    state = pickled.obj.state if isinstance(pickled.obj, _Opaque) else None
    if pickled.error or not isinstance(state, dict):
        record.update(readable=False, problem="corrupt",
                      reason=f"{metadata[0]} is unreadable: {pickled.error or 'not DCP metadata'}")
        return record
    storage = state.get("storage_data") or {}
    where: dict[str, tuple[str, int, int]] = {}
    need: dict[str, int] = {}
    for index, info in storage.items() if isinstance(storage, dict) else ():
        fields = info.state if isinstance(info, _Opaque) and isinstance(info.state, dict) else {}
        relative, offset, length = fields.get("relative_path"), fields.get("offset"), fields.get("length")
        if not isinstance(relative, str) or not isinstance(offset, int) or not isinstance(length, int):
            continue
        need[relative] = max(need.get(relative, 0), offset + length)
        fqn = index.state.get("fqn") if isinstance(index, _Opaque) and isinstance(index.state, dict) else None
        if isinstance(fqn, str):
            where.setdefault(fqn, (relative, offset, length))
    missing = sorted(f for f in need if f not in present)
    short = sorted(f for f in need if f in present and present[f] < need[f])
    extra = sorted(set(present) - set(need))
    ranks = sorted({r for f in missing + short if (m := _DCP_SHARD.match(f)) and (r := rank_number(m.group(1))) is not None})
    record.update(shards_expected=len(need), shards_present=len(need) - len(missing) - len(short),
                  missing_shards=missing + short, missing_ranks=ranks)
    if extra:
        record["notes"] = "; ".join(filter(None, [record["notes"], f"{len(extra)} shard file(s) not listed in .metadata "
                                                                  f"(left from another save): {', '.join(extra[:3])}"]))
    problems = []
    if missing:
        problems.append(f"{len(missing)} of {len(need)} shard files listed in .metadata are missing: "
                        f"{', '.join(missing[:5])}" + (f" (rank{'s' if len(ranks) > 1 else ''} "
                                                         f"{', '.join(map(str, ranks[:8]))})" if ranks else ""))
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
        if leaf in _STEP_KEYS or leaf in _EPOCH_KEYS:
            value = _small_torch_value(directory / relative, offset, length)
            if isinstance(value, int) and not isinstance(value, bool):
                if leaf in _STEP_KEYS:
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
            is_tensor = isinstance(meta, _Opaque) and meta.qualname.endswith("TensorStorageMetadata")
            node[parts[-1]] = _TENSOR if is_tensor else b"<bytes>"
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


def _deepspeed_record(display: str, directory: Path, files: list[str], auditor: _Auditor) -> dict:
    """A DeepSpeed tag directory: model states per model-parallel rank, ZeRO optimizer partitions per
    data-parallel rank; how many there must be comes from the model states (dp/mp world size)."""
    members = sorted(f for f in files if f.endswith(".pt"))
    audits = {f: auditor.file(directory / f) for f in members}
    step, epoch = _step_from_name(directory.name, directory.parent.name)
    record = _record(display, "deepspeed", step=step, epoch=epoch, mtime=_mtime(directory / f for f in members),
                     size_bytes=_size(directory / f for f in members))
    record = _merge(list(audits.values()), record)
    scalars: dict[str, int] = {}
    for a in audits.values():
        for k, v in a.scalars:
            scalars.setdefault(k, v)
    models = {f: _DS_MODEL.match(f) for f in members if _DS_MODEL.match(f)}
    optims = {f: _DS_OPTIM.match(f) for f in members if _DS_OPTIM.match(f)}
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


def _hf_record(display: str, directory: Path, files: list[str], nested: list[dict], auditor: _Auditor) -> dict:
    """A Hugging Face Trainer / Accelerate checkpoint folder: model files (sharded with an index),
    optimizer, scheduler, per-process RNG files, trainer_state.json (step; the Trainer skips the
    batches it already consumed on resume, so the data position follows from global_step)."""
    step, epoch = _step_from_name(directory.name)
    members = [f for f in files if _hf_member(directory / f, f)]
    audits = {f: auditor.file(directory / f) for f in members}
    audits = {f: a for f, a in audits.items() if a.format}
    all_paths = [directory / f for f in files]
    record = _record(display, "hf", step=step, epoch=epoch, mtime=_mtime(all_paths), size_bytes=_size(all_paths))
    record = _merge(list(audits.values()), record)
    record["checked_with"] = _checked(audits.values())
    components = set(record["components"])
    expected: dict[str, frozenset[str]] = {}  # shard file -> tensors the index maps to it
    for index in (f for f in files if _HF_INDEX.search(f)):
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
    if suffix in _CHECKPOINT_SUFFIXES:
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


def _rank_group_record(display: str, directory: Path, members: dict[int, str], pattern: tuple[str, str],
                       auditor: _Auditor) -> dict:
    """Files one per rank (`model_rank0.pt` ...): every rank from 0 to the highest must be there."""
    audits = [auditor.file(directory / f) for f in members.values()]
    step, epoch = _step_from_name(*members.values(), directory.name)
    paths = [directory / f for f in members.values()]
    expected = max(members) + 1
    missing_ranks = sorted(set(range(expected)) - set(members))
    record = _record(display, "rank_shards", step=step, epoch=epoch, mtime=_mtime(paths), size_bytes=_size(paths),
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


def _pointer(directory: Path, files: list[str]) -> tuple[str, str] | None:
    """A 'latest' pointer: DeepSpeed's `latest` (a tag) or Megatron's iteration tracker."""
    for name, fmt in (("latest", "deepspeed"), (_MEGATRON_TRACKER, "megatron")):
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


def _display(base: str, relative: str) -> str:
    if relative in ("", "."):
        return base or "."
    return f"{base.rstrip('/')}/{relative}" if base else relative


def _walk(location: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    """(directory, subdirectories, files) top-down, sorted; never following a link out of the tree."""
    real_root = _real(location)
    count = 0
    pending = [location]
    while pending:
        here = pending.pop()
        dirs, files = _entries(here, real_root)
        count += len(dirs) + len(files)
        if count > MAX_WALK_FILES:
            return
        yield here, dirs, files
        pending.extend(here / d for d in reversed(dirs))


def _real(path: Path) -> Path | None:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # Python < 3.13 raises RuntimeError for a symlink loop
        return None


def _entries(here: Path, real_root: Path | None) -> tuple[list[str], list[str]]:
    """A directory's subdirectories (links never followed) and files, a link counting only when it
    names a file inside `real_root`: `model.pt -> /etc/shadow` is never opened nor stat'ed."""
    dirs, files = [], []
    try:
        entries = sorted(os.scandir(here), key=lambda e: e.name)
    except OSError:
        return dirs, files
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                dirs.append(entry.name)
            elif entry.is_symlink():
                target = _real(Path(entry.path))
                if real_root is not None and target is not None and target.is_relative_to(real_root) and target.is_file():
                    files.append(entry.name)
            elif entry.is_file(follow_symlinks=False):
                files.append(entry.name)
        except OSError:
            continue
    return dirs, files


def _dir_kind(directory: Path, files: list[str]) -> str | None:
    kind = None
    if any(_DCP_METADATA.match(f) or _DCP_SHARD.match(f) or f.endswith(".metadata.tmp") for f in files):
        kind = "dcp"
    elif any(_DS_MODEL.match(f) or _DS_OPTIM.match(f) for f in files):
        kind = "deepspeed"
    elif _HF_DIR.match(directory.name) or any(_HF_MARKERS.match(f) or _HF_INDEX.search(f) for f in files):
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
    return (suffix in _CHECKPOINT_SUFFIXES or suffix in _SNIFFED_SUFFIXES or len(suffix) > 8
            or bool(_TEMP_NAME.search(name)))


def _single_candidate(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix in _CHECKPOINT_SUFFIXES:
        return True
    if suffix not in _SNIFFED_SUFFIXES and len(suffix) <= 8:
        return False
    kind = sniff(path)
    if kind == "pickle":
        # A plain pickle is a checkpoint only by its name: Flight Recorder dumps are pickles too.
        return suffix in (".pkl", ".pickle", ".bin") and bool(_CHECKPOINT_WORD.search(path.stem))
    return bool(kind)


def _audit_location(location: Path, base: str, recursive: bool, auditor: _Auditor, seen: set[Path]) -> list[dict]:
    records: list[dict] = []
    if location.is_file():
        real = location.resolve()
        if real in seen:
            return records
        seen.add(real)
        if _is_temporary_checkpoint(location):
            return [_temporary_record(base or location.name, location, auditor)]
        record = _file_record(base or location.name, location, auditor)
        return [record] if record else []
    tree = list(_walk(location)) if recursive else [(location, [], _entries(location, _real(location))[1])]
    kinds = {d: _dir_kind(d, files) for d, _, files in tree}
    files_of = {d: files for d, _, files in tree}
    consumed: set[Path] = set()
    pointers: dict[Path, tuple[str, str]] = {}
    for directory, _, files in tree:
        pointer = _pointer(directory, files)
        if pointer:
            pointers[directory] = pointer

    def rel(path: Path) -> str:
        return _display(base, path.relative_to(location).as_posix())

    def unit_record(directory: Path) -> dict | None:
        kind = kinds[directory]
        files = files_of[directory]
        if kind == "dcp":
            return _dcp_record(rel(directory), directory, files)
        if kind == "deepspeed":
            return _deepspeed_record(rel(directory), directory, files, auditor)
        return None

    def directory_records(directory: Path, files: list[str]) -> list[dict]:
        real = directory.resolve()
        kind = kinds[directory]
        if kind is not None:
            seen.add(real)
        if kind == "temporary":
            consumed.update(d for d in kinds if d.is_relative_to(directory))
            return [_temporary_record(rel(directory), directory, auditor)]
        if kind == "hf":
            children = [d for d in kinds if d.parent == directory and kinds[d] in ("dcp", "deepspeed")]
            consumed.update(children)
            nested = [r for r in (unit_record(d) for d in children) if r]
            return [_hf_record(rel(directory), directory, files, nested, auditor),
                    *_temporaries(directory, files, rel, auditor)]
        if kind in ("dcp", "deepspeed"):
            return [r for r in (unit_record(directory),) if r] + _temporaries(directory, files, rel, auditor)
        return _loose_files(directory, files, rel, auditor, seen)

    for directory, _, files in tree:
        if directory in consumed or directory.resolve() in seen:
            continue
        try:
            records.extend(directory_records(directory, files))
        except INPUT_ERRORS as exc:  # one odd directory must not stop the audit of the others
            records.append(_record(rel(directory), kinds[directory] or "unknown", readable=False,
                                   reason=f"could not audit: {type(exc).__name__}: {exc}"[:300]))
    records.extend(_pointer_records(pointers, kinds, records, rel))
    return records


def _temporaries(directory: Path, files: list[str], rel: Any, auditor: _Auditor) -> list[dict]:
    return [_temporary_record(rel(directory / f), directory / f, auditor) for f in files
            if not f.endswith(".metadata.tmp") and _is_temporary_checkpoint(directory / f)]


def _loose_files(directory: Path, files: list[str], rel: Any, auditor: _Auditor, seen: set[Path]) -> list[dict]:
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
            records.append(_temporary_record(rel(path), path, auditor))
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
        records.append(_rank_group_record(rel(directory / label), directory, members, pattern, auditor))
    for f in singles:
        if f not in grouped:
            record = _file_record(rel(directory / f), directory / f, auditor)
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
            step, epoch = _step_from_name(tag)
            extra.append(_record(rel(target), fmt, step=step, epoch=epoch, readable=False, problem="shards_missing",
                                 reason=f"`{rel(directory / ('latest' if fmt == 'deepspeed' else _MEGATRON_TRACKER))}` "
                                        f"names {tag}, which does not exist: a resume through it fails"))
            continue
        if named is not None:
            named["notes"] = "; ".join(filter(None, [named["notes"], f"named by {fmt}'s latest pointer"]))
        tag_step = named["step"] if named else _step_from_name(tag)[0]
        for record in records:
            sibling = record is not named and str(PurePosixPath(record["path"]).parent) == rel(directory) \
                and record["format"] in ("deepspeed", "dcp", "megatron", "hf")
            if sibling and tag_step is not None and record["step"] is not None and record["step"] > tag_step:
                record["notes"] = "; ".join(filter(None, [record["notes"], f"newer than the latest pointer ({tag}): "
                                                                          "the save may not have finished"]))
    return extra


def _locations(root: str | os.PathLike[str] | None, checkpoint_paths: Iterable[str]) -> list[tuple[Path, str, bool]]:
    """Where to look: the job (a directory, or a file's directory at the top level only), the
    checkpoint directories next to it that are its own (see `_own_siblings`), and every --checkpoint path."""
    found: list[tuple[Path, str, bool]] = []
    if root:
        path = Path(root)
        if path.is_dir():
            found.append((path, "", True))
            found += [(s, f"../{s.name}", True) for s in _own_siblings(path)]
        elif path.is_file():
            parent = path.parent
            found.append((parent, "", False))
            for sibling in _listing(parent):
                if sibling.is_dir() and not sibling.is_symlink() and _SIBLING_DIR.match(sibling.name):
                    found.append((sibling, sibling.name, True))
    for extra in checkpoint_paths:
        path = Path(extra)
        if path.exists() or path.is_symlink():
            found.insert(0, (path, str(extra), True))
    return found


def _own_siblings(job: Path) -> list[Path]:
    """Checkpoint directories beside the job that are unambiguously its own: named after it
    (`<job>-checkpoints`, `ckpt-<job>`), or checkpoint-named (`checkpoints`, `outputs`, `ckpt-*`) when
    the parent holds no other job. Under a parent of many jobs a generic `outputs/` belongs to none
    of them in particular: auditing it for each would put one job's findings in its neighbours' reports."""
    real = _real(job)
    if real is None or real.parent == real:
        return []
    siblings = [p for p in _listing(real.parent) if p.is_dir() and not p.is_symlink() and p.resolve() != real
                and not p.name.startswith(".")]
    job, word = re.escape(real.name), _CHECKPOINT_DIR_WORD.pattern
    named = re.compile(rf"(?i)(?:(?:{word})[-_.]?{job}|{job}[-_.]?(?:{word}))(?:[-_.]?\d+)?")
    own = [p for p in siblings if named.fullmatch(p.name)]
    generic = [p for p in siblings if _SIBLING_DIR.match(p.name) and p not in own]
    others = [p for p in siblings if p not in generic and p not in own]
    return sorted(own if others else own + generic)


def _listing(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def audit(root: str | os.PathLike[str] | None, checkpoint_paths: Iterable[str] = (), *, world_size: int | None = None,
          expect_cuda: bool = False, use_torch: bool | None = None) -> pl.DataFrame:
    """Every checkpoint in or next to `root` and at `checkpoint_paths`, audited: one row each
    (`CHECKPOINT_SCHEMA`), newest first, with the newest resumable one marked.

    `world_size` (when the logs tell it) checks per-rank files against the job's size;
    `expect_cuda` (the job ran on GPUs) makes CUDA RNG state part of an exact resume. `use_torch`
    None means: use torch.load(weights_only=True) when torch is installed.
    """
    auditor = _Auditor(_torch_available() if use_torch is None else use_torch, world_size)
    records: list[dict] = []
    seen: set[Path] = set()
    missing_paths = []
    for extra in checkpoint_paths:
        if not Path(extra).exists():
            missing_paths.append(_record(str(extra), "missing", readable=False, problem="corrupt",
                                         reason="--checkpoint path does not exist"))
    for location, base, recursive in _locations(root, checkpoint_paths):
        try:
            records.extend(_audit_location(location, base, recursive, auditor, seen))
        except OSError as exc:
            records.append(_record(base or str(location), "unknown", readable=False, problem="corrupt",
                                   reason=f"cannot read: {exc.strerror or exc}"))
    return _table(records + missing_paths, expect_cuda)


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


def audit_job(events: pl.DataFrame, job: Any) -> pl.DataFrame:
    """`audit` with what the job's logs tell: its root, --checkpoint paths, world size, GPU use."""
    gpu = bool(events.height) and bool(events.select((pl.col("source") == "nccl").any()).item())
    return audit(job.root, job.checkpoint_paths, world_size=job.world_size, expect_cuda=gpu)


def report_records(frame: pl.DataFrame) -> list[dict]:
    """The table as JSON-ready dicts for the report's `checkpoints` key."""
    rows = frame.with_columns(pl.col("mtime").dt.strftime("%Y-%m-%dT%H:%M:%S%.6fZ")).to_dicts()
    return rows
