"""Every registered expansion mode against the barrier in the trainer's engine with the tiny model: the
decision test of ``tests/theory/test_expansion.py`` on real rollouts (the transformers back end)."""

from __future__ import annotations

import numpy as np
import pytest

from trace_theory import EXPANSIONS, get_expansion

from tests.theory.expansion_checks import check_against_barrier, decisions

from .test_engine import UNEVEN, TurnPredictor, make_engine

KW = dict(policy="trace", roots=8, continuations_per_root=2, pool_size=len(UNEVEN), env_workers=4)


def _decisions(backend, name):
    engine = make_engine(backend, expansion=name, **KW)
    batch = engine.rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    if get_expansion(name).defers:
        assert batch is None  # the pipeline fills
        batch = engine.drain(seed=5)
    f, predicted = batch.forest, batch.predictions
    anchors = np.flatnonzero(np.isfinite(predicted) & (f.parent != -1))
    return batch, decisions(f, anchors, predicted[anchors])


@pytest.fixture(scope="module")
def barrier(tiny_dir):
    from trace_train.backends.hf_backend import HFBackend

    return _decisions(HFBackend.from_pretrained(tiny_dir), "barrier")


@pytest.mark.parametrize("name", EXPANSIONS.names())
def test_every_mode_decides_as_the_barrier_or_no_better(hf_backend, barrier, name):
    batch, ours = _decisions(hf_backend, name)
    assert batch.report.expansion == name
    assert batch.forest.n_leaves == 8 * 3  # rollout-priced: exactly M (1 + N)
    assert barrier[1].k.sum() > 0 and barrier[1].anchors.size > 0
    check_against_barrier(name, ours, barrier[1], policy="trace")
