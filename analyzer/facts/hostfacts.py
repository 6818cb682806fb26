"""Stage 3, facts (per host and rank): what each machine and process of the job ran on.

 From the canonical events it derives one long frame of *observations*: one row
per fact that a line states, attributed to a host and, where known, a rank (or a pid when the rank
is unknown): NCCL version and build, network plugin, network, NICs, transports, every `NCCL_*` /
`TORCH_*` variable reported, CUDA driver, NVIDIA driver, PyTorch version, the CUDA runtime,
cuDNN, Fabric Manager, aws-ofi-nccl and DeepSpeed versions (also from `collect_env` output and pip
freezes, `stack.version` events), GPU model and memory, the addresses a process bound to, and the OOM / bf16-unsupported errors. From it:

- `unit_facts`: one value per (host, unit, fact), a unit being a rank, else a process, else the
  host itself (host-wide sources such as an nvidia-smi table);
- `host_facts`: one value per (host, fact) and whether the host's own ranks disagree;
- `derive_host_facts`: all of the above for one job, once (the facts stage hands it on in the
  JobContext);
- `fact_table`: the wide per-host facts table (a polars frame) with the facts that differ across
  hosts named in `differs`; `host_fact_records` turns it into the report's `job.host_facts`.

Detect's environment analyses (`analyzer/analyses/environment.py`) compare these across hosts;
this module only states facts and never judges them. Everything here is polars expressions over
event subsets prefiltered by kind or by a cheap literal test; the frames that reach Python rows
are one row per host or per fact, never per line.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

# --- what is extracted, from which lines -----------------------------------------------------------

# Facts shown in the table, in order, and whether a host may legitimately hold several values of
# one (a host has several NICs; one process has one NCCL version).
FACTS: tuple[tuple[str, bool], ...] = (
    ("nccl_version", False),
    ("nccl_build", False),
    ("net_plugin", False),
    ("network", False),
    ("nics", True),
    ("transports", True),
    ("cuda_driver", False),
    ("driver_version", False),
    ("torch_version", False),
    ("cuda_runtime", False),
    ("cudnn_version", False),
    ("fabric_manager", False),
    ("aws_ofi_nccl", False),
    ("deepspeed_version", False),
    ("gpu_model", True),
    ("gpu_memory", True),
)
MULTI_FACTS = frozenset(name for name, multi in FACTS if multi)
ENV_PREFIX = "env."
UNSET = "(unset)"
# Facts that identify a machine rather than configure it: they differ across hosts by nature.
IDENTITY_FACTS = ("addresses", "nccl_nodes")
# Flags: present on the units that hit them.
FLAG_FACTS = ("oom", "bf16_unsupported")
# Variables that name the host or a per-host file by design: shown, never marked as differing.
PER_HOST_VARIABLES = tuple(f"{ENV_PREFIX}{name}" for name in ("NCCL_HOSTID", "NCCL_DEBUG_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_DUMP_FILE"))

# NCCL kinds whose every line is worth a look (few per process except transports).
_NCCL_FACT_KINDS = ("nccl.version", "nccl.net", "nccl.env", "nccl.cuda_driver", "nccl.transport")
# Versions that `collect_env` output and pip freezes state (analyzer/parse/collect_env.py): the
# parser names the fact in `code` and its value in `detail`. A log line of the job itself wins.
_STACK_KIND = "stack.version"
_STACK_PRIO = 3
# Other lines are only looked at when they contain one of these literals (one vectorised test).
_TEXT_HINT = (
    r"NCCL version|MiB|UUID: GPU-|Product Name|_CudaDeviceProperties|CUDA device \('|compute capability|"
    r"total capacity|totalMemory|Driver Version|CUDA Version|[Vv]ersion|torch==|(?i:bf16|bfloat16)|nNodes|"
    r"environments:|Environment variable|out of memory|OutOfMemoryError|\s(?:On|Off)\s+\|"
    r"|fabric manager|DeepSpeed info|CUDA used to build|nvidia-nccl-cu|aws-ofi-nccl|\+cu\d"
)
_PLUGIN_LOADED = (
    (r"NET/Plugin\s*:\s*Loaded (?:net |coll(?:net)? )?plugin (.+?)(?:\s*\(v\d+\))?\s*$", 0),
    (r"Plugin Path\s*:\s*(\S+)", 1),
    (r"P2P plugin (?:v\d+ )?(\S+)", 2),
)
_PLUGIN_ABSENT = r"NET/Plugin\s*:?\s*(?:Could not find|No plugin found|Plugin load .* returned|Using internal)"
_ADDRESS = r"[A-Za-z][\w.\-]*:(?:\d{1,3}\.){3}\d{1,3}<\d+>"
_TRANSPORT = r"via ((?:P2P|NET|COLLNET)/[A-Za-z][\w]*|SHM|direct shared memory)"
# `6[6] -> 10[2]`: each end's rank and, in brackets, its GPU (the CUDA device index in NCCL <= 2.6, the PCI
# bus id since).
_TRANSPORT_PAIR = r"(?:^|:\s)(\d+)(?:\[([0-9a-fA-F]+)\])?\s*->\s*(\d+)(?:\[([0-9a-fA-F]+)\])?"
# GPU model sources: nvidia-smi table rows, `nvidia-smi -L`, `nvidia-smi -q`, torch device
# properties, Lightning's tensor-core hint, TensorFlow's device line, a bf16 refusal.
_GPU_MODEL = (
    r"^\|\s*\d+\s+(\S.*?)\s{2,}(?:On|Off)\s+\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:",
    r"^GPU \d+: (.+?) \(UUID: GPU-",
    r"^\s*Product Name\s*:\s*(.+?)\s*$",
    r"_CudaDeviceProperties\(name='([^']+)'",
    r"CUDA device \('([^']+)'\)",
    r"Your (.+?) GPU has compute capability",
    r"\bname: (.+?) major: \d+ minor: \d+",
)
# GPU memory sources, each with the unit of its number.
_GPU_MEMORY = (
    (r"\|\s*\d+MiB\s*/\s*(\d+)MiB\s*\|", 1 / 1024),
    (r"total_memory=(\d+)MB", 1 / 1024),
    (r"total capacity of (\d+(?:\.\d+)?) GiB", 1.0),
    (r"total capacity of (\d+(?:\.\d+)?) MiB", 1 / 1024),
    (r"(\d+(?:\.\d+)?) GiB total capacity", 1.0),
    (r"(\d+(?:\.\d+)?) MiB total capacity", 1 / 1024),
    (r"totalMemory: (\d+(?:\.\d+)?)GiB", 1.0),
)
_OOM = r"CUDA out of memory|OutOfMemoryError|Cuda failure '?out of memory"
_BF16_UNSUPPORTED = (
    r"(?i)(?:does not|doesn't|do not|cannot|can't|not) support (?:bf16|bfloat16)"
    r"|(?:bf16|bfloat16)\S*\s.*(?:is only supported|not supported|unsupported|requires|require )"
    r"|Feature '\.bf16' requires"
)
_TORCH_VERSION = (
    r"(?i)(?:PyTorch|torch)(?: version|\.__version__)\s*[:=]?\s*v?(\d+\.\d+(?:\.\d+)?[\w.+\-]*)",
    r"\btorch==(\d+\.\d+(?:\.\d+)?[\w.+\-]*)",
)
_AWS_OFI_NCCL = r"aws-ofi-nccl v?(\d+\.\d+\.\d+[\w.\-]*)"  # `NET/OFI Initializing aws-ofi-nccl 1.7.4-aws`
# Version statements of the stack's other components, each with its fact and priority.
_STACK_VERSIONS = (
    # nv-fabricmanager's refusal to start names both versions (the FM's own, then the driver's).
    ("fabric_manager", r"fabric manager NVIDIA GPU driver interface version (\d+(?:\.\d+)+)", 0),
    ("driver_version", r"match with driver version (\d+(?:\.\d+)+)", 1),
    ("aws_ofi_nccl", _AWS_OFI_NCCL, 0),
    ("deepspeed_version", r"DeepSpeed info: version=(\d+\.\d+\.\d+)", 0),
    ("deepspeed_version", r"\bdeepspeed==(\d+\.\d+\.\d+)", 1),
    ("cuda_runtime", r"CUDA used to build PyTorch\s*:\s*(\d+\.\d+)", 0),
    ("nccl_version", r"\bnvidia-nccl-cu\d+==(\d+\.\d+\.\d+)", 2),
)
# A torch build's CUDA suffix: `2.3.0+cu121` is CUDA 12.1 (the last digit is the minor version).
_TORCH_CUDA_SUFFIX = r"(?i)(?:torch(?:==|\s+version:?\s*)|PyTorch version:?\s*)\d+\.\d+(?:\.\d+)?\+cu(\d+)(\d)\b"
# Relative gap above which two memory sizes are different cards (79.15 GiB usable = 80 GiB card).
_MEMORY_CLASS_GAP = 1.06

OBSERVATION_SCHEMA: dict[str, pl.DataType] = {
    "event_id": pl.Int64,
    "file": pl.String,
    "host": pl.String,
    "rank": pl.Int64,
    "pid": pl.Int64,
    "fact": pl.String,
    "value": pl.String,
    "prio": pl.Int64,  # lower wins among a single-valued fact's sources on one unit
    "src": pl.String,  # "nccl_env": NCCL's "set by environment" lines; "c10d_env": ProcessGroupNCCL's; "stack": a listing; else ""
}
_BASE = ["event_id", "file", "host", "rank", "pid"]


# --- observations ------------------------------------------------------------------------------------


def observations(events: pl.DataFrame) -> pl.DataFrame:
    """Every fact a line states, one row each (see OBSERVATION_SCHEMA)."""
    if events.height == 0:
        return pl.DataFrame(schema=OBSERVATION_SCHEMA)
    nccl = events.filter(pl.col("kind").is_in(_NCCL_FACT_KINDS))
    stack = events.filter(pl.col("kind") == _STACK_KIND)
    text = events.filter(
        ~pl.col("kind").is_in([*_NCCL_FACT_KINDS, _STACK_KIND, "nccl.comm_init", "nccl.comm_teardown", "nccl.error_chain"])
        & pl.col("message").str.contains(_TEXT_HINT)
    )
    frames = [
        *_nccl_observations(nccl),
        *_text_observations(text),
        _obs(stack, pl.col("code"), pl.col("detail"), _STACK_PRIO, src="stack"),
    ]
    obs = pl.concat([f.select(list(OBSERVATION_SCHEMA)).cast(OBSERVATION_SCHEMA) for f in frames], how="vertical")
    obs = obs.filter(
        pl.col("host").is_not_null() & pl.col("fact").is_not_null() & pl.col("value").is_not_null() & (pl.col("value") != "")
    )
    # A listing (collect_env, pip freeze) says what was installed; a line of the job's own logs says
    # what ran: where a host has both for one fact, the listing's value is dropped.
    listed = pl.col("src") == "stack"
    obs = obs.filter(~listed | ((~listed).sum().over("host", "fact") == 0))
    return _memory_classes(obs)


def _obs(frame: pl.DataFrame, fact: str | pl.Expr, value: pl.Expr, prio: int = 0, src: str = "") -> pl.DataFrame:
    fact_expr = pl.lit(fact) if isinstance(fact, str) else fact
    return frame.select(
        *_BASE,
        fact_expr.alias("fact"),
        value.cast(pl.String).str.strip_chars().alias("value"),
        pl.lit(prio, dtype=pl.Int64).alias("prio"),
        pl.lit(src).alias("src"),
    ).filter(pl.col("value").is_not_null())


def _obs_all(frame: pl.DataFrame, fact: str, values: pl.Expr, prio: int = 0) -> pl.DataFrame:
    """Several values per line (NICs, addresses): one observation each."""
    return (
        frame.select(*_BASE, pl.lit(fact).alias("fact"), values.alias("value"), pl.lit(prio, dtype=pl.Int64).alias("prio"), pl.lit("").alias("src"))
        .explode("value")
        .filter(pl.col("value").is_not_null())
    )


def _nccl_observations(nccl: pl.DataFrame) -> list[pl.DataFrame]:
    msg = pl.col("message")
    kind = pl.col("kind")
    version = nccl.filter(kind == "nccl.version")
    net = nccl.filter(kind == "nccl.net")
    env = nccl.filter(kind == "nccl.env")
    driver = nccl.filter(kind == "nccl.cuda_driver")
    frames = [
        _obs(version, "nccl_version", msg.str.extract(r"NCCL version (\d+\.\d+\.\d+)")),
        _obs(version, "nccl_build", msg.str.extract(r"NCCL version \d+\.\d+\.\d+\S*?\+(cuda\d+(?:\.\d+)?)")),
        *[_obs(net, "net_plugin", pl.lit("external: ") + msg.str.extract(p), prio) for p, prio in _PLUGIN_LOADED],
        _obs(net, "net_plugin", pl.when(msg.str.contains(_PLUGIN_ABSENT)).then(pl.lit("internal")), 5),
        _obs(net, "network", msg.str.extract(r"Using network (.+?)\s*$")),
        _obs(net, "network", msg.str.extract(r"Assigned NET plugin (\S+) to comm"), 1),
        _obs_all(
            net.filter(msg.str.contains("NET/IB", literal=True)), "nics",
            msg.str.extract_all(r"[A-Za-z][\w.\-]*:\d+/(?:IB|RoCE)"),
        ),
        _obs_all(
            net.filter(msg.str.contains(r"NET/Socket\s*:\s*Using")), "nics",
            msg.str.extract_all(r"\]([A-Za-z][\w.\-]*):").list.eval(pl.element().str.slice(1).str.strip_suffix(":")),
        ),
        _obs_all(
            net.filter(msg.str.contains("<", literal=True)), "addresses",
            msg.str.extract_all(_ADDRESS).list.eval(pl.element().str.replace(r"<\d+>$", "")),
        ),
        _obs(env, pl.lit(ENV_PREFIX) + pl.col("code"), msg.str.extract(r"set by environment to (.*?)\.?\s*$"), src="nccl_env"),
        _obs(driver, "cuda_driver", _cuda_version(msg.str.extract(r"cudaDriverVersion (\d+)").cast(pl.Int64, strict=False))),
        _obs(net, "aws_ofi_nccl", msg.str.extract(_AWS_OFI_NCCL)),
        _transport_observations(nccl.filter(kind == "nccl.transport")),
    ]
    return frames


def _cuda_version(number: pl.Expr) -> pl.Expr:
    """NCCL prints the driver's CUDA version as an integer: 12080 is CUDA 12.8."""
    return (number // 1000).cast(pl.String) + pl.lit(".") + ((number % 1000) // 10).cast(pl.String)


def _transport_observations(transport: pl.DataFrame) -> pl.DataFrame:
    """One row per (unit, transport family): transport lines grow with ranks x channels."""
    family = pl.col("message").str.extract(_TRANSPORT)
    gdr = pl.when(pl.col("message").str.contains("GDRDMA", literal=True)).then(pl.lit("/GDRDMA")).otherwise(pl.lit(""))
    return (
        transport.select(*_BASE, (family + gdr).alias("value"))
        .filter(pl.col("value").is_not_null())
        .group_by("host", "rank", "pid", "value")
        .agg(pl.col("event_id").min(), pl.col("file").first())
        .select(*_BASE, pl.lit("transports").alias("fact"), "value", pl.lit(0, dtype=pl.Int64).alias("prio"), pl.lit("").alias("src"))
    )


def _text_observations(text: pl.DataFrame) -> list[pl.DataFrame]:
    msg = pl.col("message")
    frames = [
        # PyTorch's and NCCL's own error texts name the NCCL version without its build.
        _obs(text, "nccl_version", msg.str.extract(r"NCCL version:?\s*(\d+\.\d+\.\d+)"), 1),
        *[_obs(text, "gpu_model", msg.str.extract(p).str.replace_all(r"\s+", " ")) for p in _GPU_MODEL],
        *[
            _obs(text, "gpu_memory_gib", (msg.str.extract(p).cast(pl.Float64, strict=False) * scale).round(2))
            for p, scale in _GPU_MEMORY
        ],
        _obs(text, "driver_version", msg.str.extract(r"Driver Version\s*:\s*(\d+(?:\.\d+)+)")),
        _obs(text, "cuda_driver", msg.str.extract(r"CUDA Version\s*:\s*(\d+\.\d+)"), 1),
        *[_obs(text, "torch_version", msg.str.extract(p)) for p in _TORCH_VERSION],
        _obs(text, "oom", pl.when(msg.str.contains(_OOM)).then(pl.lit("yes"))),
        _obs(text, "bf16_unsupported", pl.when(msg.str.contains(_BF16_UNSUPPORTED)).then(pl.lit("yes"))),
        _obs(
            text, "nccl_nodes",
            msg.str.extract(r"nRanks (\d+) nNodes (\d+) localRanks (\d+)", 1) + pl.lit("/")
            + msg.str.extract(r"nRanks (\d+) nNodes (\d+) localRanks (\d+)", 2) + pl.lit("/")
            + msg.str.extract(r"nRanks (\d+) nNodes (\d+) localRanks (\d+)", 3),
        ),
        _torch_env_observations(text),
        *[_obs(text, fact, msg.str.extract(pattern), prio) for fact, pattern, prio in _STACK_VERSIONS],
        _obs(text, "cuda_runtime", msg.str.extract(_TORCH_CUDA_SUFFIX, 1) + pl.lit(".") + msg.str.extract(_TORCH_CUDA_SUFFIX, 2), 1),
        _obs(
            text, pl.lit(ENV_PREFIX) + msg.str.extract(r"Environment variable ((?:TORCH|NCCL)_\w+) is deprecated"),
            pl.when(msg.str.contains(r"Environment variable (?:TORCH|NCCL)_\w+ is deprecated")).then(pl.lit("(set)")),
        ),
    ]
    return frames


def _torch_env_observations(text: pl.DataFrame) -> pl.DataFrame:
    """ProcessGroupNCCL's `... environments: TORCH_NCCL_X: 1, ...` lines (effective values)."""
    pairs = (
        text.filter(pl.col("message").str.contains("environments:", literal=True))
        .select(*_BASE, pl.col("message").str.extract_all(r"\b(?:TORCH|NCCL)_[A-Z0-9_]+(?: \([^)]*\))?: [^,\s]+").alias("pair"))
        .explode("pair")
        .filter(pl.col("pair").is_not_null())
    )
    return pairs.select(
        *_BASE,
        (pl.lit(ENV_PREFIX) + pl.col("pair").str.extract(r"^(\w+)")).alias("fact"),
        pl.col("pair").str.extract(r": (\S+)$").alias("value"),
        pl.lit(0, dtype=pl.Int64).alias("prio"),
        pl.lit("c10d_env").alias("src"),
    )


def _memory_classes(obs: pl.DataFrame) -> pl.DataFrame:
    """Raw GiB figures from several sources become card classes: 79.15 GiB (what PyTorch can use)
    and 81920 MiB (what nvidia-smi prints) are the same 80 GiB card."""
    # A figure past any real card (a 30-digit MiB count) is an invalid value on its line, not a class.
    raw = obs.filter((pl.col("fact") == "gpu_memory_gib") & (pl.col("value").cast(pl.Float64, strict=False) < 1e6))
    if raw.height == 0:
        return obs
    sizes = (
        raw.select(pl.col("value").cast(pl.Float64).alias("gib"))
        .unique()
        .sort("gib")
        .with_columns((pl.col("gib") > pl.col("gib").shift(1) * _MEMORY_CLASS_GAP).fill_null(True).cum_sum().alias("cls"))
        .with_columns(pl.col("gib").max().over("cls").alias("top"))
        .select(pl.col("gib").cast(pl.String).alias("value_raw"), (pl.col("top").round(0).cast(pl.Int64).cast(pl.String) + " GiB").alias("label"))
    )
    classed = (
        raw.with_columns(pl.col("value").cast(pl.Float64).cast(pl.String).alias("value_raw"))
        .join(sizes, on="value_raw", how="left")
        .with_columns(pl.lit("gpu_memory").alias("fact"), pl.col("label").alias("value"))
        .select(obs.columns)
    )
    return pl.concat([obs.filter(pl.col("fact") != "gpu_memory_gib"), classed], how="vertical")


def memory_gib(label: str | None) -> float | None:
    """`"80 GiB"` -> 80.0 (the class label `gpu_memory` values carry)."""
    if not label:
        return None
    try:
        return float(label.split()[0])
    except ValueError:
        return None


# --- units and hosts ---------------------------------------------------------------------------------


def _unit_expr() -> pl.Expr:
    return (
        pl.when(pl.col("rank").is_not_null())
        .then(pl.lit("rank ") + pl.col("rank").cast(pl.String))
        .when(pl.col("pid").is_not_null())
        .then(pl.lit("pid ") + pl.col("pid").cast(pl.String))
        .otherwise(pl.lit("host"))
    )


def unit_facts(obs: pl.DataFrame) -> pl.DataFrame:
    """One value per (host, unit, fact): `value` (several sorted and joined with ", " for the
    multi-valued facts), `values` (the list), `event_ids` (the evidence)."""
    # Every process repeats its facts (an address on three lines, a version per communicator):
    # one row per distinct (unit, fact, value) first, its best source and its first line kept.
    units = (
        obs.with_columns(_unit_expr().alias("unit"))
        .group_by("host", "unit", "fact", "value")
        .agg(
            pl.col("prio").min(), pl.col("src").first(), pl.col("event_id").min(), pl.col("file").first(),
            pl.col("rank").drop_nulls().first(), pl.col("pid").drop_nulls().first(),
        )
        .select(*OBSERVATION_SCHEMA, "unit")
    )
    multi = pl.col("fact").is_in(sorted(MULTI_FACTS | set(IDENTITY_FACTS)))
    # A single-valued fact keeps its best source only (the full `2.28.9+cuda13.0` line beats the
    # bare version inside an error message).
    best = units.filter(multi | (pl.col("prio") == pl.col("prio").min().over("host", "unit", "fact")))
    best = pl.concat([best, _unset_env(units)], how="vertical")
    # Values are distinct per group already; sorting once makes every list come out sorted.
    return (
        best.sort("host", "unit", "fact", "value")
        .group_by("host", "unit", "fact", maintain_order=True)
        .agg(
            pl.col("rank").drop_nulls().first().alias("rank"),
            pl.col("pid").drop_nulls().first().alias("pid"),
            pl.col("value").alias("values"),
            pl.col("event_id").drop_nulls().alias("event_ids"),
            pl.col("src").first().alias("src"),
        )
        .with_columns(pl.col("values").list.join(", ").alias("value"))
    )


def _unset_env(units: pl.DataFrame) -> pl.DataFrame:
    """NCCL prints `X set by environment to ...` for every variable it reads that is set. A process
    whose NCCL init was logged but that printed no line for a variable another process printed
    did not have it set: that absence is a fact too."""
    env_vars = units.filter(pl.col("src") == "nccl_env").select("fact").unique()
    reporting = (
        units.filter((pl.col("unit") != "host") & (pl.col("fact").is_in(["nccl_version", "cuda_driver"]) | (pl.col("src") == "nccl_env")))
        .group_by("host", "unit")
        .agg(pl.col("rank").drop_nulls().first(), pl.col("pid").drop_nulls().first(), pl.col("file").first())
    )
    if env_vars.height == 0 or reporting.height == 0:
        return units.head(0)
    present = units.filter(pl.col("src") == "nccl_env").select("host", "unit", "fact").unique()
    missing = reporting.join(env_vars, how="cross").join(present, on=["host", "unit", "fact"], how="anti")
    return missing.select(
        pl.lit(None, dtype=pl.Int64).alias("event_id"), "file", "host", "rank", "pid", "fact",
        pl.lit(UNSET).alias("value"), pl.lit(9, dtype=pl.Int64).alias("prio"), pl.lit("nccl_env").alias("src"), "unit",
    ).select(units.columns)


def host_facts(units: pl.DataFrame) -> pl.DataFrame:
    """One value per (host, fact). `varies` is true when the host's own ranks disagree (several
    values of a single-valued fact), and `value` then joins them with " | "."""
    multi = pl.col("fact").is_in(sorted(MULTI_FACTS | set(IDENTITY_FACTS)))
    return (
        units.group_by("host", "fact")
        .agg(
            pl.col("value").unique().sort().alias("unit_values"),
            pl.col("values").list.explode(keep_nulls=False, empty_as_null=False).unique().sort().alias("all_values"),
            pl.col("event_ids").list.explode(keep_nulls=False, empty_as_null=False).unique().sort().alias("event_ids"),
            pl.col("rank").drop_nulls().unique().sort().alias("ranks"),
            pl.col("src").first().alias("src"),
        )
        .with_columns(
            pl.when(multi).then(pl.col("all_values").list.join(", ")).otherwise(pl.col("unit_values").list.join(" | ")).alias("value"),
            (~multi & (pl.col("unit_values").list.len() > 1)).alias("varies"),
        )
        .drop("unit_values", "all_values")
        .sort("host", "fact")
    )


def compared_facts(hosts: pl.DataFrame) -> pl.DataFrame:
    """Per (host, fact): `differs` when the fact has several values across hosts and this host's
    is not the one most hosts share (on a tie, every host's cell differs), or its ranks disagree."""
    comparable = hosts.filter(~pl.col("fact").is_in(list(IDENTITY_FACTS) + list(FLAG_FACTS)))
    counts = comparable.filter(~pl.col("fact").is_in(PER_HOST_VARIABLES)).group_by("fact", "value").agg(pl.len().alias("n"))
    mode = (
        counts.with_columns(
            pl.col("n").max().over("fact").alias("top"),
            pl.col("value").n_unique().over("fact").alias("distinct"),
        )
        .filter(pl.col("n") == pl.col("top"))
        .group_by("fact")
        .agg(pl.col("value").first().alias("mode"), pl.len().alias("modes"), pl.col("distinct").first())
    )
    differs = ((pl.col("distinct") > 1) & ((pl.col("modes") > 1) | (pl.col("value") != pl.col("mode")))).fill_null(False)
    return comparable.join(mode, on="fact", how="left").with_columns(
        ((differs | pl.col("varies")) & ~pl.col("fact").is_in(PER_HOST_VARIABLES)).alias("differs")
    ).drop("mode", "modes", "distinct")


# --- the table and the report ------------------------------------------------------------------------


@dataclass(frozen=True)
class HostFacts:
    observations: pl.DataFrame
    units: pl.DataFrame
    hosts: pl.DataFrame  # per (host, fact), with `differs`
    identity: pl.DataFrame  # per (host, fact) for IDENTITY_FACTS and FLAG_FACTS


def derive_host_facts(events: pl.DataFrame) -> HostFacts:
    """The facts of one job's events. Derived once, by the facts stage (analyzer.facts.job_context),
    and handed on in the JobContext: the analyses and the report read that one result."""
    obs = observations(events)
    units = unit_facts(obs)
    hosts = host_facts(units)
    return HostFacts(
        observations=obs,
        units=units,
        hosts=compared_facts(hosts),
        identity=hosts.filter(pl.col("fact").is_in(list(IDENTITY_FACTS) + list(FLAG_FACTS))),
    )


def fact_table(facts: HostFacts) -> pl.DataFrame:
    """The wide per-host facts table: `host`, `ranks`, `addresses`, one column per fact of FACTS
    that any host has, one `env.NAME` column per variable, and `differs` (the columns to mark)."""
    hosts = facts.hosts
    if hosts.height == 0 and facts.identity.height == 0:
        return pl.DataFrame(schema={"host": pl.String, "ranks": pl.List(pl.Int64), "differs": pl.List(pl.String)})
    every_host = pl.concat([hosts.select("host"), facts.identity.select("host")]).unique().sort("host")
    ranks = facts.units.group_by("host").agg(pl.col("rank").drop_nulls().unique().sort().alias("ranks"))
    addresses = facts.identity.filter(pl.col("fact") == "addresses").select("host", pl.col("value").alias("addresses"))
    differs = hosts.group_by("host").agg(pl.col("fact").filter(pl.col("differs")).sort().alias("differs"))
    table = every_host.join(ranks, on="host", how="left").join(addresses, on="host", how="left")
    if hosts.height:
        wide = hosts.pivot(on="fact", index="host", values="value", sort_columns=True)
        table = table.join(wide, on="host", how="left")
    table = table.join(differs, on="host", how="left").with_columns(pl.col("differs").fill_null([]))
    fact_columns = [name for name, _ in FACTS if name in table.columns]
    env_columns = sorted(c for c in table.columns if c.startswith(ENV_PREFIX))
    return table.select("host", "ranks", "addresses", *fact_columns, *env_columns, "differs").sort("host")


def host_fact_records(facts: HostFacts, notes: dict[str, list[dict]] | None = None) -> list[dict]:
    """`job.host_facts` of the report: one record per host, `differs` naming the marked cells
    (fact names, `env.NAME` for variables), `per_rank` the ranks of a host that disagree,
    `known_issues` the notes given per host (`analyzer.knownissues.notes_by_host`)."""
    table = fact_table(facts)
    if table.height == 0:
        return []
    varying = facts.hosts.filter(pl.col("varies")).select("host", "fact")
    per_rank = (
        facts.units.join(varying, on=["host", "fact"], how="inner")
        .filter(pl.col("unit") != "host")
        .group_by("host", "unit")
        .agg(pl.col("rank").first(), pl.col("pid").first(), pl.col("fact"), pl.col("value"))
        .sort("host", "rank", "pid", nulls_last=True)
    )
    per_rank_by_host: dict[str, list[dict]] = {}
    for row in per_rank.iter_rows(named=True):
        detail = dict(zip(row["fact"], row["value"]))
        record = {"rank": row["rank"], "pid": row["pid"], **_split_env(detail)}
        per_rank_by_host.setdefault(row["host"], []).append(record)
    shared = set(address_clashes(facts.observations).get_column("host").to_list())
    notes = notes or {}
    records = []
    fact_names = [name for name, _ in FACTS]
    for row in table.iter_rows(named=True):  # one row per host
        env = {k[len(ENV_PREFIX):]: v for k, v in row.items() if k.startswith(ENV_PREFIX) and v is not None}
        records.append({
            "host": row["host"],
            "ranks": row["ranks"] or [],
            "addresses": row["addresses"].split(", ") if row.get("addresses") else [],
            **{name: row.get(name) for name in fact_names},
            "env": env,
            "duplicate_name": row["host"] in shared,
            "differs": sorted([*row["differs"], "addresses"]) if row["host"] in shared else row["differs"],
            "per_rank": per_rank_by_host.get(row["host"], []),
            "known_issues": notes.get(row["host"], []),
        })
    return records


def _split_env(detail: dict) -> dict:
    env = {k[len(ENV_PREFIX):]: v for k, v in detail.items() if k.startswith(ENV_PREFIX)}
    plain = {k: v for k, v in detail.items() if not k.startswith(ENV_PREFIX)}
    return {**plain, **({"env": env} if env else {})}


def address_clashes(obs: pl.DataFrame) -> pl.DataFrame:
    """(host, iface, ip) for every host name under which processes report several addresses on
    one interface: one machine has one address there, so that name covers several machines."""
    addresses = (
        obs.filter(pl.col("fact") == "addresses")
        .with_columns(
            pl.col("value").str.extract(r"^(.*):[^:]+$").alias("iface"),
            pl.col("value").str.extract(r":([^:]+)$").alias("ip"),
        )
        .filter(~pl.col("ip").str.starts_with("127."))
    )
    return (
        addresses.group_by("host", "iface", "ip")
        .agg(
            pl.col("rank").drop_nulls().unique().sort().alias("ranks"),
            pl.col("pid").drop_nulls().unique().sort().alias("pids"),
            pl.col("event_id").min().alias("event_id"),
        )
        .filter(pl.col("ip").n_unique().over("host", "iface") > 1)
        .sort("host", "iface", "ip")
    )


def transport_links(events: pl.DataFrame) -> pl.DataFrame:
    """The fields of every transport line (`src[src_gpu] -> dst[dst_gpu] [send] via FAMILY/GDRDMA`): its
    event and writer, which ranks NCCL connected, on which GPUs (lower-case, null where the line names
    none), how (`family`), over GPUDirect RDMA or not (`gdr`) and from which side of a network link
    (`side`: send, receive or null)."""
    message = pl.col("message")
    return (
        events.filter(pl.col("kind") == "nccl.transport")
        .select(
            "event_id", "host", "pid", "rank",
            message.str.extract_groups(_TRANSPORT_PAIR + r".*?" + _TRANSPORT).alias("f"),
            message.str.contains("GDRDMA", literal=True).alias("gdr"),
            message.str.extract(r"\[(send|receive)\] via", 1).alias("side"),
        )
        .unnest("f")
        .select(
            "event_id", "host", "pid", "rank",
            pl.col("1").cast(pl.Int64, strict=False).alias("src"),
            pl.col("3").cast(pl.Int64, strict=False).alias("dst"),
            pl.col("5").alias("family"),
            pl.col("2").str.to_lowercase().alias("src_gpu"),
            pl.col("4").str.to_lowercase().alias("dst_gpu"),
            "gdr", "side",
        )
        .filter(pl.col("src").is_not_null() & pl.col("dst").is_not_null() & pl.col("family").is_not_null())
    )


def transport_pairs(events: pl.DataFrame, via: str | None = None) -> pl.DataFrame:
    """`transport_links`, one row per distinct (host, pid, src, dst, family, GPUs) with its first event.
    `via` (a literal such as `"via NET/"`) keeps only those lines before any regex runs: they grow
    with ranks x channels."""
    if via is not None:
        events = events.filter(pl.col("message").str.contains(via, literal=True))
    return (
        transport_links(events)
        .group_by("host", "pid", "src", "dst", "family", "src_gpu", "dst_gpu")
        .agg(pl.col("event_id").min(), pl.col("rank").first())
        .sort("event_id")
    )
