"""Fixtures of the verl plugin's tests: a tiny warm-started model on disk (nothing is downloaded), and
``verl``, the verl module or a skip that names what is missing (the main venv has no verl: its tests of the
plugin's verl-facing parts skip; ``make test-verl`` runs them in the plugin's own venv)."""

from __future__ import annotations

import importlib

import pytest


def verl_or_skip():
    """``import verl`` at a version the plugin supports, or skip the test saying why."""
    from packaging.specifiers import SpecifierSet

    from trace_train.integrations.verl import VERL_VERSIONS

    try:
        verl = importlib.import_module("verl")
    except Exception as error:  # noqa: BLE001 - any import failure means: not this venv
        pytest.skip(f"verl is not importable here ({type(error).__name__}: {error}); run `make test-verl`")
    if str(getattr(verl, "__version__", "0")) not in SpecifierSet(VERL_VERSIONS):
        found = getattr(verl, "__version__", "?")
        pytest.skip(f"verl {found} is installed; the plugin's tests need verl{VERL_VERSIONS}")
    return verl


@pytest.fixture(scope="session")
def verl():
    return verl_or_skip()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> str:
    from trace_train.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-qwen3"), seed=0, warm_steps=60)


@pytest.fixture
def hf_backend(tiny_dir):
    from trace_train.backends.hf_backend import HFBackend

    return HFBackend.from_pretrained(tiny_dir)


def pytest_configure(config):
    # verl announces each training engine it lacks (megatron, mindspeed, ...) at import: not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore:.*engine is not available:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore:Ray state API is no longer experimental:DeprecationWarning")
