"""trace-sim never reports a damaged folder as finished, names corrupt files, and stops cleanly on Ctrl-C."""

import json

import pytest

from simulations import cli
from simulations.results import is_finished, run_experiment


def test_a_corrupt_summary_is_not_finished_and_is_rewritten(tmp_path):
    folder, ran = run_experiment("propositions", out=tmp_path, quick=True, progress=False)
    assert ran and is_finished(folder)
    (folder / "summary.json").write_text('{"experiment": "propositions", "claim": ')  # cut mid-write
    assert not is_finished(folder)
    folder, ran = run_experiment("propositions", out=tmp_path, quick=True, progress=False)
    assert ran and json.loads((folder / "summary.json").read_text())["experiment"] == "propositions"
    _, ran = run_experiment("propositions", out=tmp_path, quick=True, progress=False)
    assert not ran


def test_a_corrupt_config_names_the_file_and_line(tmp_path, capsys):
    (tmp_path / "propositions").mkdir()
    (tmp_path / "propositions" / "config.json").write_text('{\n  "seed": 0,\n  oops\n}')
    code = cli.main(["run", "propositions", "--quick", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "config.json, line 3: not valid JSON" in err and len(err.splitlines()) == 1


def test_a_corrupt_unit_names_the_file(tmp_path):
    from simulations.experiments.base import Units

    units = Units(tmp_path, progress=False)
    import pandas as pd

    units.map(lambda k: pd.DataFrame({"x": [k]}), [1, 2], desc="u")
    damaged = sorted(tmp_path.glob("u-0001-*.csv"))[0]
    damaged.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"{damaged.name}: cannot read this finished unit"):
        units.map(lambda k: pd.DataFrame({"x": [k]}), [1, 2], desc="u")


def test_ctrl_c_is_a_short_resume_hint(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_experiment", interrupted)
    code = cli.main(["run", "propositions", "--quick", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 130 and err.splitlines() == [
        "trace-sim: interrupted; rerun the same command to resume (finished units are kept)"]


def test_an_output_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "propositions").write_text("not a folder")
    code = cli.main(["run", "propositions", "--quick", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "is a file" in err and len(err.splitlines()) == 1
