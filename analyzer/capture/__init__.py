"""Live capture (before the pipeline, on the node): snapshot a hung job on this node before anyone kills it.

The best evidence of a hang exists only while the job is still hung. `postmortem capture` finds
the job's training processes on this node (from a pid of the launcher or of any worker, a
command-line pattern, a Slurm job id, or explicit pids), maps each to its rank, and writes into
DIR what `postmortem analyze` reads:

- per rank: `rank<R>.pyspy.txt`, `rank<R>.pyspy.json`, `rank<R>.pyspy-native.txt` (py-spy dump,
  plain, --json and --native), and on request `rank<R>.flight_recorder.pkl` (a Flight Recorder
  dump triggered through the rank's TORCH_NCCL_DEBUG_INFO_PIPE_FILE pipe). The `rank<R>` in the
  name is what discovery attributes the rank from; a process whose rank is unknown is `pid<P>`;
- node context, where the tools exist: `node.nvidia-smi-q.txt`, `node.nvidia-smi-topo.txt`,
  `node.nvidia-smi-nvlink.txt`, `node.dmesg.txt` (kernel messages since the job started),
  `node.ibstat.txt`;
- `manifest.json`: what was selected and why, each rank's pid, rank source, NCCL/TORCH
  environment, and every call's outcome with the reason when it failed (tool missing, ptrace
  denied, process exited mid-capture, timed out).

Every external tool runs in its own process group with a per-call timeout; on expiry the whole
group is killed, so one wedged process (or a wedged nvidia-smi) cannot stall the capture. The
job itself is never signalled: py-spy pauses each process briefly while it reads the stacks, and
the Flight Recorder pipe is written only when asked. Only the standard library is imported (click only by the
command, in `analyzer.cli.capture`): this runs on a node in trouble.

Modules: `processes` (the /proc table), `jobs` (ranks, jobs and the selection), `tools` (external
commands under a timeout, the node's context), `ranks` (py-spy and Flight Recorder of one rank),
`run` (the whole capture; the `postmortem capture` command over it is `analyzer.cli.capture`). What the pipeline reads of a
capture is `analyzer/parse/capture_manifest.py` (the manifest) and the ordinary parsers (the dumps).
"""

from analyzer.capture.jobs import build_tree, select
from analyzer.capture.processes import Proc, scan_processes
from analyzer.capture.run import run_capture
from analyzer.capture.tools import find_py_spy, run_tool

__all__ = ["Proc", "build_tree", "find_py_spy", "run_capture", "run_tool", "scan_processes", "select"]
