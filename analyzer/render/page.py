"""Stage 7, render (HTML pages): the Jinja2 environment the job report and the fleet page share.

Templates are files of the package (`analyzer/render/templates/*.html.j2`), loaded once per
process. `base.html.j2` holds what both pages have (the head with its Content-Security-Policy,
the inlined style and scripts, the header and the footer); each page extends it. Autoescaping is
on for every template: a value is text unless it is `Markup`, and only what this package built is
`Markup`: an inlined asset (`inline`, which refuses one that could end its element early), the JSON
of a data element (`script_json`, safe against `</script` and `<!--`), a policy made of fixed
tokens and hashes (`policy`), and rule prose rendered from Markdown with the HTML of its source
disabled (`markdown`).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from jinja2 import BaseLoader, ChoiceLoader, Environment, PackageLoader, StrictUndefined
from markdown_it import MarkdownIt
from markupsafe import Markup

from analyzer.ranks import format_ranks


@cache
def asset(package: str, *parts: str) -> str:
    """A text file shipped inside `package` (a page's style or script)."""
    return resources.files(package).joinpath(*parts).read_text(encoding="utf-8")


def inline(source: str, element: str) -> Markup:
    """`source` as the raw text of a <script> or <style> element: such an element ends at the
    first `</script` (or `</style`) whatever the code means by it, so one inside is refused."""
    if f"</{element}" in source.lower():
        raise ValueError(f"inline {element} contains '</{element}'")
    return Markup(source)


def policy(*directives: str) -> Markup:
    """A Content-Security-Policy from our own directives: fixed keywords and base64 hashes, never
    a character that an attribute value would need escaped."""
    text = "; ".join(directives)
    if any(c in text for c in '"<>&'):
        raise ValueError(f"unexpected character in the policy {text!r}")
    return Markup(text)


def json_text(value) -> str:
    """`value` as compact JSON, deterministic (no NaN: a missing figure is null)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def script_safe(raw: str) -> Markup:
    """JSON text as the content of a <script type="application/json"> element.

    Inside a script element only `</script` and `<!--` are dangerous; every <, > and & becomes its
    JSON unicode escape, which removes both and keeps the JSON identical once parsed (U+2028 and
    U+2029 too, for readers that take the text as JavaScript)."""
    safe = raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(safe.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def script_json(value) -> Markup:
    return script_safe(json_text(value))


@cache
def _markdown() -> MarkdownIt:
    # HTML in the source is shown as text; links and images are left as written: the page is
    # offline by construction and never points anywhere.
    return MarkdownIt("commonmark", {"html": False}).disable(["link", "image", "autolink"])


def markdown(text: str | None) -> Markup:
    """Rule prose (remediation) as HTML: paragraphs, numbered steps as <ol>, `code` as <code>."""
    return Markup(_markdown().render(text or ""))


def confidence(value: float) -> str:
    """`0.85 (high)`: the figure and the word a reader acts on."""
    word = next(w for threshold, w in ((0.85, "high"), (0.6, "medium"), (0.0, "low")) if value >= threshold)
    return f"{value:.2f} ({word})"


def _environment(loader: BaseLoader) -> Environment:
    # A missing value (None) prints as nothing, never as "None"; a name the context lacks is an error.
    env = Environment(loader=loader, autoescape=True, undefined=StrictUndefined, finalize=lambda v: "" if v is None else v,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(markdown=markdown, script_json=script_json, ranks=lambda ranks: format_ranks(list(ranks or [])),
                       confidence=confidence)
    return env


@cache
def environment() -> Environment:
    """The one environment of the package's templates (the base and the job report's)."""
    return _environment(PackageLoader("analyzer.render", "templates"))


@cache
def environment_with(package: str) -> Environment:
    """An environment that finds `package`'s own templates (its `templates/` directory) first and
    the base here: how a page rendered outside this stage extends the shared base."""
    return _environment(ChoiceLoader([PackageLoader(package, "templates"), environment().loader]))
