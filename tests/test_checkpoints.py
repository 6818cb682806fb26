"""The checkpoint audit (analyzer.facts.checkpoint_audit, reading through analyzer.parse.checkpoints) on checkpoints made with torch itself, on CPU.

Builders here write real torch.save files (zip and legacy), a two-rank torch.distributed.checkpoint
save (per-rank shard files and the global .metadata), DeepSpeed- and Hugging Face-shaped folders, and then break them the
ways saves break: truncation, a flipped byte, a deleted shard, a leftover temporary file. CUDA RNG
state is the 16-byte uint8 tensor per device that torch.cuda.get_rng_state_all() returns; a CPU
runner cannot call it, so the builders write that shape themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import analyzer.facts.checkpoint_audit as checkpoint_audit
from analyzer.facts.checkpoint_audit import COMPONENTS, audit
from analyzer.io import discover_job
from analyzer.parse.checkpoints.symbolic import classify_global, read_pickle_symbolically

ALL_STATE = [c for c in COMPONENTS if c != "grad_scaler"]


# --- builders --------------------------------------------------------------------------------------


def training_state(step: int, *, rng: bool = True, sampler: bool = True) -> dict:
    """What a training loop saves: model, optimizer, scheduler, RNG states, sampler position, step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    scheduler.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "lr_scheduler": scheduler.state_dict(),
             "step": step}
    if rng:
        state["rng"] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                        "cuda": [torch.zeros(16, dtype=torch.uint8)]}
    if sampler:
        state["sampler"] = {"epoch": 1, "index": 17 * step}
    return state


class Exploit:
    """A pickle payload: unpickling it calls os.system (what a malicious checkpoint does)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def malicious_state(marker: Path) -> dict:
    state = training_state(1)
    state["payload"] = Exploit(marker)
    return state


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The safetensors layout: u64 header length, JSON header, then the raw tensor bytes."""
    codes = {torch.float32: "F32", torch.int64: "I64", torch.uint8: "U8"}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, tensor in tensors.items():
        raw = bytes(tensor.contiguous().view(torch.uint8).flatten().tolist())
        header[name] = {"dtype": codes[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def hf_checkpoint(directory: Path, step: int, *, world: int = 1) -> Path:
    """A Trainer checkpoint-N folder: sharded safetensors with index, optimizer, scheduler, RNG, state."""
    directory.mkdir(parents=True)
    state = training_state(step)
    weights = state["model"]
    names = sorted(weights)
    shards = {f"model-{i + 1:05d}-of-{len(names):05d}.safetensors": {n: weights[n]} for i, n in enumerate(names)}
    for file, tensors in shards.items():
        write_safetensors(directory / file, tensors)
    index = {"metadata": {"total_size": 0}, "weight_map": {n: f for f, ts in shards.items() for n in ts}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.save(state["optimizer"], directory / "optimizer.pt")
    torch.save(state["lr_scheduler"], directory / "scheduler.pt")
    for rank in range(world):
        name = "rng_state.pth" if world == 1 else f"rng_state_{rank}.pth"
        torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state(),
                    "cuda": torch.zeros(16, dtype=torch.uint8)}, directory / name)
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": step / 100}))
    torch.save(argparse.Namespace(learning_rate=0.1, output_dir="out"), directory / "training_args.bin")
    return directory


def deepspeed_tag(directory: Path, step: int, *, dp: int, present: range | list[int]) -> Path:
    """A DeepSpeed ZeRO tag folder: model states (with dp_world_size) and one optimizer partition per dp rank."""
    directory.mkdir(parents=True)
    state = training_state(step)
    ds_config = {"optimizer": {"type": "AdamW", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 2}}
    torch.save({"module": state["model"], "optimizer": None, "lr_scheduler": state["lr_scheduler"],
                "data_sampler": None, "global_steps": step, "global_samples": step * 32, "dp_world_size": dp,
                "mp_world_size": 1, "ds_config": ds_config, "ds_version": "0.14.0", "rng": state["rng"],
                "sampler": state["sampler"]}, directory / "mp_rank_00_model_states.pt")
    for rank in present:
        torch.save({"optimizer_state_dict": {"zero_stage": 2, "partition_count": [dp],
                                             "base_optimizer_state": {"state": {0: {"exp_avg": torch.zeros(4)}},
                                                                      "param_groups": [{"lr": 0.1, "params": [0]}]},
                                             "single_partition_of_fp32_groups": [torch.zeros(4)]},
                    "ds_config": ds_config, "ds_version": "0.14.0"},
                   directory / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (directory.parent / "latest").write_text(directory.name)
    return directory


def _rank_state(rank: int, step: int) -> dict:
    """Rank `rank`'s state in a two-stage pipeline: its own layers and their optimizer state; the
    scheduler, RNG, dataloader position and step are the same on both ranks (DCP saves them once)."""
    torch.manual_seed(rank)
    layer = f"layers.{rank}.weight"
    return {
        "model": {layer: torch.randn(8, 4)},
        "optimizer": {"state": {layer: {"exp_avg": torch.zeros(8, 4), "step": torch.tensor(float(step))}},
                      "param_groups": [{"lr": 0.1, "params": [layer]}]},
        "lr_scheduler": {"last_epoch": step, "base_lrs": [0.1], "_step_count": step + 1},
        "rng": {"python": random.Random(0).getstate(), "numpy": np.random.RandomState(0).get_state(),
                "torch": torch.random.default_generator.get_state(), "cuda": [torch.zeros(16, dtype=torch.uint8)]},
        "dataloader": {"batches_seen": 17 * step},
        "step": step,
    }


def dcp_two_ranks(directory: Path, step: int) -> Path:
    """A two-rank torch.distributed.checkpoint save, made in one process: the planner and writer
    calls dcp.save makes on each rank, with its gather / scatter of the plans done as a list (a
    real process group would cost each test seconds of spawning)."""
    from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter

    ranks = range(2)
    planners = [DefaultSavePlanner() for _ in ranks]
    writers = [FileSystemWriter(str(directory), single_file_per_rank=True) for _ in ranks]
    local_plans = []
    for rank in ranks:
        planners[rank].set_up_planner(state_dict=_rank_state(rank, step), storage_meta=writers[rank].storage_meta(),
                                      is_coordinator=rank == 0)
        writers[rank].set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        local_plans.append(writers[rank].prepare_local_plan(planners[rank].create_local_plan()))
    global_plans, metadata = planners[0].create_global_plan(local_plans)
    global_plans = writers[0].prepare_global_plan(global_plans)
    results = []
    for rank in ranks:
        final = planners[rank].finish_plan(global_plans[rank])
        future = writers[rank].write_data(final, planners[rank])
        future.wait()
        results.append(future.value())
    writers[0].finish(metadata=metadata, results=results)
    return directory


def one(frame, path: str) -> dict:
    rows = [r for r in frame.to_dicts() if r["path"] == path]
    assert len(rows) == 1, f"{path} not in {frame.get_column('path').to_list()}"
    return rows[0]


@pytest.fixture(params=[True, False], ids=["torch", "structure-only"])
def use_torch(request):
    return request.param


# --- torch.save files ------------------------------------------------------------------------------


def test_complete_checkpoint_is_resumable_and_exact(tmp_path, use_torch):
    torch.save(training_state(200), tmp_path / "step_200.pt")
    row = one(audit(tmp_path, use_torch=use_torch), "step_200.pt")
    assert row["readable"] and row["resumable"] and row["exact_resume"] and row["newest_resumable"]
    assert row["format"] == "torch_zip" and row["step"] == 200
    assert row["components"] == ALL_STATE
    assert row["missing_components"] == []
    expected = "torch.load(weights_only=True)" if use_torch else "structure"
    assert row["checked_with"].startswith(expected)


def _zip_cut_points(data: bytes) -> dict[str, int]:
    import io

    infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    end_record = data.rfind(b"PK\x05\x06")
    (central,) = struct.unpack_from("<I", data, end_record + 16)
    storage = next(i for i in infos if "/data/" in i.filename and i.file_size > 64)
    return {
        "inside-data.pkl": 150,
        "after-data.pkl": infos[1].header_offset,
        "inside-a-tensor": storage.header_offset + 100,
        "before-central-directory": central,
        "inside-central-directory": central + 60,
        "last-bytes-missing": len(data) - 10,
    }


@pytest.mark.parametrize("point", ["inside-data.pkl", "after-data.pkl", "inside-a-tensor", "before-central-directory",
                                   "inside-central-directory", "last-bytes-missing"])
def test_truncated_zip_is_unreadable_at_every_point(tmp_path, point, use_torch):
    torch.save(training_state(300), tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "full.pt").unlink()
    (tmp_path / "step_300.pt").write_bytes(data[: _zip_cut_points(data)[point]])
    row = one(audit(tmp_path, use_torch=use_torch), "step_300.pt")
    assert not row["readable"] and not row["resumable"] and not row["newest_resumable"]
    assert row["problem"] == "corrupt"
    assert row["reason"].startswith("truncated")
    if point == "inside-data.pkl":
        assert "inside data.pkl" in row["reason"]
    else:
        assert "no zip central directory" in row["reason"] and "tensor storages started" in row["reason"]


def test_flipped_byte_is_a_bad_crc(tmp_path, use_torch):
    torch.save(training_state(5), tmp_path / "model.pt")
    data = bytearray((tmp_path / "model.pt").read_bytes())
    member = next(i for i in zipfile.ZipFile(tmp_path / "model.pt").infolist() if i.filename.endswith("/data/0"))
    data[member.header_offset + 120] ^= 0xFF
    (tmp_path / "model.pt").write_bytes(bytes(data))
    row = one(audit(tmp_path, use_torch=use_torch), "model.pt")
    assert not row["readable"] and row["problem"] == "corrupt"
    assert "bad CRC in member" in row["reason"] and "data/" in row["reason"]


def test_storage_record_missing_from_a_complete_zip(tmp_path, use_torch):
    """A zip whose central directory is fine but lacks a tensor record data.pkl references."""
    torch.save(training_state(5), tmp_path / "src.pt")
    with zipfile.ZipFile(tmp_path / "src.pt") as src, zipfile.ZipFile(tmp_path / "step_5.pt", "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith("/data/1"):
                dst.writestr(info, src.read(info))
    (tmp_path / "src.pt").unlink()
    row = one(audit(tmp_path, use_torch=use_torch), "step_5.pt")
    assert not row["readable"] and "storage record(s) referenced by data.pkl are missing: data/1" in row["reason"]


@pytest.mark.parametrize("cut", [10, 200, -3000, -4])
def test_legacy_format_complete_and_truncated(tmp_path, cut, use_torch):
    torch.save(training_state(150), tmp_path / "full.pt", _use_new_zipfile_serialization=False)
    data = (tmp_path / "full.pt").read_bytes()
    whole = one(audit(tmp_path, use_torch=use_torch), "full.pt")
    assert whole["format"] == "torch_legacy" and whole["readable"] and whole["exact_resume"]
    (tmp_path / "full.pt").unlink()
    (tmp_path / "cut.pt").write_bytes(data[:cut])
    row = one(audit(tmp_path, use_torch=use_torch), "cut.pt")
    assert row["format"] == "torch_legacy"
    assert not row["readable"] and row["problem"] == "corrupt"
    assert "EOF" in row["reason"] or "truncated" in row["reason"]


def test_missing_rng_and_sampler_state_is_listed(tmp_path, use_torch):
    torch.save(training_state(50, rng=False, sampler=False), tmp_path / "step_50.pt")
    row = one(audit(tmp_path, use_torch=use_torch), "step_50.pt")
    assert row["readable"] and row["resumable"] and not row["exact_resume"]
    assert row["components"] == ["model", "optimizer", "lr_scheduler", "step"]
    assert row["missing_components"] == ["rng_python", "rng_numpy", "rng_torch", "data_position"]


def test_cuda_rng_is_required_only_for_gpu_jobs(tmp_path):
    state = training_state(7)
    del state["rng"]["cuda"]
    torch.save(state, tmp_path / "step_7.pt")
    assert one(audit(tmp_path), "step_7.pt")["exact_resume"]
    gpu = one(audit(tmp_path, expect_cuda=True), "step_7.pt")
    assert not gpu["exact_resume"] and gpu["missing_components"] == ["rng_cuda"]


def test_raw_state_dict_is_weights_only(tmp_path):
    torch.save(training_state(1)["model"], tmp_path / "weights.pth")
    row = one(audit(tmp_path), "weights.pth")
    assert row["resumable"] and row["components"] == ["model"]
    assert "optimizer" in row["missing_components"]


def test_config_sections_are_not_state(tmp_path):
    """A DeepSpeed-style config that names an optimizer and scheduler holds no optimizer state."""
    state = training_state(3, rng=False, sampler=False)
    torch.save({"model": state["model"], "config": {"optimizer": {"type": "AdamW", "lr": 0.1},
                                                    "scheduler": {"type": "WarmupLR"}}, "args_optimizer": "adam"},
               tmp_path / "model.pt")
    assert one(audit(tmp_path), "model.pt")["components"] == ["model"]


# --- newest resumable --------------------------------------------------------------------------------


def test_newest_resumable_skips_newer_broken_and_temporary_saves(tmp_path):
    for step in (100, 200):
        torch.save(training_state(step), tmp_path / f"step_{step}.pt")
    torch.save(training_state(300), tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "full.pt").unlink()
    (tmp_path / "step_300.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "step_400.pt.tmp").write_bytes(data)
    frame = audit(tmp_path)
    assert frame.get_column("path").to_list() == ["step_400.pt.tmp", "step_300.pt", "step_200.pt", "step_100.pt"]
    assert frame.filter("newest_resumable").get_column("path").to_list() == ["step_200.pt"]
    leftover = one(frame, "step_400.pt.tmp")
    assert leftover["format"] == "temporary" and leftover["problem"] == "interrupted" and not leftover["resumable"]
    assert "leftover of an interrupted save" in leftover["reason"]


def test_resume_target_is_a_training_checkpoint_not_a_newer_weights_export(tmp_path):
    torch.save(training_state(900), tmp_path / "step_900.pt")
    torch.save(training_state(1000)["model"], tmp_path / "final_model_step_1000.pt")
    frame = audit(tmp_path)
    assert frame.get_column("path").to_list() == ["final_model_step_1000.pt", "step_900.pt"]
    assert frame.filter("newest_resumable").get_column("path").to_list() == ["step_900.pt"]
    alone = audit(None, [str(tmp_path / "final_model_step_1000.pt")])
    assert alone.get_column("newest_resumable").to_list() == [True]  # a weights export when nothing else is left


def test_no_resumable_checkpoint_marks_none(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"")
    frame = audit(tmp_path)
    assert one(frame, "model.pt")["reason"].startswith("empty file")
    assert frame.filter("newest_resumable").height == 0


def test_rewritten_file_is_audited_again(tmp_path):
    path = tmp_path / "step_9.pt"
    torch.save(training_state(9), path)
    assert one(audit(tmp_path), "step_9.pt")["readable"]
    path.write_bytes(path.read_bytes()[:-100])
    assert not one(audit(tmp_path), "step_9.pt")["readable"]


# --- malicious pickles -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["zip", "legacy", "pickle"])
def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path, layout, use_torch):
    marker = tmp_path / "PWNED"
    path = tmp_path / ("evil_checkpoint.pkl" if layout == "pickle" else "evil.pt")
    if layout == "pickle":
        path.write_bytes(pickle.dumps(malicious_state(marker), protocol=2))
    else:
        torch.save(malicious_state(marker), path, _use_new_zipfile_serialization=layout == "zip")
    row = one(audit(tmp_path, use_torch=use_torch), path.name)
    assert not marker.exists()
    assert not row["readable"] and not row["resumable"] and row["problem"] == "unsafe"
    assert row["unsafe_globals"] == ["posix.system"] if os.name == "posix" else row["unsafe_globals"]
    assert row["reason"].startswith("refused") and "nothing was loaded or executed" in row["reason"]


@pytest.mark.parametrize("payload", [
    b"cos\nsystem\n(S'touch {m}'\ntR.",  # protocol 0: GLOBAL + REDUCE
    b"c__builtin__\neval\n(S'open(\"{m}\", \"w\")'\ntR.",
    # getattr(__import__('os'), 'system')('touch m'): calls on what a call returned
    b"c__builtin__\ngetattr\n(c__builtin__\n__import__\n(S'os'\ntRS'system'\ntR(S'touch {m}'\ntR.",
    b"(S'touch {m}'\nios\nsystem\n.",  # INST
    b"\x80\x04\x8c\nsubprocess\x8c\x04call\x93\x8c\x05touch\x8c{n}{m}\x86\x85R.",  # STACK_GLOBAL
], ids=["reduce", "eval", "getattr-chain", "inst", "stack-global"])
def test_symbolic_reader_calls_nothing(tmp_path, payload):
    marker = str(tmp_path / "m").encode()
    result = read_pickle_symbolically(payload.replace(b"{n}", bytes([len(marker)])).replace(b"{m}", marker))
    assert not (tmp_path / "m").exists()
    assert result.error is None  # the whole stream was read: every call stayed a placeholder
    assert result.unsafe == sorted(result.globals) and result.unsafe


def test_global_classification():
    assert classify_global("torch._utils._rebuild_tensor_v2") == "allowed"
    assert classify_global("torch.FloatStorage") == "allowed"
    assert classify_global("torch.bfloat16") == "allowed"
    assert classify_global("numpy._core.multiarray._reconstruct") == "allowed"
    for code in ("posix.system", "os.system", "builtins.eval", "subprocess.Popen", "torch.load", "torch.hub.load",
                 "builtins.getattr", "runpy._run_code"):
        assert classify_global(code) == "unsafe", code
    # Classes real checkpoints pickle are never called malicious (FSDP2 state dicts hold DTensors).
    for benign in ("argparse.Namespace", "torch.distributed.checkpoint.metadata.Metadata", "functools.partial",
                   "torch.distributed.tensor._api.DTensor", "torch.distributed.device_mesh.DeviceMesh",
                   "torch._C.Generator", "io.BytesIO", "copyreg._reconstructor"):
        assert classify_global(benign) == "unknown", benign


def test_classes_outside_the_allowlist_are_noted_not_built(tmp_path):
    torch.save({"model": training_state(1)["model"], "args": argparse.Namespace(lr=0.1, iteration=4)}, tmp_path / "m.pt")
    row = one(audit(tmp_path), "m.pt")
    assert row["readable"] and row["unknown_globals"] == ["argparse.Namespace"]
    assert "weights_only=True) will refuse" in row["notes"]
    assert "skipped" in row["checked_with"]


# --- without torch -----------------------------------------------------------------------------------


def test_without_torch_installed_the_record_says_so(tmp_path, monkeypatch):
    torch.save(training_state(11), tmp_path / "step_11.pt")
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails, as on a machine without it
    row = one(audit(tmp_path), "step_11.pt")
    assert row["checked_with"] == "structure (torch not installed)"
    assert row["exact_resume"] and row["newest_resumable"]


# --- torch.distributed.checkpoint ------------------------------------------------------------------


def test_dcp_two_rank_checkpoint_is_complete(tmp_path):
    dcp_two_ranks(tmp_path / "step_250", 250)
    row = one(audit(tmp_path), "step_250")
    assert row["format"] == "dcp" and row["readable"] and row["resumable"] and row["exact_resume"]
    assert row["step"] == 250
    assert row["shards_expected"] == row["shards_present"] == 2


def test_dcp_with_a_rank_shard_deleted(tmp_path):
    directory = dcp_two_ranks(tmp_path / "step_250", 250)
    (directory / "__1_0.distcp").unlink()
    row = one(audit(tmp_path), "step_250")
    assert not row["readable"] and not row["resumable"] and row["problem"] == "shards_missing"
    assert row["shards_expected"] == 2 and row["shards_present"] == 1
    assert row["missing_shards"] == ["__1_0.distcp"] and row["missing_ranks"] == [1]
    assert "1 of 2 shard files listed in .metadata are missing" in row["reason"]


def test_dcp_shard_shorter_than_metadata(tmp_path):
    directory = dcp_two_ranks(tmp_path / "step_250", 250)
    shard = directory / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-500])
    row = one(audit(tmp_path), "step_250")
    assert not row["readable"] and row["missing_ranks"] == [0] and "shorter than .metadata says" in row["reason"]


def test_dcp_without_metadata_did_not_finish(tmp_path):
    directory = dcp_two_ranks(tmp_path / "step_250", 250)
    (directory / ".metadata").rename(directory / ".metadata.tmp")
    row = one(audit(tmp_path), "step_250")
    assert not row["readable"] and row["problem"] == "shards_missing"
    assert "no .metadata" in row["reason"] and ".metadata.tmp left behind" in row["reason"]


def test_dcp_staging_directory_is_a_leftover(tmp_path):
    dcp_two_ranks(tmp_path / "step_250.tmp", 250)
    row = one(audit(tmp_path), "step_250.tmp")
    assert row["format"] == "temporary" and row["problem"] == "interrupted" and not row["resumable"]


def test_dcp_malicious_metadata_is_refused(tmp_path):
    directory = dcp_two_ranks(tmp_path / "step_250", 250)
    marker = tmp_path / "PWNED"
    (directory / ".metadata").write_bytes(pickle.dumps(Exploit(marker)))
    row = one(audit(tmp_path), "step_250")
    assert not marker.exists() and row["problem"] == "unsafe" and row["unsafe_globals"]


# --- DeepSpeed, Hugging Face, per-rank files ----------------------------------------------------


def test_deepspeed_tag_with_every_partition(tmp_path):
    deepspeed_tag(tmp_path / "ckpt" / "global_step100", 100, dp=4, present=range(4))
    row = one(audit(tmp_path), "ckpt/global_step100")
    assert row["format"] == "deepspeed" and row["readable"] and row["exact_resume"] and row["step"] == 100
    assert row["shards_expected"] == row["shards_present"] == 5
    assert "named by deepspeed's latest pointer" in row["notes"]


def test_deepspeed_partitions_missing_like_local_disks(tmp_path):
    """Case 028's layout: dp_world_size 4 in the model states, partitions of only one node present."""
    deepspeed_tag(tmp_path / "out" / "step_5" / "pytorch_model", 5, dp=4, present=range(2))
    row = one(audit(tmp_path), "out/step_5/pytorch_model")
    assert not row["readable"] and row["problem"] == "shards_missing"
    assert row["missing_shards"] == ["bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt",
                                     "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt"]
    assert "dp_world_size in the model states" in row["reason"]


def test_deepspeed_latest_naming_a_missing_tag(tmp_path):
    deepspeed_tag(tmp_path / "global_step100", 100, dp=1, present=[0])
    (tmp_path / "latest").write_text("global_step200")
    frame = audit(tmp_path)
    missing = one(frame, "global_step200")
    assert not missing["readable"] and "names global_step200, which does not exist" in missing["reason"]
    assert one(frame, "global_step100")["newest_resumable"]


def test_deepspeed_tag_newer_than_latest_is_noted(tmp_path):
    deepspeed_tag(tmp_path / "global_step200", 200, dp=1, present=[0])
    deepspeed_tag(tmp_path / "global_step100", 100, dp=1, present=[0])  # writes latest = global_step100
    frame = audit(tmp_path)
    assert "newer than the latest pointer (global_step100)" in one(frame, "global_step200")["notes"]
    assert "named by deepspeed's latest pointer" in one(frame, "global_step100")["notes"]


def test_hf_checkpoint_folder(tmp_path):
    hf_checkpoint(tmp_path / "checkpoint-500", 500)
    row = one(audit(tmp_path), "checkpoint-500")
    assert row["format"] == "hf" and row["readable"] and row["step"] == 500
    assert row["shards_expected"] == row["shards_present"] == 2
    assert set(ALL_STATE) - {"rng_cuda"} <= set(row["components"]) and "rng_cuda" in row["components"]
    assert row["exact_resume"]
    assert row["unknown_globals"] == ["argparse.Namespace"]  # training_args.bin, read but not built


def test_hf_checkpoint_with_a_shard_missing_or_cut(tmp_path):
    hf_checkpoint(tmp_path / "checkpoint-500", 500)
    hf_checkpoint(tmp_path / "checkpoint-600", 600)
    hf_checkpoint(tmp_path / "checkpoint-700", 700)
    (tmp_path / "checkpoint-600" / "model-00002-of-00002.safetensors").unlink()
    cut = tmp_path / "checkpoint-700" / "model-00001-of-00002.safetensors"
    cut.write_bytes(cut.read_bytes()[:-8])
    frame = audit(tmp_path)
    six = one(frame, "checkpoint-600")
    assert six["problem"] == "shards_missing" and six["missing_shards"] == ["model-00002-of-00002.safetensors"]
    seven = one(frame, "checkpoint-700")
    assert seven["problem"] == "corrupt" and "the header describes" in seven["reason"]
    assert frame.filter("newest_resumable").get_column("path").to_list() == ["checkpoint-500"]


def test_per_rank_files_with_a_gap(tmp_path):
    for rank in (0, 1, 3):
        torch.save(training_state(8), tmp_path / f"model_rank{rank}.pt")
    row = one(audit(tmp_path), "model_rank{0..3}.pt")
    assert row["format"] == "rank_shards" and not row["readable"] and row["missing_ranks"] == [2]
    assert row["missing_shards"] == ["model_rank2.pt"]


# --- where checkpoints are looked for ----------------------------------------------------------------


def test_checkpoints_next_to_the_job_only_when_given_explicitly(tmp_path):
    job = tmp_path / "run" / "logs"
    job.mkdir(parents=True)
    (job / "train.log").write_text("step 1 loss 2.0\n")
    beside = tmp_path / "run" / "checkpoints"
    beside.mkdir()
    torch.save(training_state(10), beside / "step_10.pt")
    elsewhere = tmp_path / "store" / "step_20.pt"
    elsewhere.parent.mkdir()
    torch.save(training_state(20), elsewhere)
    assert audit(job).height == 0  # nothing beside the job is read unless --checkpoint names it
    frame = audit(job, [str(beside), str(elsewhere), str(tmp_path / "nope.pt")])
    assert one(frame, f"{beside}/step_10.pt")["readable"]
    assert one(frame, str(elsewhere))["newest_resumable"]
    assert one(frame, str(tmp_path / "nope.pt"))["reason"] == "--checkpoint path does not exist"


def test_the_audit_reads_discoverys_listing_and_walks_nothing(tmp_path, monkeypatch):
    """The job is walked once, by discovery: the audit takes its listing and lists nothing itself, and
    a file the listing does not hold (created after the walk) is not audited."""
    torch.save(training_state(10), tmp_path / "step_10.pt")
    listing = discover_job(tmp_path).listing
    torch.save(training_state(20), tmp_path / "step_20.pt")
    monkeypatch.setattr(checkpoint_audit.os, "scandir", None)  # any walk of its own would fail
    monkeypatch.setattr(checkpoint_audit, "list_path", None)
    assert audit(listing).get_column("path").to_list() == ["step_10.pt"]


def test_a_single_file_job_audits_that_file_and_not_its_directory(tmp_path):
    torch.save(training_state(10), tmp_path / "step_10.pt")
    (tmp_path / "train.log").write_text("step 1 loss 2.0\n")
    assert audit(tmp_path / "train.log").height == 0
    assert audit(tmp_path / "step_10.pt").get_column("path").to_list() == ["step_10.pt"]


def test_flight_recorder_dumps_and_logs_are_not_checkpoints(tmp_path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"version": "2.4", "entries": []}))
    (tmp_path / "train.log").write_text("saving checkpoint\n")
    (tmp_path / "run.tmp").write_text("scratch\n")
    assert audit(tmp_path).height == 0
