"""Batch work (above the pipeline): analyse many jobs, keep every row as it is made, and the fleet view.

- `jobs`: which directories under the scan roots are jobs, decided by their files' content;
- `rows`: the per-job function a worker runs (one `analyzer.api.analyze`) and the tables it fills;
- `store`: the inputs' fingerprint, the analyzer's identity and the SQLite store of finished rows;
- `engines`: local worker processes (each job under a time limit) or Ray tasks;
- `scan`: the scan itself and its Parquet outputs;
- `view`: what a scan table says across jobs (read by `page_text` / `page_html`, the terminal summary and the HTML page).

Nothing here imports the command line; the commands live in `analyzer.cli.scan`. The fleet's own
pages (`page_text`, `page_html`) build on what the renderers share (`analyzer.render.text`'s
escaping, `analyzer.render.page`'s base template).
"""


class ScanError(Exception):
    """The scan cannot start: a missing root, an unreadable manifest or store, an unavailable engine."""
