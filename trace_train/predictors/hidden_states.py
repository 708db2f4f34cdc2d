"""The policy's last-layer hidden state at the end of token sequences, for the ``probe`` predictor.

A causal model's state at position i depends on tokens 0..i only, so the state at the end of a prefix
is read from any forward of a longer sequence that starts with it: a rollout's turn boundaries all come
from one forward of the rollout, and a continuation's anchor from the forward of its bare rollout.
:class:`PolicyStates` sorts the requested sequences, forwards only those that are no prefix of another
(in lexicographic order the extensions of a sequence follow it contiguously), right-padded in batches of
at most ``max_batch_tokens`` padded tokens, and gathers every request's state from its host's row.

Cost: one no-grad forward of the base model (no LM head: no (tokens x vocab) logits) over the unique
longest sequences, measured per step as ``predictor_state_seconds``.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np
import torch


def hosts(sequences: Sequence[Sequence[int]]) -> tuple[list[int], np.ndarray]:
    """Which sequences to forward, and for each sequence the index (into that list) of its host.

    A host is a sequence that is no prefix of another; every sequence is a prefix of (or equal to) its host.
    """
    seqs = [tuple(s) for s in sequences]
    order = sorted(range(len(seqs)), key=seqs.__getitem__)
    host_of = np.empty(len(seqs), dtype=int)
    forwarded: list[int] = []
    host = -1
    for rank in range(len(order) - 1, -1, -1):
        i = order[rank]
        nxt = seqs[order[rank + 1]] if rank + 1 < len(order) else None
        if nxt is None or nxt[: len(seqs[i])] != seqs[i]:
            forwarded.append(i)
            host = len(forwarded) - 1
        host_of[i] = host
    return forwarded, host_of


class PolicyStates:
    """``states(sequences) -> (n, hidden)`` float32: the last layer's state at each sequence's last token."""

    def __init__(self, model: torch.nn.Module, *, max_batch_tokens: int = 16384,
                 compute_dtype: torch.dtype | None = None):
        if max_batch_tokens < 1:
            raise ValueError(f"`max_batch_tokens` must be positive, got {max_batch_tokens!r}")
        self.model = model
        self.base = getattr(model, getattr(model, "base_model_prefix", ""), model)
        self.max_batch_tokens = max_batch_tokens
        self.compute_dtype = compute_dtype

    def __call__(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        if any(len(s) == 0 for s in sequences):
            raise ValueError("every sequence needs at least one token")
        forwarded, host_of = hosts(sequences)
        order = sorted(range(len(forwarded)), key=lambda j: len(sequences[forwarded[j]]))
        host_states: list[torch.Tensor | None] = [None] * len(forwarded)
        device = next(self.model.parameters()).device
        batch: list[int] = []

        def flush():
            rows = [list(sequences[forwarded[j]]) for j in batch]
            width = max(map(len, rows))
            ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
            mask = torch.zeros_like(ids)
            for r, row in enumerate(rows):
                ids[r, : len(row)] = torch.tensor(row, device=device)
                mask[r, : len(row)] = 1
            out = self.base(input_ids=ids, attention_mask=mask).last_hidden_state
            for r, j in enumerate(batch):
                host_states[j] = out[r, : len(rows[r])].float().cpu()
            batch.clear()

        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast(device):
                for j in order:
                    width = len(sequences[forwarded[j]])
                    if batch and width * (len(batch) + 1) > self.max_batch_tokens:
                        flush()
                    batch.append(j)
                if batch:
                    flush()
        finally:
            self.model.train(was_training)
        out = np.empty((len(sequences), host_states[0].shape[1]), dtype=np.float32)
        for i, seq in enumerate(sequences):
            out[i] = host_states[host_of[i]][len(seq) - 1].numpy()
        return out

    def _autocast(self, device: torch.device):
        param = next(self.model.parameters()).dtype
        if self.compute_dtype is None or self.compute_dtype == param:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.compute_dtype)
