"""Every loader of a run directory catches per line or per checkpoint and names the file (issue 34)."""

import json

import pytest
import torch

from trace_train.run.checkpoint import CheckpointError, load_checkpoint, load_latest_checkpoint, save_checkpoint
from trace_train.run.metrics_log import read_metrics
from trace_train.train import cli

from tests.train.test_trainer import SMALL


def _policy():
    return {"w": torch.ones(3)}


@pytest.mark.parametrize("meta, message", [
    ({"step": 1e999}, "`step` must be a non-negative integer"),
    ({"step": "1"}, "`step` must be a non-negative integer"),
    ({"step": True}, "`step` must be a non-negative integer"),
    ({"step": 1, "file_bytes": {"policy.pt": "big"}}, "`file_bytes` must map"),
    ({"step": 1, "file_bytes": {"../../etc/passwd": 1}}, "`file_bytes` must map"),
    ({"step": 1, "config_fingerprint": 7}, "`config_fingerprint` must be a string"),
    ([1, 2], "not a JSON object"),
])
def test_a_trainer_state_of_wrong_types_is_one_line_naming_it(tmp_path, meta, message):
    path = save_checkpoint(tmp_path, 1, policy=_policy())
    text = json.dumps(meta).replace("Infinity", "1e999")
    (path / "trainer_state.json").write_text(text)
    with pytest.raises(CheckpointError, match=rf"trainer_state.json: cannot be read .*{message}"):
        load_checkpoint(path, restore_random_state=False)


def test_an_rng_file_of_the_wrong_structure_is_one_line_naming_it(tmp_path):
    save_checkpoint(tmp_path, 1, policy=_policy(), rng_state={"python": 1, "numpy": [], "torch": "x"})
    with pytest.warns(UserWarning, match="rng.pt: not the random states a checkpoint holds"):
        with pytest.raises(CheckpointError, match=r"no intact checkpoint .*rng\.pt: not the random states"):
            load_latest_checkpoint(tmp_path)


def test_deep_and_huge_metrics_lines_are_skipped_with_a_warning_naming_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n' + "[" * 100_000 + "\n" + '{"step": ' + "9" * 5000 + "}\n" + '{"step": 2}\n')
    with pytest.warns(UserWarning) as caught:
        rows = read_metrics(path)
    assert [r["step"] for r in rows] == [1, 2]
    assert [str(w.message) for w in caught] == [f"{path}: line {n} is damaged (not a JSON object with a step); skipped"
                                                for n in (2, 3)]


def test_a_checkpoint_whose_extra_lacks_its_keys_and_planted_files_are_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["--config", "cpu_demo", f"run_dir={run_dir}", *SMALL, "checkpoint_every=1", "--quiet"]
    assert cli([*args, "steps=1"]) == 0
    ckpt = run_dir / "checkpoints" / "step_00000001"
    old = load_checkpoint(ckpt, restore_random_state=False)
    save_checkpoint(run_dir, 1, policy=old.policy, optimizer=old.optimizer, extra={},  # rewritten whole
                    config_fingerprint=old.config_fingerprint, trajectory_fingerprint=old.trajectory_fingerprint)
    capsys.readouterr()
    assert cli([*args, "steps=2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"trace-train: {ckpt / 'extra.pt'}: does not hold this run's state (KeyError")
    assert not any(line.startswith("Traceback") for line in err)


def test_hf_planted_as_a_file_is_one_line_not_a_silent_non_export(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "hf").write_text("not a model")
    assert cli(["--config", "cpu_demo", f"run_dir={run_dir}", *SMALL, "steps=1", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"trace-train: {run_dir / 'hf'} is a file, not a folder (remove it)"
    assert not any(line.startswith("run finished") for line in err)
    assert (run_dir / "hf").read_text() == "not a model"


def test_a_partial_checkpoint_left_by_a_killed_write_is_removed_by_the_next_write(tmp_path):
    """SIGTERM during a checkpoint write leaves ``.step_*``; the next checkpoint of the run removes it."""
    save_checkpoint(tmp_path, 1, policy=_policy())
    partial = tmp_path / "checkpoints" / ".step_00000002.k1ll3d"
    partial.mkdir()
    (partial / "policy.pt").write_bytes(b"half")
    (tmp_path / "checkpoints" / ".latest.x1").write_text("step_00000002\n")
    save_checkpoint(tmp_path, 3, policy=_policy())
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step_00000001", "step_00000003"]
