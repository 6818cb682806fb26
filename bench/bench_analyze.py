"""End-to-end benchmark of `postmortem analyze` against ripgrep and polars alone, on generated jobs.

    python bench/bench_analyze.py                      # both workloads at 512 ranks/1 GB and 4,096 ranks/1 GB
    python bench/bench_analyze.py --sizes 512:256      # a quicker point while iterating
    python bench/bench_analyze.py --sizes 512:10240    # the 10 GB point (needs ~11 GB of disk per workload)
    python bench/bench_analyze.py --quick              # a tiny job of each workload (the tests smoke it)
    python bench/bench_analyze.py --cpus 0,1           # analyze, rg and the ceiling pinned to CPUs 0 and 1

Two workloads: `genjob` (bench/genjob.py: three communicators of NCCL INFO init, step lines, the
watchdog cascade of a hang) and `nccl` (what NCCL_DEBUG=INFO really prints at scale: about 40% of
the lines are per-channel connection lines; ../shared/perf/gen_logs.py when it is there, else
bench/gen_nccl.py, modelled on it). For each job, after printing the load average (the figures
mean little on a busy machine): wall, CPU seconds (user + sys of the child process), CPU s/GB,
MB/s, lines/s and peak RSS of `analyze` run in a child process as a user runs it; and, on the same
files in the same run, bench/ceiling.py (polars alone reads, prefilters and extracts the header
fields: the design limit), `rg -c` counting NCCL lines (1 thread) and `rg -P -o` extracting the
fields the analyzer extracts (1 and 2 threads). The `x` columns are analyze wall / their wall
(lower is better). `cand %` is the share of lines the prefilter keeps for classification (the
ceiling's count): when it grows, `bench/prefilter_stats.py JOB` names the literals to blame. Each figure is the best of --repeat runs by CPU time. Jobs are cached under
--work (default .bench/, git-ignored), so repeated runs read a warm page cache. `--cpus` pins every
measured child (analyze, the ceiling, rg) to those CPUs (`os.sched_setaffinity` in the child before
it starts; polars and rg size their thread pools from it), so a larger idle machine emulates the
2-core target; the `load` column is the 1-minute load average just before the job's runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import gen_nccl, genjob  # noqa: E402

SHARED_GEN_LOGS = ROOT.parent / "shared" / "perf" / "gen_logs.py"
# The fields the analyzer pulls from every candidate line, as one PCRE2 pattern for ripgrep.
RG_FIELDS = (
    r"^(?:\[rank(\d+)\]:)?(?:\[([IWEF])\d{4} [\d:.]+ [\w.]+:\d+\] )?"
    r"(?:([\w.\-]+):(\d+):(\d+) \[(\d+)\] NCCL (INFO|WARN) |.*WorkNCCL\(SeqNum=(\d+), OpType=(\w+)|.*(\w+Error): )"
)

CHILD = r"""
import json, sys
from analyzer.api import analyze
result = analyze(sys.argv[1])
print(json.dumps({
    "lines": sum(i.lines for i in result.inputs),
    "verdict": result.report["verdict"]["category"],
    "culprits": result.report["verdict"]["culprit_ranks"],
}))
"""

COLUMNS = ("workload", "ranks", "load", "MB", "lines", "wall s", "CPU s", "CPU s/GB", "MB/s", "Mlines/s", "peak RSS MB",
           "verdict", "ceiling s", "ceiling CPU s/GB", "x ceiling", "cand %", "rg -c s", "x rg -c", "rg -P j1 s", "x rg j1",
           "rg -P j2 s", "x rg j2")


@dataclass
class Run:
    wall: float
    cpu: float  # user + sys of the child
    peak_rss_mb: float
    stdout: str


def measure(cmd: list[str], repeat: int, cpus: frozenset[int] | None = None) -> Run:
    """Best of `repeat` runs of `cmd` by CPU time, each measured from its own rusage (wait4), pinned
    to `cpus` when given (set in the child between fork and exec: the parent keeps its own)."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    best: Run | None = None
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT, preexec_fn=pin)
        out = proc.stdout.read().decode("utf-8", "replace") if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        run = Run(time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out)
        if best is None or run.cpu < best.cpu:
            best = run
    assert best is not None
    return best


def job_dir(work: Path, workload: str, ranks: int, mb: int) -> Path:
    """The cached job of `workload` at `ranks` and `mb`, generated on first use."""
    if workload == "genjob":
        job = work / f"job-{ranks}r-{mb}mb"
        if not job.exists():
            genjob.generate(work, ranks, mb << 20)
        return job
    job = work / f"nccl-{ranks}r-{mb}mb"
    if not job.exists():
        if SHARED_GEN_LOGS.exists():
            cmd = [sys.executable, str(SHARED_GEN_LOGS), str(job), "--ranks", str(ranks), "--total-mb", str(mb), "--jobs", "2"]
            subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
        else:
            gen_nccl.generate(job, ranks, mb << 20)
    return job


def bench_job(workload: str, ranks: int, job: Path, repeat: int, rg: str | None, cpus: frozenset[int] | None) -> dict:
    size = sum(p.stat().st_size for p in job.rglob("*") if p.is_file())
    load = os.getloadavg()
    print("# load average %.2f %.2f %.2f" % load, flush=True)
    analyze = measure([sys.executable, "-c", CHILD, str(job)], repeat, cpus)
    info = json.loads(analyze.stdout.strip().splitlines()[-1])
    ceiling = measure([sys.executable, str(ROOT / "bench" / "ceiling.py"), str(job)], repeat, cpus)
    kept = json.loads(ceiling.stdout.strip().splitlines()[-1])
    gb, mb = size / 2**30, size / 2**20
    row = {
        "workload": workload, "ranks": ranks, "load": f"{load[0]:.1f}", "MB": f"{mb:.0f}", "lines": f"{info['lines']:,d}",
        "wall s": f"{analyze.wall:.2f}", "CPU s": f"{analyze.cpu:.2f}", "CPU s/GB": f"{analyze.cpu / gb:.1f}",
        "MB/s": f"{mb / analyze.wall:.0f}", "Mlines/s": f"{info['lines'] / analyze.wall / 1e6:.2f}",
        "peak RSS MB": f"{analyze.peak_rss_mb:.0f}", "verdict": f"{info['verdict']}{info['culprits']}",
        "ceiling s": f"{ceiling.wall:.2f}", "ceiling CPU s/GB": f"{ceiling.cpu / gb:.1f}",
        "x ceiling": f"{analyze.wall / ceiling.wall:.1f}",
        "cand %": f"{100 * kept['candidates'] / max(kept['lines'], 1):.1f}",
    }
    if rg:
        for name, ratio, cmd in (
            ("rg -c s", "x rg -c", [rg, "-j1", "-c", "NCCL (INFO|WARN)", str(job)]),
            ("rg -P j1 s", "x rg j1", [rg, "-j1", "-P", "-o", RG_FIELDS, str(job)]),
            ("rg -P j2 s", "x rg j2", [rg, "-j2", "-P", "-o", RG_FIELDS, str(job)]),
        ):
            wall = measure(cmd, repeat, cpus).wall
            row[name], row[ratio] = f"{wall:.2f}", f"{analyze.wall / wall:.1f}"
    return row


def cpu_list(text: str) -> frozenset[int]:
    """`0,1` or `0-3`: CPUs this machine lets the benchmark use."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    unknown = cpus - os.sched_getaffinity(0)
    if unknown:
        raise argparse.ArgumentTypeError(f"CPUs {sorted(unknown)} are not available here (have {sorted(os.sched_getaffinity(0))})")
    return frozenset(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512:1024,4096:1024", help="ranks:MB pairs, comma separated")
    parser.add_argument("--workloads", default="genjob,nccl", help="genjob, nccl or both, comma separated")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one tiny job of each workload, one run each")
    parser.add_argument("--markdown", action="store_true", help="also print the table as markdown (for the README)")
    parser.add_argument("--cpus", type=cpu_list, help="pin analyze, rg and the ceiling to these CPUs, e.g. 0,1")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeat = "8:4", 1
    rg = shutil.which("rg")
    if not rg:
        print("ripgrep (rg) not found: its columns are left out", file=sys.stderr)
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, nccl workload from "
          f"{'../shared/perf/gen_logs.py' if SHARED_GEN_LOGS.exists() else 'bench/gen_nccl.py'}"
          + (f", measured on CPUs {','.join(map(str, sorted(args.cpus)))}" if args.cpus else ""))
    print(" | ".join(COLUMNS), flush=True)
    rows = []
    for workload in args.workloads.split(","):
        for spec in args.sizes.split(","):
            ranks, mb = (int(x) for x in spec.split(":"))
            job = job_dir(args.work, workload, ranks, mb)
            row = bench_job(workload, ranks, job, args.repeat, rg, args.cpus)
            rows.append(row)
            print(" | ".join(str(row.get(c, "-")) for c in COLUMNS), flush=True)
    if args.markdown:
        print("\n| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
        for row in rows:
            print("| " + " | ".join(str(row.get(c, "-")) for c in COLUMNS) + " |")


if __name__ == "__main__":
    main()
