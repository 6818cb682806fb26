"""Locate the data directories (grammars, rules, schema) in a source checkout or an installed wheel.

The wheel carries them under `analyzer/_data/`; a checkout keeps them at the repository root.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"postmortem data directory {name!r} is missing from the installation")
