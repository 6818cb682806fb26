"""The long fuzz run: the properties of tests/test_fuzz.py with many random examples each (not CI).

    python -m tests.fuzz_long --examples 100000            # every property, random seeds
    python -m tests.fuzz_long --examples 5000 -k grammar   # the properties whose name matches
    python -m tests.fuzz_long --database .fuzz-db          # keep failing examples to replay later

CI runs the same tests derandomized with a few dozen examples each. Here the examples are random
(pass --seed to repeat a run), pytest stops at the first failure, and Hypothesis prints the
shrunk failing input and a `@reproduce_failure` line to paste above the test. Runs until every
property has had its examples or one fails; hours at 100,000 examples.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz_long", description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10_000, help="examples per property (default 10000)")
    parser.add_argument("--seed", type=int, help="Hypothesis seed, to repeat a run")
    parser.add_argument("-k", dest="keyword", help="only the properties whose test name matches (pytest -k)")
    parser.add_argument("--database", type=Path, help="directory that keeps failing examples between runs")
    args = parser.parse_args(argv)

    os.environ["POSTMORTEM_FUZZ_EXAMPLES"] = str(args.examples)
    os.environ["POSTMORTEM_FUZZ_RANDOM"] = "1"
    if args.database:
        os.environ["POSTMORTEM_FUZZ_DB"] = str(args.database.resolve())
    import pytest

    pytest_args = [str(ROOT / "tests" / "test_fuzz.py"), "-x", "-q", "-p", "no:cacheprovider",
                   "--hypothesis-show-statistics", "-o", "addopts="]
    if args.seed is not None:
        pytest_args.append(f"--hypothesis-seed={args.seed}")
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    return pytest.main(pytest_args)


if __name__ == "__main__":
    sys.exit(main())
