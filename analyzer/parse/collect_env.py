"""Stage 2, parse: the stack's versions from `python -m torch.utils.collect_env` output and pip listings.

Two formats of their own (classified by content in discover): torch's `collect_env` report, in its
old layout (`PyTorch version: 2.3.0+cu121`) and its new one (`PyTorch version              : 2.9.0`,
section banners), with its `[pip3] name==version` / `[conda] name version` library lines; and
`pip freeze` (`name==version`) or `pip list` (`name   version`) output. Each version a line states
becomes one `stack.version` event: `code` names the host fact (`torch_version`, `cuda_runtime`,
`driver_version`, `nccl_version`, `cudnn_version`, `deepspeed_version`, `gpu_model`, ...), `detail`
holds the value, `message` the line. Correlate's host facts read them (analyzer/facts/hostfacts.py) below
any line of the job's own logs; a listing names no host, so its events take the host of their
directory. Lines that state nothing are counted as unparsed.
"""

from __future__ import annotations

import polars as pl

from analyzer.io import InputFile
from analyzer.events import EVENT_SCHEMA, empty_events

MAX_LISTING_BYTES = 4 << 20  # a collect_env report is a few KiB, a pip freeze of a big image ~50 KiB

_KEY = r"^\s*{}\s*:\s*"  # `Key: value` and `Key        : value`
# (fact, regex with one group) over collect_env lines, in the report's own order.
COLLECT_ENV_FACTS: tuple[tuple[str, str], ...] = (
    ("torch_version", _KEY.format("PyTorch version") + r"(\d+\.\d+(?:\.\d+)?[\w.+\-]*)"),
    ("cuda_runtime", _KEY.format("CUDA used to build PyTorch") + r"(\d+\.\d+)"),
    ("cuda_runtime", _KEY.format("CUDA runtime version") + r"(\d+\.\d+)"),
    ("driver_version", _KEY.format("Nvidia driver version") + r"(\d+(?:\.\d+)+)"),
    ("cudnn_version", _KEY.format("cuDNN version") + r"(?:Probably one of the following:\s*)?\S*?(\d+\.\d+\.\d+)"),
    ("gpu_model", r"^\s*(?:GPU models and configuration\s*:\s*)?GPU \d+: (.+?)\s*$"),
    ("nccl_version", r"^\s*\[(?:pip3?|conda)\]\s+nvidia-nccl-cu\d+\s*(?:==|\s)\s*(\d+\.\d+\.\d+)"),
    ("cudnn_version", r"libcudnn\.so\.(\d+\.\d+\.\d+)"),
    ("deepspeed_version", r"^\s*\[(?:pip3?|conda)\]\s+deepspeed\s*(?:==|\s)\s*(\d+\.\d+\.\d+)"),
)
# (fact, package name regex) of pip freeze / pip list lines.
PIP_FACTS: tuple[tuple[str, str], ...] = (
    ("torch_version", r"torch"),
    ("nccl_version", r"nvidia-nccl-cu\d+"),
    ("cuda_runtime", r"nvidia-cuda-runtime-cu\d+"),
    ("cudnn_version", r"nvidia-cudnn-cu\d+"),
    ("deepspeed_version", r"deepspeed"),
)


def parse_collect_env(item: InputFile) -> pl.DataFrame:
    return _events(item, [(fact, pattern) for fact, pattern in COLLECT_ENV_FACTS])


def parse_pip_listing(item: InputFile) -> pl.DataFrame:
    patterns = [(fact, rf"^\s*{name}\s*(?:==|\s{{2,}})\s*(\d[\w.+\-!]*)\s*$") for fact, name in PIP_FACTS]
    return _events(item, patterns)


def _events(item: InputFile, patterns: list[tuple[str, str]]) -> pl.DataFrame:
    text = item.read_all(MAX_LISTING_BYTES).decode("utf-8", "replace")
    lines = pl.DataFrame({"text": text.splitlines()}).with_row_index("line", offset=1)
    item.lines = lines.height
    # One column per (fact, pattern); then one row per line and fact stated (the first pattern wins).
    extracted = lines.with_columns(
        [pl.col("text").str.extract(pattern).alias(f"{i}") for i, (_, pattern) in enumerate(patterns)]
    )
    facts = (
        extracted.unpivot(index=["line", "text"], variable_name="pattern", value_name="value")
        .filter(pl.col("value").is_not_null())
        .with_columns(pl.col("pattern").cast(pl.Int64))
        .sort("line", "pattern")
        .unique(["line"], keep="first", maintain_order=True)
        .with_columns(pl.col("pattern").replace_strict({i: fact for i, (fact, _) in enumerate(patterns)}, return_dtype=pl.String).alias("code"))
    )
    item.unparsed_lines = lines.filter(pl.col("text").str.strip_chars() != "").height - facts.height
    if facts.height == 0:
        return empty_events()
    return facts.select(
        pl.lit(item.path).alias("file"),
        pl.col("line").cast(pl.Int64),
        pl.lit("collect_env").alias("source"),
        pl.lit("stack.version").alias("kind"),
        pl.lit("info").alias("severity"),
        pl.col("text").str.strip_chars().alias("message"),
        pl.col("text").str.slice(0, 2000).alias("text"),
        "code",
        pl.col("value").str.strip_chars().alias("detail"),
    ).with_columns([pl.lit(None, dtype=dtype).alias(name) for name, dtype in EVENT_SCHEMA.items()
                    if name not in ("file", "line", "source", "kind", "severity", "message", "text", "code", "detail")]
                   ).select(list(EVENT_SCHEMA)).cast(EVENT_SCHEMA)
