"""Stage 4, detect (analysis "mpirun_first_nonzero_exit"): the rank mpirun names as the first process
that exited with a non-zero code.

Open MPI's mpirun (ORTE's `[orterun:non-zero-exit]`, PRRTE's `[prun:non-zero-exit]` help text) ends a
job whose process exited non-zero with `mpirun detected that one or more processes exited with
non-zero status, thus causing the job to be terminated. The first process to do so was:`, a blank
line, `  Process name: [[jobid,N],R]` and `  Exit code:    C`. R is that process's rank in the job
(ORTE's vpid; `[nspace,R]` under PRRTE): the rank whose own output says why it exited. The notice is
a vocabulary row (`mpi/nonzero-exit-first-process`, open_mpi.csv); the name line is the line kind
`mpirun.process_name`; this pairs each notice with the first name line at most a few lines below it
in the same file.
"""

from __future__ import annotations

import polars as pl

from analyzer.analyses import JobContext, register
from analyzer.findings import finding, findings_frame

NOTICE_ROW = "mpi/nonzero-exit-first-process"
MAX_LINES_BELOW = 4  # the notice's second line and a blank line sit between
_RANK = r"Process name: \[(?:\[\d+,\d+\],|[^\s\[\],]+,)(\d+)\]"


@register("mpirun_first_nonzero_exit")
def mpirun_first_nonzero_exit(events: pl.DataFrame, job: JobContext) -> pl.DataFrame:
    notices = events.filter(pl.col("kind").str.starts_with("vocab.") & pl.col("detail").str.starts_with(NOTICE_ROW + ":"))
    names = events.filter(pl.col("kind") == "mpirun.process_name")
    if notices.height == 0 or names.height == 0:
        return findings_frame([])
    names = names.select("file", pl.col("line").alias("name_line"), pl.col("event_id").alias("name_event"),
                         pl.col("message").str.extract(_RANK, 1).cast(pl.Int64, strict=False).alias("first_rank"))
    paired = (
        notices.select("file", "line", "event_id").join(names, on="file")
        .filter((pl.col("name_line") > pl.col("line")) & (pl.col("name_line") <= pl.col("line") + MAX_LINES_BELOW))
        .filter(pl.col("first_rank").is_not_null())
        .sort("file", "line", "name_line").unique(["file", "line"], keep="first", maintain_order=True)
    )
    if paired.height == 0:
        return findings_frame([])
    ranks = paired.get_column("first_rank").unique().sort().to_list()
    first = paired.row(0, named=True)
    # The job's other vocabulary lines of mpirun's teardown are this finding's too, so that it stands
    # in the place of the generic finding that read them.
    teardown = events.filter(pl.col("kind").str.starts_with("vocab.") & pl.col("detail").str.starts_with("mpi/")
                             & pl.col("file").is_in(paired.get_column("file").unique().to_list()))
    return findings_frame([finding(
        "mpirun-first-process-nonzero-exit",
        ranks=ranks, confidence=0.3,
        summary=(f"{first['file']}:{first['name_line']}: mpirun names rank {first['first_rank']} as the first process that exited "
                 "with a non-zero code and ended the job; that rank's own last lines say why"),
        evidence=[*paired.get_column("event_id").to_list(), *paired.get_column("name_event").to_list(),
                  *teardown.get_column("event_id").to_list()],
    )])
