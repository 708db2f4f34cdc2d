"""``make setup`` refuses a CUDA build of torch in the CPU set-up and says how to get the CPU wheel.

The check is the Makefile's own recipe line, expanded by ``make -n`` and run against a stand-in ``torch``
package (a ``version.cuda`` and a ``__version__``, nothing else), so no torch build has to be installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _check_command(venv: Path, *make_args: str) -> str:
    """The expanded torch-check line of the setup recipe (``make -n`` prints the recipe when not set up)."""
    done = subprocess.run(["make", "-n", "-C", str(REPO), "setup", f"VENV={venv}", *make_args], capture_output=True,
                          text=True, check=True)
    text = done.stdout.replace("\\\n", "")
    lines = [ln for ln in text.splitlines() if "torch.version.cuda" in ln and ln.lstrip().startswith(str(venv))]
    assert len(lines) == 1, text
    return lines[0]


def _run(tmp_path, cuda: str | None, *make_args: str) -> subprocess.CompletedProcess:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    stub = tmp_path / "stub" / "torch"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"__version__ = '2.13.0{'+cu130' if cuda else '+cpu'}'\n"
                                      f"class version:\n    cuda = {cuda!r}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub")}
    return subprocess.run(["bash", "-c", _check_command(venv, *make_args)], capture_output=True, text=True, env=env)


pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def test_a_cuda_torch_in_the_cpu_setup_is_refused_with_the_way_to_the_cpu_wheel(tmp_path):
    done = _run(tmp_path, "13.0")
    assert done.returncode == 1
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "holds torch 2.13.0+cu130, the CUDA 13.0 build" in err and "but this is the CPU set-up" in err
    assert "make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu" in err and "pip download torch==2.13.0" in err


def test_the_cpu_torch_passes_and_a_cuda_torch_can_be_kept_on_request(tmp_path):
    assert _run(tmp_path, None).returncode == 0
    assert _run(tmp_path / "kept", "13.0", "ALLOW_CUDA_TORCH=1").returncode == 0
