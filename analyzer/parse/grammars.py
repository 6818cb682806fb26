"""Stage 2, parse (structure layer): the Lark grammars in `grammars/`, built once per process.

Each grammar is LALR with the contextual lexer and gets its Transformer at construction, so a
parse returns plain dicts and never builds a tree. Callers hand over only message bodies that a
vectorised prefilter selected; `parse_body` returns None for a body that does not fit.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import LarkError

# An integer field is None past int64 (a corrupted line's 30-digit 'sequence number').
from analyzer.bounds import int64
from analyzer.resources import data_dir

GRAMMAR_STARTS: dict[str, tuple[str, ...]] = {
    "c10d": ("work", "pg_status"),
    "nccl": ("ib_completion", "ib_async", "connect_failed", "peer_closed", "duplicate_gpu", "cuda_failure"),
    "torchrun": ("entry",),
}


class FieldsTransformer(Transformer):
    """Turns every grammar's rules into flat dicts of fields (one transformer serves all grammars)."""

    # c10d: WorkNCCL fields
    def work(self, items: list[Any]) -> dict:
        return _merge(items)

    def seq(self, items):
        return {"seq": int64(items[0])}

    def op(self, items):
        return {"op": str(items[0])}

    def numel_in(self, items):
        return {"numel_in": int64(items[0])}

    def numel_out(self, items):
        return {"numel_out": int64(items[0])}

    def timeout_ms(self, items):
        return {"timeout_ms": int64(items[0])}

    def elided(self, _items):
        return {}

    # c10d: process-group status
    def status_seq(self, items):
        ints = [int64(t) for t in items if isinstance(t, Token) and t.type == "SIGNED_INT"]
        return {"seq": ints[0], "last_enqueued": ints[1], "last_completed": ints[2]}

    def status_dump(self, items):
        origin = next((i for i in items if isinstance(i, dict)), {})
        ints = [int64(t) for t in items if isinstance(t, Token) and t.type == "SIGNED_INT"]
        return {**origin, "last_enqueued": ints[0], "last_completed": ints[1]}

    def pg_status(self, items):
        return _merge(items)

    def origin_self(self, _items):
        return {"dump_from": "self"}

    def origin_rank(self, items):
        return {"dump_from": int64(items[0])}

    def old_status_head(self, _items):
        return None

    # nccl WARN families
    def ib_completion(self, items):
        fields = _merge(items)
        fields["peer"] = next(str(t) for t in items if isinstance(t, Token) and t.type == "ADDR")
        return fields

    def status_code(self, items):
        return {"status": int64(items[0])}

    def status_named(self, items):
        return {"status": int64(items[1]), "status_name": str(items[0])}

    def ib_async(self, items):
        device = next((str(t) for t in items if isinstance(t, Token) and t.type == "DEVICE_PORT"), None)
        return {"event": str(items[-1]).strip(" :"), "device": device}

    def connect_failed(self, items):
        addr = next(str(t) for t in items if isinstance(t, Token) and t.type == "ADDR")
        return {"peer": addr, "reason": str(items[-1]).strip()}

    def peer_closed(self, items):
        return {"peer": f"{items[1]}<{items[2]}>"}

    def duplicate_gpu(self, items):
        return {"ranks": [int64(items[0]), int64(items[1])], "bus_id": str(items[2])}

    def cuda_failure(self, items):
        return {"cuda_error": str(items[-1]).strip("'")}

    # torchrun failure table entry
    def entry(self, items):
        return _merge(items)

    def time(self, items):
        return {"time": str(items[0]).strip()}

    def host(self, items):
        return {"host": str(items[0]).strip()}

    def rank(self, items):
        return {"rank": int64(items[0]), "local_rank": int64(items[1])}

    def exitcode(self, items):
        fields = {"exitcode": int64(items[0]), "pid": int64(items[1])}
        if len(items) > 2:
            fields["signal"] = str(items[2])
        return fields

    def error_file(self, items):
        return {"error_file": str(items[0]).strip()}

    def traceback(self, items):
        return {"traceback": str(items[0]).strip() if items else ""}


def _merge(items: list[Any]) -> dict:
    merged: dict = {}
    for item in items:
        if isinstance(item, dict):
            merged.update(item)
    return merged


@cache
def grammar(name: str) -> Lark:
    path = data_dir("grammars") / f"{name}.lark"
    return Lark.open(
        str(path),
        parser="lalr",
        lexer="contextual",
        start=list(GRAMMAR_STARTS[name]),
        transformer=FieldsTransformer(),
        maybe_placeholders=False,
    )


def parse_body(grammar_name: str, start: str, body: str) -> dict | None:
    """Parse one prefiltered message body; None when it does not fit the grammar."""
    try:
        result = grammar(grammar_name).parse(body, start=start)
    except LarkError:
        return None
    return result if isinstance(result, dict) else None
