"""The line-kind registry (grammars/line_kinds.toml): loads validated, its prefilter covers its patterns,
and every example line is classified as its kind alone and mid-file."""

from pathlib import Path

import polars as pl
import pytest

from analyzer.io import discover
from analyzer.parse.line_kinds import LineKindError, line_kinds
from analyzer.parse.literals import covers, is_piece, required_literals
from analyzer.parse.logtext import LINE_KINDS, PREFILTER_LITERALS, PREFILTER_SCREENS, parse_text_file

KINDS = line_kinds()
BEFORE = "starting the training script on this node"
AFTER = "the training script goes on with its next batch"
FIELD_AFTER = "  time      : 2024-05-01_10:00:00"  # a prefilter candidate after a neighbour-only line


def kinds_of(tmp_path: Path, text: str) -> dict[int, set[str]]:
    (tmp_path / "x.log").write_text(text)
    (item,) = discover(tmp_path)
    events = parse_text_file(item, 2026).filter(pl.col("kind") != "log.last")
    out: dict[int, set[str]] = {}
    for line, kind in events.select("line", "kind").iter_rows():
        out.setdefault(line, set()).add(kind)
    return out


EXAMPLES = [(k, e) for k in KINDS for e in k.examples]


@pytest.mark.parametrize("kind,example", EXAMPLES, ids=[f"{k.kind}-{i}" for i, (k, _) in enumerate(EXAMPLES)])
def test_example_is_its_kind_alone_and_mid_file(tmp_path, kind, example):
    after = FIELD_AFTER if kind.neighbour_only else AFTER
    if not kind.neighbour_only:
        assert kind.kind in kinds_of(tmp_path, example + "\n").get(1, set())
    got = kinds_of(tmp_path, f"{BEFORE}\n{example}\n{after}\n").get(2, set())
    assert kind.kind in got, f"{example!r} mid-file gave {got}"


@pytest.mark.parametrize("kind", [k for k in KINDS if not k.neighbour_only and k.family != "nccl_warn"], ids=lambda k: k.kind)
def test_prefilter_literals_cover_the_pattern(kind):
    assert covers(kind.literals, kind.pattern)
    sampled = kind.kind in ("train.step", "progress")
    assert set(kind.literals) <= set(PREFILTER_LITERALS) or kind.screen in PREFILTER_SCREENS or sampled


def test_plugin_line_mid_file_is_kept(tmp_path):
    # A hand-kept literal `Plugin` used to drop this line (lower-case `plugin`) mid-file.
    text = f"{BEFORE}\nnode-1:100:200 [0] NCCL INFO P2P plugin IBext\n{AFTER}\n"
    assert kinds_of(tmp_path, text)[2] == {"nccl.net"}


def test_registry_order_is_the_match_order():
    assert tuple(LINE_KINDS) == KINDS and KINDS[0].kind == "nccl.warn"


@pytest.mark.parametrize(
    "pattern,expected",
    [
        (r"Init (?:START|COMPLETE)", {"Init START", "Init COMPLETE"}),
        (r"time +:", {"time "}),
        (r"^#\d+\s+0x[0-9a-f]+ in ", {" in "}),
        (r"foo|b.r", {"foo", "b"}),
        (r"foo|\d+", None),
        (r"(?i)loss", None),
        (r"(?i:step)\s*\d+.*\bloss\b", {"loss"}),
    ],
)
def test_required_literals(pattern, expected):
    got = required_literals(pattern)
    assert (set(got) if got is not None else None) == expected


def test_covers_rejects_a_literal_spanning_lowercase_variant():
    assert not covers(["Plugin"], r"NET/Plugin|P2P plugin")
    assert covers(["Plugin", "plugin"], r"NET/Plugin|P2P plugin")
    assert not covers(["ab"], r"a?b")


@pytest.mark.parametrize("piece,pattern,expected", [
    (r"\.py:\d+: \S", r"^(?:[A-Za-z]:)?[^\s:]*\.py:\d+: \S", True),  # a tail of the pattern
    (r"(?:time +:|msg *:)", r"^\s*(?:time +:|msg *:)", True),  # a whole alternation
    (r"(?P<h>\w+)=", r"^(?P<k>\w+)=(?P<h>\w+)=$", True),  # groups are numbered afresh in a piece
    (r"\.py:\d: \S", r"^[^\s:]*\.py:\d+: \S", False),  # not the pattern's items
    (r"time +:", r"^\s*(?:time +:|msg *:)", False),  # one alternative's items: a `msg:` line lacks it
    (r"^\.py:", r"^\.py:\d+", False),  # an anchor asserts what surrounds the piece
    (r"a\b", r"xa\b", False),
    (r"(?i)ab", r"ab", False),  # other flags
])
def test_is_piece(piece, pattern, expected):
    assert is_piece(piece, pattern) is expected


BAD_ROWS = [
    ("severity = 'loud'", "severity 'loud'"),
    ("colour = 'red'", "unknown fields ['colour']"),
    ("literals = ['Plugin']", "do not cover the pattern"),
    ("family = 'gloo'", "family 'gloo'"),
    ("collapse = '(Channel'", "collapse does not compile"),
    ("collapse = ''", "collapse must be a non-empty regex"),
    ("screen = 'P2P plug'", "is not consecutive items of the pattern"),  # inside one alternative only
    ("screen = '(P2P'", "screen does not compile"),
]


@pytest.mark.parametrize("extra,message", BAD_ROWS)
def test_bad_row_fails_with_file_kind_and_field(tmp_path, extra, message):
    body = "[[kind]]\nkind = 'x.y'\nseverity = 'info'\npattern = 'NET/Plugin|P2P plugin'\nexamples = ['P2P plugin']\n"
    body = body.replace("severity = 'info'\n", "") if extra.startswith("severity") else body
    path = tmp_path / "kinds.toml"
    path.write_text(body + extra + "\n")
    with pytest.raises(LineKindError, match=r"kinds\.toml: kind #1 'x\.y'") as info:
        line_kinds(str(path))
    assert message in str(info.value)


def test_bad_pattern_and_missing_literal_fail(tmp_path):
    path = tmp_path / "kinds.toml"
    path.write_text("[[kind]]\nkind = 'x.y'\nseverity = 'info'\npattern = '(unclosed'\nexamples = ['a']\n")
    with pytest.raises(LineKindError, match="does not compile"):
        line_kinds(str(path))
    other = tmp_path / "kinds2.toml"
    other.write_text("[[kind]]\nkind = 'x.z'\nseverity = 'info'\npattern = '[0-9]+'\nexamples = ['1']\n")
    with pytest.raises(LineKindError, match="no prefilter literal"):
        line_kinds(str(other))


RULE = """id = "x-rule"
title = "t"
category = "other"
severity = "error"
role = "cause"
priority = 1
confidence = 0.5
explanation = "e"
remediation = "r"

[match]
kinds = ["{kind}"]
severity = ["{severity}"]
"""


@pytest.mark.parametrize("kind,severity,message", [
    ("nccl.warm", "error", "[match].kinds 'nccl.warm' is not a known event kind"),
    ("vocab.gremlins", "error", "[match].kinds 'vocab.gremlins' is not a known event kind"),
    ("nccl.warn", "loud", "[match].severity 'loud'"),
])
def test_a_rule_naming_an_unknown_kind_or_severity_fails_to_load(tmp_path, kind, severity, message):
    from analyzer.rules import RuleError, load_rule

    path = tmp_path / "x-rule.toml"
    path.write_text(RULE.format(kind=kind, severity=severity))
    with pytest.raises(RuleError, match=r"x-rule\.toml") as info:
        load_rule(path)
    assert message in str(info.value)


def test_known_kinds_hold_every_registry_kind_and_the_emitted_ones():
    from analyzer.parse.line_kinds import known_kinds

    assert {k.kind for k in KINDS} <= known_kinds() and {"log.last", "c10d.error", "fr.entry"} <= known_kinds()
