"""Source code and markup beside the logs are not logs: their 'Error' and 'failed' are code, not events."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.cli import main
from analyzer.io import discover

HEALTHY = Path(__file__).resolve().parents[1] / "fixtures" / "healthy"

CSS = """.highlight .hll { background-color: #ffffcc }
.highlight .c { color: #8f5902; font-style: italic } /* Comment */
.highlight .err { color: #a40000; border: 1px solid #ef2929 } /* Error */
.highlight .g { color: #000000 } /* Generic */
.highlight .gr { color: #ef2929 } /* Generic.Error */
div.body p {
    margin: 0;
}
"""
PYTHON = '''import torch
import torch.distributed as dist


def train(model, loader):
    for batch in loader:
        if batch is None:
            raise RuntimeError("data loading failed")
        loss = model(batch)
        loss.backward()
    return model


class Trainer:
    def fit(self):
        return train(self.model, self.loader)
'''
HTML = "<!DOCTYPE html>\n<html><body><p>Error: the page failed to load</p></body></html>\n"
JS = """function onError(event) {
    // the request failed
    var message = "Error: " + event.message;
    const box = document.getElementById("error");
    box.textContent = message;
}
"""
LAUNCH = """#!/bin/bash
# launch on every node
export NCCL_SOCKET_IFNAME=eth9
export NCCL_DEBUG=INFO
# if this fails, see the runbook
torchrun --nnodes 2 --nproc-per-node 8 train.py
"""
TRACEBACK = """Traceback (most recent call last):
  File "train.py", line 40, in <module>
    main()
  File "train.py", line 31, in main
    for batch in loader:
RuntimeError: DataLoader worker (pid 262) is killed by signal: Bus error.
"""


@pytest.mark.parametrize("name, text", [("pygments.css", CSS), ("train.py", PYTHON), ("index.html", HTML), ("app.js", JS)])
def test_source_and_markup_are_skipped_as_source(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    (item,) = discover(tmp_path)
    assert (item.format, item.status) == ("source", "skipped")
    assert "source code or markup" in item.reason


@pytest.mark.parametrize("name, text", [("launch.sh", LAUNCH), ("rank3.log", TRACEBACK)])
def test_launch_scripts_and_tracebacks_stay_logs(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    (item,) = discover(tmp_path)
    assert item.format == "text"


def test_a_documentation_folder_is_no_training_log(tmp_path):
    for name, text in (("pygments.css", CSS), ("index.html", HTML), ("search.js", JS)):
        (tmp_path / name).write_text(text)
    result = CliRunner().invoke(main, ["analyze", str(tmp_path)])
    assert result.exit_code == 2 and "not a log" in result.output and "VERDICT" not in result.output, result.output


def test_a_training_script_beside_a_healthy_run_raises_nothing(tmp_path):
    job = next(p for p in sorted(HEALTHY.glob("*/job")) if p.is_dir())
    copy = tmp_path / "job"
    import shutil

    shutil.copytree(job, copy)
    (copy / "train.py").write_text(PYTHON)
    result = CliRunner().invoke(main, ["analyze", str(copy), "--format", "json"])
    assert result.exit_code == 0, result.output
