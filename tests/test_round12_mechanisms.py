"""The general changes made for the misses of held-out round 12 (docs/heldout/round12-misses.md): each
tested on made-up lines between ordinary ones, never on a case's text."""

from pathlib import Path

from analyzer.api import analyze


def job(tmp_path: Path, lines: list[str], name: str = "rank0.log") -> dict:
    (tmp_path / name).write_text("starting\n" + "\n".join(lines) + "\nstep 10 loss 0.5\n")
    return analyze(str(tmp_path)).report


def test_a_horovod_gloo_stream_tag_names_the_rank(tmp_path):
    # horovodrun's Gloo driver tags each line `[rank]<stdout>:` (Open MPI's --tag-output writes `[job,rank]`)
    report = job(tmp_path, ["[0]<stdout>:epoch 1", "[3]<stderr>:Traceback (most recent call last):",
                            '[3]<stderr>:  File "train.py", line 7, in <module>', "[3]<stderr>:ValueError: bad shard index 12",
                            "[1]<stdout>:epoch 2"])
    assert report["verdict"]["culprit_ranks"] == [3]
    assert report["verdict"]["evidence"][0]["text"].endswith("ValueError: bad shard index 12")


def test_a_conda_prompt_names_the_host_of_the_lines_after_it(tmp_path):
    report = job(tmp_path, ["(torch-env) alice@gpu-node-12:~/run$ python train.py",
                            "RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert report["verdict"]["culprit_hosts"] == ["gpu-node-12"]


def test_an_interface_lookup_inside_an_exception_is_its_cause(tmp_path):
    report = job(tmp_path, ["RuntimeError: [enforce fail at ../gloo/transport/tcp/device.cc:84]",
                            "  ifa != nullptr. Unable to find address for: ib0", "worker exiting"])
    assert report["verdict"]["category"] == "wrong_network_interface"
    generic = next(f for f in report["findings"] if f["rule_id"] == "python-uncaught-exception")
    assert generic["caused_by"] == ["vocabulary-wrong-network-interface"]


def test_a_gloo_peer_at_a_loopback_address_is_the_interface_choice(tmp_path):
    report = job(tmp_path, ["RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144]",
                            "  timed out connecting: SO_ERROR: Connection refused, remote=[127.0.1.1]:40111", "shutting down"])
    assert report["verdict"]["category"] == "wrong_network_interface"


def test_a_gloo_peer_at_a_routable_address_is_no_interface_finding(tmp_path):
    report = job(tmp_path, ["RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144]",
                            "  timed out connecting: SO_ERROR: Connection refused, remote=[10.0.3.7]:40111", "shutting down"])
    assert report["verdict"]["category"] != "wrong_network_interface"


IDLE_OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 6.00 GiB (GPU 0; 39.59 GiB total capacity; "
            "2.10 GiB already allocated; 5.20 GiB free; 30.75 GiB reserved in total by PyTorch)")
IDLE_NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
            "of which 6.01 GiB is free. Including non-PyTorch memory, this process has 73.10 GiB memory in use. Of the allocated "
            "memory 20.40 GiB is allocated by PyTorch, and 52.10 GiB is reserved by PyTorch but unallocated.")
BUSY_NEW = IDLE_NEW.replace("20.40 GiB is allocated", "62.40 GiB is allocated").replace("52.10 GiB is reserved", "10.10 GiB is reserved")


def test_an_oom_with_more_idle_cache_than_live_tensors_is_fragmentation(tmp_path):
    for name, line in (("old", IDLE_OLD), ("new", IDLE_NEW)):
        (tmp_path / name).mkdir()
        report = job(tmp_path / name, [line, "worker exiting"])
        assert report["verdict"]["category"] == "fragmented_memory", name
        oom = next(f for f in report["findings"] if f["rule_id"] == "cuda-oom")
        assert oom["caused_by"] == ["memory-oom-idle-cache-fragmented"]


def test_an_oom_on_a_card_full_of_live_tensors_stays_the_oom(tmp_path):
    # a few GiB of holes beside 62 GiB of live tensors: the model's need is the failure (cases 022, 148)
    report = job(tmp_path, [BUSY_NEW, "worker exiting"])
    assert report["verdict"]["category"] == "cuda_oom_on_some_ranks"
    assert any(f["rule_id"] == "memory-oom-reserved-unallocated" for f in report["findings"])


def test_a_healthy_mxnet_speedometer_log_is_read_and_clean(tmp_path):
    (tmp_path / "train.log").write_text("".join(
        f"INFO:root:Epoch[{e}] Batch [{b}]\tSpeed: 20{b}.5 samples/sec\taccuracy=0.{e}{b}\n" for e in range(3) for b in (20, 40, 60)
    ) + "INFO:root:Epoch[2] Validation-accuracy=0.43\n")
    assert analyze(str(tmp_path)).report["verdict"]["category"] == "none"


STORE_WAIT = ("[rank{r}]:[W516 14:34:56.854597329 socket.cpp:489] [c10d] waitForInput: socket SocketImpl(fd=79, "
              "addr=[localhost]:41170, remote=[localhost]:29500) timed out after 1800000ms")


def test_the_rank_that_wrote_no_store_wait_timeout_is_the_absent_one(tmp_path):
    # ranks 1-3 timed out waiting in a store barrier; rank 0 (still preprocessing) wrote nothing
    report = job(tmp_path, ["Tokenizing:  92%|█████████▏| 3289/3591 [29:58<12:05, 41.59 examples/s]",
                            *(STORE_WAIT.format(r=r) for r in (1, 2, 3)), "[rank3]: Traceback (most recent call last):"])
    verdict = report["verdict"]
    assert (verdict["category"], verdict["culprit_ranks"]) == ("rank_absent_from_collective", [0])


def test_a_rank_named_by_the_waiting_rank_is_the_absent_one(tmp_path):
    report = job(tmp_path, ["[rank0]: RuntimeError: Rank 2 timed out in monitoredBarrier after 30000 ms.", "[rank0]: exiting"])
    assert report["verdict"]["culprit_ranks"] == [2]
