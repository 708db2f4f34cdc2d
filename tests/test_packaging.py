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
