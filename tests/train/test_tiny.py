"""The tiny model's warm start on a task's scripted expert: the transcripts are the engine's contexts, the
loss mask covers the actions only, the tokenizer learns the task's text, and the warm start fits them."""

import numpy as np
import pytest
from transformers import AutoTokenizer

from trace_train.configs import TaskConfig
from trace_train.chat import ChatFormat
from trace_train.tasks import build_task
from trace_train.tiny import (build_model, build_tokenizer, demonstration_transcript, play_demonstrations, save_tiny,
                               warm_start)


def _qa_task():
    return build_task(TaskConfig(name="search_qa", train="demo"), seed=0, hold_out=False)


def test_a_transcript_masks_exactly_the_demonstrated_actions_and_ends_at_the_answer():
    task = _qa_task()
    tokenizer = build_tokenizer()
    chat = ChatFormat(tokenizer)
    (opening, steps), = play_demonstrations(task.make_env, task.train_rows[:1], task.demonstration)
    assert len(steps) == 3 and steps[-1][1].done  # two searches, then the answer ends it
    ids, mask = demonstration_transcript(tokenizer, (opening, steps))
    ids, mask = np.asarray(ids), np.asarray(mask, bool)
    prompt = chat.prompt_ids(opening)
    assert list(ids[:len(prompt)]) == prompt and not mask[:len(prompt)].any()
    end = chat.turn_end_ids[0]
    masked_runs = np.split(ids[mask], np.flatnonzero(ids[mask] == end) + 1)[:-1]
    assert [chat.tokenizer.decode(run[:-1]) for run in masked_runs] == [action for action, _ in steps]
    assert ids[-1] == end and mask[-1]  # nothing after the final answer


def test_the_tiny_model_of_a_task_with_an_expert_learns_its_text_and_its_episodes(tmp_path):
    task = _qa_task()
    shown = (task.make_env, task.train_rows, task.demonstration)
    path = save_tiny(tmp_path / "qa", seed=0, warm_steps=0, demonstrations=shown)
    qa_tokens, guess_tokens = AutoTokenizer.from_pretrained(path), build_tokenizer()
    passage = "It was invented in 1821 by the clockmaker Maren Osk, who built the first one for the port authority."
    assert len(qa_tokens(passage).input_ids) < len(guess_tokens(passage).input_ids)

    episodes = play_demonstrations(*shown)
    transcripts = [demonstration_transcript(qa_tokens, e) for e in episodes]
    model = build_model(qa_tokens, seed=0)
    losses = warm_start(model, qa_tokens, steps=30, batch_size=4, seed=0, transcripts=transcripts)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def test_the_warm_start_never_sees_a_held_out_row(tmp_path, monkeypatch):
    from trace_train import tiny, train
    from trace_train.run.policy import model_path
    from trace_train.config_loader import load_config

    cfg = load_config(train.TrainConfig, "cpu_demo", [f"run_dir={tmp_path}", "task.name=search_qa", "task.train=demo",
                                                     "task.rows={}", "task.eval_size=3"])
    task = build_task(cfg.task, seed=cfg.seed, hold_out=True)
    shown = {}
    monkeypatch.setattr(tiny, "save_tiny", lambda path, **kw: shown.update(kw) or str(path))
    model_path(cfg.model, cfg.run_dir, seed=cfg.seed, task=task)
    make_env, rows, expert = shown["demonstrations"]
    held_out = {row["id"] for row in task.eval_rows}
    assert len(held_out) == 3 and rows == task.train_rows and not held_out & {row["id"] for row in rows}


def test_a_tiny_model_cut_mid_write_is_rebuilt_and_an_interrupted_save_leaves_nothing(tmp_path, monkeypatch):
    """Issue 34: the model is written to a temporary folder renamed into place; an older cut write (a
    config.json without the rest) is not taken for a model, and is replaced."""
    from trace_train import tiny
    from trace_train.run.policy import model_path
    from trace_train.train import TrainConfig
    from trace_train.config_loader import load_config

    cfg = load_config(TrainConfig, "cpu_demo", [f"run_dir={tmp_path / 'run'}", "model.tiny_warm_steps=0"])
    cut = tmp_path / "run" / "tiny_model"
    cut.mkdir(parents=True)
    (cut / "config.json").write_text("{}")  # what a write killed after its first file left
    assert not tiny.is_complete(cut)
    path = model_path(cfg.model, cfg.run_dir, seed=cfg.seed)
    assert tiny.is_complete(path) and (cut / "model.safetensors").is_file()
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(path)  # loads
    real = tiny.build_tokenizer

    def failing_tokenizer(*a, **k):
        tok = real(*a, **k)
        tok.save_pretrained = lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt())
        return tok

    monkeypatch.setattr(tiny, "build_tokenizer", failing_tokenizer)
    with pytest.raises(KeyboardInterrupt):
        tiny.save_tiny(tmp_path / "other", warm_steps=0)
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob(".other.*"))


def test_a_tiny_model_with_cut_weights_is_named_in_one_line_and_rebuilt(tmp_path, capsys):
    """Issue 52, item 8: a tiny_model whose weights were cut (its other files whole) is not loaded into a
    safetensors traceback: the damaged file is named in one line and the model rebuilt."""
    from transformers import AutoModelForCausalLM

    from trace_train.config_loader import load_config
    from trace_train.run.policy import model_path
    from trace_train.train import TrainConfig

    cfg = load_config(TrainConfig, "cpu_demo", [f"run_dir={tmp_path / 'run'}", "model.tiny_warm_steps=0"])
    path = model_path(cfg.model, cfg.run_dir, seed=cfg.seed)
    weights = tmp_path / "run" / "tiny_model" / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    capsys.readouterr()
    assert model_path(cfg.model, cfg.run_dir, seed=cfg.seed) == path
    err = [line for line in capsys.readouterr().err.splitlines() if "Traceback" in line or "trace-train" in line]
    assert len(err) == 1 and str(weights) in err[0] and "rebuilt" in err[0], err  # (transformers' save bar aside)
    assert weights.read_bytes() == whole  # the same model, written whole
    AutoModelForCausalLM.from_pretrained(path)


def test_a_damaged_model_folder_of_the_user_is_named_in_one_line(tmp_path):
    from trace_train import tiny
    from trace_train.configs import ModelConfig
    from trace_train.run.policy import model_path

    folder = tiny.save_tiny(tmp_path / "mine", warm_steps=0)
    (tmp_path / "mine" / "tokenizer.json").write_text('{"version": "1.0", "trunc')
    with pytest.raises(ValueError, match=r"^model.name_or_path: .*tokenizer.json: .*the model folder is damaged"):
        model_path(ModelConfig(name_or_path=folder), tmp_path / "run", seed=0)
