"""Hostile results folders and --set values: deep nesting, NaN and infinities are one-line errors naming
the file (or the setting), never a traceback or a run silently reused (issue 24)."""

import json

import pytest

from simulations import cli
from simulations.results import MAX_DEPTH, is_finished, run_experiment

DEEP = "[" * 100_000 + "]" * 100_000
JUST_TOO_DEEP = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)


def _run(tmp_path, capsys, *extra):
    code = cli.main(["run", "propositions", "--quick", "--out", str(tmp_path), *extra])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("text, reason", [
    ('{"seed": ' + DEEP + "}", f"nested deeper than {MAX_DEPTH} levels"),
    ('{"seed": ' + JUST_TOO_DEEP + "}", f"nested deeper than {MAX_DEPTH} levels"),
    ('{"seed": NaN}', "holds NaN, which trace-sim never writes"),
    ('{"seed": -Infinity}', "holds -Infinity, which trace-sim never writes"),
])
def test_a_hostile_config_is_one_line_naming_the_file(tmp_path, capsys, text, reason):
    (tmp_path / "propositions").mkdir()
    path = tmp_path / "propositions" / "config.json"
    path.write_text(text)
    code, err = _run(tmp_path, capsys)
    assert code == 2 and err.startswith(f"trace-sim: error: {path}: {reason}") and len(err.splitlines()) == 1


@pytest.mark.parametrize("value", ["NaN", "Infinity", DEEP])
def test_a_summary_with_nan_or_deep_nesting_is_not_finished_and_is_rewritten(tmp_path, value):
    folder, _ = run_experiment("propositions", out=tmp_path, quick=True, progress=False)
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps(summary)[:-1] + f', "runtime_s_extra": {value}}}')
    assert not is_finished(folder)
    folder, ran = run_experiment("propositions", out=tmp_path, quick=True, progress=False)
    assert ran and "runtime_s_extra" not in json.loads((folder / "summary.json").read_text())


@pytest.mark.parametrize("setting, reason", [
    ("group_size=1e999", "--set group_size: numbers must be finite, got inf"),
    ("seeds=" + "(" * 100_000 + ")" * 100_000, "the value must be a Python literal"),
])
def test_a_hostile_setting_is_one_line(tmp_path, capsys, setting, reason):
    code, err = _run(tmp_path, capsys, "--set", setting)
    assert code == 2 and reason in err and len(err.splitlines()) == 1 and len(err) < 300


def test_an_arm_setting_must_be_a_finite_number():
    from simulations.runner import Arm

    with pytest.raises(ValueError, match="setting 'dapo_target' must be a finite number, got inf"):
        Arm.parse("dapo{dapo_target=1e999}")
    with pytest.raises(ValueError, match="a setting is written key=literal"):
        Arm.parse("dapo{dapo_target=" + "(" * 100_000 + "}")
