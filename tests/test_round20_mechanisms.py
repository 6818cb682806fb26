"""The general changes made for the misses of held-out round 20 (docs/heldout/round20-misses.md): each
tested on made-up lines between ordinary ones, with a counterpart that keeps the old reading, never on a
case's text."""

from pathlib import Path

from analyzer.api import analyze

ORDINARY_BEFORE = ["starting the training loop", "step 10 loss 0.51"]
ORDINARY_AFTER = ["step 11 loss 0.50"]


def job(tmp_path: Path, lines: list[str], name: str = "train.log") -> dict:
    (tmp_path / name).write_text("\n".join([*ORDINARY_BEFORE, *lines, *ORDINARY_AFTER]) + "\n")
    return analyze(str(tmp_path)).report


OPENIB_WARNING = [
    "--------------------------------------------------------------------------",
    "WARNING: There was an error initializing an OpenFabrics device.",
    "",
    "  Local host:   gpu-node-3",
    "  Local device: mlx5_1",
    "--------------------------------------------------------------------------",
    "[gpu-node-1:20211] 63 more processes have sent help message help-mpi-btl-openib.txt / error in device init",
    '[gpu-node-1:20211] Set MCA parameter "orte_base_help_aggregate" to 0 to see all help / error messages',
]


def test_open_mpis_openib_device_warning_alone_is_no_failure(tmp_path):
    report = job(tmp_path, OPENIB_WARNING)
    assert report["verdict"]["category"] == "none" and not report["findings"]


def test_a_failure_beside_the_openib_warning_is_still_reported(tmp_path):
    verdict = job(tmp_path, [*OPENIB_WARNING, "RuntimeError: CUDA error: an illegal memory access was encountered"])["verdict"]
    assert verdict["category"] != "none"
    assert "illegal memory access" in verdict["evidence"][0]["text"]


def test_another_openib_help_message_is_not_benign(tmp_path):
    report = job(tmp_path, [
        "The OpenFabrics (openib) BTL failed to initialize while trying to",
        "allocate some locked memory.  This typically can indicate that the",
        "[gpu-node-1:20211] 7 more processes have sent help message help-mpi-btl-openib.txt / init-fail-no-mem",
    ])
    assert report["verdict"]["category"] != "none"


NET_ID_WARN = "node-7:31337:31400 [3] graph/topo.h:230 NCCL WARN Could not find NET with id 0"
INTERNAL_ERROR = ("torch.distributed.DistBackendError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/"
                  "ProcessGroupNCCL.cpp:3376, internal error - please report this issue to the NCCL developers, "
                  "NCCL version 2.26.2")


def test_a_net_id_absent_from_ncclS_topology_is_nccls_bug_over_the_init_failure(tmp_path):
    verdict = job(tmp_path, [
        "node-7:31337:31400 [3] graph/search.cc:1135 NCCL WARN Could not find a path for pattern 1, falling back to simple order",
        NET_ID_WARN, INTERNAL_ERROR,
    ])["verdict"]
    assert verdict["rule_id"] == "nccl-topology-net-id-not-found"
    assert verdict["category"] == "other"


def test_an_internal_error_without_the_net_id_warn_stays_an_init_failure(tmp_path):
    verdict = job(tmp_path, [INTERNAL_ERROR])["verdict"]
    assert verdict["category"] == "nccl_init_failure"


PEER_ACCESS_WARNINGS = [
    "[TensorRT-LLM][WARNING] Device 0 peer access Device 2 is not available.",
    "[TensorRT-LLM][WARNING] Device 0 peer access Device 3 is not available.",
    "[TensorRT-LLM][INFO] Loaded engine size: 1200 MiB",
]
CUT_TRACEBACK = ["Traceback (most recent call last):", '  File "/srv/app/run.py", line 88, in <module>', "    main(args)"]


def test_gpus_without_peer_access_alone_are_no_failure(tmp_path):
    report = job(tmp_path, PEER_ACCESS_WARNINGS)
    assert report["verdict"]["category"] == "none" and not report["findings"]


def test_a_crash_whose_exception_is_lost_on_gpus_without_peer_access_is_p2p(tmp_path):
    verdict = job(tmp_path, [*PEER_ACCESS_WARNINGS, *CUT_TRACEBACK])["verdict"]
    assert verdict["rule_id"] == "gpu-peer-access-unavailable-then-crash"
    assert verdict["category"] == "p2p_nvlink_or_pcie_error"


def test_a_crash_that_names_its_exception_keeps_it_beside_the_peer_access_warning(tmp_path):
    verdict = job(tmp_path, [*PEER_ACCESS_WARNINGS, *CUT_TRACEBACK, "ValueError: max_batch_size 512 exceeds the engine's 256"])["verdict"]
    assert verdict["category"] == "other"
    assert verdict["rule_id"] != "gpu-peer-access-unavailable-then-crash"


def listing(sizes: list[str]) -> list[str]:
    return ["-rw-r--r-- 1 root root  609 Aug  1 14:27 config.json",
            *[f"-rw-r--r-- 1 root root {size} Aug  1 19:0{i} model-0000{i}-of-0000{len(sizes)}.safetensors"
              for i, size in enumerate(sizes, start=1)],
            "-rw-r--r-- 1 root root  23K Aug  1 14:27 model.safetensors.index.json"]


def test_a_listed_shard_of_lfs_pointer_size_is_an_incomplete_checkpoint(tmp_path):
    verdict = job(tmp_path, listing(["9.2G", "133", "9.3G"]), name="ls_model_dir.txt")["verdict"]
    assert verdict["rule_id"] == "checkpoint-shard-listed-at-pointer-size"
    assert verdict["category"] == "checkpoint_corruption"
    assert "model-00002-of-00003.safetensors" in verdict["evidence"][0]["text"]


def test_a_listing_of_full_shards_is_no_checkpoint_finding(tmp_path):
    report = job(tmp_path, listing(["9.2G", "9.2G", "4943274328"]), name="ls_model_dir.txt")
    assert report["verdict"]["category"] != "checkpoint_corruption"
    assert not [f for f in report["findings"] if f["rule_id"] == "checkpoint-shard-listed-at-pointer-size"]
