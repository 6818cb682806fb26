"""Batch (fleet page, HTML): one self-contained page for a scan's `FleetView`.

The page is `templates/fleet.html.j2`, which extends the base the job report shares
(`analyzer.render.page`): the same head, policy, header and footer, autoescaped. No script and
nothing loaded from the network (incident machines are often offline); the style is inline. Every
string that came from a log or a path (host names, job paths, summaries, errors) is text to the
template, and numbers are formatted there, never interpolated raw. A long job path wraps inside its
cell, after a `/` where it can (`<wbr>`) and anywhere else where it must, so a table never grows
wider than the page.
"""

from __future__ import annotations

from analyzer import __version__
from analyzer.fleet.view import FleetView
from analyzer.render import page

TOTALS = (("jobs", "jobs"), ("failed", "failed"), ("no_failure", "no failure found"),
          ("cannot_analyse", "could not be analysed"), ("timed_out", "timed out"),
          ("over_memory", "over the memory budget"), ("crashed", "crashed the analyzer"))


def render_fleet_html(view: FleetView, title: str = "postmortem fleet view", top: int = 50) -> str:
    """The page: totals, repeat-offender hosts and GPUs, recurring signatures (each its `top`
    rows), the jobs by category, every failed job and every job not analysed."""
    hosts = view.hosts.head(top)
    return page.environment_with("analyzer.fleet").get_template("fleet.html.j2").render(
        title=title,
        version=__version__,
        csp=page.policy("default-src 'none'", "style-src 'unsafe-inline'"),
        css=page.inline(page.asset("analyzer.fleet", "assets", "fleet.css"), "style"),
        view=view,
        totals=TOTALS,
        hosts=hosts.to_dicts(),
        max_failed_jobs=max([1, *view.hosts.get_column("failed_jobs").to_list()]),
        gpus=view.gpus.head(top).to_dicts(),
        signatures=view.signatures.head(top).to_dicts(),
        categories=view.categories.to_dicts(),
        failed=view.failed.to_dicts(),
        problems=view.problems.to_dicts(),
    )
