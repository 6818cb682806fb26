"""Benchmark: a hung job's Flight Recorder dumps from thousands of ranks, analysed end to end.

    python bench/bench_fr.py [--ranks 4096 16384] [--entries 2000] [--dir .bench] [--regenerate]
                             [--pool-min N] [--repeat 1]

For each size, tests/frgen.py writes a dump set built from a real recorded dump (one
`nccl_trace_rank_<R>` pickle per rank, a full ring buffer of `--entries` entries, as with
TORCH_FR_BUFFER_SIZE=2000): every rank waits in the gradient all_reduce of the stuck step except
one culprit that never arrived, and one other rank's dump is missing. The set is kept under
`--dir` (`.bench/` is git-ignored) and reused by later runs.

The analysis (`analyzer.api.analyze`, the whole pipeline and the report) runs in a fresh child
process, whose stages are timed by wrapping the pipeline functions `analyzer.api` calls; it
prints wall time per stage, CPU time, the peak RSS of the child and of its parse workers
(`resource.getrusage`), the verdict, and how many of a sample of the dumps (every 64th) the
partial decode reads, by the prefix it took (a dump it declines is read in full). `--pool-min` sets `analyzer.parse.POOL_MIN_DUMPS` in the
child (a huge value parses every dump in the main process: the "before" figure of parallel
parsing). Figures are printed, never asserted; the load average is printed with them because a
shared machine's figures mean little without it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# stage -> the names `analyzer.api` may call it by (the first one it has is timed)
STAGES = {"discover": ("discover_job", "discover"), "parse": ("parse_inputs",), "correlate": ("correlate",),
          "detect": ("detect",), "decide": ("decide",), "report": ("build_report",)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--entries", type=int, default=2000, help="ring-buffer entries per dump")
    parser.add_argument("--dir", type=Path, default=REPO / ".bench", help="where the dump sets are kept")
    parser.add_argument("--regenerate", action="store_true", help="write the dump sets again")
    parser.add_argument("--pool-min", type=int, default=None, help="analyzer.parse.POOL_MIN_DUMPS in the child")
    parser.add_argument("--repeat", type=int, default=1, help="analyse each set this many times")
    parser.add_argument("--src", type=Path, default=None,
                        help="import the analyzer from this checkout instead (e.g. an export of an older commit)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        if args.src is not None:
            sys.path.insert(0, str(args.src.resolve()))
        _child(args.child, args.pool_min)
        return
    for ranks in args.ranks:
        directory, spec = _dump_set(args.dir, ranks, args.entries, args.regenerate)
        for _ in range(args.repeat):
            _analyse(directory, spec, args.pool_min, args.src)


def _dump_set(base: Path, ranks: int, entries: int, regenerate: bool):
    from tests.frgen import DumpSetSpec, write_dump_set

    # The culprit and the missing dump sit mid-job, not at rank 0 or the last rank.
    spec = DumpSetSpec(world=ranks, entries=entries, steps=entries // 3 + 200, culprit=ranks * 5 // 8 + 3,
                       culprit_mode="behind", missing=(ranks // 3 + 1,))
    directory = base / f"fr-{ranks}x{entries}"
    marker = base / f"fr-{ranks}x{entries}.spec"  # outside the job directory: not an input
    if regenerate or not marker.exists() or marker.read_text() != repr(spec):
        started = time.perf_counter()
        if directory.exists():
            shutil.rmtree(directory)
        paths = write_dump_set(directory, spec)
        marker.write_text(repr(spec))
        total = sum(p.stat().st_size for p in paths)
        print(f"generated {len(paths)} dumps ({total / 2**30:.2f} GiB, {total / len(paths) / 1024:.0f} KiB each) "
              f"in {time.perf_counter() - started:.1f} s -> {directory}")
    else:
        sizes = [p.stat().st_size for p in directory.iterdir() if p.name.startswith("nccl_trace_rank_")]
        print(f"reusing {len(sizes)} dumps ({sum(sizes) / 2**30:.2f} GiB, {sum(sizes) / len(sizes) / 1024:.0f} KiB each) in {directory}")
    return directory, spec


def _analyse(directory: Path, spec, pool_min: int | None, src: Path | None) -> None:
    load = os.getloadavg()
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(directory)]
    if pool_min is not None:
        command += ["--pool-min", str(pool_min)]
    if src is not None:
        command += ["--src", str(src)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stdout + done.stderr)
        raise SystemExit(f"analysis child failed with exit code {done.returncode}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    stages = "  ".join(f"{name} {result['stages'].get(name, 0.0):.2f}" for name in STAGES)
    verdict = result["verdict"]
    right = verdict["culprit_ranks"] == [spec.culprit]
    print(f"{spec.world} ranks x {spec.entries} entries (culprit {spec.culprit}, dump of rank {spec.missing[0]} missing), "
          f"load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} on {os.cpu_count()} cores")
    after = os.getloadavg()
    cpu = result["cpu_self"] + result["cpu_children"]
    print(f"  analyze(): {result['wall']:.2f} s wall ({wall:.2f} s with interpreter start-up), "
          f"CPU {cpu:.1f} s = {result['cpu_self']:.1f} s main + {result['cpu_children']:.1f} s parse workers "
          f"({cpu / spec.world * 1000:.2f} ms a dump); load average {after[0]:.1f} at the end; "
          f"parse pool minimum {result['pool_min']} dumps" + (f"; analyzer from {src}" if src else ""))
    print(f"  stages (s): {stages}")
    print(f"  peak RSS: {result['rss_self_mib']:.0f} MiB main process, {result['rss_children_mib']:.0f} MiB largest parse worker; "
          f"{result['events']} events")
    print(f"  verdict: {verdict['category']} culprit {verdict['culprit_ranks']} ({'right' if right else 'WRONG'}), "
          f"confidence {verdict['confidence']}: {verdict['summary'][:200]}")
    print(f"  partial decode: {_partial_decodes(directory)}")


def _partial_decodes(directory: Path, every: int = 64) -> str:
    """How the partial decode reads a sample of the dumps: by the memo prefix it took, or in full."""
    from analyzer.parse.flight_recorder import ENTRIES_KEPT_PER_PG
    from analyzer.parse.fr_partial import decode_recent

    taken: dict[str, int] = {}
    paths = sorted(p for p in directory.iterdir() if p.name.startswith("nccl_trace_rank_"))[::every]
    for path in paths:
        recent = decode_recent(path.read_bytes(), ENTRIES_KEPT_PER_PG)
        key = "full load" if recent is None else f"prefix {recent.prefix}"
        taken[key] = taken.get(key, 0) + 1
    return f"{len(paths)} sampled dumps (every {every}th): " + ", ".join(f"{k} {n}" for k, n in sorted(taken.items()))


def _child(directory: Path, pool_min: int | None) -> None:
    """Analyse `directory` once with every pipeline stage timed; print one JSON line."""
    import resource

    from analyzer import api, parse

    if pool_min is not None:
        parse.POOL_MIN_DUMPS = pool_min
    print(f"analyzer from {Path(api.__file__).parent}", file=sys.stderr)
    stages: dict[str, float] = {}

    def timed(stage: str, fn):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                stages[stage] = stages.get(stage, 0.0) + time.perf_counter() - started
        return run

    for stage, names in STAGES.items():
        name = next(n for n in names if hasattr(api, n))
        setattr(api, name, timed(stage, getattr(api, name)))
    started = time.perf_counter()
    analysis = api.analyze(directory)
    wall = time.perf_counter() - started
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    verdict = analysis.report["verdict"]
    print(json.dumps({
        "wall": wall,
        "stages": stages,
        "cpu_self": me.ru_utime + me.ru_stime,
        "cpu_children": children.ru_utime + children.ru_stime,
        "rss_self_mib": me.ru_maxrss / 1024,  # kilobytes on Linux
        "rss_children_mib": children.ru_maxrss / 1024,
        "events": analysis.events.height,
        "pool_min": getattr(parse, "POOL_MIN_DUMPS", None),
        "verdict": {k: verdict[k] for k in ("category", "culprit_ranks", "confidence", "summary", "rule_id")},
    }))


if __name__ == "__main__":
    main()
