"""The built wheel, installed with its declared dependencies into an isolated venv, analyses a fixture.

The venv sees no system site packages and pip resolves the wheel's own requirements, so a dependency
the project forgot to declare fails here (on a developer's machine it would be masked by whatever was
installed by hand earlier).
"""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _isolated_venv(path: Path) -> Path:
    venv.create(path, with_pip=True, system_site_packages=False, clear=True)
    return path / "bin"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_installs_with_its_dependencies_and_runs(tmp_path):
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(ROOT)],
                   check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("postmortem-*.whl")
    bin_dir = _isolated_venv(tmp_path / "venv")
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    install = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)],
                             capture_output=True, text=True, env=clean_env)
    assert install.returncode == 0, install.stderr[-3000:]
    probe = subprocess.run([str(bin_dir / "python"), "-c", "import sys; print(sys.prefix != sys.base_prefix, sys.path)"],
                           capture_output=True, text=True, env=clean_env, cwd=tmp_path)
    assert probe.stdout.startswith("True") and str(ROOT) not in probe.stdout, probe.stdout

    job = ROOT / "fixtures" / "cases" / "008-dfine-hardcoded-device-duplicate-gpu" / "job"
    result = subprocess.run([str(bin_dir / "postmortem"), "analyze", str(job), "--format", "json"],
                            capture_output=True, text=True, cwd=tmp_path, env=clean_env)
    assert result.returncode == 1, result.stderr
    assert '"duplicate_gpu_or_cuda_visible_devices"' in result.stdout
    listing = subprocess.run([str(bin_dir / "python"), "-c",
                              "import analyzer.resources as r; print(r.data_dir('rules'), r.data_dir('grammars'))"],
                             capture_output=True, text=True, cwd=tmp_path, env=clean_env)
    assert "_data" in listing.stdout, listing.stderr
