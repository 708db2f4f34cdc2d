"""Runs and checkpoints are never lost or overwritten, and bad paths are one-line errors (issue 10)."""

import warnings

import pytest
import torch
import yaml

from trace_train.run.checkpoint import CheckpointError, load_latest_checkpoint, save_checkpoint
from trace_train.config_loader import config_to_dict, load_config
from trace_train.run.metrics_log import read_metrics
from trace_train.train import TrainConfig, cli, main

from .test_trainer import small_config


def _save(run_dir, step, value):
    return save_checkpoint(run_dir, step, policy={"w": torch.full((64,), float(value))},
                           optimizer={"state": {}, "param_groups": []}, extra={"step": step})


@pytest.mark.parametrize("damage", ["truncate policy", "empty extra", "delete rng", "garbage optimizer"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, damage):
    _save(tmp_path, 1, 1.0)
    latest = _save(tmp_path, 2, 2.0)
    action, name = damage.split()
    file = latest / {"policy": "policy.pt", "extra": "extra.pt", "rng": "rng.pt", "optimizer": "optimizer.pt"}[name]
    if action == "truncate":
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    elif action == "empty":
        file.write_bytes(b"")
    elif action == "delete":
        file.unlink()
    else:  # same size, wrong bytes: only unpickling can tell
        file.write_bytes(b"\0" * file.stat().st_size)
    with pytest.warns(UserWarning, match=rf"step_00000002.*{file.name}"):
        ckpt = load_latest_checkpoint(tmp_path, restore_random_state=False)
    assert ckpt.step == 1 and ckpt.extra == {"step": 1}
    assert torch.equal(ckpt.policy["w"], torch.full((64,), 1.0))


def test_old_checkpoints_without_recorded_sizes_still_name_the_bad_file(tmp_path):
    latest = _save(tmp_path, 1, 1.0)
    state = latest / "trainer_state.json"
    state.write_text(state.read_text().replace('"file_bytes"', '"ignored"'))
    (latest / "policy.pt").write_bytes((latest / "policy.pt").read_bytes()[:100])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(CheckpointError, match=r"no intact checkpoint.*policy\.pt: cannot be loaded"):
            load_latest_checkpoint(tmp_path, restore_random_state=False)


def test_a_run_without_checkpoints_loads_none(tmp_path):
    assert load_latest_checkpoint(tmp_path / "fresh") is None


def _other_config_yaml(run_dir):
    other = load_config(TrainConfig, "cpu_demo", [f"run_dir={run_dir}", "rollout.policy=grpo"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(other), sort_keys=False))
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    return (run_dir / "config.yaml").read_text()


def test_a_run_directory_of_another_config_is_refused_and_kept(tmp_path, capsys):
    run_dir = tmp_path / "run"
    before = _other_config_yaml(run_dir)
    code = cli(["--config", "cpu_demo", f"run_dir={run_dir}", "rollout.policy=trace"])
    err = capsys.readouterr().err
    assert code == 1
    assert "holds another run" in err and "rollout.policy" in err and len(err.strip().splitlines()) == 1
    assert (run_dir / "config.yaml").read_text() == before
    assert read_metrics(run_dir / "metrics.jsonl") == [{"step": 1, "loss": 0.5}]


def test_steps_and_logging_may_change_between_runs_into_one_directory(tmp_path):
    from trace_train.run.resume import check_or_write_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    check_or_write_config(small_config(run_dir), run_dir)
    check_or_write_config(small_config(run_dir, "steps=9", "checkpoint_every=3"), run_dir)
    check_or_write_config(small_config(run_dir, "optim.lr=0.5", "optim.grad_clip=0.1"), run_dir)
    with pytest.raises(ValueError, match=r"differs in optim\.weight_decay"):
        check_or_write_config(small_config(run_dir, "optim.weight_decay=0.5"), run_dir)


def test_a_run_dir_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    target = tmp_path / "out"
    target.write_text("not a folder")
    code = cli(["--config", "cpu_demo", f"run_dir={target}"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "is a file" in err and len(err.splitlines()) == 1
    assert target.read_text() == "not a folder"


@pytest.mark.parametrize("uid", [1000, 0], ids=["ordinary user", "root"])
def test_an_unwritable_run_dir_is_a_one_line_error(uid):
    """As an ordinary user (the cluster case) a folder without write permission is refused in one line;
    root is not stopped by permission bits, so for root the run directory sits on a read-only mount."""
    from tests.tools.sandbox_caller import run_as_caller

    scenario = """
import contextlib, ctypes, io, os
from trace_train.train import cli
ro = os.path.join(HOME, "ro")
os.mkdir(ro)
if os.geteuid() == 0:  # a read-only bind mount of the folder onto itself (we are in a private namespace)
    libc = ctypes.CDLL(None, use_errno=True)
    MS_BIND, MS_REMOUNT, MS_RDONLY = 4096, 32, 1
    assert libc.mount(ro.encode(), ro.encode(), None, MS_BIND, None) == 0
    assert libc.mount(None, ro.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None) == 0
else:
    os.chmod(ro, 0o555)
err = io.StringIO()
with contextlib.redirect_stderr(err):
    result["code"] = cli(["--config", "cpu_demo", "run_dir=" + os.path.join(ro, "run")])
result["err"] = err.getvalue().strip().splitlines()
"""
    result = run_as_caller(scenario, uid=uid)
    if "skip" in result:
        pytest.skip(result["skip"])
    assert result["code"] == 1
    assert result["err"][-1].startswith("trace-train: `run_dir`") and "is not writable" in result["err"][-1]


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: 3\nrollout:\n  policy: [trace\n  roots: 4\n")
    code = cli(["--config", str(bad)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and str(bad) in err and "line" in err and "not valid YAML" in err
    assert len(err.splitlines()) == 1


@pytest.mark.slow
def test_training_resumes_from_the_newest_intact_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    main(small_config(run_dir, "steps=2", "checkpoint_every=1"))
    latest = run_dir / "checkpoints" / "step_00000002" / "policy.pt"
    latest.write_bytes(latest.read_bytes()[:1000])
    with pytest.warns(UserWarning, match=r"step_00000002.*policy\.pt"):
        main(small_config(run_dir, "steps=3", "checkpoint_every=1"))
    steps = [row["step"] for row in read_metrics(run_dir / "metrics.jsonl")]
    assert steps == [1, 2, 3]  # step 2 was redone from the checkpoint of step 1, and logged once
