"""Generate a night of job directories from the real fixtures, for the scan and fleet tests.

`make_jobs(dest, n)` copies `fixtures/cases/*/job` and `fixtures/healthy/*/job` round-robin into
`dest/night-a/job-000`, `dest/night-b/job-001`, ... (the two `night-*` levels exercise the scan's
descent through directories that hold no logs). Every copy gets its own host names:

- The hosts of a source are found the way they appear in logs, with no analyzer code involved:
  NCCL's `host:pid:tid ` line prefix, pdsh / DeepSpeed `host: ` line labels (a name with a digit
  or a hyphen that labels at least `MIN_LABEL_LINES` lines of one file, as `ValueError: ` does not)
  and the `host : NAME` field of torchrun's failure table.
- Each host name is replaced wherever it occurs as a whole token (not inside a longer name or
  path component that continues with a word character), in every text file of the copy, so the
  prefixes, labels and any message naming the host stay consistent.
- The new names are unique per job (`n042-0`, `n042-1`, ...), except that in every job whose
  source has hosts, the source's first host (sorted by name) becomes one of `RECURRING`,
  alternating between them. Those two hosts therefore recur across many jobs; whether a job's
  verdict *names* them is the analyzer's business (the tests read that from the verdicts).

Files that are not UTF-8 text are copied unchanged. The returned `GeneratedJob` list records the
source fixture and the host map of every job, so a test can predict one copy's verdict from its
source's verdict without analysing all copies twice.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RECURRING = ("gpu-node-017", "gpu-node-042")
MIN_LABEL_LINES = 3

_NCCL_PREFIX = re.compile(r"(?:^|(?<=[\s\]>|:]))([\w.\-]+):\d+:\d+ (?=\[\d+\] |NCCL |\S+:\d+ )", re.MULTILINE)
_PDSH_LABEL = re.compile(r"^([A-Za-z][\w.\-]*[\d\-][\w.\-]*): ", re.MULTILINE)
_TABLE_HOST = re.compile(r"^\s*host\s*:\s*(\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class GeneratedJob:
    path: Path
    source: Path  # the fixture's job directory
    hosts: dict[str, str] = field(default_factory=dict)  # original host -> new host


def sources() -> list[Path]:
    return sorted(FIXTURES.glob("cases/*/job")) + sorted(FIXTURES.glob("healthy/*/job"))


def _text_files(job: Path) -> list[tuple[Path, str]]:
    texts = []
    for path in sorted(p for p in job.rglob("*") if p.is_file()):
        try:
            texts.append((path, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue
    return texts


def hosts_in(job: Path) -> list[str]:
    """Host names as the logs print them (see the module docstring for where they are looked for)."""
    found: set[str] = set()
    for _, text in _text_files(job):
        found.update(_NCCL_PREFIX.findall(text))
        found.update(_TABLE_HOST.findall(text))
        labels = Counter(_PDSH_LABEL.findall(text))
        found.update(name for name, count in labels.items() if count >= MIN_LABEL_LINES)
    return sorted(found)


def _token(host: str) -> re.Pattern[str]:
    # Not preceded by a name character; not followed by one (a trailing '.' that ends a sentence is fine).
    return re.compile(r"(?<![\w.\-])" + re.escape(host) + r"(?![\w\-]|\.\w)")


def rewrite_hosts(text: str, host_map: dict[str, str]) -> str:
    # Longest names first, so that `node-1` cannot eat the start of `node-10`.
    for old in sorted(host_map, key=len, reverse=True):
        text = _token(old).sub(host_map[old], text)
    return text


def make_jobs(dest: Path, n: int = 200, recurring: tuple[str, str] = RECURRING) -> list[GeneratedJob]:
    """Write `n` job directories under `dest`; return what each one was made from."""
    pool = sources()
    source_hosts = {src: hosts_in(src) for src in pool}
    source_texts = {src: _text_files(src) for src in pool}
    jobs: list[GeneratedJob] = []
    hosted = 0
    for index in range(n):
        src = pool[index % len(pool)]
        host_map = {old: f"n{index:03d}-{k}" for k, old in enumerate(source_hosts[src])}
        if host_map:
            host_map[source_hosts[src][0]] = recurring[hosted % len(recurring)]
            hosted += 1
        target = dest / f"night-{'ab'[index % 2]}" / f"job-{index:03d}"
        shutil.copytree(src, target)
        for path, text in source_texts[src]:
            copy = target / path.relative_to(src)
            copy.write_text(rewrite_hosts(text, host_map), encoding="utf-8")
        jobs.append(GeneratedJob(target, src, host_map))
    return jobs
