"""`python -m analyzer.cli`: the `postmortem` command."""

from analyzer.cli import main

main()
