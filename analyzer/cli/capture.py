"""The `postmortem capture` command: a thin shell over `analyzer.capture.run_capture`.

Only `analyzer.cli` imports this module (to register the command). Itself it imports only the standard
library, click and `analyzer.capture`; the command runs on a node in trouble, and what it loads is
what `postmortem` loads to start (click, rich, the exit codes), never the analysis.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click

from analyzer.capture.run import EXIT_CAPTURED, EXIT_NOTHING_CAPTURED, MANIFEST, run_capture
from analyzer.capture.tools import DEFAULT_TIMEOUT_S


@click.command("capture")
@click.option("--pid", "pids", type=int, multiple=True,
              help="A pid of the job on this node: the torchrun agent or any worker (repeatable).")
@click.option("--pattern", help="A regular expression over command lines; every job it matches is captured.")
@click.option("--slurm-job", help="A Slurm job id: the job's training processes on this node.")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Directory to write into (created; must not already hold a capture).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=DEFAULT_TIMEOUT_S, show_default=True,
              help="Seconds allowed for each tool call (each py-spy dump, nvidia-smi, ...).")
@click.option("--native/--no-native", default=True, show_default=True, help="Also dump native (C/C++) frames.")
@click.option("--flight-recorder", is_flag=True,
              help="Also trigger a Flight Recorder dump through each rank's TORCH_NCCL_DEBUG_INFO_PIPE_FILE pipe.")
@click.option("--node-context/--no-node-context", default=True, show_default=True,
              help="Also save nvidia-smi -q, nvidia-smi topo -m, dmesg since the job started and ibstat.")
@click.option("--py-spy", "py_spy", type=click.Path(dir_okay=False), help="The py-spy binary (default: found beside Python or on PATH).")
def capture(pids: tuple[int, ...], pattern: str | None, slurm_job: str | None, out: Path, timeout: float, native: bool,
            flight_recorder: bool, node_context: bool, py_spy: str | None) -> None:
    """Snapshot a hung job's processes on this node before it is killed; run it on every node.

    Writes py-spy stacks of every rank, the node's GPU / kernel / InfiniBand state and a manifest
    into OUT; `postmortem analyze` then reads OUT (put it inside the job's log directory to have
    both read together). The job is never signalled. Exit status: 0 if any rank was captured,
    2 if none.
    """
    if not pids and pattern is None and slurm_job is None:
        raise click.UsageError("choose the job: --pid PID (repeatable), --pattern REGEX or --slurm-job ID")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise click.BadParameter(f"not a regular expression: {exc}", param_hint="--pattern") from exc
    if (out / MANIFEST).exists():
        raise click.UsageError(f"{out} already holds a capture ({MANIFEST}); choose another --out (one per node)")
    manifest = run_capture(out, pids, pattern, slurm_job, timeout, native, flight_recorder, node_context, py_spy)
    _report(manifest, out)
    sys.exit(EXIT_CAPTURED if manifest["status"] == "captured" else EXIT_NOTHING_CAPTURED)


def _report(manifest: dict, out: Path) -> None:
    for note in manifest["notes"]:
        click.echo(f"note: {note['note']} ({', '.join(f'{k}={v}' for k, v in note.items() if k != 'note')})", err=True)
    processes = manifest["processes"]
    for path in manifest.get("process_manifests", []):
        processes = processes + json.loads((out / path).read_text(encoding="utf-8"))["processes"]
    for entry in processes:
        who = f"rank {entry['rank']}" if entry["rank"] is not None else f"pid {entry['pid']} (rank unknown)"
        line = f"{who:>22}  pid {entry['pid']:<8} {entry['status']:<9} {', '.join(entry['files']) or '-'}"
        if entry["reason"]:
            line += f"\n{'':>24}{entry['reason']}"
        click.echo(line)
    for record in manifest["node"]:
        click.echo(f"{record['call']:>22}  {record['status']:<9} {record.get('file') or record.get('reason', '')}")
    summary = manifest.get("summary", {})
    if not processes:
        click.echo("no training process selected on this node; nothing written", err=True)
        return
    if not summary.get("captured", 0) + summary.get("partial", 0):
        click.echo(f"nothing captured ({summary.get('failed', 0)} failed); manifest: {out / MANIFEST}", err=True)
        return
    click.echo(f"{summary.get('captured', 0)} captured, {summary.get('partial', 0)} partial, {summary.get('failed', 0)} failed; "
               f"manifest: {out / MANIFEST}; next: postmortem analyze {out}")
