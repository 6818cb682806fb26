"""The NVIDIA Kubernetes device plugin's health-check texts (vocabularies/k8s_device_plugin.csv): every text of its
health check that withdraws a GPU is a row, each recognised between ordinary lines; its routine lines stay silent."""

from pathlib import Path

import polars as pl

from analyzer.api import analyze
from analyzer.parse.vocabulary import vocabulary
from tests.test_vocabulary import categories_mid_file

ROWS = vocabulary().rows.filter(pl.col("file") == "k8s_device_plugin.csv")

# The plugin's own log around a health-check verdict: start-up, the ignored-Xid list, skipped events.
ROUTINE = [
    "I0810 19:09:40.100000       1 main.go:256] Retreiving plugins.",
    "I0810 19:09:40.200000       1 server.go:216] Starting GRPC server for 'nvidia.com/gpu'",
    "I0810 19:09:40.300000       1 server.go:165] Registered device plugin for 'nvidia.com/gpu' with Kubelet",
    "I0810 19:09:40.400000       1 health.go:64] Ignoring the following XIDs for health checks: map[13:true 31:true 43:true 45:true 68:true 109:true]",
    "I0810 19:09:41.500000       1 health.go:137] Skipping event {Device:{Handle:0x7f5c} EventType:8 EventData:43 GpuInstanceId:4294967295 ComputeInstanceId:4294967295}",
]


def test_every_health_check_text_that_withdraws_a_gpu_has_a_row():
    # internal/rm/health.go and internal/plugin/server.go (0.14-0.17), nvidia.go / server.go (0.6-0.13)
    assert ROWS.height == 10
    assert set(ROWS.filter(pl.col("category") == "gpu_hardware_xid").get_column("id")) == {
        "k8s-device-plugin/xid-critical-device", "k8s-device-plugin/xid-critical-all",
        "k8s-device-plugin/device-marked-unhealthy", "k8s-device-plugin/device-handle-lost"}


def test_both_wordings_of_the_critical_xid_mid_file(tmp_path):
    lines = ["2020/08/10 19:09:42 XidCriticalError: Xid=69 on Device=GPU-7540a9b3-eeb9-1214-1526-f93c9ea826a8, the device will go unhealthy.",
             "I0512 07:44:03.118210       1 health.go:185] XidCriticalError: Xid=79 on Device=GPU-0b1c2d3e; marking device as unhealthy.",
             "I0512 07:44:03.118300       1 server.go:276] 'nvidia.com/gpu' device marked unhealthy: GPU-0b1c2d3e"]
    assert categories_mid_file(tmp_path, lines) == ["gpu_hardware_xid"] * 3


def test_the_plugins_routine_lines_are_no_failure(tmp_path):
    assert categories_mid_file(tmp_path, ROUTINE) == [None] * len(ROUTINE)


def test_a_device_plugin_log_with_a_critical_xid_is_read_not_refused(tmp_path: Path):
    line = "I0512 07:44:03.118210       1 health.go:185] XidCriticalError: Xid=79 on Device=GPU-0b1c2d3e; marking device as unhealthy."
    (tmp_path / "nvidia-device-plugin.log").write_text("\n".join([*ROUTINE[:4], line, ROUTINE[4]]) + "\n")
    verdict = analyze(str(tmp_path)).report["verdict"]
    assert verdict["category"] == "gpu_hardware_xid"
    assert "Xid=79" in verdict["evidence"][0]["text"]
