"""Golden tests of the node-state reader: nvidia-smi -q, its ECC CSV query, ibstat/ibstatus, nvlink -s."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyzer.parse.lines import lines_frame_many
from analyzer.parse.nodestate import node_state_events

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "node-state"
SMI_Q = (FIXTURES / "healthy-nvidia-smi-q.txt").read_text()
NVLINK = (FIXTURES / "healthy-nvlink-s.txt").read_text()
SECOND_GPU = "GPU 00000000:00:07.0"


def events_of(*texts: str) -> pl.DataFrame:
    frame = lines_frame_many([(text, f"f{i}.txt", 1) for i, text in enumerate(texts)])
    return node_state_events(frame)


def rows(events: pl.DataFrame) -> list[tuple]:
    return events.select("file", "line", "kind", "message", "detail").rows()


def replace_in_gpu(text: str, gpu: str, old: str, new: str) -> str:
    """Change one key's value inside one GPU's block of the real capture."""
    start = text.index(gpu)
    at = text.index(old, start)
    return text[:at] + new + text[at + len(old):]


def _line_of(text: str, needle: str, after: str = "") -> int:
    start = text.index(after) if after else 0
    return text[: text.index(needle, start)].count("\n") + 1


def test_healthy_captures_give_no_event():
    assert events_of(SMI_Q, NVLINK).height == 0


def test_uncorrectable_dram_counter_names_the_gpu_and_window():
    text = replace_in_gpu(SMI_Q, SECOND_GPU, "DRAM Uncorrectable                         : 0", "DRAM Uncorrectable                         : 5")
    line = _line_of(text, "DRAM Uncorrectable                         : 5")
    assert rows(events_of(text)) == [
        ("f0.txt", line, "node.gpu_ecc", "GPU 00000000:00:07.0: uncorrectable ECC errors, DRAM Uncorrectable (volatile): 5", "00000000:00:07.0"),
    ]


def test_a_block_in_a_later_file_of_the_batch():
    """Files are batched: block boundaries are per file, whatever its position in the batch."""
    text = replace_in_gpu(SMI_Q, SECOND_GPU, "DRAM Uncorrectable                         : 0", "DRAM Uncorrectable                         : 5")
    found = events_of("step 1 loss 2.0\n" * 50, NVLINK, text)
    assert found.select("file", "kind").rows() == [("f2.txt", "node.gpu_ecc")]


def test_correctable_counters_and_ecc_mode_pending_are_not_faults():
    text = SMI_Q.replace("DRAM Correctable                           : 0", "DRAM Correctable                           : 812")
    assert "Pending                                        : Enabled" in text
    assert events_of(text).height == 0


@pytest.mark.parametrize("key, value, expected", [
    ("Remapping Failure Occurred                     : No", "Remapping Failure Occurred                     : Yes", "Remapping Failure Occurred: Yes (the GPU has no spare rows left"),
    ("        Pending                                        : No", "        Pending                                        : Yes", "a row remap is pending"),
    ("        Uncorrectable Error                            : 0", "        Uncorrectable Error                            : 2", "rows remapped after uncorrectable ECC errors: 2"),
])
def test_remapped_rows(key, value, expected):
    text = replace_in_gpu(SMI_Q, SECOND_GPU, key, value)
    found = events_of(text)
    assert found.get_column("kind").to_list() == ["node.row_remap"]
    assert found.get_column("detail").to_list() == ["00000000:00:07.0"]
    assert expected in found.get_column("message").item()


def test_older_drivers_double_bit_sections_and_retired_pages():
    old = "\n".join([
        "==============NVSMI LOG==============",
        "GPU 00000000:3B:00.0",
        "    Ecc Mode",
        "        Current                     : Enabled",
        "        Pending                     : Enabled",
        "    ECC Errors",
        "        Volatile",
        "            Single Bit            ",
        "                Device Memory       : 5",
        "                Total               : 5",
        "            Double Bit            ",
        "                Device Memory       : 2",
        "                Total               : 2",
        "        Aggregate",
        "            Double Bit            ",
        "                Total               : 0",
        "    Retired Pages",
        "        Single Bit ECC              : 1",
        "        Double Bit ECC              : 2",
        "        Pending                     : Yes",
    ])
    assert [m for _, _, _, m, _ in rows(events_of(old))] == [
        "GPU 00000000:3B:00.0: uncorrectable ECC errors, Double Bit Total (volatile): 2",
        "GPU 00000000:3B:00.0: retired pages for double-bit ECC errors: 2",
        "GPU 00000000:3B:00.0: retired pages: Pending: Yes (a GPU reset is needed)",
    ]


def test_csv_query_rows():
    csv = SMI_Q[SMI_Q.index("index, name"):]
    assert events_of(csv).height == 0
    bad = csv.rstrip("\n")[:-1] + "3\n"
    found = events_of(bad)
    assert found.select("kind", "detail").rows() == [("node.gpu_ecc", "1")]
    assert found.get_column("message").item() == "GPU 1: uncorrectable ECC errors, ecc.errors.uncorrected.volatile.total = 3"


IBSTAT = (
    "CA 'mlx5_0'\n\tCA type: MT4123\n\tNumber of ports: 1\n\tFirmware version: 20.31.1014\n\tHardware version: 0\n"
    "\tNode GUID: 0x0c42a10300a1b2c3\n\tSystem image GUID: 0x0c42a10300a1b2c3\n\tPort 1:\n\t\tState: Active\n"
    "\t\tPhysical state: LinkUp\n\t\tRate: 200\n\t\tBase lid: 12\n\t\tLMC: 0\n\t\tSM lid: 1\n"
    "\t\tCapability mask: 0x2651e848\n\t\tPort GUID: 0x0c42a10300a1b2c3\n\t\tLink layer: InfiniBand\n"
    "CA 'mlx4_0'\n\tCA type: MT4099\n\tNumber of ports: 2\n\tPort 1:\n\t\tState: Down\n\t\tPhysical state: Polling\n"
    "\t\tRate: 10\n\t\tBase lid: 0\n\t\tLink layer: InfiniBand\n\tPort 2:\n\t\tState: Down\n"
    "\t\tPhysical state: Disabled\n\t\tRate: 40\n\t\tBase lid: 0\n\t\tLink layer: InfiniBand\n"
)


def test_ibstat_one_event_per_port():
    found = events_of(IBSTAT)
    assert found.select("line", "kind", "severity", "detail").rows() == [
        (9, "node.ib_port", "info", "mlx5_0:1"),
        (22, "node.ib_port", "warning", "mlx4_0:1"),
        (28, "node.ib_port", "warning", "mlx4_0:2"),
    ]
    assert found.get_column("message").to_list() == [
        "mlx5_0 port 1: state Active, physical state LinkUp, rate 200, InfiniBand",
        "mlx4_0 port 1: state Down, physical state Polling, rate 10, InfiniBand",
        "mlx4_0 port 2: state Down, physical state Disabled, rate 40, InfiniBand",
    ]


def test_ibstat_pasted_with_spaces_instead_of_tabs():
    found = events_of(IBSTAT.replace("\t", "        "))
    assert found.get_column("detail").to_list() == ["mlx5_0:1", "mlx4_0:1", "mlx4_0:2"]


def test_ibstatus_form():
    text = (
        "Infiniband device 'mlx5_0' port 1 status:\n\tdefault gid:\t fe80:0000:0000:0000:0c42:a103:00a1:b2c3\n"
        "\tbase lid:\t 0xc\n\tsm lid:\t\t 0x1\n\tstate:\t\t 4: ACTIVE\n\tphys state:\t 5: LinkUp\n"
        "\trate:\t\t 100 Gb/sec (4X EDR)\n\tlink_layer:\t InfiniBand\n"
    )
    assert events_of(text).get_column("message").to_list() == [
        "mlx5_0 port 1: state ACTIVE, physical state LinkUp, rate 100, InfiniBand",
    ]


def test_nvlink_inactive_link():
    text = NVLINK.replace("Link 5: 26.562 GB/s", "Link 5: <inactive>", 1)
    found = events_of(text)
    assert rows(found) == [("f0.txt", 7, "node.nvlink", "GPU 0: NVLink inactive: link(s) 5 down while the other links are up", "GPU 0")]


def test_a_gpu_without_nvlink_is_not_a_fault():
    assert events_of("GPU 0: NVIDIA RTX A6000 (UUID: GPU-1)\n\t Link 0: <inactive>\n\t Link 1: <inactive>\n").height == 0


def test_a_console_log_printing_nvidia_smi_L_is_not_read_as_a_block():
    console = "GPU 0: NVIDIA H200 (UUID: GPU-1)\n" + "step 1 loss 2.0\n" * 5000 + "Link 3: <inactive>\n"
    assert events_of(console).height == 0


READOUTS = Path(__file__).resolve().parent.parent / "fixtures" / "nccl-tests" / "readouts"


@pytest.mark.parametrize("name, message", [
    ("ethtool-eth15-100mbps.txt", "eth15: speed 100Mb/s, duplex Full, link detected yes"),
    ("ethtool-enp5s0-10g.txt", "enp5s0: speed 10000Mb/s, duplex Full, link detected yes"),
])
def test_ethtool_one_event_per_interface(name, message):
    found = events_of("step 1 loss 2.0\n", (READOUTS / name).read_text())
    assert found.select("file", "line", "kind", "message").rows() == [("f1.txt", 11, "node.eth_speed", message)]  # the Speed line


def test_ibv_devinfo_ports_read_like_ibstat():
    found = events_of((READOUTS / "ibv_devinfo-port-down.txt").read_text())
    assert rows(found) == [("f0.txt", 12, "node.ib_port", "mlx5_12 port 1: state Down, physical state ?, rate ?, Ethernet", "mlx5_12:1")]
    assert found.get_column("severity").to_list() == ["warning"]


def test_ibv_devinfo_verbose_rate_is_width_times_lane_speed():
    text = (READOUTS / "ibv_devinfo-port-down.txt").read_text().replace("PORT_DOWN (1)", "PORT_ACTIVE (4)").replace(
        "                        link_layer:             Ethernet",
        "                        phys_state:             LINK_UP (5)\n                        active_width:           4X (2)\n"
        "                        active_speed:           25.0 Gbps (32)\n                        link_layer:             Ethernet")
    found = events_of(text)
    assert found.get_column("message").to_list() == ["mlx5_12 port 1: state Active, physical state LinkUp, rate 100, Ethernet"]
    assert found.get_column("severity").to_list() == ["info"]


def test_topo_nearest_nic_per_gpu_and_cross_numa_warning():
    found = events_of("epoch 1\n", (READOUTS / "topo-a100-nics-across-numa.txt").read_text())
    assert found.select("line", "detail", "severity").rows() == [
        (2, "GPU0", "warning"), (3, "GPU1", "info"), (4, "GPU2", "info"), (5, "GPU3", "warning"),
    ]
    assert found.get_column("message")[0] == "GPU0: nearest NIC mlx5_0 via SYS (every NIC across NUMA nodes); paths: mlx5_0 SYS, mlx5_1 SYS"
    assert found.get_column("message")[1].startswith("GPU1: nearest NIC mlx5_0 via PIX")


def test_topo_with_nic_legend_and_ansi_header():
    text = ("\t\x1b[4mGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \tNV18\tPIX\tSYS\t0-55\t0\t\tN/A\nGPU1\tNV18\t X \tSYS\tPIX\t0-55\t0\t\tN/A\n"
            "NIC0\tPIX\tSYS\t X \tSYS\nNIC1\tSYS\tPIX\tSYS\t X \n\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n")
    found = events_of(text)
    assert found.get_column("message").to_list() == [
        "GPU0: nearest NIC NIC0(mlx5_0) via PIX; paths: NIC0(mlx5_0) PIX, NIC1(mlx5_1) SYS",
        "GPU1: nearest NIC NIC1(mlx5_1) via PIX; paths: NIC1(mlx5_1) PIX, NIC0(mlx5_0) SYS",
    ]


def test_topo_without_nic_columns_gives_info_events_only():
    # the file is read (one event per GPU row, its paths to the other GPUs), and nothing in it is a warning
    shared = Path(__file__).resolve().parent.parent.parent / "shared" / "formats-samples" / "system" / "nvidia-smi_topo_nvlink_dmesg.txt"
    text = shared.read_text() if shared.exists() else "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tNV18\t0-31\t0\nGPU1\tNV18\t X \t0-31\t0\n"
    topology = events_of(text).filter(pl.col("kind") == "node.topology")
    assert topology.height >= 2 and set(topology.get_column("severity")) == {"info"}
    assert all("no NIC in the matrix" in m for m in topology.get_column("message"))


PS_AUX = """USER         PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND
alice      31007  117  4.6 17517200480 24494736 ? Dl  00:36 291:14 python train.py --cfg a.yaml
alice      31008 87.9  4.4 17508566232 23526964 ? Rl  00:36 217:52 python train.py --cfg a.yaml
alice      31009  0.0  0.0   1234   567 pts/0    Ss   00:30   0:00 -bash"""
PS_L = """F S   UID     PID    PPID  C PRI  NI ADDR SZ WCHAN  TTY          TIME CMD
0 D  1000    4242    4200 99  80   0 - 12345 io_sch ?        00:10:00 python
0 S  1000    4243    4200  0  80   0 - 12345 futex_ ?        00:00:01 python"""
TOP = """    PID USER      PR  NI    VIRT    RES    SHR S  %CPU  %MEM     TIME+ COMMAND
   1234 bob       20   0   16.3g  23.3g   1.1g D 117.0   4.6 291:14.00 python
   1235 bob       20   0    1.0g   1.0g   1.0g R   1.0   1.0   1:00.00 python"""


@pytest.mark.parametrize(("table", "pid", "command"), [(PS_AUX, 31007, "python train.py --cfg a.yaml"), (PS_L, 4242, "python"), (TOP, 1234, "python")])
def test_a_process_in_uninterruptible_sleep_is_an_io_wait_event(table, pid, command):
    events = events_of("log line before\n\n" + table + "\n\nlog line after")
    assert events.select("line", "kind", "severity", "pid").rows() == [(4, "node.process_io_wait", "warning", pid)]
    assert f"process {pid} ({command}) in uninterruptible sleep" in events.get_column("message")[0]


def test_a_process_table_ends_at_its_first_blank_line():
    assert events_of(PS_AUX.replace(" Dl ", " Rl ") + "\n\nstep 10 D loss 0.5 took 3 s\n0 D 1000 4242 x").height == 0
    assert events_of("rank 3 PID 4242 STAT D while saving\nalice 31007 1 1 1 1 ? D 00:36 1:00 python").height == 0
