"""A back end is built only through ``BACKENDS``: a registered entry is what ``backend.kind`` accepts, what
the trainer builds and what the benchmarks offer, with nothing else to edit."""

from __future__ import annotations

import pytest

from trace_train.backends import BACKENDS, BackEnd, build_backend, evaluation_backend, training_backend
from trace_train.bench import backend_choices, check_backends, chosen_backends
from trace_train.configs import BackendConfig, TrainConfig
from trace_train.evaluate import EvalConfig


def test_the_kind_is_checked_against_the_registry():
    assert sorted(BACKENDS) == ["hf", "vllm"]
    with pytest.raises(ValueError, match=r"unknown back end 'vlm'; known: hf, vllm"):
        BackendConfig(kind="vlm")


def test_a_registered_back_end_is_configured_built_and_benchmarked(monkeypatch):
    calls = []
    entry = BackEnd(build=lambda model, **kw: calls.append(("build", model, sorted(kw))) or "made",
                    for_training=lambda cfg, path, **kw: calls.append(("train", cfg.backend.kind, path, sorted(kw)))
                    or "trained",
                    for_evaluation=lambda config: calls.append(("evaluate", config.backend)) or "evaluated")
    monkeypatch.setitem(BACKENDS._entries, "toy", entry)
    cfg = TrainConfig(backend=BackendConfig(kind="toy"))
    assert training_backend(cfg, "m", device="cpu", policy=None, tokenizer=None, sharded=False) == "trained"
    assert build_backend("toy", "m", dtype="float32") == "made"
    assert evaluation_backend(EvalConfig(model="m", benchmark="guess_number", output_dir="out", backend="toy")) == "evaluated"
    assert calls == [("train", "toy", "m", ["device", "policy", "sharded", "tokenizer"]),
                     ("build", "m", ["device", "dtype", "seed"]), ("evaluate", "toy")]
    assert "toy" in backend_choices() and "toy" in chosen_backends("both")
    check_backends(("toy",))
    with pytest.raises(ValueError, match="non-empty subset"):
        check_backends(("nope",))


def test_evaluation_takes_its_back_end_from_the_registry(monkeypatch):
    """``trace-eval`` builds through the entry's ``for_evaluation`` (no branch on a back end's name): vLLM's
    maps the context limit and ``--vllm-options`` onto its engine, transformers' takes neither."""
    import trace_train.backends as backends

    seen = []
    monkeypatch.setattr(backends, "_vllm", lambda model, **kw: seen.append(("vllm", model, kw)) or "v")
    monkeypatch.setattr(backends, "_transformers", lambda model, **kw: seen.append(("hf", model, kw)) or "h")
    common = dict(model="m", benchmark="guess_number", output_dir="out", max_context_tokens=700, vllm_options={"block_size": 32})
    assert evaluation_backend(EvalConfig(backend="vllm", **common)) == "v"
    assert evaluation_backend(EvalConfig(backend="hf", **common)) == "h"
    assert seen[0][2]["max_model_len"] == 700 and seen[0][2]["block_size"] == 32
    assert "max_model_len" not in seen[1][2] and "block_size" not in seen[1][2]


def test_every_vllm_engine_has_one_enforce_eager_default():
    """The trainer's ``backend.enforce_eager`` and the engine's own default (what ``trace-eval`` gets) agree."""
    import inspect

    from trace_train.backends.vllm_backend import ENFORCE_EAGER, VLLMBackend

    engine_default = inspect.signature(VLLMBackend.__init__).parameters["enforce_eager"].default
    assert BackendConfig().enforce_eager == engine_default == ENFORCE_EAGER
