"""`postmortem capture`: snapshot a hung job's ranks on this node, then `analyze` names the hung rank.

The end-to-end test runs a real 3-rank gloo job (tests/data/gloo_hang_job.py, torchrun on the
CPU) in which rank 1 stalls outside any collective while ranks 0 and 2 wait in all_reduce, runs
the real py-spy against it through the CLI, and analyses the capture beside the job's torchrun
logs. The failure modes (ptrace denied, a wedged tool, a rank that exits mid-capture, a
Flight Recorder pipe) run against real processes too; only the process-table logic is also
tested on synthetic /proc tables, for launch layouts a CI machine cannot host (srun, two nodes).
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from analyzer.capture import Proc, build_tree, find_py_spy, run_capture, run_tool, scan_processes, select
from analyzer.cli import main

ROOT = Path(__file__).resolve().parents[1]
JOB_SCRIPT = ROOT / "tests" / "data" / "gloo_hang_job.py"
RULE = "hang-rank-stuck-outside-collective"

needs_py_spy = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed (test extra)")


def _analyze(path: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["analyze", str(path), "--format", "json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.output)


def _capture_cli(*args: object, timeout: float = 120, preexec_fn=None) -> subprocess.CompletedProcess:
    """The command as an on-call engineer runs it: its own process, outside the job's tree."""
    return subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "capture", *map(str, args)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn,
    )


def _state(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2]


# --- the real hung job ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory):
    """torchrun --standalone, 3 CPU ranks on gloo; yields once every rank sits where it hangs."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("gloo_hang")
    ready, logs = base / "ready", base / "logs"
    ready.mkdir()
    console = open(base / "console.log", "wb")  # noqa: SIM115 - closed in teardown
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
         "--log-dir", str(logs), "--redirects", "3", str(JOB_SCRIPT), str(ready)],
        stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "NCCL_DEBUG": "INFO"},
    )
    try:
        deadline = time.monotonic() + 90
        while len(list(ready.glob("rank*.ready"))) < 3:
            if agent.poll() is not None:
                pytest.fail(f"the job exited early ({agent.returncode}): {(base / 'console.log').read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"the job did not reach its hang in 90 s: {(base / 'console.log').read_text()[-3000:]}")
            time.sleep(0.1)
        time.sleep(1.0)  # each rank writes its marker just before the blocking call: let it enter it
        workers = {int(p.stem[4:]): int(p.read_text()) for p in ready.glob("rank*.ready")}
        yield {"agent": agent.pid, "workers": workers, "logs": logs, "base": base}
    finally:
        # The test kills the job it started; capture never does. torchelastic starts each worker in
        # a session of its own, so the agent's process group alone would leave them orphaned.
        job = [agent.pid, *build_tree(scan_processes()).descendants(agent.pid)]
        for pid in job:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        agent.wait(timeout=30)
        console.close()


@needs_py_spy
def test_capture_then_analyze_names_the_hung_rank(hung_job):
    """The issue's 'done when': capture on the node of a real hung job, analyze, the verdict names rank 1."""
    out = hung_job["logs"] / f"capture-{socket.gethostname()}"  # beside the job's own torchrun logs
    started = time.monotonic()
    result = _capture_cli("--pid", hung_job["agent"], "--out", out, "--flight-recorder")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert elapsed < 60

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "captured" and manifest["host"] == socket.gethostname()
    processes = {p["rank"]: p for p in manifest["processes"]}
    assert sorted(processes) == [0, 1, 2]
    for rank, proc in processes.items():
        assert proc["pid"] == hung_job["workers"][rank]
        assert proc["rank_source"] == "environ:RANK" and proc["local_rank"] == rank
        assert proc["launcher_pid"] == hung_job["agent"]
        assert proc["status"] == "captured", proc["reason"]
        assert proc["files"] == [f"rank{rank}.pyspy.txt", f"rank{rank}.pyspy.json", f"rank{rank}.pyspy-native.txt"]
        assert proc["env"]["WORLD_SIZE"] == "3" and proc["env"]["NCCL_DEBUG"] == "INFO"
        assert "PATH" not in proc["env"] and "HOME" not in proc["env"]  # an allow-list, not the whole environment
        # gloo has no debug pipe: the manifest says why there is no Flight Recorder dump.
        assert proc["flight_recorder"]["status"] == "unavailable"
        assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in proc["flight_recorder"]["reason"]
        for name in proc["files"]:
            assert (out / name).stat().st_size > 0
    assert "load_shard" in (out / "rank1.pyspy.txt").read_text()
    assert "all_reduce" in (out / "rank0.pyspy.txt").read_text()
    # Node context: each tool either saved its output or has its reason (no GPU / IB tools on CI).
    node = {r["call"]: r for r in manifest["node"]}
    assert set(node) == {"nvidia-smi-q", "nvidia-smi-topo", "nvidia-smi-nvlink", "ibstat", "dmesg"}
    for record in node.values():
        assert (record["status"] == "ok" and (out / record["file"]).is_file()) or record["reason"]

    # Capture never signals the job: every rank is still there, not stopped, still hung.
    for pid in hung_job["workers"].values():
        assert _state(pid) in ("S", "R", "D")

    code, report = _analyze(hung_job["logs"])
    assert code == 1
    verdict = report["verdict"]
    assert verdict["rule_id"] == RULE and verdict["category"] == "rank_absent_from_collective"
    assert verdict["culprit_ranks"] == [1]
    assert verdict["culprit_hosts"] == [socket.gethostname()]  # from the manifest: dumps carry no host
    assert "rank 1: load_shard" in verdict["summary"] and "ranks 0,2: all_reduce" in verdict["summary"]
    formats = {i["file"].rsplit("/", 1)[-1]: (i["format"], i["status"]) for i in report["inputs"]}
    assert formats["manifest.json"] == ("capture_manifest", "parsed")
    assert formats["rank1.pyspy.json"] == ("pyspy_json", "parsed")
    assert report["job"]["world_size"] == 3
    jsonschema.validate(report, json.loads((ROOT / "schema" / "report.schema.json").read_text()))
    for pid in hung_job["workers"].values():
        assert _state(pid) in ("S", "R", "D")


@needs_py_spy
def test_a_worker_pid_or_a_pattern_selects_the_whole_job(hung_job, tmp_path):
    by_worker = _capture_cli("--pid", hung_job["workers"][2], "--out", tmp_path / "w", "--no-native", "--no-node-context")
    # The job's ready directory is unique to this run: other runs of this suite on the machine do not match.
    pattern = re.escape(JOB_SCRIPT.name) + " " + re.escape(str(hung_job["base"] / "ready"))
    by_pattern = _capture_cli("--pattern", pattern, "--out", tmp_path / "p", "--no-native", "--no-node-context")
    for result, out in ((by_worker, tmp_path / "w"), (by_pattern, tmp_path / "p")):
        assert result.returncode == 0, result.stdout + result.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert [(p["rank"], p["pid"], p["status"]) for p in manifest["processes"]] == [
            (r, hung_job["workers"][r], "captured") for r in range(3)
        ]
        assert manifest["node"] == []
        assert sorted(f.name for f in out.iterdir()) == sorted(
            ["manifest.json"] + [f"rank{r}.pyspy.{ext}" for r in range(3) for ext in ("txt", "json")]
        )
        code, report = _analyze(out)  # the capture alone, without the job's logs
        assert code == 1 and report["verdict"]["culprit_ranks"] == [1]


def test_every_capture_option_is_in_the_readme():
    from analyzer.cli.capture import capture

    readme = (ROOT / "README.md").read_text()
    assert "postmortem capture" in readme
    for param in capture.params:
        assert any(f"`{opt}" in readme or f" {opt} " in readme or f"{opt}`" in readme
                   for opt in param.opts + param.secondary_opts), param.name


def test_capture_refuses_to_overwrite_and_needs_a_selector(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    result = CliRunner().invoke(main, ["capture", "--pid", str(os.getpid()), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "already holds a capture" in result.output
    result = CliRunner().invoke(main, ["capture", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--pid PID" in result.output


def test_a_pid_that_does_not_exist_writes_nothing_and_suggests_nothing(tmp_path):
    missing = next(pid for pid in range(999_999, 1_000_000_000, 7919) if not Path(f"/proc/{pid}").exists())
    out = tmp_path / "cap"
    result = CliRunner().invoke(main, ["capture", "--pid", str(missing), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert not out.exists(), "no node context (nor anything else) is written for a job that is not there"
    assert "postmortem analyze" not in result.output and "nothing written" in result.output


# --- failure modes, each against real processes -----------------------------------------------------


_IDLE_RANK = textwrap.dedent(
    """
    import time

    def wait_for_batch():
        time.sleep(120)

    wait_for_batch()
    """
)


@pytest.fixture
def idle_ranks(tmp_path):
    """Processes that look like the ranks of a job to the process table (RANK, MASTER_ADDR/PORT).

    MASTER_ADDR is a token unique to the test (also in each command line), so that another run of
    this suite on the same machine never joins the job or matches the pattern.
    """
    started: list[subprocess.Popen] = []
    token = f"idle-{uuid.uuid4().hex[:12]}"

    def start(n: int, script: str = _IDLE_RANK, extra_env: dict | None = None) -> list[subprocess.Popen]:
        for rank in range(n):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
                   "MASTER_ADDR": token, "MASTER_PORT": "29500", **(extra_env or {})}
            started.append(subprocess.Popen([sys.executable, "-c", f"# {token}\n{script}"], env=env, cwd=tmp_path))
        time.sleep(0.5)
        return started[-n:]

    start.token = token
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@needs_py_spy
def test_healthy_capture_produces_no_finding(idle_ranks, tmp_path):
    """Ranks all in the same place: the dumps, manifest, env and node files must not raise a finding."""
    ranks = idle_ranks(3)
    out = tmp_path / "cap"
    assert run_capture(out, pids=[ranks[1].pid])["status"] == "captured"  # one pid: its whole job
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(p["rank"], p["status"]) for p in manifest["processes"]] == [(0, "captured"), (1, "captured"), (2, "captured")]
    assert manifest["jobs"][0]["job"] == f"rendezvous:{idle_ranks.token}:29500"  # grouped by MASTER_ADDR:MASTER_PORT
    code, report = _analyze(out)
    assert code == 0, report["findings"]
    assert report["findings"] == [] and report["verdict"]["category"] == "none"
    assert {i["status"] for i in report["inputs"]} <= {"parsed"}


@needs_py_spy
def test_several_jobs_matched_each_get_a_directory(idle_ranks, tmp_path):
    first = idle_ranks(2, extra_env={"MASTER_PORT": "29101"})
    second = idle_ranks(1, extra_env={"MASTER_PORT": "29102"})
    manifest = run_capture(tmp_path / "cap", pattern=idle_ranks.token, native=False, node_context=False)
    assert [(j["job"], j["dir"], j["pids"]) for j in manifest["jobs"]] == [
        (f"rendezvous:{idle_ranks.token}:29101", "job1", [p.pid for p in first]),
        (f"rendezvous:{idle_ranks.token}:29102", "job2", [second[0].pid]),
    ]
    assert manifest["processes"] == [] and manifest["process_manifests"] == ["job1/manifest.json", "job2/manifest.json"]
    job1 = json.loads((tmp_path / "cap" / "job1" / "manifest.json").read_text())
    assert [(p["rank"], p["files"]) for p in job1["processes"]] == [
        (0, ["rank0.pyspy.txt", "rank0.pyspy.json"]), (1, ["rank1.pyspy.txt", "rank1.pyspy.json"])
    ]
    code, report = _analyze(tmp_path / "cap" / "job2")
    assert code == 0 and report["job"]["hosts"] == [socket.gethostname()]


def _drop_ptrace() -> None:
    """preexec: remove CAP_SYS_PTRACE from the bounding set, as in a container started without it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(24, 19, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_SYS_PTRACE
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


@needs_py_spy
def test_denied_ptrace_is_recorded_and_exits_two(idle_ranks, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("dropping CAP_SYS_PTRACE needs root (CI runs as root)")
    ranks = idle_ranks(2)
    out = tmp_path / "cap"
    result = _capture_cli("--pid", ranks[0].pid, "--out", out, "--no-node-context", preexec_fn=_drop_ptrace)
    assert result.returncode == 2, result.stdout + result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "nothing captured"
    assert [p["status"] for p in manifest["processes"]] == ["failed", "failed"]
    for proc in manifest["processes"]:
        assert proc["files"] == [] and "ptrace denied" in proc["reason"]
    assert sorted(f.name for f in out.iterdir()) == ["manifest.json"]
    code, report = _analyze(out)  # nothing to analyse but the manifest: no finding, no crash
    assert code == 0 and report["findings"] == []


def test_a_wedged_tool_is_killed_at_the_timeout(idle_ranks, tmp_path):
    """A py-spy that never returns (and whose child holds its pipes) costs one timeout per call, no more."""
    ranks = idle_ranks(1)
    spawned = tmp_path / "spawned"
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!/bin/sh\nsleep 60 &\necho $! >> {spawned}\nwait\n")
    fake.chmod(0o755)
    started = time.monotonic()
    manifest = run_capture(tmp_path / "cap", pids=[ranks[0].pid], timeout=1.0, node_context=False, py_spy=str(fake))
    assert time.monotonic() - started < 15
    proc = manifest["processes"][0]
    assert proc["status"] == "failed"
    assert [(c["call"], c["status"]) for c in proc["calls"]] == [
        ("pyspy_text", "timeout"), ("pyspy_json", "timeout"), ("pyspy_native", "timeout")
    ]
    assert all(c["reason"] == "timed out after 1 s; killed" for c in proc["calls"])
    time.sleep(0.2)
    for pid in map(int, spawned.read_text().split()):
        assert _state(pid) in (None, "Z")  # the tool's whole process group was killed
    assert ranks[0].poll() is None  # and the rank was not


def test_run_tool_timeout_and_missing_tool():
    started = time.monotonic()
    result = run_tool(["sh", "-c", "sleep 30 & wait"], 0.5)
    assert result.status == "timeout" and time.monotonic() - started < 5
    assert run_tool(["no-such-tool-anywhere"], 1).status == "missing"


@needs_py_spy
def test_a_rank_that_exits_mid_capture(idle_ranks, tmp_path):
    """The rank exits between selection and its dump: recorded as exited, the others still captured."""
    script = "import time\ndef finish_epoch():\n    time.sleep(1.5)\nfinish_epoch()\n"
    leaving = idle_ranks(1, script)[0]
    reaper = threading.Thread(target=leaving.wait)  # reaped at exit, as torchrun would
    reaper.start()
    real = find_py_spy()
    gate = tmp_path / "py-spy"
    # py-spy itself, started only once the process is gone: its real error on a vanished pid.
    gate.write_text(f'#!/bin/sh\nfor pid; do :; done\nwhile [ -e /proc/$pid ]; do sleep 0.05; done\nexec {real} "$@"\n')
    gate.chmod(0o755)
    manifest = run_capture(tmp_path / "cap", pids=[leaving.pid], timeout=10, node_context=False, py_spy=str(gate))
    reaper.join()
    proc = manifest["processes"][0]
    assert proc["status"] == "exited" and manifest["status"] == "nothing captured"
    assert proc["calls"][0]["status"] == "failed" and "process exited during capture" in proc["calls"][0]["reason"]
    assert [c["status"] for c in proc["calls"][1:]] == ["skipped", "skipped"]


@needs_py_spy
def test_a_stopped_rank_is_read_without_pausing_and_left_stopped(idle_ranks, tmp_path):
    ranks = idle_ranks(2)
    os.kill(ranks[1].pid, signal.SIGSTOP)  # the test's own process, standing in for a rank frozen by a debugger
    try:
        manifest = run_capture(tmp_path / "cap", pids=[ranks[0].pid], node_context=False)
        stopped = manifest["processes"][1]
        assert manifest["processes"][0]["status"] == "captured"
        assert stopped["status"] == "partial" and stopped["files"] == ["rank1.pyspy.txt", "rank1.pyspy.json"]
        assert [(c["call"], c["status"]) for c in stopped["calls"]] == [
            ("pyspy_text", "ok"), ("pyspy_json", "ok"), ("pyspy_native", "skipped")
        ]
        assert "--nonblocking" in stopped["calls"][0]["note"]
        assert "wait_for_batch" in (tmp_path / "cap" / "rank1.pyspy.txt").read_text()
        assert _state(ranks[1].pid) == "T"  # capture did not resume it either
    finally:
        os.kill(ranks[1].pid, signal.SIGCONT)


def test_flight_recorder_trigger_through_the_debug_pipe(idle_ranks, tmp_path):
    """The pipe protocol of ProcessGroupNCCL's heartbeat monitor: FIFO `<stem><rank>.pipe`, dump to `<temp><rank>`."""
    dump = pickle.dumps({"version": "2.4", "pg_config": {}, "pg_status": {}, "entries": []}, protocol=2)
    (tmp_path / "payload.pkl").write_bytes(dump)
    watchdog = textwrap.dedent(
        """
        import os, time
        stem, temp, rank = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"], os.environ["TORCH_FR_DUMP_TEMP_FILE"], os.environ["RANK"]
        os.mkfifo(f"{stem}{rank}.pipe", 0o666)
        fd = os.open(f"{stem}{rank}.pipe", os.O_RDONLY | os.O_NONBLOCK)
        while True:
            try:
                data = os.read(fd, 128)
            except BlockingIOError:
                data = b""
            if data:
                with open(f"{temp}{rank}", "wb") as fh:
                    fh.write(open("payload.pkl", "rb").read())
            time.sleep(0.1)
        """
    )
    ranks = idle_ranks(2, watchdog, {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "fr_pipe_", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_dump_")})
    deadline = time.monotonic() + 10
    while not all((tmp_path / f"fr_pipe_{r}.pipe").exists() for r in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    manifest = run_capture(tmp_path / "cap", pids=[ranks[0].pid], timeout=10, native=False, node_context=False,
                           flight_recorder=True, py_spy=find_py_spy() or "no-py-spy")
    for rank, proc in enumerate(manifest["processes"]):
        assert proc["flight_recorder"]["status"] == "ok", proc["flight_recorder"]
        assert (tmp_path / "cap" / f"rank{rank}.flight_recorder.pkl").read_bytes() == dump
    assert all(p.poll() is None for p in ranks)


# --- the process table: launch layouts ---------------------------------------------------------------


def _proc(pid, ppid, argv, env=None, start=None, comm=None, cgroup=""):
    argv = tuple(argv.split()) if isinstance(argv, str) else tuple(argv)
    return Proc(pid, ppid, comm or os.path.basename(argv[0])[:15], argv, start if start is not None else pid, "S", env,
                None if env is not None else "environ unreadable: Permission denied", cgroup)


def _table(*procs):
    return {p.pid: p for p in procs}


def _ranks(selection):
    return [[(w.rank, w.local_rank, w.pid) for w in job.workers] for job in selection.jobs]


def test_torchrun_tree_gives_ranks_when_the_environment_is_unreadable():
    agent = "python -m torch.distributed.run --nnodes 2 --node-rank 1 --nproc-per-node 2 train.py"
    table = _table(
        _proc(10, 1, "bash run.sh", {}),
        _proc(20, 10, agent, None),
        _proc(32, 20, "/usr/bin/python3 -u train.py", None, start=100),
        _proc(31, 20, "/usr/bin/python3 -u train.py", None, start=101),
    )
    selection = select(build_tree(table), pids=[20])
    assert _ranks(selection) == [[(2, 0, 32), (3, 1, 31)]]  # start order gives the local rank
    assert selection.jobs[0].workers[0].rank_source.startswith("torchrun tree (static rendezvous")
    # The training script's own arguments are not torchrun's.
    table[20] = _proc(20, 10, "torchrun --nnodes 2 --nproc-per-node 2 train.py --node-rank 1", None)
    assert _ranks(select(build_tree(table), pids=[20])) == [[(None, 0, 32), (None, 1, 31)]]
    table[20] = _proc(20, 10, "/usr/bin/torchrun --standalone --nproc-per-node=2 train.py", None)
    assert _ranks(select(build_tree(table), pids=[20])) == [[(0, 0, 32), (1, 1, 31)]]
    c10d = agent.replace("--node-rank 1", "--rdzv-backend c10d --rdzv-endpoint h:29400")
    table[20] = _proc(20, 10, c10d, None)
    assert _ranks(select(build_tree(table), pids=[32])) == [[(None, 0, 32), (None, 1, 31)]]


def test_environment_ranks_helpers_and_two_jobs_on_one_node():
    def env(rank, port, run="r1"):
        return {"RANK": str(rank), "LOCAL_RANK": str(rank % 2), "MASTER_ADDR": "n1", "MASTER_PORT": port,
                "TORCHELASTIC_RUN_ID": run}

    table = _table(
        _proc(100, 1, "torchrun --nproc-per-node 2 a.py", {"SLURM_PROCID": "0"}),
        _proc(101, 100, "python -u a.py", env(4, "1")),
        _proc(102, 100, "python -u a.py", env(5, "1")),
        _proc(103, 101, "python -u a.py", env(4, "1")),  # a dataloader worker of rank 4
        _proc(200, 1, "python -m torch.distributed.run --nproc-per-node 1 b.py", {}),
        _proc(201, 200, "python b.py", env(0, "2", "r2")),
    )
    tree = build_tree(table)
    assert tree.helpers == {103: 101}
    assert _ranks(select(tree, pids=[100])) == [[(4, 0, 101), (5, 1, 102)]]
    assert _ranks(select(tree, pids=[103])) == [[(4, 0, 101), (5, 1, 102)]]  # a helper selects its job
    assert _ranks(select(tree, pids=[201])) == [[(0, 0, 201)]]
    assert _ranks(select(tree, pattern=r"\.py")) == [[(4, 0, 101), (5, 1, 102)], [(0, 0, 201)]]
    # The agent killed, its workers orphaned (torchelastic gives each its own session): still one job.
    orphans = {pid: Proc(pid, 1, p.comm, p.argv, p.start_ticks, "S", p.env) for pid, p in table.items() if pid in (101, 102)}
    tree = build_tree({**table, **orphans, 100: _proc(100, 1, "vim", {})})
    assert [job.key for job in select(tree, pids=[101]).jobs] == ["rendezvous:n1:1"]
    assert _ranks(select(tree, pids=[101])) == [[(4, 0, 101), (5, 1, 102)]]


def test_no_python_wrapper_is_not_the_rank():
    env = {"RANK": "0", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "x"}
    table = _table(
        _proc(20, 1, "python -m torch.distributed.run --no-python --nproc-per-node 1 bash train.sh", {}),
        _proc(21, 20, "bash train.sh", env),
        _proc(22, 21, "python3 train.py", env),
    )
    tree = build_tree(table)
    assert _ranks(select(tree, pids=[20])) == [[(0, 0, 22)]] and tree.helpers == {}


def test_srun_per_rank_launch_and_slurm_job_selection():
    def env(procid):
        return {"SLURM_JOB_ID": "777", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid - 8)}

    cgroup = "0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_0\n"
    table = _table(
        _proc(50, 1, "slurmstepd: [777.0]", {}, comm="slurmstepd"),
        _proc(51, 50, "bash train.sh", env(8), cgroup=cgroup),
        _proc(52, 51, "python3 train.py", env(8), cgroup=cgroup),
        _proc(61, 50, "bash train.sh", env(9), cgroup=cgroup),
        _proc(62, 61, "python3 train.py", env(9), cgroup=cgroup),
        _proc(70, 1, "python3 other.py", {"SLURM_JOB_ID": "778", "SLURM_PROCID": "0"}),
    )
    selection = select(build_tree(table), slurm_job="777")
    assert _ranks(selection) == [[(8, 0, 52), (9, 1, 62)]]
    assert selection.jobs[0].workers[0].rank_source == "environ:SLURM_PROCID"
    assert _ranks(select(build_tree(table), pids=[50])) == [[(8, 0, 52), (9, 1, 62)]]  # the step selects its ranks
    assert select(build_tree(table), slurm_job="999").notes[0]["note"].startswith("no process of this Slurm job")


def test_unknown_and_non_training_pids():
    table = _table(_proc(5, 1, "python tool.py", {}), _proc(6, 1, "vim notes", {}))
    selection = select(build_tree(table), pids=[5, 99], pattern="vim")
    assert _ranks(selection) == [[(None, None, 5)]]  # an explicit pid is captured as given
    notes = [n["note"] for n in selection.notes]
    assert any("not recognised as a training process" in n for n in notes)
    assert any("no such process" in n for n in notes)
    assert any("matches --pattern but is not a training process" in n for n in notes)


# --- a real capture of an NCCL hang on GPUs ---------------------------------------------------------


NCCL_CAPTURE = ROOT / "tests" / "data" / "capture_nccl_h200"


def test_stored_nccl_capture_with_on_demand_flight_recorder_dumps():
    """A capture this command took on 2 H200s (torch 2.11+cu130, NCCL 2.28), stored with the job's logs.

    The job: torchrun --standalone --nproc-per-node 2, started with TORCH_NCCL_TRACE_BUFFER_SIZE=2000
    and TORCH_NCCL_DEBUG_INFO_PIPE_FILE; after a warm-up all_reduce, rank 1 sleeps in load_shard()
    while rank 0 enqueues the next all_reduce and blocks behind it in `t.sum().item()`. Captured
    with `capture --pattern nccl_hang_job --flight-recorder`: py-spy (plain, json, native), the
    Flight Recorder dumps each rank wrote when its pipe was poked, nvidia-smi -q and topo -m.
    Rank 0's stack shows no collective frame (it is inside cudaLaunchKernel for `sum`), so the
    stack clustering stays silent with two ranks; the triggered Flight Recorder dumps name rank 1.
    """
    manifest = json.loads((NCCL_CAPTURE / "capture" / "manifest.json").read_text())
    assert [(p["rank"], p["status"], p["flight_recorder"]["status"]) for p in manifest["processes"]] == [
        (0, "captured", "ok"), (1, "captured", "ok")
    ]
    code, report = _analyze(NCCL_CAPTURE)
    assert code == 1
    verdict = report["verdict"]
    assert verdict["rule_id"] == "hang-rank-absent-from-collective"
    assert verdict["culprit_ranks"] == [1] and verdict["culprit_hosts"] == ["vm"]
    # The node files (nvidia-smi, manifest) add no finding; the stacks may only agree with the dumps.
    assert {f["rule_id"] for f in report["findings"]} <= {"hang-rank-absent-from-collective", "hang-rank-stuck-outside-collective"}
    assert all(f["ranks"] == [1] for f in report["findings"])
    formats = {i["file"].split("/")[-1]: (i["format"], i["status"]) for i in report["inputs"]}
    assert formats["rank0.flight_recorder.pkl"] == ("pickle", "parsed")
    assert formats["node.nvidia-smi-q.txt"] == ("text", "parsed")
    assert formats["manifest.json"] == ("capture_manifest", "parsed")
