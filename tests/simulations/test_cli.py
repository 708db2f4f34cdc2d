"""``trace-sim`` end to end: every experiment's quick run, results folders, resume, bad input, layering."""

import json
import shlex
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pandas as pd
import pytest

from simulations.cli import main
from simulations.experiments import EXPERIMENTS
from simulations.experiments import effective_ratio as effective_ratio_module
from simulations.experiments.base import COLUMNS
from simulations.results import config_json, resolve_config, run_experiment

COMPARED = {  # experiments whose headline is keyed by policy (arm) names
    "effective_ratio": set(effective_ratio_module.ARMS),
    "ablation": {"uniform_tree", "active_root_uniform_prefix", "prefix_only", "trace"},
    "learning_curves": {"grpo", "dapo", "trace", "trace[oracle]", "trace+grpo"},
    "predictor_quality": {"grpo", "trace", "trace[oracle]"},
    "target_bias": {"trace[oracle]", "uniform_tree"},
}


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick")
    assert main(["run", "all", "--quick", "--out", str(out)]) == 0
    return out


def test_list_names_every_experiment_with_its_claim(capsys):
    assert main(["list"]) == 0
    printed = capsys.readouterr().out
    for name, experiment in EXPERIMENTS.items():
        assert name in printed and experiment.claim in printed
    assert list(EXPERIMENTS) == [
        "contrast_identities",
        "propositions",
        "effective_ratio",
        "ablation",
        "learning_curves",
        "predictor_quality",
        "target_bias",
        "expansion_rounds",
        "sensitivity",
        "regime_map",
        "eager_expansion",
        "key_lock",
    ]


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_quick_run_writes_config_table_and_summary(quick_runs, name):
    folder = quick_runs / name
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "results.csv", "summary.json"]
    assert json.loads((folder / "config.json").read_text()) == config_json(resolve_config(name, quick=True))
    table = pd.read_csv(folder / "results.csv")
    assert list(table.columns[: len(COLUMNS)]) == list(COLUMNS) and len(table) > 0
    assert set(table["experiment"]) == {name} and table["value"].notna().any()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["experiment"] == name and summary["claim"] == EXPERIMENTS[name].claim
    assert isinstance(summary["held"], bool) and summary["result"].endswith(".")
    assert summary["quick"] is True and summary["seed"] == 0 and summary["runtime_s"] >= 0
    assert summary["command"] == f"trace-sim run {name} --quick --seed 0"
    assert len(summary["load_average"]) == 3
    assert summary["commit"] == _head(), "a summary copied under benchmarks/ must say which code it measured"
    if name in COMPARED:
        assert COMPARED[name] <= set(summary["headline"])


def test_quick_headlines_hold_numbers(quick_runs):
    summary = json.loads((quick_runs / "effective_ratio" / "summary.json").read_text())
    for entry in summary["headline"].values():
        assert 0.0 <= entry["effective_ratio"] <= 1.0
    grpo, trace = summary["headline"]["grpo"], summary["headline"]["trace[oracle]"]
    assert trace["effective_ratio"] > grpo["effective_ratio"]


def test_a_finished_run_is_skipped(quick_runs, capsys):
    before = (quick_runs / "propositions" / "results.csv").stat().st_mtime_ns
    assert main(["run", "propositions", "--quick", "--out", str(quick_runs)]) == 0
    assert "already finished, skipped" in capsys.readouterr().out
    assert (quick_runs / "propositions" / "results.csv").stat().st_mtime_ns == before


def test_same_seed_same_results_and_another_seed_differs(quick_runs, tmp_path):
    assert main(["run", "effective_ratio", "--quick", "--out", str(tmp_path / "a")]) == 0
    again = (tmp_path / "a" / "effective_ratio" / "results.csv").read_bytes()
    assert again == (quick_runs / "effective_ratio" / "results.csv").read_bytes()
    assert main(["run", "effective_ratio", "--quick", "--seed", "1", "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "effective_ratio" / "results.csv").read_bytes() != again


def test_an_interrupted_run_resumes_without_redoing_finished_units(tmp_path, monkeypatch):
    real = effective_ratio_module.online_batches
    calls = []

    def interrupted(*args, **kwargs):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(effective_ratio_module, "online_batches", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_experiment("effective_ratio", out=tmp_path, quick=True, progress=False)
    folder = tmp_path / "effective_ratio"
    assert (folder / "config.json").exists() and not (folder / "summary.json").exists()
    assert len(list((folder / "units").glob("*.csv"))) == 3

    calls.clear()
    monkeypatch.setattr(
        effective_ratio_module, "online_batches", lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    )
    _, ran = run_experiment("effective_ratio", out=tmp_path, quick=True, progress=False)
    units = (
        len(resolve_config("effective_ratio", quick=True).arms) * 2 * 2
    )  # arms x seeds x (rollout, turn) views
    assert ran and len(calls) == units - 3
    assert not (folder / "units").exists()

    run_experiment("effective_ratio", out=tmp_path / "fresh", quick=True, progress=False)
    assert (folder / "results.csv").read_bytes() == (
        tmp_path / "fresh" / "effective_ratio" / "results.csv"
    ).read_bytes()


def _error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trace-sim: error: ")
    return err[0]


def test_a_folder_from_another_config_is_refused(quick_runs, capsys):
    assert main(["run", "propositions", "--out", str(quick_runs)]) == 2  # full size over a quick run
    assert "holds a run with a different config" in _error_line(capsys)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "nope"], "unknown experiment 'nope'; known: contrast_identities"),
        (["run", "propositions", "--seed", "-1"], "--seed must be a non-negative integer"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(argv, message, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    assert message in _error_line(capsys)


def test_argument_errors_exit_with_status_2():
    with pytest.raises(SystemExit) as exit_info:
        main(["run"])
    assert exit_info.value.code == 2


def test_console_script_and_module_entry_point():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("trace-sim") == "simulations.cli:main"
    done = subprocess.run(
        [sys.executable, "-m", "simulations.cli", "list"], capture_output=True, text=True, check=True
    )
    assert "effective_ratio" in done.stdout


def test_simulations_imports_no_training_or_plotting_stack():
    code = (
        "import sys, pkgutil, importlib, simulations, simulations.experiments\n"
        "for m in pkgutil.walk_packages(simulations.__path__, 'simulations.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = {'torch', 'transformers', 'vllm', 'trace_train', 'matplotlib'} & set(sys.modules)\n"
        "print(','.join(sorted(bad)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_benchmark_script_reports_turns_per_second(tmp_path):
    target = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulations.benchmark",
            "--rollouts",
            "3000",
            "--repeats",
            "1",
            "--json",
            str(target),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "M turns/s" in done.stdout
    numbers = json.loads(target.read_text())
    assert numbers["raw_mturns_per_s"] > 0 and numbers["batch_mturns_per_s"] > 0
    assert numbers["commit"] == _head()
    assert numbers["command"].startswith("python -m simulations.benchmark --rollouts 3000")


def _head() -> str | None:
    """``git rev-parse HEAD`` of this checkout, None outside one."""
    done = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def test_set_changes_config_fields_and_policy_settings_ride_on_the_arm(tmp_path, capsys):
    overrides = {"arms": ["grpo", "dapo{dapo_target=2}"], "seeds": 1}
    config = resolve_config("effective_ratio", quick=True, overrides=overrides)
    assert config.arms == ("grpo", "dapo{dapo_target=2}") and config.seeds == 1
    assert main(["run", "effective_ratio", "--quick", "--out", str(tmp_path), "--set", "seeds=1",
                 "--set", "arms=('grpo', 'dapo{dapo_target=2}')"]) == 0
    summary = json.loads((tmp_path / "effective_ratio" / "summary.json").read_text())
    assert set(summary["headline"]) == {"grpo", "dapo{dapo_target=2}"}
    rerun = shlex.split(summary["command"])  # the recorded command reruns the same config: it is finished
    assert rerun[0] == "trace-sim" and main([*rerun[1:], "--out", str(tmp_path)]) == 0
    assert "already finished, skipped" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "nope=1"], "experiment 'effective_ratio' has no config field 'nope'"),
        (["--set", "seeds"], "--set takes key=value, got 'seeds'"),
        (["--set", "arms=(grpo,)"], "the value must be a Python literal"),
        (["--set", "arms=('dapo{target=2}',)"], "arm 'dapo{target=2}'"),
    ],
)
def test_a_bad_set_is_one_line(tmp_path, capsys, argv, message):
    assert main(["run", "effective_ratio", "--quick", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
