"""Stage 1, io: find every input of a job and classify it by content.

Walks the directory read-only and iteratively (never following symlinks out of the root, never
deeper than MAX_DEPTH levels), or reads one file, or standard input (`-`). Compressed files
(gzip, xz, bzip2, zstd) and archives (tar, compressed tar, zip) are recognised by their first bytes
and read in memory, never extracted, under size, ratio and memory caps: members of a tar on disk
are read in place on demand, members of a compressed tar or a zip (and standard input) are read
once and held zstd-compressed. Each input's first bytes decide its format. Every cap that leaves
something unread says so with a row (status skipped, `capped` set), so a report can never pass off
unread evidence as a clean run. Path-layout hints (torchrun `attempt_N/<local_rank>/`, per-rank
file names) are recorded for correlate. Nothing here parses lines.

Hands on: `discover(root) -> list[InputFile]`, each with its format and status; `discover_job(root)`
adds the `Listing` of what the walk found on disk, which the checkpoint audit reads. Modules:
`walk` (the directory walk, `discover`), `archives` (tar and zip members, held inputs), `streams`
(decompression under caps), `sniff` (format from the first bytes), `inputs` (`InputFile`, text
reading).
"""

from analyzer.io.inputs import SNIFF_BYTES, STDIN, DiscoveryError, InputFile, iter_text_chunks
from analyzer.io.streams import DecompressionLimit
from analyzer.io.walk import Discovery, Listing, discover, discover_job, list_path

__all__ = ["SNIFF_BYTES", "STDIN", "DecompressionLimit", "DiscoveryError", "Discovery", "InputFile", "Listing", "discover",
           "discover_job", "iter_text_chunks", "list_path"]
