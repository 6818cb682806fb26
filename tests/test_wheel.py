"""The built wheel carries grammars/, rules/ and the schema, and analyses a fixture in a fresh venv."""

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_runs(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("postmortem-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True)
    job = ROOT / "fixtures" / "cases" / "008-dfine-hardcoded-device-duplicate-gpu" / "job"
    result = subprocess.run([str(env_dir / "bin" / "postmortem"), "analyze", str(job), "--format", "json"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert '"duplicate_gpu_or_cuda_visible_devices"' in result.stdout
    listing = subprocess.run([str(python), "-c", "import analyzer.resources as r; print(r.data_dir('rules'), r.data_dir('grammars'))"],
                             capture_output=True, text=True, cwd=tmp_path)
    assert "_data" in listing.stdout
