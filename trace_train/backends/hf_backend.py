"""Generation with plain transformers/PyTorch: the back end for machines without vLLM.

The decoding loop is written out (no ``model.generate``) so that it has exactly the semantics of
:mod:`.base`: per-sample seeds, log-probabilities of the sampling distribution (vLLM's
``processed_logprobs``), vLLM's stop rules and top-p rule. Prompts of a
batch are left-padded; the ``n`` samples of a request share one prefill whose key/value cache is copied
to each sample, so ``n - 1`` of them report their prompt as served from cache. A prefix that every prompt
of a batch starts with (an agent's system prompt and tool list, a tree's common history) is computed once
and its cache copied to every prompt (:func:`shared_prefix_length`): the prompts after the first report it
as served from cache. Nothing is cached across ``generate`` calls.

Sampling uses the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``), as vLLM does, with one
``torch.Generator`` per sample; the random streams differ from vLLM's, so sampled outputs agree with
vLLM in distribution, and greedy outputs (``temperature=0``) agree token for token up to float ties.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import torch

from .base import Completion, GenerationRequest, GenerationStats, Sampling, check_requests, pad_token_id

__all__ = ["HFBackend", "shared_prefix_length", "MIN_SHARED_PREFIX"]


class HFBackend:
    """:class:`~.base.GenerationBackend` over a transformers causal LM.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM, used as is (a trainer may share it: generation runs in eval mode and then restores
        the model's mode).
    tokenizer : transformers.PreTrainedTokenizerBase
        Its tokenizer (EOS, pad token and decoding for stop strings).
    max_batch_size : int
        Most samples decoded together; larger calls run in chunks of prompts of similar lengths (a
        request's samples stay together).
    """

    def __init__(self, model, tokenizer, *, max_batch_size: int = 64):
        if max_batch_size < 1:
            raise ValueError(f"`max_batch_size` must be at least 1, got {max_batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.stats = GenerationStats()
        self.pad_id = pad_token_id(tokenizer)
        self.eos_id = tokenizer.eos_token_id
        extra = getattr(model.generation_config, "eos_token_id", None)
        extra = [extra] if isinstance(extra, int) else list(extra or [])
        self._config_stop_ids = tuple(t for t in extra if t != self.eos_id)  # vLLM adds these as stop tokens

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu", **kwargs):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        return cls(model, AutoTokenizer.from_pretrained(path), **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -----------------------------------------------------------------------------------------------

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy ``state_dict`` into the model's parameters (strict: every name must match)."""
        self.model.load_state_dict(dict(state_dict), strict=True)

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling) -> list[list[Completion]]:
        requests = check_requests(requests, sampling)
        results: list[list[Completion]] = [[] for _ in requests]
        chunks: list[list[int]] = [[]]
        for i in sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids)):  # less padding
            if chunks[-1] and sum(requests[c].n for c in chunks[-1]) + requests[i].n > self.max_batch_size:
                chunks.append([])
            chunks[-1].append(i)
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk in chunks if requests else []:
                self._run(requests, chunk, sampling, results)
        finally:
            self.model.train(was_training)
        for r, out in zip(requests, results):
            for c in out:
                self.stats.add(r.prompt_ids, c)
        return results

    def _run(self, requests, chunk: list[int], sampling: Sampling, results) -> None:
        """Decode the samples of the requests in ``chunk`` together and store them in ``results``."""
        reqs = [requests[i] for i in chunk]
        prompts = [r.prompt_ids for r in reqs]
        shared = shared_prefix_length(prompts)
        logits, cache, mask = self._prefill(prompts, shared)
        owner = torch.repeat_interleave(torch.arange(len(reqs)), torch.tensor([r.n for r in reqs]))
        cache.reorder_cache(owner.to(self.device))
        logits, mask = logits[owner], mask[owner]
        positions = torch.tensor([len(p) for p in prompts])[owner].to(self.device)  # the next token's position
        samples = [(reqs[int(o)], j) for o, j in zip(owner.tolist(), _ranks(owner.tolist()))]
        decoder = _Decoder(self, samples, sampling)
        while True:
            tokens = decoder.step(logits)
            if decoder.finished:
                break
            mask = torch.cat([mask, torch.ones(len(owner), 1, dtype=torch.long, device=self.device)], dim=1)
            out = self.model(
                input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
            positions = positions + 1
            logits, cache = out.logits[:, -1].float(), out.past_key_values
        for k, (r, j) in enumerate(samples):
            o = int(owner[k])
            cached = len(r.prompt_ids) if j else (shared if o else 0)  # the shared prefix: computed for the first
            results[chunk[o]].append(decoder.completion(k, cached=cached))

    def _prefill(self, prompts: Sequence[Sequence[int]], shared: int = 0):
        """Forward pass over distinct prompts whose first ``shared`` tokens are the same; returns the last
        logits, the key/value cache and its attention mask (one row per prompt).

        Without a shared prefix the prompts are left-padded. With one, the prefix runs once and its cache
        is copied to every prompt; the rest of each prompt follows it, left-padded, so a row of the cache
        reads ``prefix | padding | rest`` (the mask hides the padding, the position ids skip it).
        """
        device = self.device
        cache, head = None, torch.zeros((len(prompts), 0), dtype=torch.long)
        if shared:
            out = self.model(input_ids=torch.tensor([list(prompts[0][:shared])], device=device), use_cache=True,
                             logits_to_keep=1)
            cache = out.past_key_values
            cache.reorder_cache(torch.zeros(len(prompts), dtype=torch.long, device=device))
            head = torch.ones((len(prompts), shared), dtype=torch.long)
        rests = [p[shared:] for p in prompts]
        width = max(len(r) for r in rests)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, r in enumerate(rests):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = 1
        position_ids = shared + (mask.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([head, mask], dim=1).to(device)
        out = self.model(
            input_ids=ids.to(device), attention_mask=mask, position_ids=position_ids.to(device),
            past_key_values=cache, use_cache=True, logits_to_keep=1,  # last position only
        )
        return out.logits[:, -1].float(), out.past_key_values, mask


MIN_SHARED_PREFIX = 16
"""Fewest tokens of a common prompt prefix that :class:`HFBackend` prefills once for a whole batch."""


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens at the start of every prompt that one forward pass computes for the batch: the longest common
    prefix, short of every prompt's last token (whose logits start the decoding), or 0 when there is one
    prompt or fewer than :data:`MIN_SHARED_PREFIX` shared tokens."""
    if len(prompts) < 2:
        return 0
    n = min(len(os.path.commonprefix([tuple(p) for p in prompts])), min(len(p) for p in prompts) - 1)
    return n if n >= MIN_SHARED_PREFIX else 0


def _ranks(owner: list[int]) -> list[int]:
    """Index of each sample within its request (0, 1, ... per owner)."""
    seen: dict[int, int] = {}
    ranks = []
    for o in owner:
        ranks.append(seen.get(o, 0))
        seen[o] = ranks[-1] + 1
    return ranks


class _Decoder:
    """Token choice and stop rules for a batch of samples, one step at a time."""

    def __init__(self, backend: HFBackend, samples, sampling: Sampling):
        self.backend, self.sampling = backend, sampling
        self.limits = [r.new_tokens(sampling) for r, _ in samples]
        self.generators = []
        for r, j in samples:
            g = torch.Generator()
            seed = r.sample_seed(j)
            g.manual_seed(seed) if seed is not None else g.seed()
            self.generators.append(g)
        self.stop_ids = set(sampling.stop_token_ids) | set(backend._config_stop_ids)
        self.tokens: list[list[int]] = [[] for _ in samples]
        self.logprobs: list[list[float]] = [[] for _ in samples]
        self.finish: list[tuple[str, str | int | None] | None] = [None] * len(samples)

    @property
    def finished(self) -> bool:
        return all(f is not None for f in self.finish)

    def step(self, logits: torch.Tensor) -> torch.Tensor:
        """Choose the next token of every unfinished sample; returns the tokens to feed (pad when done)."""
        processed = self._process(logits)
        recorded = torch.log_softmax(processed, dim=-1)  # the distribution the token is drawn from
        chosen = self._choose(processed)
        feed = torch.full((len(self.tokens),), self.backend.pad_id, dtype=torch.long)
        for k, t in enumerate(chosen.tolist()):
            if self.finish[k] is not None:
                continue
            self.tokens[k].append(t)
            self.logprobs[k].append(float(recorded[k, t]))
            self.finish[k] = self._stop(k, t)
            feed[k] = t
        return feed.to(logits.device)

    def _process(self, logits: torch.Tensor) -> torch.Tensor:
        """vLLM's processed logits: divided by the temperature, then top-p (raw logits when greedy)."""
        if self.sampling.temperature == 0.0:
            return logits.cpu()
        logits = (logits / self.sampling.temperature).cpu()
        if self.sampling.top_p < 1.0:
            logits = _top_p(logits, self.sampling.top_p)
        return logits

    def _choose(self, logits: torch.Tensor) -> torch.Tensor:
        if self.sampling.temperature == 0.0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits, dim=-1)
        q = torch.empty_like(probs)
        for k, g in enumerate(self.generators):
            q[k].exponential_(generator=g)
        return (probs / q).argmax(dim=-1)

    def _stop(self, k: int, token: int):
        """vLLM's order: EOS, stop tokens, stop strings (the earliest end wins), then the length limit."""
        if token == self.backend.eos_id:
            return ("stop", None)
        if token in self.stop_ids:
            return ("stop", token)
        if self.sampling.stop:
            text = self.backend.tokenizer.decode(self.tokens[k], skip_special_tokens=True)
            hits = [(text.find(s) + len(s), i, s) for i, s in enumerate(self.sampling.stop) if s in text]
            if hits:
                return ("stop", min(hits)[2])
        if len(self.tokens[k]) >= self.limits[k]:
            return ("length", None)
        return None

    def completion(self, k: int, *, cached: int) -> Completion:
        reason, stop = self.finish[k]
        return Completion(tuple(self.tokens[k]), tuple(self.logprobs[k]), reason, stop, cached)


def _top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """vLLM's top-p rule: drop the least likely tokens whose cumulative probability is at most 1 - p."""
    sorted_logits, idx = logits.sort(dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= 1 - p
    drop[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return logits.scatter(-1, idx, sorted_logits)
