"""Stage 1, io (support): load untrusted pickles without executing anything.

Flight Recorder dumps (and PyTorch memory snapshots) are pickles written by a process we do not
trust: a job directory may come from anywhere, and `pickle.load` on a crafted file runs arbitrary
code. The restricted unpickler here refuses every global, so only what the pickle opcodes can
build by themselves loads: dict, list, tuple, set, frozenset, str, bytes, bytearray, int, float,
bool and None. That is all a Flight Recorder dump contains.

Checkpoints name globals (torch's rebuild functions, storages, user classes) that must be seen
without being imported: the same unpickler in its symbolic mode turns each global into an inert
placeholder (`Opaque`) recording the name and what the pickle passed it, and records persistent ids.
Either way nothing outside the data is ever reached.
"""

from __future__ import annotations

import gc
import io
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO

DEFAULT_MAX_BYTES = 1 << 30
_READ_BUFFER = 1 << 20  # larger than any real FR dump (2,000 entries with frames is ~2 MB)


class UnsafePickleError(ValueError):
    """The pickle asked for a global (a class or a function): it was refused, nothing ran."""

    def __init__(self, message: str, global_name: str | None = None):
        super().__init__(message)
        self.global_name = global_name


class CorruptPickleError(ValueError):
    """The data is not a complete, well-formed pickle (truncated, garbage, too large)."""


class Opaque:
    """Stands for an object a pickle asked a global to build; the global was never imported or called.

    Subclassed once per global name (`qualname`). REDUCE/NEWOBJ record their arguments here, BUILD
    records the state, SETITEMS/APPENDS on it (OrderedDict, defaultdict, list subclasses) record
    the items: everything the pickle said, nothing it would have run.
    """

    __slots__ = ("args", "kwargs", "state", "items", "pairs")
    qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Opaque:
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

    def __call__(self, *args: Any, **kwargs: Any) -> Opaque:
        # A call on a placeholder (a gadget chain such as getattr(x, "y")(...)) stays symbolic.
        return _opaque_class(self.qualname + "()")(*args, **kwargs)


def _opaque_class(qualname: str) -> type[Opaque]:
    return type("Opaque", (Opaque,), {"__slots__": (), "qualname": qualname})


@dataclass(frozen=True)
class PersistentRef:
    """A persistent id: torch's pointer from the pickle to a storage record."""

    pid: Any


class _GuardedUnpickler(pickle.Unpickler):
    """The C unpickler with every way to reach a Python object outside the data closed.

    GLOBAL/STACK_GLOBAL, INST and the copyreg EXT opcodes all go through find_class, and REDUCE,
    NEWOBJ and OBJ need a callable that only find_class can provide. Restricted (the default),
    find_class and persistent ids are refused, leaving nothing callable; symbolic, find_class returns
    a placeholder class and persistent ids become `PersistentRef`s, so the load builds containers,
    scalars and placeholders only. `globals` and `refs` list what the pickle named, in order.
    """

    def __init__(self, file: BinaryIO, *, symbolic: bool = False, **options: Any):
        super().__init__(file, **options)
        self.symbolic = symbolic
        self.globals: list[str] = []
        self.refs: list[Any] = []
        self._classes: dict[str, type[Opaque]] = {}

    def find_class(self, module: str, name: str):  # noqa: D102 - see class docstring
        qualified = f"{module}.{name}"
        if not self.symbolic:
            raise UnsafePickleError(
                f"refused to load global {qualified}: only plain containers and scalars are allowed in untrusted pickles",
                qualified,
            )
        if qualified not in self._classes:
            self.globals.append(qualified)
            self._classes[qualified] = _opaque_class(qualified)
        return self._classes[qualified]

    def persistent_load(self, pid):  # noqa: D102
        if not self.symbolic:
            raise UnsafePickleError(f"refused persistent id {pid!r}: only plain containers and scalars are allowed")
        self.refs.append(pid)
        return PersistentRef(pid)


def restricted_unpickler(stream: BinaryIO) -> pickle.Unpickler:
    """The restricted unpickler over `stream`, for a caller that reads its memo after the load
    (`analyzer.parse.fr_partial`); load it with `load_bounded`."""
    return _GuardedUnpickler(stream)


def symbolic_unpickler(stream: BinaryIO) -> _GuardedUnpickler:
    """The symbolic unpickler over `stream` (checkpoints: globals become `Opaque`); load it with
    `load_bounded`, then read its `globals` and `refs`."""
    return _GuardedUnpickler(stream, symbolic=True, encoding="latin1")


def load_untrusted_pickle(data: bytes | BinaryIO, *, max_bytes: int = DEFAULT_MAX_BYTES) -> object:
    """Unpickle `data` (bytes, or a binary stream read up to STOP) admitting only plain containers and scalars.

    Raises UnsafePickleError when the pickle references any global (nothing is executed),
    CorruptPickleError when it is truncated, malformed or larger than `max_bytes`, and
    BudgetExceeded when building it needs more than the parse budget's memory.
    """
    if isinstance(data, bytes | bytearray):
        if len(data) > max_bytes:
            raise CorruptPickleError(f"pickle is {len(data)} bytes, more than the {max_bytes}-byte limit")
        if not data:
            raise CorruptPickleError("empty input: not a pickle")
        # Through a BufferedReader: the C unpickler reads a file object that has `peek` in large
        # chunks, but calls a bare BytesIO's read() for every opcode (2-3x slower on FR dumps).
        data = io.BufferedReader(io.BytesIO(data), buffer_size=_READ_BUFFER)
    return load_bounded(_GuardedUnpickler(data))


def load_bounded(unpickler: pickle.Unpickler) -> object:
    """`unpickler.load()` under the parse memory budget, every failure of the stream a CorruptPickleError.

    The one loading path for untrusted pickles (Flight Recorder dumps, memory snapshots, and the
    checkpoint audit's symbolic unpickler). The C unpickler sizes its memo by the largest index a
    PUT names (a 9-byte pickle with `LONG_BINPUT 2**28` asks for 4 GB) and builds one object per
    opcode byte (a 64 MB pickle of empty dicts is 4 GB): the address-space budget turns both into
    a refused allocation, BudgetExceeded, instead of memory the machine does not have.
    """
    from analyzer.io.budget import address_space

    collecting = gc.isenabled()
    # A dump is tens of thousands of fresh dicts and lists: with the collector on, every few hundred
    # allocations trigger a pass over them (about a third of the load time). They are collected as
    # usual once it is back on.
    gc.disable()
    try:
        with address_space():
            return unpickler.load()
    except UnsafePickleError:
        raise
    except RecursionError as exc:
        raise CorruptPickleError("pickle nests too deeply to load") from exc
    except EOFError as exc:
        raise CorruptPickleError("truncated pickle: data ends before the STOP opcode") from exc
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "truncated" in text:
            raise CorruptPickleError(f"truncated pickle: {text}") from exc
        raise CorruptPickleError(f"corrupt pickle: {text}") from exc
    except Exception as exc:  # noqa: BLE001 - any opcode-level failure means a malformed stream
        from analyzer.io.budget import BudgetExceeded

        if isinstance(exc, BudgetExceeded):
            raise
        # e.g. BUILD on a dict, a bad memo key, an unhashable dict key: all mean "not a valid dump".
        raise CorruptPickleError(f"corrupt pickle: {type(exc).__name__}: {exc}") from exc
    finally:
        if collecting:
            gc.enable()
