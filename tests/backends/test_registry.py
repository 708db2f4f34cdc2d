"""A back end is built only through ``BACKENDS``: a registered entry is what ``backend.kind`` accepts, what
the trainer builds and what the benchmarks offer, with nothing else to edit."""

from __future__ import annotations

import pytest

from trace_train.backends import BACKENDS, BackEnd, build_backend, training_backend
from trace_train.bench import backend_choices, check_backends, chosen_backends
from trace_train.configs import BackendConfig, TrainConfig


def test_the_kind_is_checked_against_the_registry():
    assert sorted(BACKENDS) == ["hf", "vllm"]
    with pytest.raises(ValueError, match=r"unknown back end 'vlm'; known: hf, vllm"):
        BackendConfig(kind="vlm")


def test_a_registered_back_end_is_configured_built_and_benchmarked(monkeypatch):
    calls = []
    entry = BackEnd(build=lambda model, **kw: calls.append(("build", model, sorted(kw))) or "made",
                    for_training=lambda cfg, path, **kw: calls.append(("train", cfg.backend.kind, path, sorted(kw)))
                    or "trained")
    monkeypatch.setitem(BACKENDS._entries, "toy", entry)
    cfg = TrainConfig(backend=BackendConfig(kind="toy"))
    assert training_backend(cfg, "m", device="cpu", policy=None, tokenizer=None, sharded=False) == "trained"
    assert build_backend("toy", "m", dtype="float32") == "made"
    assert calls == [("train", "toy", "m", ["device", "policy", "sharded", "tokenizer"]),
                     ("build", "m", ["device", "dtype", "seed"])]
    assert "toy" in backend_choices() and "toy" in chosen_backends("both")
    check_backends(("toy",))
    with pytest.raises(ValueError, match="non-empty subset"):
        check_backends(("nope",))
