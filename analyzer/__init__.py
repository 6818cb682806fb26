"""postmortem: post-mortem analysis of distributed training failures.

The pipeline is discover -> parse -> correlate -> detect -> decide -> render; `analyzer.analyze`
runs it end to end (the CLI is a thin shell over that function). In a notebook:

    from analyzer import analyze
    result = analyze("path/to/job")      # result.report (the JSON document), result.events and
    result.findings                      # result.findings (polars frames), result.inputs
"""

__version__ = "0.1.0"
__all__ = ["Analysis", "analyze", "__version__"]


def __getattr__(name: str):
    # Lazy, so `postmortem --version` and the CLI's start do not import polars and the whole pipeline.
    if name in ("analyze", "Analysis"):
        from analyzer import api

        return getattr(api, name)
    raise AttributeError(f"module 'analyzer' has no attribute {name!r}")
