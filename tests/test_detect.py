"""Detect: fallback signatures speak only when nothing else did, so no job is 'clean' by omission."""

from __future__ import annotations

from analyzer.api import analyze


def _job(tmp_path, text):
    (tmp_path / "console.log").write_text(text)
    return analyze(tmp_path).report


def test_an_error_no_signature_knows_is_reported_not_hidden(tmp_path):
    report = _job(tmp_path, "step 10 loss 2.1\n[2026-11-30 14:58:48] ERROR shard server 3 lost its lease\nstep 11 loss 2.0\n")
    assert report["verdict"]["category"] == "other"
    assert [f["rule_id"] for f in report["findings"]] == ["unexplained-errors"]
    assert "shard server 3 lost its lease" in report["findings"][0]["summary"]
    assert report["verdict"]["culprit_ranks"] == [] and report["verdict"]["confidence"] <= 0.2


def test_an_unknown_nccl_warning_is_reported(tmp_path):
    report = _job(tmp_path, "gpu-3:1200:1300 [2] transport/foo.cc:77 NCCL WARN something nobody catalogued happened\n")
    assert [f["rule_id"] for f in report["findings"]] == ["unexplained-nccl-warnings"]


def test_fallbacks_are_silent_when_a_signature_explains_the_job(tmp_path):
    report = _job(tmp_path, "[2026-11-30 14:58:48] ERROR shard server 3 lost its lease\n"
                            "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                            "GPU 0 has a total capacity of 79.15 GiB of which 1.20 GiB is free.\n")
    rule_ids = [f["rule_id"] for f in report["findings"]]
    assert "cuda-oom" in rule_ids
    assert not {"unexplained-errors", "unexplained-nccl-warnings"} & set(rule_ids)


def test_a_clean_log_has_no_finding(tmp_path):
    assert _job(tmp_path, "step 10 loss 2.1\nstep 11 loss 2.0\n")["findings"] == []


def test_an_nvls_setup_failure_is_the_fabric_unless_it_is_out_of_memory(tmp_path):
    # The same NVLS error chain: a CUDA 'invalid argument' is the NVSwitch fabric (fabric manager),
    # a CUDA 'out of memory' is memory, whichever transport happened to allocate.
    chain = "node1:100:200 [0] NCCL INFO transport/nvls.cc:394 -> 1\nnode1:100:200 [0] NCCL INFO init.cc:1196 -> 1\n"
    (tmp_path / "fabric").mkdir()
    (tmp_path / "memory").mkdir()
    fabric = _job(tmp_path / "fabric", "node1:100:200 [0] transport/nvls.cc:244 NCCL WARN Cuda failure 1 'invalid argument'\n" + chain)
    memory = _job(tmp_path / "memory", "node1:100:200 [0] transport/nvls.cc:244 NCCL WARN Cuda failure 2 'out of memory'\n" + chain)
    assert (fabric["verdict"]["category"], fabric["verdict"]["rule_id"]) == ("p2p_nvlink_or_pcie_error", "nccl-nvls-setup-failure")
    assert memory["verdict"]["category"] == "cuda_oom_on_some_ranks"


def test_a_line_naming_the_host_it_could_not_reach_names_the_culprit_host(tmp_path):
    """A hosts-attributed signature whose lines carry no writer takes the host the line itself names."""
    (tmp_path / "launch.log").write_text(
        "[2025-03-01 10:00:00,000] [INFO] [runner.py:463:main] Using IP address of 10.0.0.4 for node worker-0\n"
        "RuntimeError: Using hostfile at /etc/hostfile but host=worker-1.train-svc was not reachable via ssh. If you are "
        "running with a single node please remove /etc/hostfile or setup passwordless ssh.\n"
        "Traceback ends here\n"
    )
    verdict = analyze(tmp_path).report["verdict"]
    assert verdict["category"] == "network_unreachable_or_firewall"
    assert verdict["culprit_hosts"] == ["worker-1.train-svc"]


def test_a_host_word_without_a_name_names_no_host(tmp_path):
    (tmp_path / "launch.log").write_text(
        "RuntimeError: Using hostfile at /etc/hostfile but the host was not reachable via ssh.\nnext line\n"
    )
    assert analyze(tmp_path).report["verdict"]["culprit_hosts"] == []


def test_a_record_header_word_is_no_host_label(tmp_path):
    """apt's history.log `Start-Date:` / `End-Date:` carry a hyphen like `worker-1: ` labels, but name no host."""
    (tmp_path / "apt-history.log").write_text(
        "Start-Date: 2021-04-24  06:50:30\nCommandline: /usr/bin/unattended-upgrade\n"
        "Upgrade: libnvidia-compute-460:amd64 (460.56-0ubuntu1, 460.73.01-0ubuntu1)\nEnd-Date: 2021-04-24  06:50:54\n"
    )
    (tmp_path / "nvidia-smi.txt").write_text("Failed to initialize NVML: Driver/library version mismatch\n")
    report = analyze(tmp_path).report
    assert report["verdict"]["category"] == "nccl_version_mismatch"
    assert "End-Date" not in report["verdict"]["culprit_hosts"] and "Start-Date" not in report["verdict"]["culprit_hosts"]


def test_a_shell_prompt_names_the_host_of_the_output_after_it(tmp_path):
    """`user@host:~$ nvidia-smi` then nvidia-smi's failure: that host is the culprit; lines before the prompt name none."""
    (tmp_path / "session.txt").write_text(
        "Failed to initialize NVML: Driver/library version mismatch\n"
        "ops@gpu-node-7:~$ nvidia-smi\n"
        "Failed to initialize NVML: Driver/library version mismatch\n"
    )
    report = analyze(tmp_path).report
    assert report["verdict"]["category"] == "nccl_version_mismatch"
    assert report["verdict"]["culprit_hosts"] == ["gpu-node-7"]


def test_an_address_in_a_message_is_no_prompt(tmp_path):
    (tmp_path / "log.txt").write_text("notify ops@gpu-node-7.example.com: Failed to initialize NVML: Driver/library version mismatch\n")
    assert analyze(tmp_path).report["verdict"]["culprit_hosts"] == []


def test_a_launcher_labelling_every_line_is_trusted(tmp_path):
    (tmp_path / "pdsh.log").write_text(
        "worker-1: step 10 loss 0.5\nworker-2: step 10 loss 0.5\n"
        "worker-2: RuntimeError: CUDA error: an illegal memory access was encountered\nworker-1: step 11 loss 0.4\n"
    )
    assert analyze(tmp_path).report["verdict"]["culprit_hosts"] == ["worker-2"]


def test_a_slow_transport_explains_no_error_line(tmp_path):
    """A warning-level finding (inter-node traffic over sockets) is no explanation of an NCCL WARN: the
    fallback still names the error, and being an error it is the verdict."""
    lines = [f"[1,{r}]<stdout>:{host}:{100 + r}:{200 + r} [0] NCCL INFO {msg}"
             for r, host in enumerate(("gpu-a", "gpu-b", "gpu-c"))
             for msg in ("NET/Plugin : No plugin found (libnccl-net.so), using internal implementation", "Using network Socket")]
    lines.append("[1,1]<stdout>:gpu-b:101:201 [0] misc/argcheck.cc:39 NCCL WARN AllGather : invalid root 0 (root should be in the 0..-1 range)")
    report = _job(tmp_path, "\n".join(lines) + "\n")
    rule_ids = [f["rule_id"] for f in report["findings"]]
    assert "transport-multinode-socket" in rule_ids and report["verdict"]["rule_id"] != "transport-multinode-socket"
    assert report["verdict"]["culprit_hosts"] == ["gpu-b"]


def test_a_line_the_benign_vocabulary_knows_is_no_uncaught_exception(tmp_path):
    # CPython's resource_tracker at exit (gh-82300): a traceback by shape, known harmless by its text.
    tb = ('Traceback (most recent call last):\n  File "/usr/lib/python3.10/multiprocessing/resource_tracker.py", line 209, in main\n'
          "    cache[rtype].remove(name)\nKeyError: '/psm_10b3d52e'\n")
    assert _job(tmp_path, "step 10 loss 2.1\n" + tb + "done\n")["findings"] == []
