"""Time and peak memory of `postmortem analyze` on the large hostile inputs (issue: bounded results).

    python bench/bench_bad_input.py                   # every item
    python bench/bench_bad_input.py --only one-line   # items whose name contains the word

Each item is generated once under --work (default .bench/bad-inputs, git-ignored) and analysed by
the CLI in a child process, as a user would run it; the child prints its own wall and CPU time
and its peak RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`). The table shows those with the
exit code and what the report says about the item. The bound the project holds to: the 200 MB
file with no newline peaks under 1 GiB (the last line says so; exit status 1 if it does not).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20
RSS_BOUND_MB = 1024
WARN_LINE = ("kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer 10.0.35.1<49189> "
             "with error 4, opcode 5327, len 5327, vendor err 81 (Send)")

CHILD = r"""
import json, resource, sys, time
wall, cpu = time.perf_counter(), time.process_time()
import click
from analyzer.cli import main
code, message = 0, ""
try:
    main(["analyze", sys.argv[1], "--format", "json", "--output", sys.argv[2]], standalone_mode=False)
except SystemExit as exc:
    code = exc.code
except click.ClickException as exc:
    code, message = exc.exit_code, exc.format_message()
print(json.dumps({
    "seconds": time.perf_counter() - wall,
    "cpu_seconds": time.process_time() - cpu,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "exit": code,
    "message": message,
}))
"""


def _write_repeated(path: Path, block: bytes, total: int) -> None:
    with open(path, "wb") as fh:
        written = 0
        while written < total:
            fh.write(block)
            written += len(block)


def _gzip_members(chunk: bytes, copies: int) -> bytes:
    return gzip.compress(chunk, compresslevel=9, mtime=0) * copies


def one_line(job: Path) -> str:
    _write_repeated(job / "one-line.log", (WARN_LINE + " ").encode() * 4096, 200 * MB)
    return "one-line.log"


def one_line_utf16(job: Path) -> str:
    _write_repeated(job / "one-line-utf16.log", (WARN_LINE + " ").encode("utf-16-le") * 2048, 200 * MB)
    return "one-line-utf16.log"


def tar_member_one_line(job: Path) -> str:
    source = job.parent / f"{job.name}.member"
    _write_repeated(source, (WARN_LINE + " ").encode() * 4096, 200 * MB)
    with tarfile.open(job / "logs.tar", "w") as tar:
        tar.add(source, arcname="rank0/one-line.log")
    source.unlink()
    return "logs.tar!rank0/one-line.log"


def nul_padding(job: Path) -> str:
    with open(job / "nul-padded.log", "wb") as fh:
        fh.write((WARN_LINE + "\n").encode() * 1000)
        for _ in range(200):
            fh.write(bytes(MB))
    return "nul-padded.log"


def gzip_bomb_one_line(job: Path) -> str:
    (job / "bomb.log.gz").write_bytes(_gzip_members(b"A" * MB, 1024))  # 1 GiB of one line in ~1 MB
    return "bomb.log.gz"


def gzip_bomb_zeros(job: Path) -> str:
    (job / "zeros.log.gz").write_bytes(_gzip_members(bytes(MB), 4096))  # 4 GiB of NULs
    return "zeros.log.gz"


def gzip_bomb_short_lines(job: Path) -> str:
    (job / "lines.log.gz").write_bytes(_gzip_members(b"x\n" * (MB // 2), 1024))  # 1 GiB of 2-byte lines
    return "lines.log.gz"


def tiny_files(job: Path) -> str:
    for i in range(100_000):
        (job / f"r{i:06d}.log").write_text(f"[rank{i}]:[W1130 14:57:21.464574780 Utils.hpp:137] Warning: tiny file {i}\n")
    return "r000000.log"


ITEMS = {
    "one-line-200MB": one_line,
    "one-line-200MB-utf16": one_line_utf16,
    "tar-member-one-line-200MB": tar_member_one_line,
    "nul-padding-200MB": nul_padding,
    "gzip-bomb-one-line-1GiB": gzip_bomb_one_line,
    "gzip-bomb-zeros-4GiB": gzip_bomb_zeros,
    "gzip-bomb-short-lines-1GiB": gzip_bomb_short_lines,
    "tiny-files-100000": tiny_files,
}
BOUNDED = "one-line-200MB"


def prepare(work: Path, name: str) -> tuple[Path, str]:
    job = work / name
    marker = work / f"{name}.ready"
    if marker.exists():
        return job, marker.read_text()
    if job.exists():
        import shutil

        shutil.rmtree(job)
    job.mkdir(parents=True)
    entry = ITEMS[name](job)
    marker.write_text(entry)
    return job, entry


def measure(job: Path, entry: str, work: Path) -> dict:
    out = work / f"{job.name}.report.json"
    out.unlink(missing_ok=True)
    run = subprocess.run([sys.executable, "-c", CHILD, str(job), str(out)], capture_output=True, text=True, cwd=ROOT)
    if run.returncode != 0 or not run.stdout.strip():
        raise SystemExit(f"{job.name}: the child failed:\n{run.stderr[-3000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    if out.exists():
        inputs = {i["file"]: i for i in json.loads(out.read_text())["inputs"]}
        item = inputs.get(entry, {})
        result["status"] = f"{item.get('status', '?')}: {item.get('reason', '')}"[:90]
        result["inputs"] = len(inputs)
    else:
        result["status"] = result["message"][:90]
        result["inputs"] = 0
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "bad-inputs")
    parser.add_argument("--only", help="run the items whose name contains this")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    names = [n for n in ITEMS if not args.only or args.only in n]
    print(f"{'item':28} {'disk MB':>8} {'wall s':>7} {'cpu s':>7} {'peak RSS MB':>11} {'exit':>4}  report says")
    results = {}
    for name in names:
        job, entry = prepare(args.work, name)
        disk = sum(p.stat().st_size for p in job.rglob("*") if p.is_file()) / MB
        result = results[name] = measure(job, entry, args.work)
        print(f"{name:28} {disk:8.1f} {result['seconds']:7.2f} {result['cpu_seconds']:7.2f} "
              f"{result['peak_rss_mb']:11.0f} {result['exit']:>4}  {result['status']}", flush=True)
    if BOUNDED in results:
        peak = results[BOUNDED]["peak_rss_mb"]
        verdict = "ok" if peak < RSS_BOUND_MB else "OVER THE BOUND"
        print(f"\n200 MB file with no newline: peak RSS {peak:.0f} MB (bound {RSS_BOUND_MB} MB): {verdict}")
        return 0 if peak < RSS_BOUND_MB else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
