"""End-to-end benchmark of `postmortem analyze` against ripgrep, on generated job directories.

    python bench/bench_analyze.py                 # 64 ranks/100 MB, 512 ranks/1 GB, 4096 ranks/1 GB
    python bench/bench_analyze.py --sizes 512:10240   # add the 10 GB point (needs ~11 GB of disk)

For each job it prints MB/s, lines/s and peak RSS of the analysis (run in a child process, as a
user would run it), and, measured in the same run on the same files: `rg -c` counting NCCL lines
(1 thread) and `rg -P -o` extracting the same fields the analyzer extracts (1 and 2 threads).
The ratio column is analyze time / rg time: lower is better. Generated jobs are cached under
--work (default .bench/, git-ignored) so repeated runs measure warm page cache.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.genjob import generate  # noqa: E402

# The fields the analyzer pulls from every candidate line, as one PCRE2 pattern for ripgrep.
RG_FIELDS = (
    r"^(?:\[rank(\d+)\]:)?(?:\[([IWEF])\d{4} [\d:.]+ [\w.]+:\d+\] )?"
    r"(?:([\w.\-]+):(\d+):(\d+) \[(\d+)\] NCCL (INFO|WARN) |.*WorkNCCL\(SeqNum=(\d+), OpType=(\w+)|.*(\w+Error): )"
)

CHILD = r"""
import json, resource, sys, time
t = time.perf_counter()
from analyzer.api import analyze
result = analyze(sys.argv[1])
elapsed = time.perf_counter() - t
print(json.dumps({
    "seconds": elapsed,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "lines": sum(i.lines for i in result.inputs),
    "verdict": result.report["verdict"]["category"],
    "culprits": result.report["verdict"]["culprit_ranks"],
}))
"""


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(cmd: list[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        best = min(best, time.perf_counter() - start)
    return best


def analyze_child(job: Path, repeat: int) -> dict:
    best: dict | None = None
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD, str(job)], capture_output=True, text=True, cwd=ROOT, check=True)
        run = json.loads(out.stdout.strip().splitlines()[-1])
        if best is None or run["seconds"] < best["seconds"]:
            best = run
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64:100,512:1024,4096:1024", help="ranks:MB pairs, comma separated")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    rg = shutil.which("rg")
    args.work.mkdir(parents=True, exist_ok=True)
    header = f"{'job':>16} {'MB':>7} {'lines':>11} {'analyze s':>9} {'MB/s':>7} {'Mlines/s':>8} {'peak RSS MB':>11} {'verdict':>28}"
    if rg:
        header += f" {'rg -c s':>8} {'x':>6} {'rg -P j1 s':>10} {'x':>6} {'rg -P j2 s':>10} {'x':>6}"
    print(header)
    for spec in args.sizes.split(","):
        ranks, mb = (int(x) for x in spec.split(":"))
        job = args.work / f"job-{ranks}r-{mb}mb"
        if not job.exists():
            generate(args.work, ranks, mb << 20)
        size_mb = directory_bytes(job) / 2**20
        run = analyze_child(job, args.repeat)
        row = (f"{job.name:>16} {size_mb:7.0f} {run['lines']:11,d} {run['seconds']:9.2f} {size_mb / run['seconds']:7.0f} "
               f"{run['lines'] / run['seconds'] / 1e6:8.2f} {run['peak_rss_mb']:11.0f} "
               f"{run['verdict'] + str(run['culprits']):>28}")
        if rg:
            count = timed([rg, "-j1", "-c", "NCCL (INFO|WARN)", str(job)], args.repeat)
            pcre1 = timed([rg, "-j1", "-P", "-o", RG_FIELDS, str(job)], args.repeat)
            pcre2 = timed([rg, "-j2", "-P", "-o", RG_FIELDS, str(job)], args.repeat)
            row += (f" {count:8.2f} {run['seconds'] / count:6.1f} {pcre1:10.2f} {run['seconds'] / pcre1:6.1f}"
                    f" {pcre2:10.2f} {run['seconds'] / pcre2:6.1f}")
        print(row, flush=True)


if __name__ == "__main__":
    main()
