"""The transformers back end's prefix cache: key/value tensors of prompt prefixes, kept across ``generate``
calls (vLLM's automatic prefix caching, in miniature).

A multi-turn rollout's prompt at turn t is its prompt at turn t - 1, that turn's completion and the
environment's answer; a tree's continuation starts from its bare rollout's history; every prompt of an agent
starts with the same system text. Without a cache each turn computes the whole history again, so a step's
prefill grows with the square of its depth, and deeper rows (a tree's continuations) cost more per
generated token than shallow ones.

The cache holds whole blocks of :data:`BLOCK` tokens. A block's key is ``(hash of the previous block's key,
the block's tokens)``, so a key names the block *and everything before it* (two prompts share a cached block
only if they share the whole prefix up to it), and a dictionary lookup compares the tokens themselves.
:meth:`PrefixCache.lookup` walks a prompt's blocks until the first one that is missing;
:meth:`PrefixCache.add` stores the blocks of a finished sample that are not there yet. Blocks are evicted
least recently used first once the cache holds more than ``max_bytes``; a block whose parent was evicted is
unreachable and goes next. A block is one tensor holding every layer's keys and values (:data:`KV`), so
a prompt's cached prefix is one concatenation however deep the model.

What is cached is only valid for the weights that computed it: :meth:`PrefixCache.clear` on every weight
change (``HFBackend.update_weights`` does; a trainer that shares its model with the back end calls
``HFBackend.reset_prefix_cache`` after each update).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Sequence

import torch

__all__ = ["PrefixCache", "BLOCK"]

BLOCK = 16
"""Tokens per cached block (vLLM's default block size)."""

KV = torch.Tensor
"""Keys and values of every layer for some tokens: shape (layers, 2, key/value heads, tokens, head dim)."""


class PrefixCache:
    """Blocks of key/value tensors keyed by their prefix; see the module docstring.

    Parameters
    ----------
    max_bytes : int
        Most bytes of keys and values held; the least recently used blocks go first. 0 keeps nothing.
    """

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"the prefix cache's size must be at least 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._blocks: OrderedDict[tuple, KV] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        """Forget every block (the weights changed)."""
        self._blocks.clear()
        self.bytes = 0

    @staticmethod
    def _keys(tokens: Sequence[int], n_blocks: int) -> list[tuple]:
        keys, parent = [], 0
        for b in range(n_blocks):
            key = (parent, tuple(tokens[b * BLOCK:(b + 1) * BLOCK]))
            keys.append(key)
            parent = hash(key)
        return keys

    def lookup(self, tokens: Sequence[int], limit: int) -> tuple[int, KV | None]:
        """The longest cached prefix of ``tokens`` of at most ``limit`` tokens, in whole blocks: its length
        and its keys and values, or ``(0, None)``."""
        found = self.lookup_blocks(tokens, limit)
        return (len(found) * BLOCK, torch.cat(found, dim=3)) if found else (0, None)

    def lookup_blocks(self, tokens: Sequence[int], limit: int) -> list[KV]:
        """:meth:`lookup`'s blocks, one tensor each, in order (for a caller that copies them where they go)."""
        found: list[KV] = []
        if not self._blocks:
            return found
        for key in self._keys(tokens, max(limit, 0) // BLOCK):
            block = self._blocks.get(key)
            if block is None:
                break
            self._blocks.move_to_end(key)
            found.append(block)
        return found

    def add(self, tokens: Sequence[int], gather: Callable[[int, int], KV]) -> None:
        """Store the whole blocks of ``tokens`` that are not cached; ``gather(start, stop)`` returns the keys
        and values of positions ``start:stop`` of ``tokens`` (called once, for the missing ones only)."""
        if self.max_bytes == 0:
            return
        keys = self._keys(tokens, len(tokens) // BLOCK)
        first = next((b for b, key in enumerate(keys) if key not in self._blocks), len(keys))
        for key in keys[:first]:
            self._blocks.move_to_end(key)
        if first == len(keys):
            return
        kv = gather(first * BLOCK, len(keys) * BLOCK)
        for b, key in enumerate(keys[first:]):
            if key in self._blocks:  # cached, though a block before it was evicted
                self._blocks.move_to_end(key)
                continue
            block = kv[:, :, :, b * BLOCK:(b + 1) * BLOCK].clone()
            self._blocks[key] = block
            self.bytes += block.nbytes
        while self.bytes > self.max_bytes and self._blocks:
            _, block = self._blocks.popitem(last=False)
            self.bytes -= block.nbytes
