"""A rank that left the job while its peers waited (analysis departed_rank, rule rank-left-peers-closed):
named when every failing rank only saw a peer close its connection, never when a rank raised something
of its own, was killed by a signal, or when the silent ranks are most of the job. Lines sit between
ordinary lines."""

from pathlib import Path

from analyzer.api import analyze

CLOSED = "[rank{r}]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [10.0.0.2]:23965"


def report(tmp_path: Path, lines: list[str]) -> dict:
    body = ["[rank0]: step 4 loss 0.0313", "[rank1]: step 4 loss 0.0313", *lines, "[rank0]: exiting"]
    (tmp_path / "console.log").write_text("\n".join(body) + "\n")
    return analyze(str(tmp_path)).report


def rule_ids(rep: dict) -> list[str]:
    return [f["rule_id"] for f in rep["findings"]]


def test_the_rank_that_reports_nothing_while_the_others_see_closed_connections_is_named(tmp_path):
    verdict = report(tmp_path, [CLOSED.format(r=r) for r in (3, 1, 0)])["verdict"]
    assert (verdict["rule_id"], verdict["category"], verdict["culprit_ranks"]) == (
        "rank-left-peers-closed", "rank_absent_from_collective", [2])


def test_a_rank_that_raised_its_own_error_is_the_crash_not_a_departure(tmp_path):
    own = "[rank2]: ValueError: sample 4711: expected sequence length 1024, got 0"
    rep = report(tmp_path, [own, *[CLOSED.format(r=r) for r in (3, 1, 0)]])
    assert "rank-left-peers-closed" not in rule_ids(rep)
    assert rep["verdict"]["culprit_ranks"] == [2]


def test_a_rank_the_launcher_saw_killed_is_not_a_departure(tmp_path):
    table = ["Root Cause (first observed failure):", "[0]:", "  time      : 2026-12-02_16:35:44",
             "  host      : node1", "  rank      : 2 (local_rank: 2)", "  exitcode  : -9 (pid: 740)",
             "  error_file: <N/A>", "  traceback : Signal 9 (SIGKILL) received by PID 740"]
    rep = report(tmp_path, [*[CLOSED.format(r=r) for r in (3, 1, 0)], *table])
    assert "rank-left-peers-closed" not in rule_ids(rep)


def test_silent_ranks_that_are_most_of_the_job_name_nobody(tmp_path):
    rep = report(tmp_path, [CLOSED.format(r=0), CLOSED.format(r=7)])
    assert "rank-left-peers-closed" not in rule_ids(rep)
