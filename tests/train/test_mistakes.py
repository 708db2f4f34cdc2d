"""Plausible mistakes end in one line and a non-zero exit, before anything heavy loads (issue 38): a missing
local model path, CUDA asked on a CPU machine, a Hub id (model or data) with no network, and an evaluation
whose environment fails on most rollouts. "No network" is made exact and independent of this machine: the
Hub endpoint is a local port nothing listens on and the Hugging Face cache is an empty folder."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from trace_train import evaluate, train
from trace_train import preflight

PARITY = ["task.name=examples/parity_game/parity_env.py:ParityEnv", "task.train=examples/parity_game/rows.jsonl"]


@pytest.fixture
def no_network(tmp_path, monkeypatch):
    """An unreachable Hub (a closed local port) and an empty cache."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                 "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "unset")  # recorded, so that what a test sets is undone afterwards
        monkeypatch.delenv(name)
    monkeypatch.setattr(preflight, "_reachable", {})


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _train(tmp_path, *overrides):
    return train.cli([*PARITY, f"run_dir={tmp_path / 'run'}", "steps=1", *overrides, "--quiet"])


def test_a_missing_local_model_path_is_no_such_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(train.Path(__file__).resolve().parents[2])
    assert _train(tmp_path, f"model.name_or_path={tmp_path}/nope") == 1
    line = _one_line(capsys)
    assert line == (f"trace-train: model.name_or_path={tmp_path}/nope: no such directory (a local model is a "
                    "directory holding config.json; a Hub id is owner/name)")
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before the run directory was used


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("args", [["device=cuda"], ["--config", "gpu_smoke"]], ids=["device=cuda", "gpu_smoke"])
def test_cuda_asked_on_a_cpu_machine_is_one_line(tmp_path, capsys, monkeypatch, args):
    monkeypatch.chdir(train.Path(__file__).resolve().parents[2])
    assert train.cli([*args, f"run_dir={tmp_path / 'run'}", "--quiet"]) == 1
    line = _one_line(capsys)
    assert line.startswith("trace-train: device=cuda, but torch ") and "finds no CUDA device" in line
    assert "use device=cpu" in line


def test_a_hub_model_id_without_network_is_one_line(tmp_path, capsys, monkeypatch, no_network):
    monkeypatch.chdir(train.Path(__file__).resolve().parents[2])
    assert _train(tmp_path, "model.name_or_path=Qwen/Qwen3-0.6B", "device=cpu") == 1
    line = _one_line(capsys)
    assert line.startswith("trace-train: model.name_or_path=Qwen/Qwen3-0.6B is a Hub id that is not in the local "
                           "Hugging Face cache, and 127.0.0.1 cannot be reached")
    assert "hf download Qwen/Qwen3-0.6B" in line


def test_a_cached_hub_id_without_network_goes_offline_instead_of_retrying(tmp_path, monkeypatch, no_network):
    (tmp_path / "hf_home" / "hub" / "models--Qwen--Qwen3-0.6B").mkdir(parents=True)
    constants = __import__("huggingface_hub.constants", fromlist=["x"])
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)  # undone afterwards
    preflight.check_model("Qwen/Qwen3-0.6B")
    assert preflight.os.environ["HF_HUB_OFFLINE"] == "1"


def test_a_hub_data_id_in_trace_eval_without_network_is_one_line(tmp_path, capsys, no_network):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a model directory: the data is what fails
    assert evaluate.cli(["--model", str(model), "--benchmark", "math", "--data", "HuggingFaceH4/MATH-500",
                         "--output-dir", str(tmp_path / "out")]) == 2
    line = _one_line(capsys)
    assert line.startswith("trace-eval: error: data=HuggingFaceH4/MATH-500 is a Hub id that is not in the local "
                           "Hugging Face cache, and 127.0.0.1 cannot be reached")
    assert "hf download --repo-type dataset HuggingFaceH4/MATH-500" in line


def test_trace_eval_help_starts_without_markup(capsys):
    with pytest.raises(SystemExit):
        evaluate.cli(["--help"])
    out = capsys.readouterr().out
    assert "trace-eval: a model's score" in out and "``" not in out.split("options:")[0]


BROKEN_ENV = textwrap.dedent("""
    class Broken:
        def reset(self, row):
            return [{"role": "user", "content": "Say a number."}]

        def step(self, action):
            raise RuntimeError("the scorer's database is down")

        def verify(self):
            return 0.0

        def snapshot(self):
            return None

        def restore(self, snapshot):
            pass
""")


@pytest.mark.slow
def test_trace_eval_exits_non_zero_when_the_environment_fails_above_the_trainers_share(tmp_path, capsys, tiny_dir):
    (tmp_path / "broken_env.py").write_text(BROKEN_ENV)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(4)))
    code = evaluate.cli(["--model", tiny_dir, "--task", f"{tmp_path / 'broken_env.py'}:Broken", "--data", str(rows),
                         "--max-turn-tokens", "4", "--device", "cpu", "--output-dir", str(tmp_path / "out")])
    assert code == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("trace-eval:")]
    assert len(err) == 1, err
    assert err[0].startswith("trace-eval: error: 4 of 4 rollouts (100%) ended in an environment failure (env_error 4)")
    assert "RuntimeError: the scorer's database is down" in err[0] and "max_env_failure_share=0.5" in err[0]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["end_reasons"] == {"env_error": 4}


def test_a_few_environment_failures_only_warn(capsys):
    summary = {"samples": 20, "end_reasons": {"done": 18, "env_timeout": 2}, "env_error_sample": "TimeoutError"}
    assert evaluate._report_env_failures(summary, "out") == 0
    assert capsys.readouterr().err.startswith("trace-eval: warning: 2 of 20 rollouts (10%) ended in an environment "
                                              "failure (env_timeout 2): TimeoutError")
    assert evaluate._report_env_failures({"samples": 20, "end_reasons": {"done": 20}}, "out") == 0
    assert capsys.readouterr().err == ""


def test_a_hub_id_passes_when_the_hub_answers(tmp_path, monkeypatch, no_network):
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        preflight.check_model("Qwen/Qwen3-0.6B")  # not cached, but reachable: the loaders fetch it
    assert "HF_HUB_OFFLINE" not in preflight.os.environ
