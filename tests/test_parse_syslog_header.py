"""Parse, line layer: the syslog / journald short header is a wrapper that names the host (round 10, case 341)."""

import pytest

from analyzer.api import analyze
from analyzer.parse.lines import lines_frame_many, peel_prefixes


def peeled(lines):
    return peel_prefixes(lines_frame_many([("\n".join(lines) + "\n", "syslog", 1)]))


@pytest.mark.parametrize(
    "line, host, body",
    [
        ("Mar 14 03:12:09 gpu-node-17 kernel: [88112.104233] NVRM: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus.",
         "gpu-node-17", "[88112.104233] NVRM: Xid (PCI:0000:b3:00): 79, GPU has fallen off the bus."),
        ("Nov 02 22:41:55 dgx-a07 nvidia-fabricmanager[2231]: fabric manager NVLink initialization failed",
         "dgx-a07", "fabric manager NVLink initialization failed"),
        ("2026-03-14T03:12:09.104233+00:00 trn-4.cluster kernel: mlx5_core 0000:c1:00.0: mlx5_cmd_out_err:838: FW error",
         "trn-4.cluster", "mlx5_core 0000:c1:00.0: mlx5_cmd_out_err:838: FW error"),
    ],
)
def test_the_header_gives_the_host_and_leaves_the_message(line, host, body):
    frame = peeled(["some earlier line", line, "a later line"])
    assert frame.get_column("pfx_host").to_list() == [None, host, None]
    assert frame.get_column("body").to_list()[1] == body


@pytest.mark.parametrize(
    "line",
    [
        "Epoch 3: loss 1.2412, lr 2e-05",
        "Validation sanity check: 0it [00:00, ?it/s]",
        "kernel: NVRM: Xid (PCI:0000:b9:00): 74, pid=<unknown>, NVLink: fatal error detected on link 6",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ],
)
def test_lines_without_a_syslog_header_name_no_host(line):
    frame = peeled(["before", line, "after"])
    assert frame.get_column("pfx_host").to_list() == [None, None, None]
    assert frame.get_column("body").to_list()[1] == line


def test_an_xid_in_a_host_s_syslog_names_that_host(tmp_path):
    (tmp_path / "messages").write_text(
        "Jan  9 11:02:41 node-b12 systemd[1]: Started Session 412 of user train.\n"
        "Jan  9 11:05:13 node-b12 kernel: [351204.778120] NVRM: Xid (PCI:0000:41:00): 48, pid='<unknown>', name=<unknown>, "
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x1f3c0000\n"
        "Jan  9 11:05:14 node-b12 systemd[1]: Stopping User Manager for UID 1000...\n"
    )
    verdict = analyze(str(tmp_path)).report["verdict"]
    assert verdict["category"] == "gpu_hardware_xid"
    assert verdict["culprit_hosts"] == ["node-b12"]
