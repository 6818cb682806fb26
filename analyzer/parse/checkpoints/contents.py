"""Stage 2, parse (checkpoints: contents): which training state an unpickled checkpoint holds.

`summarize` walks a symbolic object (or a DCP metadata tree) from its keys, its ancestors' keys
and its shape: model weights, optimizer, scheduler, RNG states, data position, step and epoch,
and the world-size scalars that say how many shards there must be.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from analyzer.bounds import bounded_str, int64, rank_number
from analyzer.io.safepickle import Opaque

_WALK_NODES = 200_000  # nodes of one unpickled object examined for components
_WALK_DEPTH = 6

_TENSOR_BUILDERS = re.compile(r"^torch\.(?:_utils\._rebuild_\w+|_tensor\._rebuild_from_type_v2|nn\.parameter\.Parameter|Tensor)$")
_TOKEN_SPLIT = re.compile(r"[^a-z0-9]+")
_MODEL_TOKENS = frozenset({"model", "models", "module", "net", "network", "weights", "params", "parameters", "ema"})
_DATA_EXACT = frozenset({"loader", "iterator", "data_state", "dataset_state", "batch_idx", "batch_index", "data_iter",
                         "data_iterator", "skip_batches", "dl_state_dict", "data_position"})
_DATA_PARTS = ("sampler", "dataloader", "data_loader", "consumed", "samples_seen", "batch_progress")
STEP_KEYS = frozenset({"step", "global_step", "global_steps", "iteration", "iter", "iters", "steps", "num_updates",
                        "completed_steps", "train_step", "curr_step", "current_step", "num_steps", "trained_steps"})
EPOCH_KEYS = frozenset({"epoch", "epochs", "current_epoch", "cur_epoch"})
_SCALER_KEYS = frozenset({"scaler", "grad_scaler", "amp", "loss_scaler", "amp_scaler"})
_RNG_CONTEXT = ("rng", "random", "seed")
_SUBTREE_COMPONENTS = frozenset({"model", "optimizer", "lr_scheduler", "rng_python", "rng_numpy", "rng_torch",
                                 "rng_cuda", "data_position", "grad_scaler"})
_CONFIG_TOKENS = frozenset({"config", "cfg", "args", "hparams", "hyper", "conf", "settings", "options", "opts"})
_SCALARS = frozenset({"dp_world_size", "mp_world_size", "world_size", "partition_count", "zero_stage",
                      "tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size"})


class _TensorLeaf:
    """Marks a tensor in a tree built from metadata (DCP) rather than from a pickle."""


TENSOR = _TensorLeaf()


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
    return value is TENSOR or (isinstance(value, Opaque) and bool(_TENSOR_BUILDERS.match(value.qualname)))


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
    if isinstance(value, Opaque) and not _is_tensor(value):
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
    if isinstance(value, Opaque) and not _is_tensor(value):
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
    return isinstance(value, (dict, list, tuple)) or (isinstance(value, Opaque) and not _is_tensor(value))


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
    if isinstance(value, dict) or (isinstance(value, Opaque) and not _is_tensor(value)):
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
                if lowered in STEP_KEYS and int64(value) is not None and isinstance(value, int) and found.step is None:
                    found.step = value
                    found.components.add("step")
                elif lowered in EPOCH_KEYS and found.epoch is None and value < 1e9:
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
