"""Correlate: a line that names only its local rank (torchrun's `[defaultN]:` tee prefix before the process
group exists) gets the global rank its file's other lines pair with that local rank, or, on a one-host
job, the pairing all the job's lines agree on; a file whose pairs disagree (nodes sharing a console)
gets none. Lines sit between ordinary lines."""

from pathlib import Path

from analyzer.api import analyze

ORDINAL = "torch.AcceleratorError: CUDA error: invalid device ordinal"


def ranks_of(tmp_path: Path, lines: list[str], text: str) -> list:
    body = ["W1202 16:37:52.513000 548 torch/distributed/run.py:851] *****", *lines, "[default0]:step 0 done"]
    (tmp_path / "console.log").write_text("\n".join(body) + "\n")
    events = analyze(str(tmp_path)).events
    return sorted({r for r, m in zip(events["rank"], events["message"]) if m and text in m}, key=str)


def test_a_local_rank_line_takes_the_rank_its_file_pairs_it_with(tmp_path):
    lines = ["[default1]:[rank1]: step 3 loss 0.5", "[default3]:[rank3]: step 3 loss 0.5", f"[default1]:{ORDINAL}"]
    assert ranks_of(tmp_path, lines, ORDINAL) == [1]


def test_a_second_node_offset_is_applied(tmp_path):
    lines = ["[default0]:[rank8]: step 3 loss 0.5", "[default1]:[rank9]: step 3 loss 0.5", f"[default1]:{ORDINAL}"]
    assert ranks_of(tmp_path, lines, ORDINAL) == [9]


def test_a_console_shared_by_two_nodes_names_no_rank(tmp_path):
    lines = ["[default0]:[rank0]: step 3 loss 0.5", "[default0]:[rank8]: step 3 loss 0.5", f"[default1]:{ORDINAL}"]
    assert ranks_of(tmp_path, lines, ORDINAL) == [None]
