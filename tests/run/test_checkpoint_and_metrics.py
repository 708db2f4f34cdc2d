"""Checkpoints restore everything a run depends on; the metrics log survives crashes and resumes."""

import random

import numpy as np
import pytest
import torch

from trace_train.run.checkpoint import (CheckpointError, check_world_size, latest_checkpoint, load_checkpoint,
                                        save_checkpoint, written_by_processes)
from trace_train.run.metrics_log import MetricsLogger, read_metrics


def small_training_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt


def train_step(model, opt, gen):
    x = torch.randn(8, 4) + torch.from_numpy(gen.standard_normal((8, 4))).float() + random.random()
    loss = model(x).pow(2).mean() + float(np.random.rand())
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def test_resume_continues_exactly(tmp_path):
    # Uninterrupted: 6 steps.
    model, opt = small_training_state()
    gen = np.random.default_rng(7)
    random.seed(1), np.random.seed(2)
    straight = [train_step(model, opt, gen) for _ in range(6)]
    final = {k: v.clone() for k, v in model.state_dict().items()}

    # Interrupted after 3 steps, restored into fresh objects with scrambled random states.
    model, opt = small_training_state()
    gen = np.random.default_rng(7)
    random.seed(1), np.random.seed(2)
    first = [train_step(model, opt, gen) for _ in range(3)]
    save_checkpoint(tmp_path, 3, policy=model.state_dict(), optimizer=opt.state_dict(),
                    extra={"data_position": 3}, generators={"sampler": gen}, config_fingerprint="abc")
    model, opt = small_training_state(seed=99)
    gen = np.random.default_rng(12345)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    ckpt = load_checkpoint(latest_checkpoint(tmp_path), generators={"sampler": gen})
    model.load_state_dict(ckpt.policy)
    opt.load_state_dict(ckpt.optimizer)
    assert ckpt.step == 3 and ckpt.extra == {"data_position": 3} and ckpt.config_fingerprint == "abc"
    rest = [train_step(model, opt, gen) for _ in range(3)]
    assert first + rest == straight
    for k, v in model.state_dict().items():
        assert torch.equal(v, final[k])


def test_keeps_the_newest_and_latest_points_at_a_complete_checkpoint(tmp_path):
    model, _ = small_training_state()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, policy=model.state_dict(), keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step_00000002", "step_00000003"]
    assert latest_checkpoint(tmp_path).name == "step_00000003"
    assert latest_checkpoint(tmp_path / "elsewhere") is None


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path):
    model, _ = small_training_state()
    save_checkpoint(tmp_path, 1, policy=model.state_dict())

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path, 2, policy=model.state_dict(), extra={"bad": Unpicklable()})
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    assert not any(p.name.startswith(".step") for p in (tmp_path / "checkpoints").iterdir())


def test_checkpoint_errors(tmp_path):
    with pytest.raises(ValueError, match=r"`step` must be a non-negative integer, got -1"):
        save_checkpoint(tmp_path, -1, policy={})
    with pytest.raises(ValueError, match=r"is not a checkpoint \(no trainer_state.json\)"):
        load_checkpoint(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_00000009\n")
    with pytest.raises(ValueError, match=r"is incomplete or missing"):
        latest_checkpoint(tmp_path)


@pytest.mark.parametrize("written, running, advice", [(1, 2, "resume it without torchrun"),
                                                       (2, 1, "resume it with torchrun --nproc_per_node 2"),
                                                       (2, 4, "resume it with torchrun --nproc_per_node 2")])
def test_a_resume_on_another_number_of_processes_is_one_line_saying_what_to_do(tmp_path, written, running, advice):
    ranks = {"ranks": [{"rng": None}] * written} if written > 1 else {}
    save_checkpoint(tmp_path, 3, policy={"w": torch.zeros(2)}, extra={"sampler": {}, **ranks})
    ckpt = load_checkpoint(latest_checkpoint(tmp_path), restore_random_state=False)
    assert written_by_processes(ckpt) == written
    check_world_size(ckpt, written)  # the same number resumes
    with pytest.raises(CheckpointError) as err:
        check_world_size(ckpt, running)
    message = str(err.value)
    assert "\n" not in message and f"written by {written} process" in message and f"this run has {running}" in message
    assert advice in message and "another run_dir" in message


def test_metrics_log_resume_and_torn_lines(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=True) as log:
        for step in range(1, 6):
            log.log(step, {"loss": np.float32(1.0 / step), "reward": torch.tensor(0.5), "bad": float("nan")})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[0]["bad"] == "nan"
    assert any((tmp_path / "tensorboard").iterdir())
    # A crash mid-write leaves a torn last line; it is ignored.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 5
    # Resuming from the checkpoint of step 3 drops what steps 4-5 wrote before the crash.
    with MetricsLogger(tmp_path, resume_step=3, tensorboard=False) as log:
        log.log(4, {"loss": 0.2})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["loss"] == 0.2


def test_a_damaged_metrics_line_is_skipped_with_a_warning_and_does_not_block_a_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n[3]\n{"step": 2}\n{"step": 3}\n')
    with pytest.warns(UserWarning, match=r"metrics.jsonl: line 2 is damaged") as caught:
        assert read_metrics(path) == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert any("line 3 is damaged" in str(w.message) for w in caught)
    with pytest.warns(UserWarning, match="line 2"):
        with MetricsLogger(tmp_path, resume_step=2, tensorboard=False) as log:
            log.log(3, {"loss": 0.1})
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]


def test_a_planted_pickle_in_a_checkpoint_is_refused_and_never_runs(tmp_path):
    """A file whose unpickling would call os.system (here: touch a file) is refused by name, unrun."""
    import json
    import os

    from trace_train.run.checkpoint import CheckpointError, load_latest_checkpoint

    model, _ = small_training_state()
    ckpt = save_checkpoint(tmp_path, 1, policy=model.state_dict(), extra={"a": 1})
    marker = tmp_path / "pwned"

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    for name in ("extra.pt", "rng.pt", "policy.pt"):
        torch.save({"x": Planted()}, ckpt / name)
    meta = json.loads((ckpt / "trainer_state.json").read_text())
    meta["file_bytes"] = {n: (ckpt / n).stat().st_size for n in meta["file_bytes"]}
    (ckpt / "trainer_state.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"rng\.pt: refused: it asks for \S*system.*could run code"):
        load_checkpoint(ckpt)
    with pytest.warns(UserWarning, match="refused"), pytest.raises(CheckpointError, match="no intact checkpoint"):
        load_latest_checkpoint(tmp_path)
    assert not marker.exists()


def test_a_full_disk_while_checkpointing_is_one_line_naming_the_file_and_keeps_the_last_one(tmp_path, monkeypatch):
    import errno

    from trace_train.run import checkpoint
    from trace_train.run.files import OutOfSpaceError

    model, _ = small_training_state()
    save_checkpoint(tmp_path, 1, policy=model.state_dict())
    real_save = torch.save

    class FillsUp:  # the file system fills up after 100 bytes of extra.pt: torch's writer sees the OSError
        def __init__(self, file):
            self.file, self.written = file, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 100:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.file.write(data)

        def flush(self):
            self.file.flush()

    def full(obj, file, *a, **k):
        if getattr(file, "name", str(file)).endswith("extra.pt"):
            file = FillsUp(file)  # torch raises "RuntimeError: [enforce fail at inline_container.cc]"
        return real_save(obj, file, *a, **k)

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(OutOfSpaceError) as err:
        save_checkpoint(tmp_path, 2, policy=model.state_dict())
    message = str(err.value)
    assert "step_00000002/extra.pt" in message and "no space left" in message and "free there" in message
    assert len(message.splitlines()) == 1
    monkeypatch.setattr(checkpoint.torch, "save", real_save)
    assert latest_checkpoint(tmp_path).name == "step_00000001"
    assert load_checkpoint(latest_checkpoint(tmp_path), restore_random_state=False).step == 1
    assert not any(p.name.startswith(".") for p in (tmp_path / "checkpoints").iterdir())


def test_partial_checkpoints_are_cleaned_and_never_loaded(tmp_path):
    from trace_train.run.checkpoint import clean_partial_checkpoints, load_latest_checkpoint

    model, _ = small_training_state()
    save_checkpoint(tmp_path, 1, policy=model.state_dict())
    root = tmp_path / "checkpoints"
    partial = root / ".step_00000002.abc123"  # what a SIGTERM during save_checkpoint leaves
    partial.mkdir()
    (partial / "policy.pt").write_bytes(b"half")
    (root / ".latest.xyz").write_text("step_00000002\n")
    assert load_latest_checkpoint(tmp_path, restore_random_state=False).step == 1
    assert clean_partial_checkpoints(tmp_path) == [root / ".latest.xyz", partial]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000001"]
