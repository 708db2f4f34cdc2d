"""Quick-size results of every experiment, simulated once per test session (about 3 s)."""

import shutil

import pytest

from simulations.experiments import EXPERIMENTS
from simulations.results import run_experiment


@pytest.fixture(scope="session")
def quick_results(tmp_path_factory):
    """A results folder as `trace-sim run all --quick` writes it. Tests must not modify it: copy it first."""
    root = tmp_path_factory.mktemp("quick")
    for name in EXPERIMENTS:
        run_experiment(name, out=root, quick=True, progress=False)
    return root


@pytest.fixture
def results_copy(quick_results, tmp_path):
    """A private copy of the quick results, free to corrupt."""
    return shutil.copytree(quick_results, tmp_path / "results")
