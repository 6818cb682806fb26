"""Stage 2 support (parse): the literals a regular expression cannot match without.

The text prefilter is one Aho-Corasick pass (`str.contains_any`) over every line; only lines that
hold one of its literals reach a regex. For that to be safe the literals must *cover* the regex:
every string the regex matches contains one of them. The regex's parse tree (the stdlib's own
parser) is reduced to a requirement tree: a set of literal strings one of which must appear, a
sequence any of whose requirements suffices, or alternatives that must each be covered.
`required_literals` derives the most selective cover from it, and `covers` checks a hand-declared
set against it, so a registry row whose literals drift from its pattern fails at load instead of
silently dropping lines mid-file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from re import _constants as _c  # the stdlib parser's opcodes (stable since 3.11)
from re import _parser

_REPEATS = (_c.MAX_REPEAT, _c.MIN_REPEAT, getattr(_c, "POSSESSIVE_REPEAT", _c.MAX_REPEAT))
_MAX_EXPANSION = 64  # `(?:On|Off)` and the like expand into whole words; beyond this, stop joining

# A requirement: ("lits", frozenset) one of these strings appears; ("any", [req]) one child holds;
# ("all", [req]) every alternative holds (an alternation).
Req = tuple


def required_literals(pattern: str) -> frozenset[str] | None:
    """A set of literals one of which every match of `pattern` contains, or None if none can be derived."""
    req = _tree(pattern)
    return None if req is None else _derive(req)


def required_literals_of(patterns: Iterable[str]) -> dict[str, frozenset[str] | None]:
    """`required_literals` of each pattern. Deriving them parses every regex (a second at each start
    for the vocabularies), so the result is kept in a cache file named by a digest of this module's
    code and the patterns: an edit to either is a new file. A cache that cannot be read or written
    is derived again; a pattern that does not compile raises re.error as `required_literals` does."""
    wanted = sorted(set(patterns))
    path = _cache_path(wanted)
    cached = _read_cache(path)
    if cached is not None and set(cached) == set(wanted):
        return {p: None if lits is None else frozenset(lits) for p, lits in cached.items()}
    derived = {p: required_literals(p) for p in wanted}
    _write_cache(path, {p: None if lits is None else sorted(lits) for p, lits in derived.items()})
    return derived


def _cache_path(patterns: list[str]) -> Path:
    root = os.environ.get("POSTMORTEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "postmortem")
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update("\0".join(patterns).encode("utf-8", "surrogatepass"))
    return Path(root) / f"literals-{digest.hexdigest()[:32]}.json"


def _read_cache(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    valid = isinstance(data, dict) and all(
        lits is None or (isinstance(lits, list) and all(isinstance(x, str) for x in lits)) for lits in data.values())
    return data if valid else None


def _write_cache(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(data), encoding="utf-8")
        partial.replace(path)  # whole or absent: a reader never sees half a file
    except OSError:
        return  # a read-only home: derive again next time


def covers(literals: tuple[str, ...] | list[str], pattern: str) -> bool:
    """True when every string `pattern` matches contains at least one of `literals`."""
    req = _tree(pattern)
    return req is not None and _covered(tuple(literals), req)


def _tree(pattern: str) -> Req | None:
    parsed = _parser.parse(pattern)
    if parsed.state.flags & re.IGNORECASE:
        return None  # case-folded matching: no case-sensitive literal is required
    return _sequence(list(parsed))


def _sequence(items: list) -> Req:
    children: list[Req] = []
    runs = {""}
    for op, av in items:
        words = _words(op, av)
        if words is not None and len(runs) * len(words) <= _MAX_EXPANSION:
            runs = {r + w for r in runs for w in words}
            continue
        repeated = _repeated_word(op, av)
        if repeated is not None:
            # `x{1,}` holds one x where the run before it ends and one where the run after begins.
            children.append(("lits", frozenset(r + repeated for r in runs)))
            runs = {repeated}
            continue
        if runs != {""}:
            children.append(("lits", frozenset(runs)))
        runs = {""}
        child = _item(op, av)
        if child is not None:
            children.append(child)
    if runs != {""}:
        children.append(("lits", frozenset(runs)))
    return ("any", children)


def _words(op, av) -> list[str] | None:
    """The finite strings an item matches when it is pure literal text (`x`, `(?:On|Off)`), else None."""
    if op is _c.LITERAL:
        return [chr(av)]
    if op is _c.SUBPATTERN and not av[1] & re.IGNORECASE:
        return _pure(list(av[3]))
    if op is _c.BRANCH:
        alternatives = [_pure(list(alt)) for alt in av[1]]
        if any(a is None for a in alternatives):
            return None
        return [w for a in alternatives for w in a]
    return None


def _repeated_word(op, av) -> str | None:
    if op in _REPEATS and av[0] >= 1:
        words = _pure(list(av[2]))
        if words is not None and len(words) == 1 and words[0]:
            return words[0]
    return None


def _pure(items: list) -> list[str] | None:
    out = [""]
    for op, av in items:
        words = _words(op, av)
        if words is None or len(out) * len(words) > _MAX_EXPANSION:
            return None
        out = [o + w for o in out for w in words]
    return out


def _item(op, av) -> Req | None:
    if op is _c.SUBPATTERN:
        return None if av[1] & re.IGNORECASE else _sequence(list(av[3]))
    if op is _c.BRANCH:
        return ("all", [_sequence(list(alt)) for alt in av[1]])
    if op in _REPEATS:
        low, _high, sub = av
        return _sequence(list(sub)) if low >= 1 else None
    if op is getattr(_c, "ATOMIC_GROUP", None):
        return _sequence(list(av))
    return None  # classes, anchors, dots, back-references, look-arounds: no literal required


def _derive(req: Req) -> frozenset[str] | None:
    tag, body = req
    if tag == "lits":
        return body if all(body) else None
    derived = [_derive(child) for child in body]
    if tag == "all":
        return None if not derived or any(d is None for d in derived) else frozenset().union(*derived)
    usable = [d for d in derived if d]
    # Most selective: the longest shortest member, then the fewest members.
    return max(usable, key=lambda s: (min(len(x) for x in s), -len(s)), default=None)


def _covered(literals: tuple[str, ...], req: Req) -> bool:
    tag, body = req
    if tag == "lits":
        return all(any(lit in word for lit in literals) for word in body)
    if tag == "all":
        return bool(body) and all(_covered(literals, child) for child in body)
    return any(_covered(literals, child) for child in body)


# --- screens: a piece of the pattern instead of its literals ------------------------------------------
# A kind whose literals are common in healthy logs (`.py:` is in every Python logging line, `time `
# in every step line) would make most lines candidates. Such a kind names a *screen*: a run of
# consecutive top-level items of its own pattern, tested on the raw line instead of its literals.
# Every string the pattern matches holds a match of such a run (the part of the match those items
# consume), so the screen drops no line the pattern could match, as long as the run asserts nothing
# about what surrounds it (no anchor, look-around or back-reference).
_CONTEXTUAL = {_c.AT, _c.ASSERT, _c.ASSERT_NOT, _c.GROUPREF, getattr(_c, "GROUPREF_EXISTS", _c.GROUPREF)}


def is_piece(piece: str, pattern: str) -> bool:
    """True when `piece` parses to consecutive top-level items of `pattern` (same flags) that hold no
    anchor, look-around or back-reference: a line `pattern` matches in then holds a match of `piece`."""
    whole, part = _parser.parse(pattern), _parser.parse(piece)
    if whole.state.flags != part.state.flags:
        return False
    items, run = [_norm(i) for i in whole], [_norm(i) for i in part]
    if not run or any(_contextual(i) for i in part):
        return False
    return any(items[at : at + len(run)] == run for at in range(len(items) - len(run) + 1))


def _norm(item) -> str:
    """An item's parse with capture-group numbers left out (a piece numbers its groups afresh)."""
    op, av = item
    if op is _c.SUBPATTERN:
        return f"(sub {av[1]} {av[2]} {[_norm(i) for i in av[3]]})"
    if op is _c.BRANCH:
        return f"(branch {[[_norm(i) for i in alt] for alt in av[1]]})"
    if op in _REPEATS:
        return f"({op} {av[0]} {av[1]} {[_norm(i) for i in av[2]]})"
    if op is getattr(_c, "ATOMIC_GROUP", None):
        return f"(atomic {[_norm(i) for i in av]})"
    return repr(item)


def _contextual(item) -> bool:
    op, av = item
    if op in _CONTEXTUAL:
        return True
    if op is _c.SUBPATTERN:
        return any(_contextual(i) for i in av[3])
    if op is _c.BRANCH:
        return any(_contextual(i) for alt in av[1] for i in alt)
    if op in _REPEATS:
        return any(_contextual(i) for i in av[2])
    if op is getattr(_c, "ATOMIC_GROUP", None):
        return any(_contextual(i) for i in av)
    return False
