"""Every interpreter the project starts is immune to the caller's working directory, PYTHONPATH and user
site (issue 52, item 1): a module planted there under a name the child imports is never imported."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.predictors.test_fit_process import FIT, _problem
from trace_theory.benchmark import _table_in_child
from trace_train.predictors.fit_process import FitProcess
from trace_train.child_python import isolated_environment, module_command, spawn_pool
from trace_train.verifiers.math import MathChecker

PLANTED = ("math_verify", "numpy", "scipy", "json", "runpy", "sitecustomize", "usercustomize", "trace_train")


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """Modules named like those children import, in the cwd, a PYTHONPATH directory and the user site;
    each one, if imported, leaves a file in ``tmp_path / "imported"``."""
    markers = tmp_path / "imported"
    markers.mkdir()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    places = [tmp_path / "cwd", tmp_path / "pythonpath", tmp_path / "userbase" / "lib" / version / "site-packages"]
    for place in places:
        place.mkdir(parents=True)
        for name in PLANTED:
            (place / f"{name}.py").write_text(
                f"open({str(markers / (place.name + '-' + name))!r}, 'w').close()\n")
    (places[0] / "trace_train").mkdir()  # a package too, for `-m trace_train...`
    (places[0] / "trace_train" / "__init__.py").write_text(f"open({str(markers / 'cwd-package')!r}, 'w').close()\n")
    monkeypatch.chdir(places[0])
    monkeypatch.setenv("PYTHONPATH", str(places[1]))
    monkeypatch.setenv("PYTHONUSERBASE", str(tmp_path / "userbase"))
    monkeypatch.delenv("PYTHONNOUSERSITE", raising=False)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    return markers


def _imported(markers: Path) -> list[str]:
    return sorted(path.name for path in markers.iterdir())


def test_the_plants_are_imported_by_a_plain_child(planted):
    """The fixture's plants are live: ``python -m`` (the old way) imports them."""
    subprocess.run([sys.executable, "-m", "json.tool", "--help"], capture_output=True)
    assert _imported(planted)


def test_the_math_verifier_worker_imports_nothing_of_the_caller(planted):
    checker = MathChecker()
    try:
        assert checker.compare("1/2", "0.5") == "correct"
    finally:
        checker.close()
    assert _imported(planted) == []


def test_the_predictor_fit_process_imports_nothing_of_the_caller(planted):
    worker = FitProcess()
    try:
        encoding, state, y, w = _problem(0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fit that fell back inline would warn
            worker.fit(encoding, state, y, w, **FIT)
        assert worker.failed is None
    finally:
        worker.close()
    assert _imported(planted) == []


def test_the_theory_benchmark_child_imports_nothing_of_the_caller(planted):
    row = _table_in_child(64, 128, 0, 1, seconds=120, memory_gb=4)
    assert "failed" not in row and _imported(planted) == []


def test_module_command_runs_the_parents_package_isolated(planted):
    done = subprocess.run([*module_command("trace_train.verifiers._math_worker")], input="", capture_output=True,
                          text=True, timeout=120)
    assert '"ready"' in done.stdout and _imported(planted) == []


def test_launchers_children_get_the_isolation_as_environment(planted):
    """torchrun's workers (``python -u -m``) get ``isolated_environment``: no cwd, PYTHONPATH or user site."""
    done = subprocess.run([sys.executable, "-u", "-m", "trace_train.child_python"], capture_output=True,
                          text=True, env=isolated_environment(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert _imported(planted) == []


def _square(x):
    return int(np.square(x))


def test_a_spawn_pool_worker_starts_without_the_callers_plants(planted):
    with spawn_pool(1) as pool:
        assert pool.apply(_square, (3,)) == 9
    assert _imported(planted) == []
