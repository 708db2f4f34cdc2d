"""The ``verl.plugins`` entry point: ``import verl`` registers TRACE, and a plugin that cannot register says
so in one line at warning level (verl itself logs a failing plugin at DEBUG only)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from trace_train.integrations.verl import VERL_VERSION, VERL_VERSIONS

PLUGIN_LINE = "TRACE's verl plugin"


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_import_verl_registers_the_estimators_the_agent_loop_and_the_trainer(verl):
    # verl's own registries, read right after `import verl` (its entry-point loader ran the plugin), then
    # the plugin's summary line, the one the README prints.
    run = python("import verl; from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as R; "
                 "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as L; "
                 "print('trace' in R, 'trace_tool_agent' in L); "
                 "import trace_train.integrations.verl.plugin as p; print(p.summary())")
    assert run.returncode == 0, run.stderr
    registries, line = run.stdout.strip().splitlines()[-2:]
    assert registries.split() == ["True", "True"], run.stderr
    assert line.startswith(f"TRACE in verl {VERL_VERSION}: estimators ['trace', 'trace_grpo'"), line
    assert "agent loops ['trace_tool_agent']" in line and "trainers ['trace']" in line
    assert "problem" not in line and PLUGIN_LINE not in run.stderr


def test_a_plugin_that_cannot_register_says_so_in_one_line(verl):
    run = python("import sys; sys.modules['trace_train.integrations.verl.estimator'] = None; import verl")
    assert run.returncode == 0, run.stderr  # verl itself still imports
    lines = [ln for ln in run.stderr.splitlines() if PLUGIN_LINE in ln]
    assert len(lines) == 1, run.stderr
    assert "could not register the advantage estimators" in lines[0] and "ModuleNotFoundError" in lines[0]


@pytest.fixture
def plugin(verl, monkeypatch):
    import trace_train.integrations.verl.plugin as plugin

    monkeypatch.setattr(plugin, "PROBLEM", plugin.PROBLEM)  # restored after the test
    return plugin


def test_a_wrong_verl_version_is_one_warning_naming_both_versions(plugin, monkeypatch, caplog):
    import verl

    monkeypatch.setattr(verl, "__version__", "0.8.0")
    with caplog.at_level(logging.DEBUG, logger="trace_train.integrations.verl"):
        plugin.register()
    records = [r for r in caplog.records if r.name == "trace_train.integrations.verl"]
    assert len(records) == 1 and records[0].levelno >= logging.WARNING
    assert f"needs verl{VERL_VERSIONS} (tested: {VERL_VERSION}), found verl 0.8.0" in records[0].getMessage()
    assert plugin.PROBLEM == records[0].getMessage()


@pytest.mark.parametrize("version", ["0.9.1", "0.9.2", "0.9.10"])
def test_a_verl_release_in_the_range_registers_without_a_warning(plugin, monkeypatch, caplog, version):
    import verl

    monkeypatch.setattr(verl, "__version__", version)
    monkeypatch.setattr(plugin, "PROBLEM", None)
    with caplog.at_level(logging.DEBUG, logger="trace_train.integrations.verl"):
        plugin.register()
    assert not [r for r in caplog.records if r.name == "trace_train.integrations.verl"] and plugin.PROBLEM is None
    assert not plugin.supported("0.10.0") and not plugin.supported("0.9.0") and not plugin.supported("garbage")


def test_verl_missing_is_one_warning(plugin, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "verl", None)  # `import verl` raises ImportError
    with caplog.at_level(logging.DEBUG, logger="trace_train.integrations.verl"):
        plugin.register()
    records = [r for r in caplog.records if r.name == "trace_train.integrations.verl"]
    assert len(records) == 1 and records[0].levelno >= logging.WARNING
    assert "`import verl` failed" in records[0].getMessage() and "[verl]" in records[0].getMessage()
