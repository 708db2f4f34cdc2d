"""vLLM's "RotaryEmbedding: Failed to load weights" after a weight reload is dropped at its logger, and only
that record: the rotary cache is computed from the config and kept (module docstring of vllm_backend)."""

from __future__ import annotations

import logging

import pytest
import torch

from trace_train.backends.vllm_backend import RELOAD_LOGGER, RotaryReloadFilter


def _record(layer: str) -> logging.LogRecord:
    return logging.LogRecord(RELOAD_LOGGER, logging.WARNING, __file__, 1, "%s: Failed to load weights", (layer,), None)


def test_the_filter_drops_only_the_rotary_reload_warning():
    quiet = RotaryReloadFilter()
    assert not quiet.filter(_record("RotaryEmbedding"))
    assert not quiet.filter(_record("MRotaryEmbedding"))
    assert quiet.filter(_record("QKVParallelLinear"))  # a layer that should load still warns
    other = logging.LogRecord(RELOAD_LOGGER, logging.WARNING, __file__, 1, "something else %s", ("RotaryEmbedding",),
                              None)
    assert quiet.filter(other)


class _Catch(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.slow
def test_a_weight_sync_prints_no_rotary_warning(vllm_backend, tiny_dir):
    from transformers import AutoModelForCausalLM

    catch = _Catch()
    logger = logging.getLogger(RELOAD_LOGGER)
    logger.addHandler(catch)
    try:
        weights = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).state_dict()
        vllm_backend.update_weights(weights)
    finally:
        logger.removeHandler(catch)
    assert not [m for m in catch.messages if "RotaryEmbedding" in m], catch.messages
