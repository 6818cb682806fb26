"""Support for every stage: the severities a finding, a signature and a line kind can have.

One definition, read by the rule and line-kind loaders (which refuse any other value), decide (which
ranks by it) and the report model (whose JSON Schema enum is generated from `Severity`). A line's
own level as its header prints it (glog's `F`, NCCL's `WARN`) is another thing: `LINE_LEVELS` are the
levels a rule's `[match].severity` may select lines by.
"""

from __future__ import annotations

from typing import Literal, get_args

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[str, ...] = get_args(Severity)  # most severe first: decide's order
SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}
LINE_LEVELS = frozenset({*SEVERITIES, "fatal"})
