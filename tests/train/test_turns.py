"""Presets that can earn reward: what a turn holds under Qwen3's published chat template, the start-up line
and warning about thinking, the per-step share of turns cut by length, and the stop when most are cut.

``qwen3_chat_template.jinja`` is the chat template Qwen3-8B publishes in its ``tokenizer_config.json``
(Apache-2.0), kept here because no installed package ships it and nothing may be downloaded; it is set on
the tiny tokenizer, which has Qwen3's special tokens."""

import dataclasses
from pathlib import Path

import pytest

from trace_train.chat import ChatFormat
from trace_train.config_loader import available_presets, load_config
from trace_train.run.metrics_log import read_metrics
from trace_train.run.turns import THINKING_TURN_TOKENS, template_thinks, thinking_warning, turn_limits_line
from trace_train.tiny import build_tokenizer
from trace_train.train import TrainConfig, cli

QWEN3_TEMPLATE = (Path(__file__).parent / "qwen3_chat_template.jinja").read_text()
OPENING = [{"role": "system", "content": "Solve the problem; run Python in <code> tags."},
           {"role": "user", "content": "What is 2 + 3?"}]
REACT_PRESETS = ("math_qwen3_8b", "qa_qwen3_14b", "bfcl_qwen3_8b")


@pytest.fixture(scope="module")
def qwen3_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = QWEN3_TEMPLATE
    return tokenizer


def _preset(name):
    return load_config(TrainConfig, name, [])


@pytest.mark.parametrize("name", REACT_PRESETS)
def test_a_react_preset_turn_starts_after_a_closed_empty_think_block(name, qwen3_tokenizer):
    """With the preset's template arguments, Qwen3's template closes an empty <think> block after every
    generation prompt (the first and each one after an observation): the model's turn is its action,
    written at once. Without them the generation prompt ends open and the model would think first."""
    cfg = _preset(name)
    chat = ChatFormat(qwen3_tokenizer, template_kwargs=cfg.rollout.chat_template_kwargs)
    prompt = qwen3_tokenizer.decode(chat.prompt_ids(OPENING))
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    action = qwen3_tokenizer.encode("<code>print(2 + 3)</code><|im_end|>")
    after = qwen3_tokenizer.decode(chat.observation_ids(action, {"role": "tool", "content": "5"}))
    assert after.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and "<tool_response>\n5\n" in after
    thinking = ChatFormat(qwen3_tokenizer, template_kwargs={})
    assert qwen3_tokenizer.decode(thinking.prompt_ids(OPENING)).endswith("<|im_start|>assistant\n")


def test_qwen3_template_thinks_unless_thinking_is_turned_off(qwen3_tokenizer):
    assert template_thinks(qwen3_tokenizer, {})
    assert template_thinks(qwen3_tokenizer, {"enable_thinking": True})
    assert not template_thinks(qwen3_tokenizer, {"enable_thinking": False})
    opens = build_tokenizer()  # a template whose generation prompt opens the block itself (DeepSeek-R1 style)
    opens.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                           "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    assert template_thinks(opens, {})
    assert not template_thinks(_plain_tokenizer(), {})


def _plain_tokenizer():
    tokenizer = build_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tokenizer


@pytest.mark.parametrize("name", sorted(set(available_presets()) - {"cpu_demo"}))
def test_no_preset_thinks_with_turns_that_cut_thinking(name, qwen3_tokenizer):
    """Every GPU preset runs a Qwen3 model: under its published template none may think with turns shorter
    than THINKING_TURN_TOKENS (before this test the math, QA and BFCL presets did, with 1-2k-token turns)."""
    cfg = _preset(name)
    assert "Qwen3" in cfg.model.name_or_path
    assert thinking_warning(cfg, qwen3_tokenizer) is None
    assert turn_limits_line(cfg, qwen3_tokenizer).startswith("trace-train: thinking off;")


def test_a_preset_that_thinks_with_short_turns_is_warned_in_one_line(qwen3_tokenizer):
    cfg = _preset("math_qwen3_8b")
    thinking = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, chat_template_kwargs={}))
    warning = thinking_warning(thinking, qwen3_tokenizer)
    assert warning is not None and "\n" not in warning
    assert "thinking is on" in warning and "stop at 2048 tokens" in warning and "enable_thinking=false" in warning
    assert turn_limits_line(thinking, qwen3_tokenizer).startswith("trace-train: thinking on; up to 8 turns of at "
                                                                  "most 2048 tokens")
    long_turns = dataclasses.replace(thinking.rollout, limits=dataclasses.replace(
        thinking.rollout.limits, max_turn_tokens=THINKING_TURN_TOKENS))
    assert thinking_warning(dataclasses.replace(thinking, rollout=long_turns), qwen3_tokenizer) is None


SMALL = ["steps=3", "device=cpu", "tensorboard=false", "checkpoint_every=10", "eval.every=0",
         "rollout.pool_size=4", "rollout.roots=8", "rollout.group_size=4", "model.tiny_warm_steps=20"]


def test_a_step_whose_turns_are_mostly_cut_stops_the_run_in_one_line(tmp_path, capsys):
    """Turns of one token cannot hold a guess: every turn is cut by length, the step logs
    length_cut_share 1, and the run stops after it with a checkpoint of step 1 and one line (exit 1)."""
    run_dir = tmp_path / "run"
    code = cli(["--config", "cpu_demo", f"run_dir={run_dir}", *SMALL, "rollout.limits.max_turn_tokens=1"])
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("trace-train: step 1: ") and "turns (100%) were cut by length" in err[-1]
    assert "max_length_cut_share=0.9" in err[-1] and "stopped with a checkpoint of step 1" in err[-1]
    assert not any(line.startswith("Traceback") for line in err)
    assert (run_dir / "checkpoints" / "step_00000001").is_dir()
    [row] = read_metrics(run_dir / "metrics.jsonl")
    assert row["length_cut_share"] == 1.0 and row["length_cut_turns"] == row["turns"] > 0
    assert "trace-train: thinking off; up to 3 turns of at most 1 tokens each" in out


def test_the_cpu_demo_logs_its_cut_turns_and_runs_on(tmp_path):
    """The tiny model's guesses fit their 8 tokens: the share is logged every step and stays under the stop."""
    run_dir = tmp_path / "run"
    assert cli(["--config", "cpu_demo", f"run_dir={run_dir}", *SMALL, "steps=2", "--quiet"]) == 0
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(0.0 <= r["length_cut_share"] <= 0.5 and r["turns"] >= r["length_cut_turns"] for r in rows)
