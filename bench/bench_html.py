"""Benchmark of the HTML incident report: file size and time to first render in headless Chromium.

    python bench/bench_html.py                       # 1,024 and 16,384 ranks, one log file per host
    python bench/bench_html.py --layout torchrun     # torchrun --log-dir layout, 2 files per rank
    python bench/bench_html.py --ranks 4096 --loads 5 --screenshots /tmp/shots

Jobs are synthetic hangs (every rank but one times out in ALLREDUCE #35): `tests/synth_job.py`
(one file per host of 8 ranks, one odd rank, a script tag in a log line) or `bench/genjob.py`
(torchrun layout, NCCL init chatter and training steps on every rank). For each size it prints the
analysis and render times (Python), the report's size, and from Chromium (system /usr/bin/chromium,
never downloaded) the time from navigation start to the timeline's first render (the page's
`pm-timeline-ready` performance mark), median over --loads fresh loads. Budget at 16,384 ranks:
under 5 MB and under 3 s; the exit status is 1 when a size at or above 16,384 ranks misses it.
Jobs are cached under --work (default .bench/html, git-ignored).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analyzer.api import analyze  # noqa: E402
from analyzer.render.html import render_html  # noqa: E402
from tests.browser_util import headless_chromium, unavailable_reason  # noqa: E402

BUDGET_BYTES = 5 * 1024 * 1024
BUDGET_MS = 3000.0
BUDGET_FROM_RANKS = 16384


def make_job(work: Path, layout: str, ranks: int) -> Path:
    if layout == "host":
        from tests.synth_job import write_job

        job = work / f"host-{ranks}"
        if not (job / "gpu-00000.log").exists():
            write_job(job, ranks)
        return job
    from bench.genjob import generate

    done = work / f"torchrun-{ranks}.done"
    job = work / f"torchrun-{ranks}"
    if not done.exists():
        generate(job, ranks, ranks * 4096)  # the generator's minimum: init chatter plus a few steps per rank
        done.write_text("ok")
    return next(job.iterdir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--layout", choices=["host", "torchrun"], default="host")
    parser.add_argument("--loads", type=int, default=3, help="page loads per report (median reported)")
    parser.add_argument("--work", type=Path, default=ROOT / ".bench" / "html")
    parser.add_argument("--screenshots", type=Path, help="save one screenshot per report here")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"cannot measure load times: {reason}", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    with headless_chromium() as browser:
        for ranks in args.ranks:
            job = make_job(args.work, args.layout, ranks)
            t = time.perf_counter()
            analysis = analyze(job)
            analysed = time.perf_counter() - t
            t = time.perf_counter()
            page = render_html(analysis)
            rendered = time.perf_counter() - t
            out = args.work / f"report-{args.layout}-{ranks}.html"
            out.write_text(page, encoding="utf-8")
            size = out.stat().st_size
            ready, errors, lanes = [], [], None
            for _ in range(args.loads):
                load = browser.load(out, timeout=120)
                errors += load.console_errors + load.traps.get("errors", []) + load.traps.get("csp", [])
                if load.state != "ready" or load.ready_ms is None:
                    errors.append(f"timeline state {load.state!r}")
                    break
                ready.append(load.ready_ms)
                lanes = browser.js("return window.postmortemTimeline.rows().length")
            if args.screenshots:
                args.screenshots.mkdir(parents=True, exist_ok=True)
                browser.screenshot(args.screenshots / f"{args.layout}-{ranks}.png")
            first = statistics.median(ready) if ready else float("nan")
            over = ranks >= BUDGET_FROM_RANKS and (size >= BUDGET_BYTES or not first < BUDGET_MS)
            rows.append((ranks, analysis.events.height, len(analysis.inputs), lanes, analysed, rendered, size, first,
                         bool(errors), over))
            if errors:
                print(f"{ranks} ranks: page errors: {errors[:5]}", file=sys.stderr)
    header = ("ranks", "events", "files", "lanes", "analyze s", "render s", "size MB", "first render ms", "errors", "budget")
    print(f"layout: {args.layout}; budget at {BUDGET_FROM_RANKS}+ ranks: < {BUDGET_BYTES / 2**20:.0f} MB, < {BUDGET_MS:.0f} ms")
    print(" | ".join(header))
    for ranks, events, files, lanes, analysed, rendered, size, first, errors, over in rows:
        verdict = "-" if ranks < BUDGET_FROM_RANKS else ("OVER" if over else "ok")
        print(f"{ranks} | {events} | {files} | {lanes} | {analysed:.2f} | {rendered:.2f} | {size / 2**20:.2f} | "
              f"{first:.0f} | {'yes' if errors else 'no'} | {verdict}")
    return 1 if any(over or errors for *_, errors, over in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
