"""Stage 2, parse (checkpoints: restricted parsing): read a checkpoint's pickle without running it.

Nothing in a checkpoint is ever executed. Pickles are read by io's unpickler in its symbolic mode
(`analyzer.io.safepickle`): each global a pickle names becomes an inert placeholder (`Opaque`) that
records the name and its arguments, so the structure (keys, tensors, storage references) is visible
without importing or calling anything. `classify_global` sorts every name a pickle uses: allowed (torch's weights-only set),
unsafe (code: the file is refused) or unknown (a class, read without being built).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from analyzer.io.budget import BudgetExceeded
from analyzer.io.safepickle import CorruptPickleError, load_bounded, symbolic_unpickler

MAX_PICKLE_BYTES = 512 << 20

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


@dataclass
class Pickled:
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


def read_pickle_symbolically(source: bytes | BinaryIO, limit: int = MAX_PICKLE_BYTES) -> Pickled:
    """Unpickle without calling anything: globals become `Opaque` placeholders (see module doc)."""
    if isinstance(source, bytes):
        if len(source) > limit:
            return Pickled(error=f"pickle of {len(source)} bytes exceeds the {limit}-byte limit")
        stream: Any = io.BytesIO(source)
    else:
        stream = _CappedReader(source, limit)
    unpickler = symbolic_unpickler(stream)
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
        return Pickled(None, tuple(unpickler.globals), unpickler.refs, error[:300])
    return Pickled(obj, tuple(unpickler.globals), unpickler.refs)
