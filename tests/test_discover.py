"""Discovery: layouts, content classification, and hostile inputs become input-table entries."""

import gzip
import io
import os
import tarfile

from analyzer.io import discover, iter_text_chunks

NCCL_LINE = "node1:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"


def test_torchrun_layout_gives_local_rank(tmp_path):
    d = tmp_path / "none_abc" / "attempt_0" / "3"
    d.mkdir(parents=True)
    (d / "stderr.log").write_text(NCCL_LINE)
    (item,) = discover(tmp_path)
    assert item.local_rank_hint == 3 and item.format == "text"


def test_classified_by_content_not_name(tmp_path):
    (tmp_path / "weird.name").write_text('{"message": {"message": "ValueError: x", "extraInfo": {"timestamp": "1"}}}')
    (tmp_path / "dump.txt").write_text("Process 12: python train.py\nPython v3.12.3 (/usr/bin/python3)\n\nThread 12 (idle): \"MainThread\"\n")
    formats = {i.path: i.format for i in discover(tmp_path)}
    assert formats == {"weird.name": "error_json", "dump.txt": "pyspy_text"}


def test_symlink_out_of_root_is_not_followed(tmp_path):
    outside = tmp_path / "outside.log"
    outside.write_text(NCCL_LINE)
    job = tmp_path / "job"
    job.mkdir()
    os.symlink(outside, job / "link.log")
    (item,) = discover(job)
    assert item.status == "skipped" and "outside" in item.reason


def test_symlink_loop_terminates(tmp_path):
    os.symlink(tmp_path, tmp_path / "loop")
    (tmp_path / "a.log").write_text(NCCL_LINE)
    paths = [i.path for i in discover(tmp_path)]
    assert "a.log" in paths


def test_tar_members_read_in_memory(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = NCCL_LINE.encode()
        info = tarfile.TarInfo("../escape/rank0.log")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (tmp_path / "logs.tar").write_bytes(buffer.getvalue())
    (item,) = discover(tmp_path)
    assert item.path == "logs.tar!../escape/rank0.log"
    assert item.format == "text" and "escapes" in item.reason
    assert not (tmp_path.parent / "escape").exists()


def test_gzip_bomb_is_capped(tmp_path):
    (tmp_path / "bomb.log.gz").write_bytes(gzip.compress(b"a" * (300 << 20)))
    (item,) = discover(tmp_path)
    try:
        consumed = sum(len(c) for c in iter_text_chunks(item))
    except Exception as exc:  # noqa: BLE001 - the cap raises; parse turns it into an input status
        assert "gzip bomb" in str(exc)
    else:
        raise AssertionError(f"bomb fully decompressed ({consumed} chars)")


def test_utf16_and_crlf_and_ansi(tmp_path):
    (tmp_path / "u16.log").write_bytes(NCCL_LINE.encode("utf-16"))
    (tmp_path / "crlf.log").write_bytes(NCCL_LINE.replace("\n", "\r\n").encode())
    formats = {i.path: i.format for i in discover(tmp_path)}
    assert formats["u16.log"] == "text-utf16" and formats["crlf.log"] == "text"
