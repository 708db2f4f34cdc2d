"""``make setup`` builds the package without setuptools' deprecation banner (issue 54): ``project.license`` is
the SPDX string of PEP 639, which setuptools reads without a warning."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_license_is_an_spdx_string_that_setuptools_reads_without_a_warning():
    from setuptools.config.pyprojecttoml import read_configuration

    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert data["project"]["license"] == "Apache-2.0"
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in data["build-system"]["requires"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_configuration(REPO / "pyproject.toml")
    assert not [w for w in caught if "license" in str(w.message).lower()], [str(w.message)[:200] for w in caught]


def test_make_setup_silences_the_editable_install_banner_of_setuptools():
    """Every editable install printed setuptools' "Editable installation" banner (a folder named like the
    package may shadow it: here the folders are the package). The Makefile's install lines pass a warning
    filter that hides exactly that message, and Python applies it to the message setuptools emits."""
    import re
    import subprocess
    import sys

    # -B: print the recipe even when the venv is already set up (as it is when the suite runs from make test)
    out = subprocess.run(["make", "-n", "-B", "setup"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    line = next(l for l in out.splitlines() if "pip install --quiet -e" in l)
    spec = re.search(r'PYTHONWARNINGS="([^"]+)"', line)
    assert spec, line
    emit = ("from setuptools.warnings import InformationOnly; "
            "InformationOnly.emit('Editable installation.', 'folders named like the package')")
    shown = subprocess.run([sys.executable, "-c", emit], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "default"})
    assert "Editable installation" in shown.stderr  # setuptools does print it without the filter
    hidden = subprocess.run([sys.executable, "-c", emit], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": spec.group(1)})
    assert hidden.returncode == 0 and "Editable installation" not in hidden.stderr, hidden.stderr
