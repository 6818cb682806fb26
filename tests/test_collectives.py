"""`postmortem collectives`: each rank's collectives aligned by seq, first divergence marked."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.analyses.collectives import collective_table, divergences, shown_ranks
from analyzer.cli import main
from analyzer.events import events_from_records

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"


def _entry(rank: int, seq: int, op: str = "ALLREDUCE", numel: int = 1024, state: str = "completed") -> dict:
    return {"kind": "fr.entry", "file": f"fr/rank{rank}", "line": seq, "rank": rank, "pg": "0", "seq": seq, "op": op,
            "numel_in": numel, "numel_out": numel, "code": state,
            "message": f"pg 0 #{seq} {op} state={state} in=[[{numel}]] Float out=[[{numel}]] Float (nccl:{op.lower()})"}


def _run(*args):
    return CliRunner().invoke(main, ["collectives", *map(str, args)])


@pytest.mark.parametrize(("case", "seq", "line"), [
    ("hang_rank_stuck_outside", 20, "first divergence at #20: rank(s) 1 never called it"),
    ("hang_rank0_only_branch", 23, "first divergence at #23: rank(s) 0 never called it"),
    ("hang_conditional_collective", 28, "first divergence at #28: ranks 0,1 call different collectives (no majority)"),
])
def test_recorded_hangs_show_their_first_divergence(case, seq, line):
    result = _run(RECORDED / case / "job")
    assert result.exit_code == 1, result.output
    assert line in result.output
    marked = [row for row in result.output.splitlines() if row.startswith("  >>")]
    assert len(marked) == 1 and marked[0].split()[1] == str(seq)


def test_json_document_and_rank_filter():
    result = _run(RECORDED / "hang_uneven_data" / "job", "--format", "json", "--ranks", "1")
    assert result.exit_code == 0, result.output  # one rank alone agrees with itself
    group = json.loads(result.output)["process_groups"][0]
    assert group["ranks"] == [1] and group["first_divergence"] is None
    assert all(set(row["cells"]) == {"1"} for row in group["rows"])


def test_nothing_recorded_or_bad_filters_exit_two():
    assert _run(RECORDED / "healthy" / "job").exit_code == 2
    assert "no collective recorded" in _run(RECORDED / "hang_uneven_data" / "job", "--pg", "nope").output
    bad = _run(RECORDED / "hang_uneven_data" / "job", "--ranks", "x-3")
    assert bad.exit_code == 2 and "not a rank" in bad.output and "Traceback" not in bad.output


def test_a_majority_names_the_one_rank_that_called_something_else():
    records = [_entry(r, s) for r in range(4) for s in (1, 2)]
    records += [_entry(r, 3, numel=1024 if r != 2 else 8, state="scheduled") for r in range(4)]
    events = events_from_records(records)
    table = collective_table(events)
    found = divergences(table, events)
    first = found.filter(found["first"]).to_dicts()[0]
    assert (first["seq"], first["kind"], first["ranks"], first["tied"]) == (3, "mismatch", [2], False)


def test_a_rotated_out_seq_is_not_missing_but_a_never_enqueued_one_is():
    # rank 1's buffer starts at 5 (older entries rotated out); rank 0 stops at 6 while rank 1 waits in 7.
    records = [_entry(0, s) for s in range(1, 7)] + [_entry(1, s) for s in range(5, 7)] + [_entry(1, 7, state="scheduled")]
    events = events_from_records(records)
    found = divergences(collective_table(events), events)
    assert found.select("seq", "kind", "ranks").to_dicts() == [{"seq": 7, "kind": "missing", "ranks": [0]}]


def test_many_ranks_show_the_diverging_ones_first():
    records = [_entry(r, 1, numel=1024 if r != 37 else 4) for r in range(64)]
    events = events_from_records(records)
    table = collective_table(events)
    assert 37 in shown_ranks(table, divergences(table, events), limit=4)
