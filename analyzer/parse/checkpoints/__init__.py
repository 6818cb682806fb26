"""Stage 2, parse (checkpoints): read checkpoint files and directories without running anything.

`symbolic` reads a pickle without calling what it names, `contents` says which training state it
holds, `files` checks one file (torch.save zip or legacy, plain pickle, safetensors) and `layouts`
turns a checkpoint directory or a group of per-rank files into one record. The audit that finds
the checkpoints of a job and ranks them is `analyzer.facts.checkpoint_audit`.
"""
