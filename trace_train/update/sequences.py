"""From rollout trees to training sequences, with every generated token trained exactly once.

A tree's turns are shared: the first turns of a prefix belong to every rollout that passed through it.
We build **one sequence per leaf** (its root-to-leaf tokens, as the model saw them) and give a token loss
mask 1 only in the sequence of the leaf its turn *belongs to*: the end of the turn's own rollout,
``RolloutForest.factual_leaf`` (follow first children down). So

* every generated token is in the loss of exactly one sequence, with the advantage of its turn (node);
* a continuation's sequence trains only its own new turns; the shared prefix before the branch point is
  context (mask 0) there, and is trained in the sequence of the rollout it came from.

**Weight of a shared turn** (``shared_turn_weight``): ``"leaves"`` (default) weights each token of turn
y by n_y, the number of leaves below y, so the loss equals flat GRPO on the root-to-leaf paths (each path
a trajectory, shared tokens counted once per path) while computing each token once; ``"once"`` weights
every token 1, so a turn shared by many rollouts counts like any other. The choice is explicit; nothing
is weighted twice by accident. The loss's ``token_mean`` divides by the total weight.

This is the reference layout (``algorithm.packing=leaf``). The default, ``tree``
(:mod:`trace_train.update.packing`), trains the same tokens with the same weights but forwards each tree token
once, with a tree attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..configs import SHARED_TURN_WEIGHTS
from ..rollout.batch import RolloutBatch
from .logprobs import sampled_logprobs
from .loss import LossInputs, ReadsLossInputs, node_values

__all__ = ["TrainingSequences", "build_sequences", "SHARED_TURN_WEIGHTS", "NodeTokens", "path_tokens",
           "nodes_on_paths", "token_logprobs", "micro_batch_bounds"]


@dataclass(frozen=True)
class TrainingSequences(ReadsLossInputs):
    """Padded (batch, length) tensors, one row per leaf that owns at least one generated token."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    inputs: LossInputs
    """The loss's per-token inputs (``loss_mask`` 1 where the token is trained in this row: generated, and
    owned by this row's leaf; ``weights`` n_y or 1, see the module docstring)."""
    leaves: np.ndarray
    """Leaf node id of each row."""
    micro_batch_size: int = 16
    """Rows per forward pass in :meth:`micro_batches` (at most)."""
    unique_tokens: int = 0
    """Tokens of the nodes on the rows' paths, counted once (what tree packing forwards)."""
    token_budget: int | None = None
    """Tokens per forward pass (rows x width of the micro-batch, padding included), at most; None: no bound
    beyond ``micro_batch_size``. A row longer than the budget is a micro-batch of its own."""


    def __len__(self) -> int:
        return len(self.leaves)

    @property
    def forward_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def select(self, rows) -> "TrainingSequences":
        """A micro-batch of rows, trimmed to its longest sequence."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[rows].sum(dim=1).max())
        pick = lambda t: t[rows, :width]  # noqa: E731
        return TrainingSequences(pick(self.input_ids), pick(self.attention_mask), self.inputs.select(rows, width),
                                 self.leaves[rows.numpy()], self.micro_batch_size, token_budget=self.token_budget)

    def micro_batches(self) -> list["TrainingSequences"]:
        """Consecutive rows, at most ``micro_batch_size`` of them and, with a ``token_budget``, at most that
        many tokens (rows x the longest row) per micro-batch: :func:`micro_batch_bounds`."""
        lengths = self.attention_mask.sum(dim=1).tolist()
        return [self.select(range(a, b)) for a, b in micro_batch_bounds(lengths, self.micro_batch_size,
                                                                         self.token_budget)]

    def normaliser(self, per_token: bool) -> float:
        """Total token weight (``token_mean``) or number of rows with a trained token (sequence means)."""
        return float(self.weights.sum()) if per_token else float((self.loss_mask.sum(1) > 0).sum())

    def logprobs(self, model, *, temperature: float = 1.0, chunk_tokens: int = 1024,
                 trained_only: bool = False, layouts: dict | None = None) -> torch.Tensor:
        """log pi_T of every token under ``model`` (0 at position 0 and padding), on the model's device:
        the distribution softmax(logits / ``temperature``) the rollouts sampled from, in chunks of
        ``chunk_tokens`` positions (:mod:`trace_train.update.logprobs`). ``trained_only``: only where
        ``loss_mask`` is 1 (0 elsewhere), which is all the loss reads. ``layouts`` is not read: per-leaf
        rows are causal, a mask the model builds itself (tree rows keep theirs in it:
        :meth:`trace_train.update.packing.PackedTrees.logprobs`)."""
        device = next(model.parameters()).device
        only = self.loss_mask.to(device) > 0 if trained_only else None
        return token_logprobs(model, self.input_ids.to(device), self.attention_mask.to(device),
                              temperature=temperature, chunk_tokens=chunk_tokens, only=only)


@dataclass(frozen=True)
class NodeTokens:
    """Every node's own tokens (action then observation), as the layouts need them."""

    ids: list
    """Token ids of each node (int64 arrays)."""
    action: list
    """True on each node's action tokens."""
    logprobs: list
    """Generation-time log-probabilities (0 on observation tokens)."""
    offset: np.ndarray
    """Position of each node's first token on its root-to-node path."""

    @property
    def length(self) -> np.ndarray:
        return np.array([len(x) for x in self.ids], dtype=np.int64)

    @property
    def n_action(self) -> np.ndarray:
        return np.array([int(a.sum()) for a in self.action], dtype=np.int64)


def micro_batch_bounds(lengths, max_rows: int, token_budget: int | None = None) -> list[tuple[int, int]]:
    """Split rows of the given lengths, in order, into ranges [a, b) of at most ``max_rows`` rows whose
    padded size (b - a) x max(lengths[a:b]) is at most ``token_budget`` (greedy: a range grows until the
    next row would break a bound). A row longer than the budget alone is a range of its own, since the
    leaf layout cannot split a row."""
    bounds, start, width = [], 0, 0
    for i, length in enumerate(lengths):
        rows, wide = i - start + 1, max(width, int(length))
        if i > start and (rows > max_rows or (token_budget is not None and rows * wide > token_budget)):
            bounds.append((start, i))
            start, wide = i, int(length)
        width = wide
    if lengths:
        bounds.append((start, len(lengths)))
    return bounds


def path_tokens(batch: RolloutBatch) -> NodeTokens:
    """The tokens of every node of ``batch`` and where on its path each node starts."""
    ids, action, logp = [], [], []
    for p in batch.nodes:
        ids.append(np.asarray(p.action_ids + p.observation_ids, dtype=np.int64))
        action.append(np.arange(len(ids[-1])) < len(p.action_ids))
        logp.append(np.concatenate([np.asarray(p.action_logprobs, dtype=np.float64), np.zeros(len(p.observation_ids))]))
    length = np.array([len(x) for x in ids], dtype=np.int64)
    offset = np.zeros(len(ids), dtype=np.int64)
    forest = batch.forest
    for level in list(forest.iter_levels())[1:]:
        offset[level] = offset[forest.parent[level]] + length[forest.parent[level]]
    return NodeTokens(ids, action, logp, offset)


def nodes_on_paths(batch: RolloutBatch, leaves: np.ndarray) -> np.ndarray:
    """Boolean mask of the nodes on the root-to-leaf paths of ``leaves`` (:meth:`RolloutBatch.path`)."""
    on = np.zeros(len(batch.forest), dtype=bool)
    for leaf in np.asarray(leaves).tolist():
        on[batch.path(leaf)] = True
    return on


def build_sequences(batch: RolloutBatch, advantages: np.ndarray, *, pad_token_id: int,
                    shared_turn_weight: str = "leaves", micro_batch_size: int = 16,
                    token_budget: int | None = None, train_env_failures: bool = False) -> TrainingSequences:
    """One padded sequence per leaf; see the module docstring for which tokens each one trains.

    Parameters
    ----------
    batch : RolloutBatch
    advantages : ndarray, shape (n_nodes,)
        Advantage of each node's turn (``trace_theory.compute_advantages``).
    pad_token_id : int
    shared_turn_weight : {"leaves", "once"}
    micro_batch_size : int
        Rows per forward pass, at most.
    token_budget : int or None
        Tokens per forward pass (rows x width), at most (None: rows bound only).
    train_env_failures : bool
        Train the turns of rollouts ended by an environment fault too (default: left out, as are DAPO's
        uniform groups; :meth:`~trace_train.rollout.batch.RolloutBatch.trained_nodes`).
    """
    forest = batch.forest
    per_node = node_values(forest, advantages, shared_turn_weight)
    if micro_batch_size < 1:
        raise ValueError(f"`micro_batch_size` must be at least 1, got {micro_batch_size}")
    if token_budget is not None and (isinstance(token_budget, bool) or not isinstance(token_budget, (int, np.integer))
                                     or token_budget < 1):
        raise ValueError(f"`token_budget` must be a positive integer or None, got {token_budget!r}")
    rows = []
    trained = batch.trained_nodes(train_env_failures=train_env_failures)
    for leaf in forest.leaves.tolist():
        traj = batch.trajectory(leaf)
        owned = (forest.factual_leaf[traj.node] == leaf) & trained[traj.node]
        train = (traj.loss_mask == 1) & owned
        if not train.any():
            continue  # a leaf whose own turns generated no token (nothing to train)
        rows.append((leaf, traj.token_ids, train, traj.node, traj.logprobs))
    width = max((len(r[1]) for r in rows), default=0)
    n = len(rows)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    inputs = LossInputs.zeros(n, width, packed=False)
    for i, (_, ids, train, node, logp) in enumerate(rows):
        length = len(ids)
        input_ids[i, :length] = torch.from_numpy(ids)
        attention[i, :length] = 1
        mask = torch.from_numpy(train.astype(np.float32))
        inputs.loss_mask[i, :length] = mask
        inputs.old_logprobs[i, :length] = torch.from_numpy(logp.astype(np.float32)) * mask
        for name, values in per_node.items():  # every per-node input, on its node's trained tokens
            getattr(inputs, name)[i, :length] = torch.from_numpy(values[node].astype(np.float32)) * mask
    leaves = np.array([r[0] for r in rows], dtype=np.int64)
    unique = sum(len(batch.nodes[n].token_ids) for n in np.flatnonzero(nodes_on_paths(batch, leaves)).tolist())
    return TrainingSequences(input_ids, attention, inputs, leaves, micro_batch_size, unique, token_budget)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
                   chunk_tokens: int = 1024, only: torch.Tensor | None = None) -> torch.Tensor:
    """log pi_T(token_t | tokens_<t) for every real position t >= 1 (0 at position 0, on padding and where
    ``only`` is False), shape (batch, length); see :func:`trace_train.update.logprobs.sampled_logprobs`."""
    rows, width = input_ids.shape
    want = attention_mask.bool().clone()
    want[:, 0] = False
    if only is not None:
        want &= only.bool()
    r, t = want.nonzero(as_tuple=True)
    logp = sampled_logprobs(model, input_ids, r * width + t - 1, input_ids[r, t], temperature=temperature,
                            chunk_tokens=chunk_tokens, attention_mask=attention_mask)
    out = torch.zeros((rows, width), dtype=torch.float32, device=input_ids.device)
    return out.index_put((r, t), logp)
