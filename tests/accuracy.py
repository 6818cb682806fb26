"""Accuracy of the verdict against every fixture that carries a truth.toml (helper for the tests)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from analyzer.api import analyze

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


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

    @property
    def category_ok(self) -> bool:
        return self.category == self.truth_category

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


def evaluate(case: Path) -> CaseResult:
    truth = tomllib.loads((case / "truth.toml").read_text(encoding="utf-8"))
    verdict = analyze(case / "job").report["verdict"]
    return CaseResult(
        name=case.name,
        truth_category=truth["category"],
        category=verdict["category"],
        truth_ranks=list(truth.get("culprit_ranks", [])),
        truth_hosts=list(truth.get("culprit_hosts", [])),
        ranks=verdict["culprit_ranks"],
        hosts=verdict["culprit_hosts"],
        subset=truth.get("culprit_match") == "subset",
    )


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


if __name__ == "__main__":
    print(summarise([evaluate(c) for c in truth_cases()])[2])
