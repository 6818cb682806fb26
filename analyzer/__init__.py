"""postmortem: post-mortem analysis of distributed training failures.

The pipeline is discover -> parse -> correlate -> detect -> decide -> render; `analyzer.api.analyze`
runs it end to end and the CLI is a thin shell over that function.
"""

__version__ = "0.1.0"
