"""Command lines (issue 34): overrides on both sides of --quiet; a plugin that fails to import is one line."""

import pytest
import yaml

from trace_train.train import cli


def test_overrides_may_come_on_both_sides_of_quiet(capsys):
    code = cli(["--config", "cpu_demo", "steps=3", "--quiet", "seed=7", "--print-config", "optim.lr=0.002"])
    out = capsys.readouterr().out
    assert code == 0
    cfg = yaml.safe_load(out)
    assert (cfg["steps"], cfg["seed"], cfg["quiet"], cfg["optim"]["lr"]) == (3, 7, True, 0.002)


@pytest.mark.parametrize("body, error", [
    ("x = 1 / 0\n", "ZeroDivisionError: division by zero"),
    ("def broken(:\n", "SyntaxError"),
    ("raise RuntimeError('needs a GPU driver')\n", "RuntimeError: needs a GPU driver"),
])
def test_a_plugin_that_fails_to_import_is_one_line_naming_the_module_and_the_error(tmp_path, capsys, body, error):
    plugin = tmp_path / "bad_env.py"
    plugin.write_text(body)
    code = cli(["--config", "cpu_demo", f"run_dir={tmp_path / 'run'}", f"task.name={plugin}:Env", "steps=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (1, 2)
    assert len(err) == 1 and err[0].startswith("trace-train: ")
    assert f"environment module '{plugin}' fails to import: {error}" in err[0] and "line" in err[0]
    assert "Traceback" not in err[0]
