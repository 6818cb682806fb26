"""Accuracy of the verdict against every fixture that carries a truth.toml (helper for the tests).

`python -m tests.accuracy [--round N]` prints the per-case table and the figures a held-out round is
scored by: category and culprit accuracy, silent failures (a failure case whose verdict is `none`) and
false alarms (a healthy run under fixtures/healthy with any finding, or a benign decoy case whose truth
is `none` with a verdict). A case's round is its truth.toml `round`; a healthy run's is `round` in the
`about.toml` beside its job/ (runs without one belong to no round).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from analyzer.api import NothingToAnalyse, analyze

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# The verdict recorded for a job the analyzer refuses (exit 2, nothing of a known format): no verdict at all.
UNREAD = "cannot_analyse"


@dataclass
class CaseResult:
    name: str
    truth_category: str
    category: str
    truth_ranks: list[int]
    truth_hosts: list[str]
    ranks: list[int]
    hosts: list[str]
    subset: bool
    round: int | None = None

    @property
    def category_ok(self) -> bool:
        return self.category == self.truth_category

    @property
    def silent(self) -> bool:
        """A failure the analyzer did not report at all."""
        return self.truth_category != "none" and self.category in ("none", UNREAD)

    @property
    def false_alarm(self) -> bool:
        """A benign run (truth `none`) that got a verdict."""
        return self.truth_category == "none" and self.category not in ("none", UNREAD)

    @property
    def has_culprit(self) -> bool:
        return bool(self.truth_ranks or self.truth_hosts)

    @property
    def culprit_ok(self) -> bool:
        """Ranks: exact set, or any non-empty subset where the truth says `culprit_match = "subset"`.
        Hosts: a non-empty subset of the truth (excerpts often show only some of the hosts)."""
        if self.truth_ranks:
            got, want = set(self.ranks), set(self.truth_ranks)
            if not (got == want or (self.subset and got and got <= want)):
                return False
        if self.truth_hosts and not self.truth_ranks:
            got = set(self.hosts)
            if not got or not got <= set(self.truth_hosts):
                return False
        return True


def truth_cases() -> list[Path]:
    return sorted(p.parent for p in FIXTURES.glob("*/*/truth.toml"))


@cache  # the decoys and benign runs are scored by three tests of one module: each job is analysed once a process
def evaluate(case: Path) -> CaseResult:
    truth = tomllib.loads((case / "truth.toml").read_text(encoding="utf-8"))
    try:
        verdict = analyze(case / "job").report["verdict"]
    except NothingToAnalyse:
        verdict = {"category": UNREAD, "culprit_ranks": [], "culprit_hosts": []}
    return CaseResult(
        name=case.name,
        truth_category=truth["category"],
        category=verdict["category"],
        truth_ranks=list(truth.get("culprit_ranks", [])),
        truth_hosts=list(truth.get("culprit_hosts", [])),
        ranks=verdict["culprit_ranks"],
        hosts=verdict["culprit_hosts"],
        subset=truth.get("culprit_match") == "subset",
        round=truth.get("round"),
    )


@dataclass
class HealthyResult:
    name: str
    category: str
    findings: int
    round: int | None

    @property
    def false_alarm(self) -> bool:
        return self.category != "none" or self.findings > 0


def healthy_runs() -> list[Path]:
    return sorted(p.parent for p in (FIXTURES / "healthy").glob("*/job"))


@cache
def evaluate_healthy(run: Path) -> HealthyResult:
    about = run / "about.toml"
    meta = tomllib.loads(about.read_text(encoding="utf-8")) if about.is_file() else {}
    report = analyze(run / "job").report
    return HealthyResult(run.name, report["verdict"]["category"], len(report["findings"]), meta.get("round"))


def round_figures(results: list[CaseResult], healthy: list[HealthyResult]) -> str:
    """The first-contact line of a held-out round: what the README's held-out table records. Category and
    silent count the failure cases; the benign decoys (truth `none`) and healthy runs count only as false alarms."""
    with_culprit = [r for r in results if r.has_culprit]
    failures = [r for r in results if r.truth_category != "none"]
    benign = [r for r in results if r.truth_category == "none"]
    alarms = sum(r.false_alarm for r in benign) + sum(h.false_alarm for h in healthy)
    return (f"category {sum(r.category_ok for r in failures)}/{len(failures)}, "
            f"culprit {sum(r.culprit_ok for r in with_culprit)}/{len(with_culprit)}, "
            f"silent {sum(r.silent for r in failures)}/{len(failures)}, "
            f"false alarms {alarms}/{len(benign) + len(healthy)} "
            f"(healthy runs {len(healthy)}, benign decoys {len(benign)})")


def summarise(results: list[CaseResult]) -> tuple[float, float, str]:
    category_acc = sum(r.category_ok for r in results) / len(results)
    with_culprit = [r for r in results if r.has_culprit]
    culprit_acc = sum(r.culprit_ok for r in with_culprit) / len(with_culprit) if with_culprit else 1.0
    lines = [f"{'case':58} {'truth':34} {'verdict':34} cat culprit"]
    for r in results:
        culprit = ("ok" if r.culprit_ok else f"MISS {r.ranks or ''}{r.hosts or ''} want {r.truth_ranks or ''}{r.truth_hosts or ''}") if r.has_culprit else "-"
        lines.append(f"{r.name:58} {r.truth_category:34} {r.category:34} {'ok ' if r.category_ok else 'BAD'} {culprit}")
    per_category: dict[str, list[bool]] = {}
    for r in results:
        per_category.setdefault(r.truth_category, []).append(r.category_ok)
    lines.append("per category: " + ", ".join(f"{c} {sum(v)}/{len(v)}" for c, v in sorted(per_category.items())))
    lines.append(f"category accuracy {category_acc:.0%} ({sum(r.category_ok for r in results)}/{len(results)}); "
                 f"culprit accuracy {culprit_acc:.0%} ({sum(r.culprit_ok for r in with_culprit)}/{len(with_culprit)} cases that name a culprit)")
    return category_acc, culprit_acc, "\n".join(lines)


def _round_of(toml_file: Path) -> int | None:
    return tomllib.loads(toml_file.read_text(encoding="utf-8")).get("round") if toml_file.is_file() else None


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.accuracy", description=__doc__.splitlines()[0])
    parser.add_argument("--round", type=int, help="only the cases and healthy runs of this held-out round")
    args = parser.parse_args(argv)
    cases, runs = truth_cases(), healthy_runs()
    if args.round is not None:  # chosen before analysing: a round's score then costs its own cases only
        cases = [c for c in cases if _round_of(c / "truth.toml") == args.round]
        runs = [h for h in runs if _round_of(h / "about.toml") == args.round]
        if not cases:
            raise SystemExit(f"no case has round = {args.round} in its truth.toml")
    results = [evaluate(c) for c in cases]
    healthy = [evaluate_healthy(h) for h in runs]
    print(summarise(results)[2])
    for h in healthy:
        print(f"healthy {h.name:50} {h.category:34} {'FALSE ALARM' if h.false_alarm else 'ok'}"
              f"{f' ({h.findings} findings)' if h.findings else ''}")
    silent = [r.name for r in results if r.silent]
    print(("silent failures: " + ", ".join(silent)) if silent else "silent failures: none")
    print(f"{'round ' + str(args.round) if args.round is not None else 'whole corpus'}: {round_figures(results, healthy)}")


if __name__ == "__main__":
    main()
