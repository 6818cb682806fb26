"""The exit-status contract of `postmortem`, and which exceptions are the input's fault.

Exit codes: 0 nothing found, 1 failure identified, 2 could not analyse (no such path, nothing
readable, no training log, an output path that cannot be written), 3 internal error (the analyzer's
own fault: never passed off as a verdict).

`INPUT_ERRORS` is the one place that says which exceptions bad *input* raises: the per-file and
per-audit boundaries catch exactly these and record them as the file's status. Anything else (a
TypeError, an AttributeError, an ImportError of a required package, a failed assertion) is a bug of
the analyzer and propagates to the command, which exits 3.
"""

from __future__ import annotations

import json
import lzma
import pickle
import sqlite3
import struct
import tarfile
import zipfile
import zlib

import zstandard
from lark.exceptions import LarkError
from polars.exceptions import ComputeError, InvalidOperationError, NoDataError, PanicException

from analyzer.bounds import DecompressionLimit

EXIT_NOTHING_FOUND = 0
EXIT_FAILURE_FOUND = 1
EXIT_CANNOT_ANALYSE = 2
EXIT_INTERNAL_ERROR = 3


class CannotAnalyse(Exception):
    """Could not analyse at all: the command exits 2 with this message."""


INPUT_ERRORS: tuple[type[BaseException], ...] = (
    # Bytes, text and numbers the input holds: bad encodings, values out of range, cut streams.
    # ValueError covers json.JSONDecodeError and the project's own format errors (NotNsysExport,
    # FlightRecorderError, TraceFormatError, ErrorJsonError, UnsafePickleError, CorruptPickleError).
    UnicodeError, ValueError, OverflowError, EOFError,
    # Reading it: permissions, vanished files, truncated archives (gzip's BadGzipFile, bz2), and
    # discovery's bomb caps.
    OSError, DecompressionLimit,
    # Containers and codecs.
    zlib.error, lzma.LZMAError, zstandard.ZstdError, tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile,
    pickle.UnpicklingError, struct.error, json.JSONDecodeError, sqlite3.Error,
    # A document nested deeper than the interpreter's stack, or too large to hold.
    RecursionError, MemoryError,
    # Grammars and polars on data they cannot take.
    LarkError, ComputeError, InvalidOperationError, NoDataError,
    # A Rust library's panic surfaces as pyo3's PanicException, a BaseException: data that crashed
    # the library, not our code (KeyboardInterrupt and SystemExit are never listed).
    PanicException,
)


def is_input_error(exc: BaseException) -> bool:
    """True when `exc` comes from the input (a per-file status), False when it is the analyzer's fault."""
    return isinstance(exc, INPUT_ERRORS)
