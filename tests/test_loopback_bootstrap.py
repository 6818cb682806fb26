"""A job whose every NCCL bootstrap listens on a loopback address, with nothing failing to connect, is one
host's (analyses/ifname.py, shown_single_host): its `lo` in NCCL's interface list is no cause there, while
the same list beside a failed connect still is. The aws-ofi-nccl plugin giving up on an instance without EFA
is benign (vocabularies/benign.csv), and a job across hosts that fell back to sockets is still read."""

from pathlib import Path

from analyzer.api import analyze

INIT = [
    "c0ffee:123:890 [0] ofi_init:1355 NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
    "c0ffee:123:890 [0] NCCL INFO NET/IB : No device found.",
    "c0ffee:123:890 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0> [1]eth0:172.17.0.2<0>",
    "c0ffee:123:890 [0] NCCL INFO Using network Socket",
    "c0ffee:125:125 [2] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>",
    "c0ffee:126:126 [3] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>",
    "c0ffee:125:125 [2] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v6 symbol.",
]


def verdict(tmp_path: Path, lines: list[str]) -> dict:
    (tmp_path / "train.log").write_text("\n".join(["loading the model", *lines, "step 1 loss 2.31"]) + "\n")
    return analyze(str(tmp_path)).report["verdict"]


def test_a_loopback_bootstrap_with_nothing_failing_is_one_hosts_job(tmp_path):
    assert verdict(tmp_path, INIT)["category"] == "none"


def test_the_same_interfaces_beside_a_failed_connect_are_the_cause(tmp_path):
    failed = ["c0ffee:125:131 [2] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 127.0.0.1<40123> failed : Connection refused",
              "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"]
    assert verdict(tmp_path, [*INIT, *failed])["category"] == "wrong_network_interface"


def test_a_bootstrap_on_a_routable_address_proves_nothing(tmp_path):
    lines = [line.replace("Bootstrap : Using lo:127.0.0.1<0>", "Bootstrap : Using eth0:172.17.0.2<0>") for line in INIT]
    assert verdict(tmp_path, lines)["category"] == "wrong_network_interface"


def test_a_plugin_that_gave_up_on_a_job_across_hosts_is_still_read(tmp_path):
    lines = ["node-a:11:11 [0] ofi_init:1355 NCCL WARN NET/OFI aws-ofi-nccl initialization failed",
             "node-a:11:11 [0] NCCL INFO Bootstrap : Using ens5:10.0.0.11<0>",
             "node-a:11:11 [0] NCCL INFO NET/IB : No device found.",
             "node-a:11:11 [0] NCCL INFO NET/Socket : Using [0]ens5:10.0.0.11<0>",
             "node-a:11:11 [0] NCCL INFO Using network Socket",
             "node-b:12:12 [1] NCCL INFO Bootstrap : Using ens5:10.0.0.12<0>",
             "node-b:12:12 [1] NCCL INFO Using network Socket",
             "node-a:11:20 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 busId 1e0 - Init COMPLETE",
             "node-a:11:20 [0] NCCL INFO Channel 00/0 : 1[1e0] -> 0[1e0] [receive] via NET/Socket/0"]
    assert verdict(tmp_path, lines)["category"] == "degraded_transport"
