"""The command line (support): the one console every command prints its summary or report on."""

from __future__ import annotations

from rich.console import Console

PIPE_WIDTH = 4096  # piped or redirected: lines as long as they are


def report_console(*, to_terminal: bool | None = None) -> Console:
    """The terminal's own width and colours on a terminal; piped, redirected or to a file, lines as
    long as they are (no hard wrap) and no colour codes."""
    terminal = Console().is_terminal if to_terminal is None else to_terminal
    if terminal:
        return Console(highlight=False, emoji=False)
    return Console(width=PIPE_WIDTH, soft_wrap=True, no_color=True, color_system=None, highlight=False, emoji=False)
