"""`postmortem analyze` touches no network, starts no process, runs no pickled code, writes nothing in the job.

The proof is a child process with a Python audit hook (PEP 578) installed before anything of the
analyzer is imported: every socket, DNS, HTTP, process, `pickle.find_class` and file-open event of
the whole run (imports included, torch's among them when a checkpoint is audited) passes through
it. Network and process events are refused (the hook raises) and recorded; the child then writes
what it saw next to the report, outside the job. The job holds a recorded hang with Flight
Recorder dumps and py-spy stacks, pickles built to run code, log lines carrying markup, an
archive with `../` members, and a checkpoint; the run writes the JSON and the HTML report.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.test_hostile_inputs import BAD, _legacy_torch_save, _Runs, tree_state

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "fixtures" / "recorded" / "hang_conditional_collective" / "job"

CHILD = r"""
import json, os, sys

job, record = os.path.realpath(sys.argv[1]), sys.argv[2]
NETWORK = ("socket.", "urllib.", "http.client.", "ftplib.", "smtplib.", "poplib.", "imaplib.", "nntplib.", "telnetlib.",
           "webbrowser.")
PROCESS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
           "pty.spawn", "os.startfile", "ctypes.dlopen")
MUTATE = ("os.remove", "os.unlink", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
          "os.utime", "os.truncate", "os.link", "os.symlink", "shutil.", "os.setxattr", "os.removexattr")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
seen = {"network": [], "process": [], "find_class": [], "job_writes": []}


def inside_job(path):
    if isinstance(path, int):
        return False
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(job + os.sep)
    except (TypeError, ValueError):
        return False


def hook(event, args):
    if event.startswith(NETWORK):
        seen["network"].append([event, repr(args)[:200]])
        raise PermissionError(f"network refused by the test's audit hook: {event}")
    if event.startswith(PROCESS) and not (event == "ctypes.dlopen"):
        seen["process"].append([event, repr(args)[:200]])
        raise PermissionError(f"process refused by the test's audit hook: {event}")
    if event == "pickle.find_class":
        seen["find_class"].append(".".join(map(str, args)))
    elif event == "open" and inside_job(args[0]):
        mode, flags = args[1], args[2] if len(args) > 2 else 0
        if (mode and any(c in mode for c in "wax+")) or (flags or 0) & WRITE_FLAGS:
            seen["job_writes"].append([event, repr(args)[:200]])
    elif event.startswith(MUTATE) and any(inside_job(a) for a in args if isinstance(a, (str, bytes, os.PathLike))):
        seen["job_writes"].append([event, repr(args)[:200]])


sys.addaudithook(hook)

if sys.argv[3] == "--control":  # the harness's own check: each of these must be seen
    import pickle, socket, subprocess
    for attempt in (lambda: socket.create_connection(("127.0.0.1", 9), timeout=1),
                    lambda: subprocess.run(["true"]),
                    lambda: pickle.loads(pickle.dumps(os.getcwd))):
        try:
            attempt()
        except PermissionError:
            pass
    open(os.path.join(job, "written.txt"), "w").close()
    code = "control"
else:
    import click
    from analyzer.cli import main

    code = None
    try:
        main(sys.argv[3:], standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
    except click.ClickException as exc:
        code = exc.exit_code
seen["exit"] = code
with open(record, "w") as fh:
    json.dump(seen, fh)
"""

DANGEROUS = ("posix.system", "nt.system", "os.system", "builtins.exec", "builtins.eval", "subprocess.Popen",
             "posix.mkdir", "shutil.copyfile", "builtins.open", "builtins.__import__")


def hostile_job(root: Path) -> tuple[Path, list[Path]]:
    job = root / "job"
    shutil.copytree(RECORDED, job, symlinks=True)
    for name in ("markup.log", "traversal.tar", "binary-garbage.bin", "truncated.log.gz", "nul-padded.log"):
        shutil.copyfile(BAD / name, job / name)
    marks = [root / f"ran-{i}" for i in range(3)]
    payloads = [_Runs(os.system, f"touch {marks[0]}"), _Runs(subprocess.Popen, ["touch", str(marks[1])]),
                _Runs(os.mkdir, str(marks[2]))]
    (job / "fr" / "nccl_trace_rank_7").write_bytes(pickle.dumps({"version": "2.4", "entries": payloads}, protocol=4))
    (job / "snapshot.pickle").write_bytes(pickle.dumps({"segments": [{"blocks": payloads}]}, protocol=5))
    (job / "ckpt").mkdir()
    (job / "ckpt" / "legacy.pt").write_bytes(_legacy_torch_save({"model": payloads}))
    with zipfile.ZipFile(job / "ckpt" / "evil.pt", "w") as archive:
        archive.writestr("evil/data.pkl", pickle.dumps({"state_dict": payloads}, protocol=2))
        archive.writestr("evil/version", "3\n")
    try:
        import torch

        torch.save({"weight": torch.zeros(4), "step": 3}, job / "ckpt" / "model.pt")  # audited with torch.load
    except ImportError:
        pass
    return job, marks


def run_audited(job: Path, record: Path, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    child = subprocess.run([sys.executable, "-c", CHILD, str(job), str(record), *args],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-4000:]
    return json.loads(record.read_text())


def test_the_audit_hook_sees_connects_processes_unpickled_globals_and_writes(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    seen = run_audited(job, tmp_path / "audit.json", "--control")
    assert {event for event, _ in seen["network"]} & {"socket.getaddrinfo", "socket.__new__", "socket.connect"}
    assert [event for event, _ in seen["process"]] == ["subprocess.Popen"]
    assert seen["find_class"] == ["posix.getcwd"] or seen["find_class"] == ["nt.getcwd"]
    assert [event for event, _ in seen["job_writes"]] == ["open"]


def test_analyze_uses_no_network_no_process_and_runs_no_pickled_code(tmp_path):
    job, marks = hostile_job(tmp_path)
    before = tree_state(job)
    record, report, page = tmp_path / "audit.json", tmp_path / "report.json", tmp_path / "report.html"
    seen = run_audited(job, record, "analyze", str(job), "--format", "json", "--output", str(report), "--html", str(page))
    assert seen["exit"] == 1
    assert seen["network"] == []
    assert seen["process"] == []
    assert seen["job_writes"] == []
    assert not [name for name in seen["find_class"] if name.startswith(DANGEROUS)]
    assert not any(mark.exists() for mark in marks)
    assert tree_state(job) == before
    inputs = {i["file"]: i for i in json.loads(report.read_text())["inputs"]}
    assert inputs["fr/nccl_trace_rank_7"]["status"] == "error" and "unsafe pickle" in inputs["fr/nccl_trace_rank_7"]["reason"]
    assert inputs["snapshot.pickle"]["status"] == "error" and "unsafe pickle" in inputs["snapshot.pickle"]["reason"]
    checkpoints = {c["path"]: c for c in json.loads(report.read_text())["checkpoints"]}
    assert checkpoints["ckpt/legacy.pt"]["problem"] == checkpoints["ckpt/evil.pt"]["problem"] == "unsafe"
    assert page.stat().st_size > 0
