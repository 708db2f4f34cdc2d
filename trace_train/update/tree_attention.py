"""Tree attention on CPU at the cost of the pairs a token can see, not of the whole row squared.

A packed row (:mod:`trace_train.update.packing`) is a tree in depth-first order: row position i sees column j
iff j <= i < until[j] (``visible_until``). The masked square (one SDPA call on a dense (rows, 1, W, W)
mask) computes every (query, key) pair, W^2 scores a row whatever its tree. Here each row's queries go in
blocks of ``QUERY_BLOCK`` positions, and a block [q0, q1) attends only to the key columns some query of it
sees,

    K(q0, q1) = {j < q1 : until[j] > q0},

one SDPA call per block on its (q1 - q0) x |K| slice of the mask:

    cost = sum over rows and blocks of (q1 - q0) |K(q0, q1)|,

about (path length + block) per token instead of W: in depth-first order a block's columns are its
queries' ancestors plus the block itself. Masked-out keys contribute exactly zero to a softmax, so the
result equals the square's to float rounding (the reductions run over fewer terms).

**What a forward costs beyond the scores.** The plan (:class:`TreePlan`: every block's key columns and
mask) is built once per forward from ``visible_until`` alone, vectorised over blocks, and every layer
reuses it; the dense W x W mask is never built. A layer gathers all blocks' keys and values with one
``index_select`` and splits them (so the backward scatters into the key gradient once, not once per
block: slicing a tensor per block would zero and add a full-size gradient per block, a cost that grows
with the row's width squared), and calls SDPA on 4-D tensors with an additive mask, which PyTorch's fused
CPU kernel takes (3-D inputs or a boolean mask fall back to the slower math kernel); grouped-query models
pass their kv heads as they are (``enable_gqa``), not copied once per query head.

Registered with transformers as the attention implementation ``"tree_sdpa"``, whose mask function builds
nothing: :func:`trace_train.update.packing.tree_logprobs` passes the plan as the forward's ``tree_plan``
keyword, which transformers hands to every attention call. On CUDA FlexAttention's block mask skips the
empty blocks itself (``attention="flex"``), which is cheap where the blocks are regular: the same
depth-first layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["TREE_SDPA", "QUERY_BLOCK", "TreePlan", "block_plan", "tree_sdpa_attention", "register"]

TREE_SDPA = "tree_sdpa"
QUERY_BLOCK = 64
"""Queries per SDPA call: a block attends to its queries' ancestors plus its own triangle, computed whole,
so smaller blocks compute fewer pairs in more calls (each about 0.1 ms of overhead, one thread). On the
1-8-guess games' batches 64 computes 222 keys per token for streamed TRACE where 128 computes 288 (its
tokens' own paths: 160)."""


@dataclass
class TreePlan:
    """Every query block of a (rows, width) packed batch, in row-major order, and the keys it attends to."""

    rows: int
    width: int
    query_sizes: list
    """Queries of each block (consecutive positions of the flattened rows x width)."""
    key_index: torch.Tensor
    """Flat key positions (row x width + column) of every block, block after block."""
    key_sizes: list
    """Keys of each block (its share of ``key_index``)."""
    first: torch.Tensor
    """Per key of ``key_index``: the first query of its block (counted from the block's start) that sees it."""
    end: torch.Tensor
    """Per key: the queries before this one (counted from the block's start) see it; from ``first`` on."""
    block: int
    """Queries per full block (min(block size, width))."""
    _masks: dict = field(default_factory=dict, repr=False)

    @property
    def visible(self) -> torch.Tensor:
        """Boolean (block, len(key_index)): query q0 + i of a block sees its key e."""
        return self._sees(slice(None))

    def _sees(self, keys) -> torch.Tensor:
        i = torch.arange(self.block, device=self.first.device)[:, None]
        return (i >= self.first[keys][None, :]) & (i < self.end[keys][None, :])

    def masks(self, dtype: torch.dtype) -> list:
        """Each block's additive (1, 1, queries, keys) mask in ``dtype``: 0 where seen, -inf elsewhere.

        Most keys are ancestors every query of their block sees (a column of zeros); only the keys some
        query does not see (the block's own triangle, subtrees that end inside the block) are worked out.
        """
        if dtype not in self._masks:
            full = torch.zeros((self.block, len(self.key_index)), dtype=dtype, device=self.first.device)
            partial = ((self.first > 0) | (self.end < self.block)).nonzero().squeeze(1)
            if partial.numel():
                hidden = torch.full((), float("-inf"), dtype=dtype, device=full.device)
                full[:, partial] = torch.where(self._sees(partial), torch.zeros((), dtype=dtype), hidden)
            self._masks[dtype] = [part[:q][None, None]
                                  for part, q in zip(full.split(self.key_sizes, dim=1), self.query_sizes)]
        return self._masks[dtype]


def block_plan(visible_until: torch.Tensor, block: int | None = None) -> TreePlan:
    """The :class:`TreePlan` of rows whose position i sees column j iff j <= i < visible_until[r, j], in
    query blocks of ``block`` positions (default ``QUERY_BLOCK``): block [q0, q1) sees K(q0, q1) (module
    docstring); its query q0 + i sees key j iff j - q0 <= i < visible_until[r, j] - q0."""
    block = QUERY_BLOCK if block is None else block
    until = visible_until
    rows, width = until.shape
    device = until.device
    q0 = torch.arange(0, width, block, device=device)
    q1 = (q0 + block).clamp(max=width)
    cols = torch.arange(width, device=device)
    sees = (cols[None, None, :] < q1[None, :, None]) & (until[:, None, :] > q0[None, :, None])  # (rows, blocks, W)
    r, b, j = sees.nonzero(as_tuple=True)
    n_blocks = len(q0)
    key_sizes = torch.bincount(r * n_blocks + b, minlength=rows * n_blocks).tolist()
    start = q0[b]
    query_sizes = (q1 - q0).tolist() * rows
    return TreePlan(rows, width, query_sizes, r * width + j, key_sizes, j - start, until[r, j] - start,
                    min(block, width))


def tree_sdpa_attention(module, query, key, value, attention_mask=None, dropout: float = 0.0, scaling=None,
                        tree_plan: TreePlan | None = None, **kwargs):
    """transformers' attention signature: query (rows, heads, width, d), key/value (rows, kv heads, width,
    d) and ``tree_plan`` (:func:`block_plan`; ``attention_mask`` is not read). Returns (rows, width, heads,
    d) and no weights."""
    rows, heads, width, dim = query.shape
    if tree_plan is None:
        raise ValueError("tree_sdpa attention needs the forward's `tree_plan` keyword (update.tree_attention."
                         "block_plan); this model does not pass its forward's keywords to its attention: "
                         "train it with attn_implementation='eager'")
    if (tree_plan.rows, tree_plan.width) != (rows, width) or key.shape[2] != width:
        raise ValueError(f"the tree plan is for {tree_plan.rows} x {tree_plan.width} positions, the attention "
                         f"got {rows} x {width} queries and {key.shape[2]} keys")
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    dropout = dropout if module.training else 0.0
    index = tree_plan.key_index

    def gather(t):  # (rows, kv heads, W, d) -> (1, kv heads, keys, d), one gather for every block
        return t.transpose(0, 1).reshape(kv_heads, rows * width, dim).index_select(1, index)[None]

    keys = gather(key).split(tree_plan.key_sizes, dim=2)
    values = gather(value).split(tree_plan.key_sizes, dim=2)
    queries = query.transpose(0, 1).reshape(heads, rows * width, dim)[None].split(tree_plan.query_sizes, dim=2)
    # grouped-query attention inside SDPA (query head h reads kv head h // groups), not by copying each kv
    # head `groups` times (a copy per layer whose backward sums the copies again)
    gqa = {"enable_gqa": True} if groups > 1 else {}
    out = [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=dropout, scale=scaling,
                                                            **gqa)
           for q, k, v, m in zip(queries, keys, values, tree_plan.masks(query.dtype))]
    out = torch.cat(out, dim=2).reshape(heads, rows, width, dim).permute(1, 2, 0, 3).contiguous()
    return out, None


def _no_mask(*args, **kwargs):
    """The mask function of ``tree_sdpa``: none (the attention reads the ``tree_plan`` keyword instead)."""
    return None


def register() -> str:
    """Register ``"tree_sdpa"`` with transformers (its attention and mask interfaces; idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(TREE_SDPA, tree_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(TREE_SDPA, _no_mask)
    return TREE_SDPA
