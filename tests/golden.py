"""Golden reports: the JSON report of every fixture job, committed, so a change of behaviour is seen.

    python -m tests.golden            # compare; lists the fixtures whose report changed
    python -m tests.golden --update   # rewrite tests/golden/ (commit it with the reason)

A restructuring must leave every golden report identical; a deliberate change of a verdict, a
finding or an evidence line updates the golden set in the same commit. Values that depend on the
checkout rather than on the analysis (file modification times, the analyzer version) are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"
FIXTURE_JOBS = ("fixtures/cases/*/job", "fixtures/recorded/*/job", "fixtures/healthy/*/job", "fixtures/drift/recorded/*",
                "fixtures/traces/*/*", "fixtures/nccl-tests/*/job")
VOLATILE_KEYS = {"analyzer_version", "mtime", "mtime_ns", "modified", "modified_at", "age_s", "seconds"}


def fixture_jobs() -> list[Path]:
    found = {p for pattern in FIXTURE_JOBS for p in ROOT.glob(pattern) if p.is_dir()}
    return sorted(found)


def golden_name(job: Path) -> str:
    return job.relative_to(ROOT).as_posix().replace("/", "__") + ".json"


def stable(value: object) -> object:
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def report_of(job: Path) -> dict:
    """The report as `postmortem analyze --format json` writes it, or the refusal when it cannot analyse."""
    from analyzer.api import analyze
    from analyzer.exits import CannotAnalyse
    from analyzer.io import DiscoveryError

    try:
        return stable(json.loads(json.dumps(analyze(job.relative_to(ROOT)).report, ensure_ascii=False)))
    except (CannotAnalyse, DiscoveryError) as exc:
        return {"cannot_analyse": str(exc)}


def differences() -> list[str]:
    changed = []
    for job in fixture_jobs():
        path = GOLDEN / golden_name(job)
        if not path.exists() or json.loads(path.read_text(encoding="utf-8")) != report_of(job):
            changed.append(job.relative_to(ROOT).as_posix())
    stale = {p.name for p in GOLDEN.glob("*.json")} - {golden_name(j) for j in fixture_jobs()}
    return changed + [f"(no fixture any more) {name}" for name in sorted(stale)]


def update() -> int:
    import os

    os.chdir(ROOT)
    GOLDEN.mkdir(exist_ok=True)
    for stale in GOLDEN.glob("*.json"):
        stale.unlink()
    for job in fixture_jobs():
        text = json.dumps(report_of(job), indent=1, ensure_ascii=False, sort_keys=False) + "\n"
        (GOLDEN / golden_name(job)).write_text(text, encoding="utf-8")
    return len(fixture_jobs())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", action="store_true")
    args = parser.parse_args()
    if args.update:
        print(f"{update()} golden reports written to {GOLDEN.relative_to(ROOT)}")
        return 0
    import os

    os.chdir(ROOT)
    changed = differences()
    print("\n".join(changed) or "every golden report is current")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
