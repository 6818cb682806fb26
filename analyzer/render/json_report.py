"""Stage 7, render: the report as JSON, the document of the typed model (analyzer/report.py).

What `postmortem analyze --format json` writes: keys in the model's field order, two-space
indent, non-ASCII text as itself (log lines keep their characters), one final newline. The
document validates against schema/report.schema.json, which is generated from the same model.
"""

from __future__ import annotations

import json

from analyzer.report import Report, document


def render_json(report: Report) -> str:
    return json.dumps(document(report), indent=2, sort_keys=False, ensure_ascii=False) + "\n"
