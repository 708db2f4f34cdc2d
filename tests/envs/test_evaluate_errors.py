"""trace-eval's data and output folders: clear one-line errors, never a Hub lookup for a local path,
and one results folder whatever its spelling (issue 10)."""

from __future__ import annotations

import json
import os
import re

import pytest

from trace_train.data.loading import is_local_source, load_rows
from trace_train.evaluate import EvalConfig, cli, main

from .conftest import arithmetic_rows


@pytest.fixture
def math_file(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in arithmetic_rows(2, seed=5)))
    return path


@pytest.mark.parametrize("source, local", [
    ("HuggingFaceH4/MATH-500", False), ("gsm8k", False), ("agentica-org/DeepScaleR-Preview-Dataset", False),
    ("data/train.jsonl", True), ("./problems", True), ("/abs/problems", True), ("~/problems", True),
    ("a/b/c", True), ("rows.csv", True),
])
def test_local_paths_are_told_apart_from_hub_ids(source, local):
    assert is_local_source(source) is local


@pytest.mark.parametrize("source", ["missing.jsonl", "./missing", "some/dir/missing"])
def test_a_missing_local_file_is_an_error_not_a_hub_lookup(tmp_path, source, monkeypatch):
    import datasets

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail(f"asked datasets for {a}"))
    with pytest.raises(FileNotFoundError, match="never looked up on the Hugging Face Hub"):
        load_rows(source)


def test_empty_and_corrupt_data_files_name_the_file_and_line(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_rows(empty)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(ValueError, match="holds no rows"):
        load_rows(blank)
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": \n')
    with pytest.raises(ValueError, match=r"corrupt\.jsonl, line 2: not valid JSON"):
        load_rows(corrupt)
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"deep\.jsonl, line 1"):
        load_rows(deep)


@pytest.mark.parametrize("problem", ["missing", "empty", "output is a file"])
def test_trace_eval_reports_bad_paths_in_one_line_before_loading_a_model(tmp_path, capsys, math_file, problem):
    data, out = str(math_file), tmp_path / "out"
    if problem == "missing":
        data = str(tmp_path / "nowhere" / "problems.jsonl")
    elif problem == "empty":
        (tmp_path / "empty.jsonl").write_text("")
        data = str(tmp_path / "empty.jsonl")
    else:
        out.write_text("a file")
    code = cli(["--model", str(tmp_path / "no-model"), "--benchmark", "math", "--data", data,
                "--output-dir", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert {"missing": "does not exist", "empty": "is empty", "output is a file": "is a file"}[problem] in err


def test_a_corrupt_results_line_names_the_file_and_line(tmp_path, math_file):
    out = tmp_path / "out"
    config = EvalConfig(model="unused", benchmark="math", data=str(math_file), output_dir=str(out))
    out.mkdir()
    (out / "config.json").write_text(json.dumps(__import__("trace_train.config_loader", fromlist=["x"]).config_to_dict(config)))
    (out / "results.jsonl").write_text('{"id": "arith5-0", "samples": []}\nnot json\n')
    with pytest.raises(ValueError, match=r"results\.jsonl, line 2: not a result record"):
        main(config)


def test_the_same_folder_resumes_by_relative_or_absolute_path(tmp_path, tiny_dir, math_file, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = dict(model=tiny_dir, benchmark="math", k=1, limit=1, max_turns=1, max_turn_tokens=16)
    first = main(EvalConfig(**common, data="problems.jsonl", output_dir="out"))
    again = main(EvalConfig(**common, data=str(math_file), output_dir=os.path.join(tmp_path, "out")))
    assert first["evaluated_now"] == 1 and again["evaluated_now"] == 0
    assert again["metrics"] == first["metrics"]


def test_every_other_engine_field_is_reachable_through_rollout_options(math_file, tmp_path):
    config = EvalConfig(model="unused", benchmark="math", data=str(math_file), output_dir=str(tmp_path / "o"),
                        k=3, temperature=0.5, rollout_options={"schedule": "lockstep", "env_workers": 4,
                                                               "env_timeout_s": 30.0})
    engine = config.rollout_config(pool_size=2, binary_rewards=True)
    assert (engine.schedule, engine.env_workers, engine.env_timeout_s) == ("lockstep", 4, 30.0)
    assert (engine.roots, engine.group_size, engine.min_group, engine.temperature) == (6, 3, 1, 0.5)
    assert engine.limits == config.limits


def _alias_bomb(levels: int = 9, width: int = 10) -> str:
    """A flow-style "billion laughs" mapping: ``width ** levels`` values once its aliases are expanded."""
    parts = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    parts += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "{" + ", ".join(parts) + "}"


@pytest.mark.parametrize("flag, value, message", [
    ("--vllm-options", _alias_bomb(), "--vllm-options: not valid YAML: the document expands to more than"),
    ("--rollout-options", "{x: " + "[" * 100_000 + "]" * 100_000 + "}", "--rollout-options: not valid YAML: "),
    ("--k", "9" * 5000, r"--k: not valid YAML: Exceeds the limit \(4300 digits\)"),
])
def test_trace_eval_reads_its_flags_with_the_bounded_yaml_loader(tmp_path, capsys, flag, value, message):
    code = cli(["--model", str(tmp_path), "--benchmark", "math", "--output-dir", str(tmp_path / "out"),
                flag, value, "--print-config"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert re.match("trace-eval: error: " + message, err), err


FLAKY_ENV = """
class Flaky:
    \"\"\"Rows {"id", "bad"}: step raises on a bad row (an environment failure); any reply ends the episode.\"\"\"

    def reset(self, row):
        self.row, self.done = dict(row), False
        return [{"role": "user", "content": "Say a number."}]

    def step(self, action):
        from trace_train.envs.base import StepResult
        if self.row["bad"]:
            raise RuntimeError("the tool server is down")
        self.done = True
        return StepResult("ok", done=True)

    def verify(self):
        return 1.0 if self.done else 0.0

    def metrics(self):
        return {"answered": 1.0 if self.done else 0.0}

    def snapshot(self):
        return (self.row, self.done)

    def restore(self, snapshot):
        self.row, self.done = dict(snapshot[0]), snapshot[1]
"""


def test_failed_rollouts_are_recorded_as_failures_and_the_summary_is_written(tmp_path, tiny_dir):
    """A task whose rollouts fail in the environment is recorded (its samples with their failure, reward
    and measures 0) and summary.json is written; a rerun resumes from the records."""
    (tmp_path / "flaky_env.py").write_text(FLAKY_ENV)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "bad": i % 2 == 0}) + "\n" for i in range(4)))
    common = dict(model=tiny_dir, benchmark=f"{tmp_path / 'flaky_env.py'}:Flaky", data=str(data), k=2,
                  max_turns=2, max_turn_tokens=32, output_dir=str(tmp_path / "out"))
    summary = main(EvalConfig(**common))
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert written["tasks"] == 4 and written["env_failures"] == summary["env_failures"]
    records = {json.loads(line)["id"]: json.loads(line)
               for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()}
    failed = [s for i in ("t0", "t2") for s in records[i]["samples"] if s["end_reason"] == "env_error"]
    assert failed and all(s["reward"] == 0.0 and s["metrics"] == {} for s in failed)
    assert all("the tool server is down" in s["env_failure"] for s in failed)
    assert summary["env_failures"] == len(failed) and summary["end_reasons"]["env_error"] == len(failed)
    assert not any("env_failure" in s for i in ("t1", "t3") for s in records[i]["samples"])
    assert 0.0 <= summary["means"]["answered"] <= 0.5  # the failed half counts 0
    again = main(EvalConfig(**common))
    assert again["evaluated_now"] == 0 and again["metrics"] == summary["metrics"]


@pytest.mark.parametrize("content", ["[]", "{" * 100_000, '{"k": 1e999, "x": ' + "9" * 5000 + "}"])
def test_a_damaged_config_json_in_the_output_folder_is_one_line(tmp_path, math_file, content):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text(content)
    with pytest.raises(ValueError, match=r"config\.json cannot be read"):
        main(EvalConfig(model="unused", benchmark="math", data=str(math_file), output_dir=str(out)))
