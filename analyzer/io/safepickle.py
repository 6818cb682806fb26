"""Stage 1, io (support): load untrusted pickles without executing anything.

Flight Recorder dumps (and PyTorch memory snapshots) are pickles written by a process we do not
trust: a job directory may come from anywhere, and `pickle.load` on a crafted file runs arbitrary
code. The restricted unpickler here refuses every global, so only what the pickle opcodes can
build by themselves loads: dict, list, tuple, set, frozenset, str, bytes, bytearray, int, float,
bool and None. That is all a Flight Recorder dump contains.
"""

from __future__ import annotations

import gc
import io
import pickle
from typing import BinaryIO

DEFAULT_MAX_BYTES = 1 << 30
_READ_BUFFER = 1 << 20  # larger than any real FR dump (2,000 entries with frames is ~2 MB)


class UnsafePickleError(ValueError):
    """The pickle asked for a global (a class or a function): it was refused, nothing ran."""

    def __init__(self, message: str, global_name: str | None = None):
        super().__init__(message)
        self.global_name = global_name


class CorruptPickleError(ValueError):
    """The data is not a complete, well-formed pickle (truncated, garbage, too large)."""


class _RestrictedUnpickler(pickle.Unpickler):
    """The C unpickler with every way to reach a Python object outside the data refused.

    GLOBAL/STACK_GLOBAL and the copyreg EXT opcodes all go through find_class, and REDUCE, NEWOBJ,
    INST and OBJ need a callable that only find_class can provide; so refusing find_class (and
    persistent ids) leaves nothing callable.
    """

    def find_class(self, module: str, name: str):  # noqa: D102 - see class docstring
        qualified = f"{module}.{name}"
        raise UnsafePickleError(
            f"refused to load global {qualified}: only plain containers and scalars are allowed in untrusted pickles",
            qualified,
        )

    def persistent_load(self, pid):  # noqa: D102
        raise UnsafePickleError(f"refused persistent id {pid!r}: only plain containers and scalars are allowed")


def restricted_unpickler(stream: BinaryIO) -> pickle.Unpickler:
    """The restricted unpickler over `stream`, for a caller that reads its memo after the load
    (`analyzer.parse.fr_partial`); load it with `load_bounded`."""
    return _RestrictedUnpickler(stream)


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
    return load_bounded(_RestrictedUnpickler(data))


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
