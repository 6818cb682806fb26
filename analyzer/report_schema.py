"""Stage 6, report: the JSON Schema of the report, generated from the model in analyzer/report.py.

`json_schema()` walks the dataclasses' type hints: str, int, float, bool, `X | None`, Literal,
list, dict and nested dataclasses map to their JSON Schema forms; a field's `Meta` adds its
description, bounds and whether it is required; an `Enum` marker and a `@shared` dataclass become
`$defs` entries (the verdict categories come from schema/categories.toml). The committed
`schema/report.schema.json` is `schema_text()`; tests/test_report_model.py fails when it is not.
"""

from __future__ import annotations

import json
import sys
from dataclasses import is_dataclass
from types import NoneType, UnionType
from typing import Literal, Union, get_args, get_origin

from analyzer.categories import category_ids
from analyzer.report import SCHEMA_ID, SCHEMA_VERSION, Enum, Meta, Report, field_meta, hints, strip

TITLE = "postmortem analysis report"
DESCRIPTION = (
    "The JSON contract of `postmortem analyze --format json`, schema_version 1.x (this file documents "
    f"{SCHEMA_VERSION}). Keys are stable; new optional keys may be added in minor versions. Written only when the "
    "command exits 0 (nothing found) or 1 (failure identified). Generated from the report model, analyzer/report.py "
    "(`python -m analyzer.report_schema > schema/report.schema.json`): change the model, not this file."
)
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def json_schema() -> dict:
    defs: dict[str, dict] = {}
    body = _object(Report, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, "title": TITLE,
            "description": DESCRIPTION, **body, "$defs": dict(sorted(defs.items()))}


def schema_text() -> str:
    """The schema file's exact text."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def enum_values(name: str) -> list:
    """The values of an Enum, from the data that defines them."""
    if name == "category":
        return list(category_ids())
    if name == "checkpoint_component":
        from analyzer.facts.checkpoint_audit import COMPONENTS

        return list(COMPONENTS)
    raise KeyError(f"no enum named {name!r}")


def _object(cls: type, defs: dict) -> dict:
    """A dataclass as an object schema: its fields' properties, the required ones, and what a
    flattened field's items may be (`additionalProperties`)."""
    properties: dict[str, dict] = {}
    required: list[str] = []
    extra: dict | None = None
    for name, meta in field_meta(cls):
        hint = hints(cls)[name]
        if meta.flatten:
            extra = _type(get_args(strip(hint))[1], defs)
            continue
        properties[name] = _field(hint, meta, defs)
        if meta.required and meta.since is None:
            required.append(name)
    out: dict = {"type": "object"}
    if required:
        out["required"] = required
    out["properties"] = properties
    if extra is not None:
        out["additionalProperties"] = extra
    return out


def _field(hint: object, meta: Meta, defs: dict) -> dict:
    description = f"Optional ({meta.since}): {meta.description}" if meta.since else meta.description
    # A key left out when None is never null in the document.
    schema = _type(_drop_none(strip(hint)) if meta.omit_none else hint, defs)
    return {"description": description, **schema} if description else schema


def _type(hint: object, defs: dict) -> dict:
    """The schema of one type (Annotated bounds appended after the type)."""
    metadata = getattr(hint, "__metadata__", ())
    base = strip(hint)
    marker = next((m for m in metadata if isinstance(m, Enum)), None)
    if marker is not None:
        defs[marker.name] = {"enum": enum_values(marker.name)}
        return {"$ref": f"#/$defs/{marker.name}"}
    schema = _base(base, defs)
    for meta in (m for m in metadata if isinstance(m, Meta)):
        for key in ("minimum", "maximum", "pattern"):
            if getattr(meta, key) is not None:
                schema[key] = getattr(meta, key)
    return schema


def _base(base: object, defs: dict) -> dict:
    origin, args = get_origin(base), get_args(base)
    if origin in (Union, UnionType):
        return _nullable(_drop_none(base), defs)
    if origin is Literal:
        return {"enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _type(args[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type(args[1], defs)}
    if is_dataclass(base):
        name = getattr(base, "__schema_def__", None)
        if name is None:
            return _object(base, defs)
        defs[name] = _object(base, defs)
        return {"$ref": f"#/$defs/{name}"}
    if base in _SCALARS:
        return {"type": _SCALARS[base]}
    raise TypeError(f"the report model holds a type the schema cannot state: {base!r}")


def _nullable(inner: object, defs: dict) -> dict:
    """`X | None`: null joins the type (or the enum) of X."""
    if get_origin(strip(inner)) is Literal:
        return {"enum": [None, *get_args(strip(inner))]}
    schema = _type(inner, defs)
    if "type" in schema:
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


def _drop_none(union: object) -> object:
    kept = [a for a in get_args(union) if a is not NoneType]
    if len(kept) != 1:
        raise TypeError(f"the report model's unions are `X | None`: {union!r}")
    return kept[0]


def main(argv: list[str]) -> int:
    if argv:
        print("usage: python -m analyzer.report_schema   (prints the report's JSON Schema)", file=sys.stderr)
        return 2
    sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
