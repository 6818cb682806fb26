"""Stage 2, parse (node state): the health read-outs of a node's tools, as events.

`nvidia-smi -q` (ECC counters, retired pages, remapped rows), `ibstat` / `ibstatus` (HCA port
state, physical state, rate) and `nvidia-smi nvlink -s` (per-link speed or `<inactive>`) print
key/value blocks whose meaning depends on the section above a line: `Pending : Yes` is a row
remap waiting for a GPU reset under `Remapped Rows`, and nothing alarming under `ECC Mode`. The
blocks are read with vectorised expressions over a batch's lines: each line's indentation and
section headers are forward-filled within its file, then the lines that report something wrong
become events:

* `node.gpu_ecc`: a non-zero uncorrectable ECC counter (new `DRAM/SRAM Uncorrectable` keys and
  the older `Double Bit` sections), pages retired for double-bit errors or pending retirement;
* `node.row_remap`: `Remapping Failure Occurred : Yes`, a remap pending a reset, rows remapped
  after uncorrectable errors;
* `node.ib_port`: one event per HCA port (state, physical state, rate, link layer), whatever its
  state: whether a down port matters depends on what NCCL used, which the analysis decides;
* `node.nvlink`: a GPU's links that are `<inactive>` while links of the same dump are up;
* `node.ib_port` from `ibv_devinfo` too (`hca_id:` / `port:` blocks, `PORT_ACTIVE (4)`, with `-v`
  the rate as `active_width` x `active_speed`);
* `node.eth_speed`: one event per `ethtool` interface (speed, duplex, link detected), whatever
  its speed: whether it is slow depends on what the job needed, which the analysis decides;
* `node.topology`: one event per GPU row of `nvidia-smi topo -m` that has NIC columns, its path
  to each NIC and the nearest one (a GPU that reaches every NIC only through `SYS` crosses NUMA
  nodes for all its network traffic: a warning);
* `node.process_io_wait`: a process that `ps` (`ps aux`, `ps -el`, `ps -eo ...stat...`) or `top`
  lists in uninterruptible sleep (state `D`): blocked in the kernel on I/O that has not returned,
  a frozen file system or device. Its pid is the event's, so correlate can name its rank.

The GPU or port a line belongs to goes into `detail`; the host comes from correlate (the file's
host), since these tools print no host name.
"""

from __future__ import annotations

import polars as pl

from analyzer.events import conform, empty_events

# A line cannot belong to a block of interest without one of these (cheap prefilter per batch).
NODE_STATE_LITERALS = (
    "NVSMI LOG", "CA '", "Infiniband device '", "ecc.errors.uncorrected", "hca_id:", "Settings for ", "CPU Affinity",
    " STAT ", " SHR S ", "F S ",  # process tables: the state column of `ps aux` / `ps -o stat`, `top`, `ps -l`
)
_GPU_START = r"^GPU (?:\d+: .+\(UUID|[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:)"  # nvlink -s, nvidia-smi -q per GPU
NODE_STATE_START_LITERALS = (*NODE_STATE_LITERALS, "GPU 0000", "(UUID: GPU-")
_BLOCK_LINES = 4096

_GPU_HEADER = r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$"
_NVLINK_GPU = r"^GPU (\d+): (.+?) \(UUID"
_CA_HEADER = r"^CA '([^']+)'\s*$"
_IBSTATUS_HEADER = r"^Infiniband device '([^']+)' port (\d+) status:\s*$"
_PORT_HEADER = r"^Port (\d+):\s*$"
_KEY_VALUE = r"^([A-Za-z][\w /().\-]*?)\s*:\s*(.*?)\s*$"
_NVLINK = r"^Link (\d+): (.+?)\s*$"
_ETHTOOL_HEADER = r"^Settings for (\S+):\s*$"
_ANSI = r"\x1b\[[0-9;]*m"
_TOPO_DEVICE = r"^(?:GPU|NIC)\d+$|^[a-z][a-z0-9]*_\d+$"  # GPU0, NIC3, mlx5_0 (older drivers name the NIC)
_TOPO_LEGEND = r"^(NIC\d+):\s+(\S+)\s*$"
_LEVEL_WIDTH = 4  # nvidia-smi indents 4 spaces per level; ibstat one TAB (expanded to 4 here)


def node_state_events(lines: pl.DataFrame, candidates: str | None = None) -> pl.DataFrame:
    """Events for the node-state blocks in a batch's lines (`file`, `line`, `text`).

    `candidates` names a boolean column already true on every line holding one of
    NODE_STATE_START_LITERALS (the text parser's prefilter pass): only those lines are tested for a
    block start. Without it the literals are searched here.
    """
    text = pl.col("text")
    flag = pl.col(candidates) if candidates else text.str.contains_any(list(NODE_STATE_START_LITERALS))
    flagged = lines.select("text", flag.alias("_flag")).with_row_index("_row").filter(pl.col("_flag"))
    starts_at = flagged.filter(text.str.contains_any(list(NODE_STATE_LITERALS)) | text.str.contains(_GPU_START))
    if starts_at.height == 0:
        return empty_events()
    starts = pl.int_range(pl.len(), dtype=pl.UInt32).is_in(starts_at.get_column("_row").implode())
    # A tool's output is a few thousand lines at most: only lines that close after a block start
    # are read, so a console log that prints `nvidia-smi -L` once is not read again in full.
    marked = lines.select("file", "line", "text", starts.alias("_start"))
    block_start = pl.when(pl.col("_start")).then(pl.col("line")).forward_fill().over("file")
    in_blocks = marked.filter((pl.col("line") - block_start).is_between(0, _BLOCK_LINES)).drop("_start")
    if in_blocks.height == 0:
        return empty_events()
    frame = _structured(in_blocks)
    parts = [
        _ecc(frame), _ecc_query(frame), _row_remap(frame), _ib_ports(frame), _nvlink(frame), _eth(frame), _topology(in_blocks),
        _process_io_wait(in_blocks),
    ]
    parts = [p for p in parts if p.height]
    if not parts:
        return empty_events()
    events = pl.concat(parts, how="diagonal_relaxed").with_columns(
        pl.lit("system").alias("source"),
        pl.col("text").str.slice(0, 2000),
    )
    return conform(events)


def _structured(lines: pl.DataFrame) -> pl.DataFrame:
    """Each line's key, value and the section headers above it (`gpu`, `s1`..`s3`, `ca`, `port`)."""
    expanded = pl.col("text").str.replace_all("\t", " " * _LEVEL_WIDTH)
    body = expanded.str.strip_chars()
    frame = lines.select("file", "line", "text").with_columns(
        body.alias("body"),
        ((expanded.str.len_chars() - expanded.str.strip_chars_start().str.len_chars()) // _LEVEL_WIDTH).alias("level"),
    )
    frame = frame.with_columns(
        pl.col("body").str.extract(_KEY_VALUE, 1).alias("key"),
        pl.col("body").str.extract(_KEY_VALUE, 2).alias("value"),
        pl.coalesce(
            pl.col("body").str.extract(_GPU_HEADER, 1),
            pl.concat_str(pl.lit("GPU "), pl.col("body").str.extract(_NVLINK_GPU, 1)),
        ).alias("_gpu"),
        pl.coalesce(pl.col("body").str.extract(_CA_HEADER, 1), pl.col("body").str.extract(_IBSTATUS_HEADER, 1)).alias("_ca"),
        pl.coalesce(pl.col("body").str.extract(_PORT_HEADER, 1), pl.col("body").str.extract(_IBSTATUS_HEADER, 2)).alias("_port"),
    )
    # A section header is a non-empty line without a value: `ECC Errors`, `    Volatile`, `Port 1:`.
    is_header = (pl.col("body").str.len_chars() > 0) & (pl.col("value").is_null() | (pl.col("value") == ""))
    # `ibv_devinfo` names its HCA and port as key/value lines: `hca_id: mlx5_0`, `port: 1`.
    frame = frame.with_columns(
        pl.coalesce("_ca", pl.when(pl.col("key") == "hca_id").then(pl.col("value"))).alias("_ca"),
        pl.coalesce("_port", pl.when(pl.col("key") == "port").then(pl.col("value"))).alias("_port"),
        pl.col("body").str.extract(_ETHTOOL_HEADER, 1).alias("_iface"),
    )
    unit = pl.col("_gpu").is_not_null() | pl.col("_ca").is_not_null() | pl.col("_iface").is_not_null()
    frame = frame.with_columns(is_header.alias("_hdr"), unit.cum_sum().over("file").alias("_unit"))
    frame = frame.with_columns(
        pl.col("_gpu").forward_fill().over("file", "_unit").alias("gpu"),
        pl.col("_ca").forward_fill().over("file", "_unit").alias("ca"),
        pl.col("_port").forward_fill().over("file", "_unit").alias("port"),
        pl.col("_iface").forward_fill().over("file", "_unit").alias("iface"),
    )
    scope = ["file", "_unit"]
    for level in (1, 2, 3):
        closes = (pl.col("_hdr") & (pl.col("level") <= level - 1)).cum_sum().over(scope).alias(f"_seg{level}")
        frame = frame.with_columns(closes)
        name = pl.when(pl.col("_hdr") & (pl.col("level") == level)).then(pl.col("body").str.strip_suffix(":"))
        frame = frame.with_columns(name.forward_fill().over(*scope, f"_seg{level}").alias(f"s{level}"))
    return frame


def _count(value: pl.Expr) -> pl.Expr:
    return value.str.extract(r"^(\d+)", 1).cast(pl.Int64, strict=False)


def _event(kind: str, severity: str, message: pl.Expr, detail: pl.Expr) -> list[pl.Expr]:
    return [
        pl.lit(kind).alias("kind"),
        pl.lit(severity).alias("severity"),
        message.alias("message"),
        detail.alias("detail"),
    ]


def _ecc(frame: pl.DataFrame) -> pl.DataFrame:
    """Non-zero uncorrectable counters; pages retired or pending retirement for double-bit errors."""
    key, value = pl.col("key"), pl.col("value")
    in_ecc = pl.col("s1") == "ECC Errors"
    new_style = key.str.contains(r"Uncorrectable") & ~key.str.contains("Threshold")
    old_style = ((pl.col("s2") == "Double Bit") | (pl.col("s3") == "Double Bit")) & (key == "Total")
    uncorrectable = in_ecc & (new_style | old_style) & (_count(value) > 0)
    retired = (pl.col("s1") == "Retired Pages") & (
        (key.str.contains("Double Bit") & (_count(value) > 0))
        | (key.str.contains("Pending") & (value == "Yes"))
    )
    hits = frame.filter(uncorrectable | retired)
    if hits.height == 0:
        return hits
    scope = pl.when(in_ecc & pl.col("s2").is_in(["Volatile", "Aggregate"])).then(
        pl.concat_str(pl.lit(" ("), pl.col("s2").str.to_lowercase(), pl.lit(")"))
    ).otherwise(pl.lit(""))
    what = pl.when(in_ecc).then(
        pl.concat_str(pl.lit("uncorrectable ECC errors, "), pl.when(old_style).then(pl.lit("Double Bit ")).otherwise(pl.lit("")), key, scope, pl.lit(": "), value)
    ).when(key.str.contains("Pending")).then(
        pl.concat_str(pl.lit("retired pages: "), key, pl.lit(": "), value, pl.lit(" (a GPU reset is needed)"))
    ).otherwise(pl.concat_str(pl.lit("retired pages for double-bit ECC errors: "), value))
    return hits.with_columns(*_event("node.gpu_ecc", "error", _on_gpu(what), pl.col("gpu")))


def _ecc_query(frame: pl.DataFrame) -> pl.DataFrame:
    """`nvidia-smi --query-gpu=index,...,ecc.errors.uncorrected.volatile.total --format=csv` rows."""
    header = pl.when(pl.col("text").str.contains("ecc.errors.uncorrected", literal=True)).then(pl.col("text"))
    rows = frame.with_columns(header.forward_fill().over("file").alias("_columns")).filter(
        pl.col("_columns").is_not_null()
        & (pl.col("text") != pl.col("_columns"))
        & (pl.col("text").str.count_matches(",") == pl.col("_columns").str.count_matches(","))
    )
    if rows.height == 0:
        return rows
    cells = rows.select(
        "file", "line", "text",
        pl.col("_columns").str.split(",").alias("column"),
        pl.col("text").str.split(",").alias("cell"),
        pl.col("text").str.split(",").list.first().str.strip_chars().alias("gpu"),
    ).explode("column", "cell").with_columns(pl.col("column").str.strip_chars(), pl.col("cell").str.strip_chars())
    hits = cells.filter(pl.col("column").str.starts_with("ecc.errors.uncorrected") & (_count(pl.col("cell")) > 0))
    what = pl.concat_str(pl.col("column"), pl.lit(" = "), pl.col("cell"))
    return hits.with_columns(*_event("node.gpu_ecc", "error", _on_gpu(pl.concat_str(pl.lit("uncorrectable ECC errors, "), what)), pl.col("gpu"))).drop("column", "cell")


def _row_remap(frame: pl.DataFrame) -> pl.DataFrame:
    key, value = pl.col("key"), pl.col("value")
    in_remap = pl.col("s1") == "Remapped Rows"
    failure = key.str.starts_with("Remapping Failure") & (value == "Yes")
    pending = (key == "Pending") & (value == "Yes")
    uncorrectable = (key == "Uncorrectable Error") & (_count(value) > 0)
    hits = frame.filter(in_remap & (failure | pending | uncorrectable))
    if hits.height == 0:
        return hits
    what = (
        pl.when(key.str.starts_with("Remapping Failure"))
        .then(pl.lit("Remapping Failure Occurred: Yes (the GPU has no spare rows left for a bad memory row)"))
        .when(key == "Pending")
        .then(pl.lit("a row remap is pending: the GPU must be reset before the bad row is retired"))
        .otherwise(pl.concat_str(pl.lit("rows remapped after uncorrectable ECC errors: "), value))
    )
    return hits.with_columns(*_event("node.row_remap", "error", _on_gpu(what), pl.col("gpu")))


def _on_gpu(what: pl.Expr) -> pl.Expr:
    return pl.concat_str(pl.lit("GPU "), pl.col("gpu").str.strip_prefix("GPU "), pl.lit(": "), what, ignore_nulls=True)


def _ib_ports(frame: pl.DataFrame) -> pl.DataFrame:
    """One event per port: `mlx5_0 port 1: state Down, physical state Polling, rate 10, InfiniBand`."""
    rows = frame.filter(pl.col("ca").is_not_null() & pl.col("port").is_not_null() & pl.col("key").is_not_null())
    if rows.height == 0:
        return rows
    key = pl.col("key").str.to_lowercase()
    field = (
        pl.when(key == "state").then(pl.lit("state"))
        .when(key.is_in(["physical state", "phys state", "phys_state"])).then(pl.lit("physical"))
        .when(key == "rate").then(pl.lit("rate"))
        .when(key == "active_width").then(pl.lit("width"))
        .when(key == "active_speed").then(pl.lit("speed"))
        .when(key.is_in(["link layer", "link_layer"])).then(pl.lit("layer"))
    )
    # ibstatus prints `4: ACTIVE`, `5: LinkUp`, `200 Gb/sec (4X HDR)`: keep the word and the number.
    # ibv_devinfo: `PORT_ACTIVE (4)`, `LINK_UP (5)`, `4X (2)`, `25.0 Gbps (32)`.
    value = (
        pl.col("value").str.replace(r"^\d+:\s*", "").str.replace(r"^(\d+(?:\.\d+)?) Gb/sec.*$", "$1")
        .str.replace(r"\s*\(\d+\)$", "")
        .str.replace(r"^(\d+)X$", "$1").str.replace(r"^(\d+(?:\.\d+)?) Gbps$", "$1")
    )
    value = pl.when(value == "PORT_ACTIVE").then(pl.lit("Active")).when(value.str.starts_with("PORT_")).then(
        value.str.strip_prefix("PORT_").str.to_titlecase()).when(value == "LINK_UP").then(pl.lit("LinkUp")).otherwise(value)
    fields = rows.with_columns(field.alias("field"), value.alias("v")).filter(pl.col("field").is_not_null())
    if fields.height == 0:
        return fields
    ports = fields.group_by("file", "ca", "port", maintain_order=True).agg(
        pl.col("line").min(),
        pl.col("text").first(),
        pl.col("v").filter(pl.col("field") == "state").first().alias("state"),
        pl.col("v").filter(pl.col("field") == "physical").first().alias("physical"),
        pl.col("v").filter(pl.col("field") == "rate").first().alias("rate"),
        pl.col("v").filter(pl.col("field") == "layer").first().alias("layer"),
        pl.col("v").filter(pl.col("field") == "width").first().cast(pl.Float64, strict=False).alias("_width"),
        pl.col("v").filter(pl.col("field") == "speed").first().cast(pl.Float64, strict=False).alias("_lane"),
    )
    ports = ports.with_columns(pl.coalesce("rate", (pl.col("_width") * pl.col("_lane")).round(1).cast(pl.String).str.strip_suffix(".0")).alias("rate"))
    state_word = pl.col("state").str.to_lowercase()
    physical_word = pl.col("physical").str.to_lowercase()
    healthy = (state_word == "active") & (physical_word.is_null() | (physical_word == "linkup"))
    message = pl.concat_str(
        pl.col("ca"), pl.lit(" port "), pl.col("port"), pl.lit(": state "), pl.col("state").fill_null("?"),
        pl.lit(", physical state "), pl.col("physical").fill_null("?"),
        pl.lit(", rate "), pl.col("rate").fill_null("?"),
        pl.lit(", "), pl.col("layer").fill_null("link layer ?"),
    )
    return ports.with_columns(
        pl.lit("node.ib_port").alias("kind"),
        pl.when(healthy).then(pl.lit("info")).otherwise(pl.lit("warning")).alias("severity"),
        message.alias("message"),
        pl.concat_str(pl.col("ca"), pl.lit(":"), pl.col("port")).alias("detail"),
    ).drop("ca", "port", "state", "physical", "rate", "layer", "_width", "_lane")


def _nvlink(frame: pl.DataFrame) -> pl.DataFrame:
    """Inactive links of GPUs in an `nvidia-smi nvlink -s` dump where other links are up."""
    links = frame.filter(pl.col("gpu").is_not_null()).with_columns(
        pl.col("body").str.extract(_NVLINK, 1).alias("link"),
        pl.col("body").str.extract(_NVLINK, 2).alias("speed"),
    ).filter(pl.col("link").is_not_null())
    if links.height == 0:
        return links
    inactive = pl.col("speed").str.contains("inactive")
    links = links.with_columns((~inactive).any().over("file").alias("_any_up"))
    down = links.filter(inactive & pl.col("_any_up"))
    if down.height == 0:
        return down
    per_gpu = down.group_by("file", "gpu", maintain_order=True).agg(
        pl.col("line").min(), pl.col("text").first(), pl.col("link").str.join(", ").alias("links"), pl.len().alias("n")
    )
    what = pl.concat_str(pl.lit("NVLink inactive: link(s) "), pl.col("links"), pl.lit(" down while the other links are up"))
    return per_gpu.with_columns(*_event("node.nvlink", "error", _on_gpu(what), pl.col("gpu"))).drop("links", "n")


def _eth(frame: pl.DataFrame) -> pl.DataFrame:
    """One event per `ethtool` interface: `eth0: speed 100Mb/s, duplex Full, link detected yes`."""
    rows = frame.filter(pl.col("iface").is_not_null() & pl.col("key").is_in(["Speed", "Duplex", "Link detected"]))
    if rows.height == 0:
        return rows
    per_iface = rows.group_by("file", "iface", maintain_order=True).agg(
        pl.col("line").min(), pl.col("text").first(),
        pl.col("value").filter(pl.col("key") == "Speed").first().alias("speed"),
        pl.col("value").filter(pl.col("key") == "Duplex").first().alias("duplex"),
        pl.col("value").filter(pl.col("key") == "Link detected").first().alias("link"),
    )
    message = pl.concat_str(
        pl.col("iface"), pl.lit(": speed "), pl.col("speed").fill_null("?"), pl.lit(", duplex "), pl.col("duplex").fill_null("?"),
        pl.lit(", link detected "), pl.col("link").fill_null("?"),
    )
    return per_iface.with_columns(*_event("node.eth_speed", "info", message, pl.col("iface"))).drop("iface", "speed", "duplex", "link")


def _topology(lines: pl.DataFrame) -> pl.DataFrame:
    """`nvidia-smi topo -m`: per GPU row with NIC columns, its path to each NIC and the nearest one."""
    body = pl.col("text").str.replace_all(_ANSI, "").str.strip_chars()
    frame = lines.select("file", "line", "text", body.alias("b"))
    header = pl.when(pl.col("b").str.starts_with("GPU0") & pl.col("b").str.contains("CPU Affinity", literal=True)).then(
        pl.col("b").str.extract_all(r"\S+").list.eval(pl.element().filter(pl.element().str.contains(_TOPO_DEVICE))))
    frame = frame.with_columns(header.forward_fill().over("file").alias("_cols"))
    rows = frame.filter(pl.col("_cols").is_not_null() & pl.col("b").str.contains(r"^GPU\d+\s") & ~pl.col("b").str.contains("CPU Affinity", literal=True))
    if rows.height == 0:
        return rows
    cells = pl.col("b").str.extract_all(r"\S+").list.slice(1, pl.col("_cols").list.len())
    long = rows.select("file", "line", "text", pl.col("b").str.extract(r"^(GPU\d+)", 1).alias("gpu"), pl.col("_cols"), cells.alias("_cells"))
    long = long.filter(pl.col("_cols").list.len() == pl.col("_cells").list.len()).explode("_cols", "_cells")
    nics = long.filter(~pl.col("_cols").str.starts_with("GPU"))
    if nics.height == 0:
        return _gpu_peer_paths(long)
    legend = frame.select("file", pl.col("b").str.extract(_TOPO_LEGEND, 1).alias("_cols"), pl.col("b").str.extract(_TOPO_LEGEND, 2).alias("_name")).drop_nulls()
    nics = nics.join(legend.unique(["file", "_cols"]), on=["file", "_cols"], how="left").with_columns(
        pl.when(pl.col("_name").is_not_null()).then(pl.concat_str("_cols", pl.lit("("), "_name", pl.lit(")"))).otherwise(pl.col("_cols")).alias("nic"),
        pl.col("_cells").replace_strict(_PATH_RANK, default=9).alias("_rank"),
    )
    per_gpu = nics.sort("file", "line", "_rank", maintain_order=True).group_by("file", "gpu", maintain_order=True).agg(
        pl.col("line").first(), pl.col("text").first(),
        pl.concat_str("nic", pl.lit(" "), "_cells").str.join(", ").alias("_paths"),
        pl.col("nic").first().alias("_nearest"), pl.col("_cells").first().alias("_via"),
    )
    cross_numa = pl.col("_via") == "SYS"
    message = pl.concat_str(
        pl.col("gpu"), pl.lit(": nearest NIC "), pl.col("_nearest"), pl.lit(" via "), pl.col("_via"),
        pl.when(cross_numa).then(pl.lit(" (every NIC across NUMA nodes)")).otherwise(pl.lit("")),
        pl.lit("; paths: "), pl.col("_paths"),
    )
    return per_gpu.with_columns(
        pl.lit("node.topology").alias("kind"),
        pl.when(cross_numa).then(pl.lit("warning")).otherwise(pl.lit("info")).alias("severity"),
        message.alias("message"), pl.col("gpu").alias("detail"),
    ).drop("gpu", "_paths", "_nearest", "_via")


# A process table's header: a PID column, a state column (`STAT` of ps aux / -o stat, `S` of ps -l and
# top) and the command last. Its rows follow it up to the first blank line.
_PS_HEADER = r"^(?:\S+ )*PID (?:\S+ )*(?:STAT|S) (?:\S+ )*(?:COMMAND|CMD|ARGS)$|^(?:\S+ )*(?:STAT|S) (?:\S+ )*PID (?:\S+ )*(?:COMMAND|CMD|ARGS)$"
# ps's process state codes: one of the states, then its flags (`Dl`, `Ssl`, `R+`, `D<`).
_PS_STATE = r"^[DRSTtWXZIP][<NLsl+]*$"


def _process_io_wait(lines: pl.DataFrame) -> pl.DataFrame:
    """Rows of `ps` / `top` tables whose process is in uninterruptible sleep (state D)."""
    body = pl.col("text").str.replace_all(_ANSI, "").str.strip_chars().str.replace_all(r"\s+", " ")
    frame = lines.select("file", "line", "text", body.alias("b"))
    is_header = pl.col("b").str.contains(_PS_HEADER)
    names = pl.col("b").str.split(" ")
    header = [
        pl.when(is_header).then(names.list.len()).alias("_width"),
        pl.when(is_header).then(names.list.eval((pl.element() == "PID").arg_max())).alias("_pid_at"),
        pl.when(is_header).then(names.list.eval(pl.element().is_in(["STAT", "S"]).arg_max())).alias("_state_at"),
    ]
    frame = frame.with_columns((pl.col("b") == "").cum_sum().over("file").alias("_table"), is_header.alias("_header"), *header)
    frame = frame.with_columns(pl.col("_width", "_pid_at", "_state_at").forward_fill().over("file", "_table"))
    rows = frame.filter(pl.col("_width").is_not_null() & ~pl.col("_header") & (pl.col("b") != ""))
    if rows.height == 0:
        return rows.select("file", "line", "text")
    cells = pl.col("b").str.split(" ")
    rows = rows.with_columns(
        cells.list.get(pl.col("_pid_at").list.first(), null_on_oob=True).cast(pl.Int64, strict=False).alias("pid"),
        cells.list.get(pl.col("_state_at").list.first(), null_on_oob=True).alias("_state"),
        cells.list.slice(pl.col("_width") - 1).list.join(" ").alias("_command"),
    )
    stuck = rows.filter(
        (cells.list.len() >= pl.col("_width")) & pl.col("pid").is_not_null()
        & pl.col("_state").str.contains(_PS_STATE) & pl.col("_state").str.starts_with("D")
    )
    message = pl.concat_str(
        pl.lit("process "), pl.col("pid").cast(pl.String), pl.lit(" ("), pl.col("_command"),
        pl.lit(") in uninterruptible sleep, state "), pl.col("_state"), pl.lit(": blocked in the kernel on I/O that has not returned"),
    )
    detail = pl.concat_str(pl.lit("pid "), pl.col("pid").cast(pl.String))
    return stuck.select("file", "line", "text", "pid", *_event("node.process_io_wait", "warning", message, detail))


def _gpu_peer_paths(long: pl.DataFrame) -> pl.DataFrame:
    """A matrix without NIC columns: per GPU row, its path to each other GPU (info: which path a GPU pair
    takes says nothing wrong on its own; the file is read, not refused)."""
    peers = long.filter(pl.col("_cols").str.starts_with("GPU") & (pl.col("_cells") != "X"))
    if peers.height == 0:
        return peers
    per_gpu = peers.group_by("file", "gpu", maintain_order=True).agg(
        pl.col("line").first(), pl.col("text").first(), pl.concat_str("_cols", pl.lit(" "), "_cells").str.join(", ").alias("_paths"),
    )
    return per_gpu.with_columns(
        pl.lit("node.topology").alias("kind"), pl.lit("info").alias("severity"),
        pl.concat_str(pl.col("gpu"), pl.lit(": no NIC in the matrix; paths to the other GPUs: "), pl.col("_paths")).alias("message"),
        pl.col("gpu").alias("detail"),
    ).drop("gpu", "_paths")


# `nvidia-smi topo -m` paths, nearest first.
_PATH_RANK = {"X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
