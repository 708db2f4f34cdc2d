"""Tree packing: forward every token of a rollout tree once, with a tree attention mask.

The per-leaf layout (:mod:`trace_train.update.sequences`) forwards one row per root-to-leaf path, so a prefix
shared by k rollouts is forwarded k times, by the policy and by the reference model. Here each tree is
laid out once, its nodes in depth-first order, and attention follows the tree instead of the row:

    tree            row (one tree)             mask (row i sees column j: x)
    P               P P a a b c c              P P a a b c c
    |-- a - b       0 1 2 3 4 2 3  positions   x . . . . . .   P
    `-- c                                      x x . . . . .   P
                                               x x x . . . .   a
                                               x x x x . . .   a
                                               x x x x x . .   b
                                               x x . . . x .   c
                                               x x . . . x x   c

A token sees exactly its ancestors' tokens and the earlier tokens of its own node, and its position id
continues its own path (c starts at 2, where a started), so each token's hidden states, and hence its
log-probability, equal those of the per-leaf row of its path. Because the nodes lie in depth-first order,
the subtree of a node is a contiguous range of the row, and the mask is one integer per key:

    row i sees column j  <=>  j <= i < visible_until[j],

with ``visible_until[j]`` the end of the range holding the subtree of j's node. Logits predict the next
token, and the "previous" token of a node's first token is the last token of its parent (b's first token
is predicted from a's last, c's from P's last), not the token before it in the row: each token carries
the row position whose logits predict it (``predictor``). Observation tokens (loss mask 0) between turns
are ordinary context here.

**Budget.** Pieces of trees are packed into rows, and rows into micro-batches of at most ``token_budget``
tokens (rows x width, padding included), so the peak memory of an update is set by the budget. A tree
larger than the budget is split between the token chains that rollouts own (:mod:`trace_train.update.sequences`:
a turn is trained in the row of the leaf its rollout ends in), and each piece repeats its ancestors'
tokens as context (loss mask 0). With a budget of one path this is the per-leaf layout. A chain is never
split, so every sequence-level aggregation of the loss stays exact.

**Attention back ends.** On CPU (and with ``attention="dense"``) a model whose attention is ``eager`` gets
the dense additive (rows, 1, width, width) mask through transformers' standard mask interface; any other
attends with SDPA per query block on only the key columns its queries see
(:mod:`trace_train.update.tree_attention`: a token costs about its path's length, not the row's width as
the masked square does), from a plan built from ``visible_until`` without the dense mask, and a
micro-batch's rows go end to end in one row without their padding (:func:`tree_logprobs`' ``lengths``).
On CUDA (``attention="flex"``) it is a FlexAttention ``BlockMask`` whose
mask function is the inequality above, used through ``attn_implementation="flex_attention"`` for the
duration of the forward; blocks with no visible pair are skipped. PyTorch 2.13 runs FlexAttention on CPU
only without gradients, so on CPU the dense path is used for training.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from ..configs import PACKINGS
from ..rollout.batch import RolloutBatch
from .logprobs import sampled_logprobs
from .loss import LossInputs, ReadsLossInputs, node_values
from .sequences import TrainingSequences, build_sequences, nodes_on_paths, path_tokens
from .tree_attention import block_plan
from .tree_attention import register as register_tree_sdpa

__all__ = ["PACKINGS", "ATTENTIONS", "PackedTrees", "pack_trees", "build_training_batch", "training_batch_for",
           "tree_logprobs", "tree_attention_mask", "TreeLayout"]

ATTENTIONS = ("auto", "dense", "flex")


@dataclass(frozen=True)
class PackedTrees(ReadsLossInputs):
    """Padded (rows, width) tensors holding packed trees; see the module docstring."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    """Position of each token on its own root-to-token path (0 for padding)."""
    visible_until: torch.Tensor
    """Row i sees column j iff j <= i < visible_until[j] (j + 1 for padding, which sees itself only)."""
    predictor: torch.Tensor
    """Row position whose logits predict the token (-1 for a path's first token and padding)."""
    inputs: LossInputs
    """The loss's per-token inputs; ``sequence_ids``: index into ``leaves`` of the rollout that owns a
    trained token (-1 where nothing is trained)."""
    node: torch.Tensor
    """Node whose turn holds the token (-1 for padding)."""
    lengths: torch.Tensor
    """Real (unpadded) tokens of each row."""
    leaves: np.ndarray
    """Leaf node id of each sequence index: the per-leaf rows, for the sequence-level aggregations."""
    micro: tuple[tuple[int, ...], ...]
    """Rows of each micro-batch."""
    unique_tokens: int
    """Tokens of the nodes on some trained path, counted once."""


    @property
    def forward_tokens(self) -> int:
        return int(self.lengths.sum())

    def select(self, rows) -> "PackedTrees":
        """These rows only, trimmed to the longest, as one micro-batch."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.lengths[rows].max()) if len(rows) else 0
        pick = lambda t: t[rows, :width]  # noqa: E731
        return PackedTrees(pick(self.input_ids), pick(self.position_ids), pick(self.visible_until),
                           pick(self.predictor), self.inputs.select(rows, width), pick(self.node),
                           self.lengths[rows], self.leaves, (tuple(range(len(rows))),), 0)

    def micro_batches(self) -> list["PackedTrees"]:
        return [self.select(rows) for rows in self.micro]

    def normaliser(self, per_token: bool) -> float:
        """Total token weight (``token_mean``) or number of trained sequences (the sequence means)."""
        if per_token:
            return float(self.weights.sum())
        trained = self.sequence_ids[self.loss_mask > 0]
        return float(torch.unique(trained).numel())

    def logprobs(self, model, *, attention: str = "auto", temperature: float = 1.0, chunk_tokens: int = 1024,
                 trained_only: bool = False, layouts: dict | None = None) -> torch.Tensor:
        """log pi_T of every token under ``model`` (0 where ``predictor`` is -1), shape (rows, width); see
        :meth:`trace_train.update.sequences.TrainingSequences.logprobs` for the other arguments and
        :func:`tree_logprobs` for ``layouts`` (the policy's and the reference's forward of one micro-batch
        share one)."""
        predictor = self.predictor.where(self.loss_mask > 0, -1) if trained_only else self.predictor
        return tree_logprobs(model, self.input_ids, self.position_ids, self.visible_until, predictor,
                             attention=attention, temperature=temperature, chunk_tokens=chunk_tokens,
                             lengths=self.lengths, layouts=layouts)


# ---------------------------------------------------------------------------------------------------
# Packing
# ---------------------------------------------------------------------------------------------------


def build_training_batch(batch: RolloutBatch, advantages: np.ndarray, *, packing: str, pad_token_id: int,
                         shared_turn_weight: str = "leaves", micro_batch_size: int = 16,
                         token_budget: int | None = None,
                         train_env_failures: bool = False) -> PackedTrees | TrainingSequences:
    """The update's input: packed trees (``packing="tree"``, micro-batches of at most ``token_budget``
    tokens, 8192 if None) or one row per leaf (``"leaf"``, micro-batches of at most ``micro_batch_size`` rows
    and, if given, ``token_budget`` tokens). Both have ``micro_batches()``, ``normaliser()``,
    ``logprobs(model)``, ``forward_tokens`` and ``unique_tokens``. Both train only the turns of
    ``batch.trained_nodes(train_env_failures=...)``: DAPO's kept groups, no environment faults."""
    if packing not in PACKINGS:
        raise ValueError(f"`packing` must be one of {PACKINGS}, got {packing!r}")
    if packing == "leaf":
        return build_sequences(batch, advantages, pad_token_id=pad_token_id, shared_turn_weight=shared_turn_weight,
                               micro_batch_size=micro_batch_size, token_budget=token_budget,
                               train_env_failures=train_env_failures)
    return pack_trees(batch, advantages, pad_token_id=pad_token_id, shared_turn_weight=shared_turn_weight,
                      token_budget=8192 if token_budget is None else token_budget,
                      train_env_failures=train_env_failures)


def training_batch_for(batch: RolloutBatch, advantages: np.ndarray, cfg, *, pad_token_id: int):
    """:func:`build_training_batch` with a ``TrainConfig``'s settings: ``algorithm.packing``,
    ``algorithm.shared_turn_weight``, ``optim.micro_batch_size`` and the token budget
    ``algorithm.pack_tokens`` (default: ``optim.micro_batch_size x rollout.max_context_tokens``, the
    largest micro-batch of the leaf layout, which holds any path; both layouts keep to it) and
    ``algorithm.train_env_failures``."""
    budget = cfg.algorithm.pack_tokens or cfg.optim.micro_batch_size * cfg.rollout.limits.max_context_tokens
    return build_training_batch(batch, advantages, packing=cfg.algorithm.packing, pad_token_id=pad_token_id,
                                shared_turn_weight=cfg.algorithm.shared_turn_weight,
                                micro_batch_size=cfg.optim.micro_batch_size, token_budget=budget,
                                train_env_failures=cfg.algorithm.train_env_failures)


def pack_trees(batch: RolloutBatch, advantages: np.ndarray, *, pad_token_id: int, shared_turn_weight: str = "leaves",
               token_budget: int = 8192, train_env_failures: bool = False) -> PackedTrees:
    """Pack the forest's trees into rows and micro-batches of at most ``token_budget`` tokens.

    Trains the same tokens, with the same advantages, old log-probabilities and weights, as
    :func:`trace_train.update.sequences.build_sequences`; only the layout differs.
    """
    forest = batch.forest
    per_node = node_values(forest, advantages, shared_turn_weight)
    if isinstance(token_budget, bool) or not isinstance(token_budget, (int, np.integer)) or token_budget < 1:
        raise ValueError(f"`token_budget` must be a positive integer, got {token_budget!r}")
    tokens = path_tokens(batch)
    in_loss = batch.trained_nodes(train_env_failures=train_env_failures)
    chains = [c for c in _trained_chains(forest, tokens.n_action) if in_loss[c[0]]]
    leaves = np.array([c[-1] for c in chains], dtype=np.int64)
    order, size = _preorder(forest)
    pieces = []
    for tree_chains in _by_tree(forest, chains, order):
        pieces += _split_tree(forest, tree_chains, tokens.length, token_budget)
    layouts = [_lay_out(forest, nodes, trained, order, size, tokens) for nodes, trained in pieces]
    rows = _first_fit_decreasing([len(p["ids"]) for p in layouts])
    seq_of_leaf = {int(leaf): i for i, leaf in enumerate(leaves)}
    width = max((sum(len(layouts[p]["ids"]) for p in row) for row in rows), default=0)
    n = len(rows)
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    position = torch.zeros((n, width), dtype=torch.long)
    until = torch.arange(1, width + 1).repeat(n, 1)
    predictor = torch.full((n, width), -1, dtype=torch.long)
    node = torch.full((n, width), -1, dtype=torch.long)
    inputs = LossInputs.zeros(n, width, packed=True)
    lengths = torch.zeros(n, dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for p in row:
            lay = layouts[p]
            end = start + len(lay["ids"])
            span = slice(start, end)
            ids[r, span] = torch.from_numpy(lay["ids"])
            position[r, span] = torch.from_numpy(lay["position"])
            until[r, span] = torch.from_numpy(lay["until"] + start)
            predictor[r, span] = torch.from_numpy(np.where(lay["predictor"] >= 0, lay["predictor"] + start, -1))
            mask = lay["train"].astype(np.float32)
            inputs.loss_mask[r, span] = torch.from_numpy(mask)
            inputs.old_logprobs[r, span] = torch.from_numpy(lay["logprobs"].astype(np.float32) * mask)
            for name, values in per_node.items():  # every per-node input, on its node's trained tokens
                getattr(inputs, name)[r, span] = torch.from_numpy(values[lay["node"]].astype(np.float32) * mask)
            owner = np.array([seq_of_leaf.get(int(x), -1) for x in forest.factual_leaf[lay["node"]]], dtype=np.int64)
            inputs.sequence_ids[r, span] = torch.from_numpy(np.where(lay["train"], owner, -1))
            node[r, span] = torch.from_numpy(lay["node"])
            start = end
        lengths[r] = start
    micro = _micro_batches(lengths.tolist(), token_budget)
    unique = int(tokens.length[nodes_on_paths(batch, leaves)].sum())
    return PackedTrees(ids, position, until, predictor, inputs, node, lengths, leaves, micro, unique)


def _trained_chains(forest, n_action: np.ndarray) -> list[list[int]]:
    """For every leaf whose rollout owns a generated token (leaf order), its owned nodes, top down."""
    owner = forest.factual_leaf
    order = np.lexsort((forest.depth, owner))  # by owning leaf (leaf order), then top down
    order = order[owner[order] >= 0]
    bounds = np.flatnonzero(np.diff(owner[order])) + 1
    return [c.tolist() for c in np.split(order, bounds) if len(c) and n_action[c].sum() > 0]


def _preorder(forest) -> tuple[np.ndarray, np.ndarray]:
    """Depth-first preorder index of every node (children in creation order) and its subtree size."""
    order = np.zeros(len(forest), dtype=np.int64)
    order[forest.preorder()] = np.arange(len(forest))
    size = forest.subtree_sum(np.ones(len(forest))).astype(np.int64)
    return order, size


def _by_tree(forest, chains: list[list[int]], order: np.ndarray) -> list[list[list[int]]]:
    """Chains grouped by tree, each group in depth-first order of the chains' first nodes."""
    groups: dict[int, list[list[int]]] = {}
    for chain in sorted(chains, key=lambda c: order[c[0]]):
        groups.setdefault(int(forest.root_of[chain[0]]), []).append(chain)
    return list(groups.values())


def _split_tree(forest, chains: list[list[int]], length: np.ndarray, budget: int) -> list[tuple[list[int], set]]:
    """Greedy pieces of at most ``budget`` tokens: (nodes, trained nodes). A piece holds whole chains and
    every ancestor of their nodes (context where another piece trains it)."""
    pieces, nodes, trained, used = [], set(), set(), 0
    for chain in chains:
        need = _with_ancestors(forest, chain, nodes)
        cost = int(length[need].sum())
        if trained and used + cost > budget:
            pieces.append((sorted(nodes), trained))
            nodes, trained, used = set(), set(), 0
            need = _with_ancestors(forest, chain, nodes)
            cost = int(length[need].sum())
        if cost > budget:
            raise ValueError(f"the rollout ending at node {chain[-1]} has {cost} tokens, more than the token budget "
                             f"of a micro-batch ({budget}): raise algorithm.pack_tokens to at least the longest path")
        nodes.update(need)
        trained.update(chain)
        used += cost
    if trained:
        pieces.append((sorted(nodes), trained))
    return pieces


def _with_ancestors(forest, chain: list[int], have: set) -> list[int]:
    """The chain's nodes and the ancestors of its first node that ``have`` lacks."""
    need = list(chain)
    node = int(forest.parent[chain[0]])
    while node != -1 and node not in have:
        need.append(node)
        node = int(forest.parent[node])
    return need


def _lay_out(forest, nodes: list[int], trained: set, order: np.ndarray, size: np.ndarray, tokens) -> dict:
    """One piece as token arrays: depth-first node order, positions, visible_until and predictor."""
    nodes = sorted(nodes, key=lambda n: order[n])
    pre = order[nodes]
    lens = tokens.length[nodes]
    starts = np.concatenate([[0], np.cumsum(lens)])
    total = int(starts[-1])
    last: dict[int, int] = {}
    ids, position, until, predictor, node_of, train, logp = [], [], [], [], [], [], []
    for i, node in enumerate(nodes):
        s, k = int(starts[i]), int(lens[i])
        end_of_subtree = int(starts[np.searchsorted(pre, order[node] + size[node])])
        parent = int(forest.parent[node])
        before = last.get(parent, -1) if parent != -1 else -1
        last[node] = s + k - 1 if k else before
        ids.append(tokens.ids[node])
        position.append(tokens.offset[node] + np.arange(k))
        until.append(np.full(k, end_of_subtree))
        predictor.append(np.concatenate([[before], s + np.arange(k - 1)]) if k else np.zeros(0, dtype=np.int64))
        node_of.append(np.full(k, node))
        train.append(tokens.action[node] & (node in trained))
        logp.append(tokens.logprobs[node])
    cat = lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)  # noqa: E731
    out = {"ids": cat(ids, np.int64), "position": cat(position, np.int64), "until": cat(until, np.int64),
           "predictor": cat(predictor, np.int64), "node": cat(node_of, np.int64), "train": cat(train, bool),
           "logprobs": cat(logp, np.float64)}
    assert len(out["ids"]) == total
    return out


def _first_fit_decreasing(lengths: list[int]) -> list[list[int]]:
    """Pieces into rows no wider than the longest piece (dense attention costs width squared, so rows do
    not grow beyond what the largest tree needs); short pieces share a row."""
    capacity = max(lengths, default=0)
    rows: list[list[int]] = []
    room: list[int] = []
    for p in sorted(range(len(lengths)), key=lambda p: -lengths[p]):
        for r, free in enumerate(room):
            if lengths[p] <= free:
                rows[r].append(p)
                room[r] -= lengths[p]
                break
        else:
            rows.append([p])
            room.append(capacity - lengths[p])
    return rows


def _micro_batches(lengths: list[int], budget: int) -> tuple[tuple[int, ...], ...]:
    """Rows, longest first, grouped so that rows x (longest row) <= budget and no row is padded to more
    than twice its length: a shorter row starts the next micro-batch (its padding would cost the layers'
    per-position work, which no attention mask skips, more than its own tokens)."""
    out: list[list[int]] = []
    for r in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        longest = lengths[out[-1][0]] if out else 0
        if out and (len(out[-1]) + 1) * longest <= budget and 2 * lengths[r] >= longest:
            out[-1].append(r)
        else:
            out.append([r])
    return tuple(tuple(m) for m in out)


# ---------------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------------


def tree_attention_mask(visible_until: torch.Tensor) -> torch.Tensor:
    """Boolean (rows, 1, width, width) mask: entry [r, 0, i, j] is True iff j <= i < visible_until[r, j]."""
    width = visible_until.shape[-1]
    pos = torch.arange(width, device=visible_until.device)
    return ((pos[None, None, :] <= pos[None, :, None]) & (pos[None, :, None] < visible_until[:, None, :]))[:, None]


def tree_logprobs(model, input_ids: torch.Tensor, position_ids: torch.Tensor, visible_until: torch.Tensor,
                  predictor: torch.Tensor, *, attention: str = "auto", temperature: float = 1.0,
                  chunk_tokens: int = 1024, lengths: torch.Tensor | None = None,
                  layouts: dict | None = None) -> torch.Tensor:
    """log pi_T(token) for every packed token, from the logits at its ``predictor`` position (0 where -1),
    at ``temperature``, ``chunk_tokens`` positions at a time (:mod:`trace_train.update.logprobs`).

    ``attention``: "dense" (4-D mask; sdpa or eager), "flex" (FlexAttention block mask) or "auto"
    (flex on CUDA, dense elsewhere). ``lengths``: the real tokens of each row; on the dense SDPA path
    (``update.tree_attention``) the rows' real tokens then go end to end in one row, so no padding is
    forwarded (a row's tree mask already keeps its pieces apart: row r's column j becomes
    offset_r + j, with visible_until and predictor shifted by offset_r = lengths[:r].sum()).

    ``layouts``: a dict that keeps the attention's layout (:class:`TreeLayout`: the block plan and its
    masks, the block mask, or the dense mask) between calls on the same rows, so that a second model's
    forward of the same micro-batch (the reference's, after the policy's) does not build it again; the
    caller owns it and drops it with the micro-batch. None: built for this call only.
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"`attention` must be one of {ATTENTIONS}, got {attention!r}")
    param = next(model.parameters())
    device = param.device
    if attention == "auto":
        attention = "flex" if device.type == "cuda" else "dense"
    current = model.config._attn_implementation
    kind = "flex" if attention == "flex" else "eager" if current == "eager" else "tree_sdpa"
    key = (kind, str(device), param.dtype if kind == "eager" else None)
    layout = None if layouts is None else layouts.get(key)
    if layout is None:
        rows = (x.to(device) for x in (input_ids, position_ids, visible_until))
        layout = TreeLayout.build(kind, *rows, None if lengths is None else lengths.to(device), param.dtype)
        if layouts is not None:
            layouts[key] = layout
    pred = predictor.to(device)
    r, t = (pred >= 0).nonzero(as_tuple=True)
    target = input_ids.to(device)[r, t]
    source = (r * input_ids.shape[1] if layout.offset is None else layout.offset[r]) + pred[r, t]
    with _attention_implementation(model, layout.implementation):
        logp = sampled_logprobs(model, layout.input_ids, source, target, temperature=temperature,
                                chunk_tokens=chunk_tokens, position_ids=layout.position_ids, **layout.forward)
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)
    return out.index_put((r, t), logp)


@dataclass(frozen=True)
class TreeLayout:
    """What the model is given for packed rows besides their tokens: the attention implementation, the
    (possibly end-to-end) ids and positions, and the mask or plan (:func:`tree_logprobs`)."""

    implementation: str
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    offset: torch.Tensor | None
    """Where each packed row starts in the end-to-end row (None: the rows are forwarded as they are)."""
    forward: dict
    """The forward's other keywords: ``attention_mask`` (a block mask or the dense additive mask) or
    ``tree_plan``."""

    @classmethod
    def build(cls, kind: str, ids, position, until, lengths, dtype: torch.dtype) -> "TreeLayout":
        if kind == "flex":
            return cls("flex_attention", ids, position, None, {"attention_mask": _block_mask(until)})
        if kind == "eager":  # eager adds the dense mask to the scores
            mask = tree_attention_mask(until)
            additive = torch.zeros(mask.shape, dtype=dtype, device=ids.device)
            additive.masked_fill_(~mask, torch.finfo(dtype).min)
            return cls("eager", ids, position, None, {"attention_mask": additive})
        # sdpa per query block on the keys its queries see (update.tree_attention): no dense mask
        offset = None
        if lengths is not None and ids.shape[0] > 1:
            ids, position, until, offset = _end_to_end(ids, position, until, lengths)
        return cls(register_tree_sdpa(), ids, position, offset, {"tree_plan": block_plan(until)})


def _end_to_end(ids, position, until, lengths):
    """The rows' real tokens end to end in one row: (ids, position, visible_until) of shape (1, total) and
    where each row starts in it (row r's column j is offset_r + j)."""
    offset = torch.cumsum(lengths, 0) - lengths
    real = torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]
    shifted = until + offset[:, None]
    return ids[real][None], position[real][None], shifted[real][None], offset


def _block_mask(until: torch.Tensor):
    from torch.nn.attention.flex_attention import create_block_mask

    def visible(b, h, q, kv):
        return (kv <= q) & (q < until[b, kv])

    rows, width = until.shape
    return create_block_mask(visible, rows, None, width, width, device=until.device)


@contextlib.contextmanager
def _attention_implementation(model, impl: str):
    """Use attention implementation ``impl`` inside the block (the model's own is restored after)."""
    current = model.config._attn_implementation
    if current == impl:
        yield
        return
    model.set_attn_implementation(impl)
    try:
        yield
    finally:
        model.set_attn_implementation(current)
