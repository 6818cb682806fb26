"""The restricted unpickler: hostile pickles are refused without running anything; real dumps load."""

from __future__ import annotations

import copyreg
import io
import os
import pickle
from pathlib import Path

import pytest

from analyzer.io.safepickle import CorruptPickleError, UnsafePickleError, load_untrusted_pickle

SHARED = Path(__file__).resolve().parents[2] / "shared"
FR_DIR = SHARED / "formats-samples" / "flight-recorder"


def _fr_samples() -> list[Path]:
    if not FR_DIR.is_dir():
        pytest.skip("shared/formats-samples not available")
    files = sorted(FR_DIR.glob("api-dump/*.pkl")) + sorted(FR_DIR.glob("timeout-dump_*/nccl_trace_rank_*"))
    assert files
    return files


class _Touch:
    """Unpickling this would run os.system and create the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Writes:
    """Unpickling this would call builtins.open(marker, 'w')."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


class _Plain:
    def __init__(self):
        self.x = 1


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_os_system_is_refused_and_never_runs(tmp_path, protocol):
    marker = tmp_path / "pwned"
    data = pickle.dumps({"entries": [_Touch(marker)]}, protocol=protocol)
    with pytest.raises(UnsafePickleError) as info:
        load_untrusted_pickle(data)
    assert "refused to load global" in str(info.value)
    assert info.value.global_name in ("posix.system", "nt.system", "os.system")
    assert "system" in str(info.value)
    assert not marker.exists()


def test_file_writing_reduce_is_refused(tmp_path):
    marker = tmp_path / "written"
    with pytest.raises(UnsafePickleError, match=r"refused to load global (?:io|builtins)\.open"):
        load_untrusted_pickle(pickle.dumps([_Writes(marker)]))
    assert not marker.exists()


def test_plain_class_instance_is_refused():
    with pytest.raises(UnsafePickleError, match=r"_Plain"):
        load_untrusted_pickle(pickle.dumps(_Plain()))


def test_copyreg_extension_code_is_refused():
    # EXT1/EXT2/EXT4 opcodes reach objects through the copyreg registry, also via find_class.
    copyreg.add_extension("posix", "system", 0xF1)
    try:
        data = pickle.dumps(os.system, protocol=2)
    finally:
        copyreg.remove_extension("posix", "system", 0xF1)
    assert b"\x82" in data  # EXT1
    copyreg.add_extension("posix", "system", 0xF1)
    try:
        with pytest.raises(UnsafePickleError):
            load_untrusted_pickle(data)
    finally:
        copyreg.remove_extension("posix", "system", 0xF1)


def test_persistent_ids_are_refused():
    class WithPid(pickle.Pickler):
        def persistent_id(self, obj):
            return "storage-0" if obj == "tensor" else None

    buffer = io.BytesIO()
    WithPid(buffer, protocol=2).dump({"t": "tensor"})
    with pytest.raises(UnsafePickleError, match="persistent id"):
        load_untrusted_pickle(buffer.getvalue())


def test_plain_containers_and_scalars_load():
    value = {
        "list": [1, 2.5, None, True, False],
        "tuple": ("0", "default_pg"),
        "bytes": b"\x00\x01",
        "nested": {"set": {1, 2}, "frozen": frozenset({"a"}), "big": 2**70, "neg": -1},
        "text": "nccl:all_reduce",
    }
    # Protocols >= 4 have opcodes for every one of these; FR dumps are written with protocol >= 2.
    for protocol in range(4, pickle.HIGHEST_PROTOCOL + 1):
        assert load_untrusted_pickle(pickle.dumps(value, protocol=protocol)) == value
    scalars = {"a": [1, 2.5, None, True], "b": ("0", "default_pg"), "c": "x" * 300}
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert load_untrusted_pickle(pickle.dumps(scalars, protocol=protocol)) == scalars


def test_old_protocol_bytes_need_a_global_and_are_refused():
    # Protocol 2 spells bytes as _codecs.encode(...) and sets as builtins.set(...): every global is
    # refused, with no allow-list, so these do not load.
    with pytest.raises(UnsafePickleError, match="_codecs.encode"):
        load_untrusted_pickle(pickle.dumps(b"abc", protocol=2))


def test_errors_are_value_errors():
    assert issubclass(UnsafePickleError, ValueError)
    assert issubclass(CorruptPickleError, ValueError)


@pytest.mark.parametrize(
    "data",
    [b"", b"\x80\x04\x95", b"\x80\x04garbage", b"not a pickle at all", b"\x80\x02]q\x00(K\x01K\x02"],
    ids=["empty", "frame-header-only", "garbage", "text", "no-stop"],
)
def test_corrupt_input_raises_corrupt_error(data):
    with pytest.raises(CorruptPickleError):
        load_untrusted_pickle(data)


def test_size_cap():
    data = pickle.dumps(list(range(1000)))
    with pytest.raises(CorruptPickleError, match="limit"):
        load_untrusted_pickle(data, max_bytes=100)


def test_real_flight_recorder_dumps_load_like_plain_pickle():
    for path in _fr_samples():
        data = path.read_bytes()
        loaded = load_untrusted_pickle(data)
        assert loaded == pickle.loads(data)  # our own captured samples: trusted for the comparison
        assert isinstance(loaded, dict) and "entries" in loaded


def test_truncated_real_dump_is_corrupt():
    data = _fr_samples()[0].read_bytes()
    for cut in (1, len(data) // 3, len(data) - 1):
        with pytest.raises(CorruptPickleError):
            load_untrusted_pickle(data[:cut])
