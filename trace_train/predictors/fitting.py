"""The predictor's part of a training step: what the step teaches V~, and the fit on a worker thread.

Each step fits V~ to the recursive targets of every non-terminal node (``trace_theory.node_targets``)
and adds the roots' outcomes (the factual rewards of the rollouts sampled at each root,
``trace_theory.root_outcomes``) to the prompts' posteriors. Under ``torchrun`` one predictor serves the
job: every rank fits the same model to every rank's examples, concatenated in rank order, so the ranks
hold identical states and the global root allocation compares predictions of one model
(:func:`check_one_predictor` refuses a checkpoint where they do not).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from trace_theory import node_targets, root_outcomes

from .base import PosteriorPredictor

__all__ = ["histories", "fit_inputs", "job_fit_inputs", "fit", "PredictorFit", "attach_policy_states",
           "check_one_predictor"]


def histories(batch, nodes) -> list:
    """The histories (prefixes) of ``nodes`` of a rollout batch."""
    return [batch.history(int(n)) for n in nodes]


def fit_inputs(batch, value_target: str) -> tuple:
    """What one step teaches the predictor: (histories, targets, weights) of the non-terminal nodes and
    (histories, successes, failures) of the roots."""
    f = batch.forest
    nodes = np.flatnonzero(~f.is_leaf)
    values, weights = node_targets(f, value_target)
    roots, m, s = root_outcomes(f)
    return histories(batch, nodes), values[nodes], weights[nodes], histories(batch, roots), s, m - s


def job_fit_inputs(parts: list[tuple]) -> tuple:
    """Every rank's :func:`fit_inputs` (``parts``, in rank order) concatenated into the job's."""
    return (sum((list(p[0]) for p in parts), []), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), sum((list(p[3]) for p in parts), []),
            np.concatenate([p[4] for p in parts]), np.concatenate([p[5] for p in parts]))


def fit(predictor: PosteriorPredictor, inputs: tuple) -> dict:
    """Fit and observe one step's ``inputs``; the metrics include the fit's wall and CPU (this thread's)
    seconds."""
    t0, c0 = time.perf_counter(), time.thread_time()
    nodes, values, weights, roots, successes, failures = inputs
    metrics = predictor.update(nodes, values, weights)
    predictor.observe(roots, successes, failures)
    return {**metrics, "predictor_fit_seconds": time.perf_counter() - t0,
            "predictor_fit_cpu_seconds": time.thread_time() - c0}


def _fit_batch(predictor: PosteriorPredictor, batch, value_target: str) -> dict:
    return fit(predictor, fit_inputs(batch, value_target))


class PredictorFit:
    """The predictor update of one step, run on a worker thread while the policy updates.

    Safe because the two share no mutable state: the fit reads the batch (immutable once generated) and
    writes only the predictor; the policy update reads tensors built from the same batch and writes only
    the model and optimiser. Nothing reads the predictor before :meth:`result` (the next step's allocation
    and every checkpoint wait for it), so a run is bitwise the same as with the fit done inline. The work
    is NumPy/SciPy and the policy update is PyTorch; both release the GIL in their kernels but hold it
    between them, so the ``ngram`` predictor's fit (hashing, calibration, Adam steps) runs in a child
    process (:mod:`.fit_process`; ``python -m trace_train.bench.fit --compare --arms grpo_fit grpo`` measures
    what the fit still costs the step).

    ``fits`` False (policies that never read V~, unless ``log_predictor`` asks for its calibration) skips
    the fit. ``gather`` (every rank's object, in rank order: a collective, so it runs here in the main
    thread) makes the fit the job's (module docstring).
    """

    def __init__(self, pool: ThreadPoolExecutor, predictor: PosteriorPredictor, batch, *, value_target: str,
                 fits: bool = True, gather: Callable[[Any], list] | None = None):
        self._future: Future | None = None
        if not fits:
            return
        if gather is not None:
            self._future = pool.submit(fit, predictor, job_fit_inputs(gather(fit_inputs(batch, value_target))))
            return
        if predictor.needs_states:  # the policy's states, before it updates
            predictor.prepare(fit_inputs(batch, value_target)[0])
        self._future = pool.submit(_fit_batch, predictor, batch, value_target)

    def result(self) -> dict:
        return self._future.result() if self._future is not None else {}


def attach_policy_states(predictor: PosteriorPredictor, policy, *, distributed: bool, compute_dtype=None) -> None:
    """Give a predictor that reads the policy's hidden states (``needs_states``) the policy's forward.

    One process only: under FSDP the forward is a collective every rank must join with the same shapes,
    and each rank predicts its own pool."""
    if not predictor.needs_states:
        return
    if distributed:
        raise ValueError(f"predictor.kind={predictor.kind} reads the policy's hidden states and runs on "
                         "one process for now (under FSDP that forward is a collective every rank must join in "
                         "step); with torchrun use predictor.kind=ngram or running_mean")
    from .hidden_states import PolicyStates

    predictor.attach(PolicyStates(policy, compute_dtype=compute_dtype))


def check_one_predictor(digests: list[str]) -> None:
    """Refuse to checkpoint a job whose ranks hold different predictors (one V~ serves the whole job);
    ``digests``: every rank's :meth:`~.base.PosteriorPredictor.digest`."""
    distinct = set(digests)
    if len(distinct) > 1:
        raise RuntimeError(f"the ranks' success predictors differ ({len(distinct)} distinct states); every rank "
                           "must fit the same predictor to the same gathered targets")
