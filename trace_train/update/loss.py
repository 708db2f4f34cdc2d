"""The policy loss: token-level clipped policy gradient with tree advantages.

For a token t with new log-probability log pi(t), behaviour log-probability log mu(t) (recorded by the
generation back end) and advantage A (the advantage of the turn that contains the token, from
``trace_theory.compute_advantages``), the per-token objective is PPO's clipped surrogate

    rho = exp(log pi - log mu),
    L_pg(t) = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A),

optionally plus a KL penalty to a reference policy, beta * k(t), with one of Schulman's estimators.
Only tokens with loss mask 1 count: the model's own tokens of the turn being trained. Prompt, history
and observation (tool output) tokens have mask 0.

**The KL estimators, by the gradient they give inside the loss.** With d = log ref - log pi at a token
y ~ pi (on-policy: the ratio is 1), and g = grad log pi(y), the loss term's gradient is grad k(y), and

    k1 = -d                 grad k1 = g                E_pi[g] = 0: no gradient in expectation
    k2 = d^2 / 2            grad k2 = -d g             E_pi[-d g] = grad KL(pi || ref)
    k3 = e^d - d - 1        grad k3 = (1 - e^d) g      E_pi[(1 - ref/pi) g] = -E_ref[g] = grad KL(ref || pi)

(the expectations take y ~ pi as fixed samples, which is what a loss term does; sum over y and use
E_pi[g] = sum_y grad pi(y) = 0). So ``k3``, the default (as in GRPO and verl's "low_var_kl"), pulls the
policy toward the reference along the *reverse* KL, KL(ref || pi), not KL(pi || ref); ``k2`` is the one
whose gradient is that of KL(pi || ref) (verl's "mse"; see verl's kl_penalty notes); ``k1`` is refused
as a loss term (``kl_coef > 0``), since its expected gradient is zero, and stays available as the logged
value. As *values* (the ``kl`` metric), k1 and k3 are unbiased estimates of KL(pi || ref), k2 is biased.

**Shared prefixes.** A turn shared by several rollouts of a tree is one node of the forest and is
trained exactly once: :func:`trace_train.update.sequences` (or any caller) must give each generated token a
mask of 1 in exactly one sequence. The aggregation below then weights every generated token once.

**Aggregation** (``aggregation=``), over the batch's masked tokens, as in verl:

- ``"token_mean"``: sum of token losses / number of masked tokens (DAPO; every token counts equally);
- ``"seq_mean_token_mean"``: mean over sequences of the per-sequence token mean;
- ``"seq_mean_token_sum"``: mean over sequences of the per-sequence token sum (Dr. GRPO-style, with no
  length normalisation).

A *sequence* here is what the trainer trains as one: the tokens a rollout owns (``sequence_ids``; one row
of :mod:`trace_train.update.sequences`), weighted by ``token_weights``. For flat groups (GRPO, DAPO: no
branching) that is each trajectory, and ``seq_mean_token_mean`` is the original GRPO loss. With branched
trees it is not flat GRPO on root-to-leaf paths: a continuation's sequence holds only its own new turns
(its shared prefix is trained in the rollout that owns it), and with ``shared_turn_weight="leaves"`` the
per-sequence mean is a weighted mean with weights n_y. Only ``token_mean`` with ``"leaves"`` equals flat
GRPO on the paths exactly (:mod:`trace_train.update.sequences`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..configs import KL_ESTIMATORS, SHARED_TURN_WEIGHTS, PolicyLossConfig  # every config lives in configs

__all__ = ["PolicyLossConfig", "LossInputs", "ReadsLossInputs", "LOSS_METRICS", "node_values", "policy_loss", "kl_penalty"]

LOSS_METRICS = ("pg_loss", "kl", "clip_fraction", "ratio_mean")
"""The metrics :func:`policy_loss` returns (the trainer logs each, 0 on a step with nothing to train)."""


@dataclass(frozen=True)
class LossInputs:
    """What :func:`policy_loss` reads besides the new log-probabilities, one (rows, width) tensor per input,
    in either layout of the update (one row per leaf, :mod:`.sequences`; packed trees, :mod:`.packing`).

    Every value is 0 where ``loss_mask`` is 0. The per-node inputs (:func:`node_values`: ``advantages``,
    ``weights``) are broadcast to the trained tokens of their node by the layouts, which fill every field
    :func:`node_values` returns, so a new per-node loss input is a field here, an entry of
    :func:`node_values` and its use in :meth:`loss`.
    """

    loss_mask: torch.Tensor
    """1 where the token is trained (generated, and owned by the row's rollout)."""
    old_logprobs: torch.Tensor
    """Generation-time log-probabilities."""
    advantages: torch.Tensor
    """The advantage of the token's turn."""
    weights: torch.Tensor
    """Per-token weight in the loss (n_y or 1: ``shared_turn_weight``)."""
    sequence_ids: torch.Tensor | None = None
    """The rollout each token is trained for (-1: none) where a row holds several; None: one per row."""

    @classmethod
    def zeros(cls, rows: int, width: int, *, packed: bool) -> "LossInputs":
        z = lambda: torch.zeros((rows, width), dtype=torch.float32)  # noqa: E731
        seq = torch.full((rows, width), -1, dtype=torch.long) if packed else None
        return cls(z(), z(), z(), z(), seq)

    def select(self, rows: torch.Tensor, width: int) -> "LossInputs":
        """These rows, their first ``width`` columns."""
        return LossInputs(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[rows, :width]
                             for f in dataclasses.fields(self)})

    def loss(self, logprobs: torch.Tensor, config: PolicyLossConfig, *,
             ref_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """:func:`policy_loss` of ``logprobs`` on these inputs (moved to ``logprobs``' device)."""
        on = lambda t: None if t is None else t.to(logprobs.device)  # noqa: E731
        return policy_loss(logprobs, on(self.old_logprobs), on(self.advantages), on(self.loss_mask), config,
                           ref_logprobs=ref_logprobs, token_weights=on(self.weights), sequence_ids=on(self.sequence_ids))


class ReadsLossInputs:
    """The loss inputs of a layout's ``inputs`` record, read as the layout's own fields (both layouts)."""

    inputs: LossInputs

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.inputs.loss_mask

    @property
    def old_logprobs(self) -> torch.Tensor:
        return self.inputs.old_logprobs

    @property
    def advantages(self) -> torch.Tensor:
        return self.inputs.advantages

    @property
    def weights(self) -> torch.Tensor:
        return self.inputs.weights

    @property
    def sequence_ids(self) -> torch.Tensor | None:
        """The rollout each token is trained for where a row holds several (packed trees); None: one per row."""
        return self.inputs.sequence_ids


def node_values(forest, advantages, shared_turn_weight: str) -> dict[str, np.ndarray]:
    """The per-node loss inputs, checked: each node's ``advantages`` (one per node) and the token
    ``weights`` of ``shared_turn_weight`` (its leaf count, ``"leaves"``, or 1, ``"once"``)."""
    advantages = np.asarray(advantages, dtype=float)
    if advantages.shape != (len(forest),):
        raise ValueError(f"`advantages` must hold one value per node ({len(forest)}), got shape {advantages.shape}")
    if shared_turn_weight not in SHARED_TURN_WEIGHTS:
        raise ValueError(f"`shared_turn_weight` must be one of {SHARED_TURN_WEIGHTS}, got {shared_turn_weight!r}")
    weights = forest.leaf_count.astype(float) if shared_turn_weight == "leaves" else np.ones(len(forest))
    return {"advantages": advantages, "weights": weights}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi.

    With d = log ref - log pi: k1 = -d, k2 = d^2 / 2, k3 = exp(d) - d - 1. As values k1 and k3 are
    unbiased; as loss terms their gradients differ (module docstring: k2 gives grad KL(pi || ref), k3
    grad KL(ref || pi), k1 nothing).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"`estimator` must be one of {KL_ESTIMATORS}, got {estimator!r}")
    d = ref_logprobs - logprobs
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    return torch.expm1(d) - d


def _aggregate(values: torch.Tensor, mask: torch.Tensor, how: str, sequence_ids: torch.Tensor | None = None) -> torch.Tensor:
    if how == "token_mean":
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    if sequence_ids is None:  # one sequence per row
        per_seq_tokens = mask.sum(dim=-1)
        per_seq = (values * mask).sum(dim=-1)
    else:  # sequences spread over rows (packed trees): sum by id
        ids = sequence_ids.reshape(-1)
        keep = ids >= 0
        _, dense = torch.unique(ids[keep], return_inverse=True)
        n = int(dense.max()) + 1 if dense.numel() else 0
        per_seq_tokens = mask.new_zeros(n).index_add(0, dense, mask.reshape(-1)[keep])
        per_seq = mask.new_zeros(n).index_add(0, dense, (values * mask).reshape(-1)[keep])
    has_tokens = per_seq_tokens > 0
    if how == "seq_mean_token_mean":
        per_seq = per_seq / per_seq_tokens.clamp_min(1.0)
    return per_seq[has_tokens].sum() / has_tokens.sum().clamp_min(1)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: PolicyLossConfig = PolicyLossConfig(),
    *,
    ref_logprobs: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
    sequence_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss over masked tokens; returns (loss, metrics).

    Parameters
    ----------
    logprobs, old_logprobs : Tensor, shape (batch, tokens)
        Log-probabilities of the sampled tokens under the current and the behaviour policy.
    advantages : Tensor, shape (batch, tokens)
        Advantage of each token (its turn's advantage).
    loss_mask : Tensor, shape (batch, tokens)
        1 for tokens in the loss, 0 elsewhere (prompt, history, observations, padding).
    config : PolicyLossConfig
    ref_logprobs : Tensor, optional
        Reference-policy log-probabilities; required when ``config.kl_coef > 0``.
    token_weights : Tensor, optional
        A weight per token (default 1), multiplying its loss and its share of the normaliser: a token of
        weight w counts as w tokens (``trace_train.update.sequences`` uses it for turns shared by rollouts).
    sequence_ids : Tensor of int, optional
        The sequence each token belongs to (-1 for none), for the sequence-level aggregations when a
        row holds several sequences (packed trees, ``trace_train.update.packing``); default: one per row.

    Returns
    -------
    loss : Tensor
        A scalar to call ``backward()`` on.
    metrics : dict
        ``pg_loss``, ``kl`` (mean per masked token, 0 without a reference), ``clip_fraction`` (share of
        masked tokens whose ratio was clipped in the direction that matters), ``ratio_mean``.
    """
    shapes = {t.shape for t in (logprobs, old_logprobs, advantages, loss_mask)}
    if len(shapes) != 1 or logprobs.dim() != 2:
        raise ValueError(f"logprobs, old_logprobs, advantages and loss_mask must share one 2-D shape, got {sorted(shapes)}")
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("`ref_logprobs` is required when `kl_coef` > 0")
    if token_weights is not None and (token_weights.shape != logprobs.shape or bool((token_weights < 0).any())):
        raise ValueError("`token_weights` must be non-negative and shaped like `logprobs`")
    if sequence_ids is not None and sequence_ids.shape != logprobs.shape:
        raise ValueError("`sequence_ids` must be shaped like `logprobs`")
    mask = loss_mask.to(logprobs.dtype)
    if token_weights is not None:
        mask = mask * token_weights.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped * advantages
    token_loss = -torch.minimum(unclipped_obj, clipped_obj)
    pg = _aggregate(token_loss, mask, config.aggregation, sequence_ids)
    loss = pg
    kl_value = torch.zeros((), dtype=logprobs.dtype)
    if ref_logprobs is not None:
        kl_tokens = kl_penalty(logprobs, ref_logprobs, config.kl_estimator)
        kl_value = _aggregate(kl_tokens, mask, "token_mean")
        if config.kl_coef > 0:
            loss = loss + config.kl_coef * _aggregate(kl_tokens, mask, config.aggregation, sequence_ids)
    n = mask.sum().clamp_min(1.0)
    with torch.no_grad():
        was_clipped = (clipped_obj < unclipped_obj).to(mask.dtype)
        metrics = {
            "pg_loss": float(pg.detach()),
            "kl": float(kl_value.detach()),
            "clip_fraction": float((was_clipped * mask).sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
        }
    return loss, metrics
