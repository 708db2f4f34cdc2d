"""TRACE's tree-aware advantages as verl advantage estimators (``register_adv_est``).

``algorithm.adv_estimator=trace`` (or ``trace_grpo``, ``trace_local``, ``trace_treerl``, ``trace_treepo``:
any estimator of ``trace_theory.ADVANTAGES`` under ``trace_<name>``, ``trace`` itself being ``trace``).
verl calls an estimator with ``token_level_rewards`` (B, T), ``response_mask`` (B, T), ``index`` (the uid of
each trajectory's prompt) and ``config``; the ``trace`` trainer (:mod:`.trainer`) adds each trajectory's
extra fields (``trace_fields``, through :data:`CURRENT_TRACE_FIELDS`), from which
:func:`~.trees.forest_from_trajectories` rebuilds the step's trees. Node advantages are
``trace_theory.compute_advantages(forest, name)``, spread over each turn's tokens
(:func:`~.trees.token_advantages`); returns = advantages, as for verl's GRPO.

A row whose fields are None is one of verl's synthetic padding rows (``upsample_batch_to_divisible_size``
copies a real row's fields into them): it is left out of the trees and gets advantage 0.

Without ``trace_fields`` (verl's stock trainers) every trajectory is one bare rollout of its ``index``
group: a flat forest, on which ``trace`` equals ``grpo`` -- ours, which gives a group of one (or without
spread) advantage 0 where verl's GRPO passes the raw reward through.
"""

from __future__ import annotations

import contextvars

import numpy as np
import torch

from trace_theory import ADVANTAGES, compute_advantages

from .trees import forest_from_trajectories, token_advantages

__all__ = ["ESTIMATORS", "CURRENT_TRACE_FIELDS", "trace_token_advantages", "register_estimators"]

CURRENT_TRACE_FIELDS: contextvars.ContextVar = contextvars.ContextVar("trace_fields", default=None)
"""The trajectories' extra fields while verl computes advantages: set by the ``trace`` trainer around verl's
own advantage step (whose call of an estimator passes only rewards, mask, uids and config)."""

ESTIMATORS = {("trace" if name == "trace" else f"trace_{name}"): name for name in ADVANTAGES.names()}
"""verl estimator name -> ``trace_theory.ADVANTAGES`` name."""


def _flat_fields(index, response_mask: np.ndarray) -> list[dict]:
    """Every trajectory a one-turn bare rollout of its ``index`` group (turn ids 1, 2, ... per group)."""
    seen: dict = {}
    fields = []
    for b, uid in enumerate(index):
        seen[uid] = seen.get(uid, 0) + 1
        fields.append({"trace_tree": uid, "trace_parent": 0, "trace_nodes": [seen[uid]], "trace_turn_starts": [0]})
    return fields


def trace_token_advantages(token_level_rewards, response_mask, *, estimator: str = "trace", index=None,
                           trace_fields=None, epsilon: float = 1e-6) -> torch.Tensor:
    """Token advantages (B, T) of ``trace_theory``'s ``estimator`` on the trajectories' trees (module docstring)."""
    mask = response_mask.detach().cpu().numpy()
    reward = token_level_rewards.detach().sum(-1).cpu().double().numpy()
    if trace_fields is None:
        if index is None:
            raise ValueError("TRACE's advantages need either `trace_fields` (the trace trainer) or `index` (uids)")
        trace_fields = _flat_fields(index, mask)
    rows = [b for b, f in enumerate(trace_fields) if f is not None]  # None: verl's padding rows (advantage 0)
    out = np.zeros_like(mask, dtype=float)
    if rows:
        kept = [trace_fields[b] for b in rows]
        forest, turns = forest_from_trajectories(kept, reward[rows])
        node = compute_advantages(forest, estimator, eps=epsilon)
        out[rows] = token_advantages(node, turns, [f["trace_turn_starts"] for f in kept], mask[rows])
    return torch.as_tensor(out, dtype=token_level_rewards.dtype, device=token_level_rewards.device)


def _estimator(name: str):
    def estimate(token_level_rewards, response_mask, index=None, config=None, trace_fields=None, epsilon=1e-6,
                 **_):
        if trace_fields is None:
            trace_fields = CURRENT_TRACE_FIELDS.get()
        if trace_fields is not None and len(trace_fields) != len(token_level_rewards):
            raise ValueError(f"{len(trace_fields)} trajectories' tree fields for {len(token_level_rewards)} rows")
        adv = trace_token_advantages(token_level_rewards, response_mask, estimator=name, index=index,
                                     trace_fields=trace_fields, epsilon=epsilon)
        return adv, adv

    estimate.__name__ = f"compute_{name}_tree_advantage"
    estimate.__doc__ = f"verl estimator: ``trace_theory`` advantage ``{name}`` on the step's trees (module docstring)."
    return estimate


_REGISTERED: dict = {}


def register_estimators() -> list[str]:
    """Register every estimator of :data:`ESTIMATORS` with verl (idempotent); returns their names."""
    from verl.trainer.ppo.core_algos import register_adv_est

    for verl_name, ours in ESTIMATORS.items():
        if verl_name not in _REGISTERED:
            _REGISTERED[verl_name] = register_adv_est(verl_name)(_estimator(ours))
    return sorted(_REGISTERED)
