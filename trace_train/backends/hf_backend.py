"""Generation with plain transformers/PyTorch: the back end for machines without vLLM.

The decoding loop is written out (no ``model.generate``) so that it has exactly the semantics of
:mod:`.base`: per-sample seeds, log-probabilities of the sampling distribution (vLLM's
``processed_logprobs``), vLLM's stop rules and top-p rule. Prompts of a batch are left-padded; the
samples of one prompt (a request's ``n``, and those of other requests with the same prompt: a continuation
and the rollout it branches from ask for the same next turn) share one prefill whose key/value cache is
copied to each sample, so all but one of them report their prompt as served from cache. A prefix that
every prompt of a batch starts with (an agent's system prompt and tool list) is computed once and its cache copied to
every prompt (:func:`shared_prefix_length`), and a prefix cache kept across calls (:mod:`.prefix_cache`:
whole blocks of earlier prompts and completions, emptied on every weight update) serves a multi-turn
rollout's history and a continuation's prefix; what comes from either is reported as served from cache.
A decoding batch's key/value cache is allocated once with room for every token it can add
(:class:`_PreallocatedLayer`), so a step writes one position instead of copying the cache.

Sampling uses the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``), as vLLM does, with one
``torch.Generator`` per sample; the random streams differ from vLLM's, so sampled outputs agree with
vLLM in distribution, and greedy outputs (``temperature=0``) agree token for token up to float ties.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .base import (Capabilities, Completion, GenerationRequest, GenerationStats, Sampling, check_requests,
                   pad_token_id)
from .prefix_cache import PrefixCache

__all__ = ["HFBackend", "shared_prefix_length", "MIN_SHARED_PREFIX", "PREFIX_CACHE_BYTES"]

PREFIX_CACHE_BYTES = 2**30
"""Default size of the transformers back end's prefix cache (1 GiB of keys and values)."""


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
    prefix_cache_bytes : int
        Size of the prefix cache kept across calls (:mod:`.prefix_cache`); 0 turns it off. Models whose
        cache is not plain full attention (sliding windows, linear attention) run without it.
    """

    capabilities = Capabilities(prefix_cache_reset=True)
    """A prefix cache to reset; generation in batches (no stream of its own), no sleep, weights as a dict."""

    def __init__(self, model, tokenizer, *, max_batch_size: int = 64,
                 prefix_cache_bytes: int = PREFIX_CACHE_BYTES):
        if max_batch_size < 1:
            raise ValueError(f"`max_batch_size` must be at least 1, got {max_batch_size}")
        self.model = model
        self._plain_cache = _full_attention(model)
        """Whether every cache layer is plain full attention: the prefix cache and preallocated decoding
        buffers (:class:`_PreallocatedLayer`) are used only then."""
        self.prefix_cache = PrefixCache(prefix_cache_bytes if self._plain_cache else 0)
        self._weights_version: tuple[int, ...] | None = None
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
        """Copy ``state_dict`` into the model's parameters (strict: every name must match); the prefix cache
        is emptied."""
        self.model.load_state_dict(dict(state_dict), strict=True)
        self.reset_prefix_cache()

    def shares_weights(self, model) -> bool:
        """Whether ``model`` is the model it generates from (a single-process fp32 trainer's policy)."""
        return self.model is model

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache: call it whenever the model's weights change other than through
        :meth:`update_weights` (a trainer that shares its model with this back end, after each update).
        :meth:`generate` also empties it when a parameter's version counter moved (an in-place change
        such as ``p.add_`` or a foreach optimiser step), but a fused optimiser does not move them."""
        self.prefix_cache.clear()

    def _check_weights(self) -> None:
        version = tuple(p._version for p in self.model.parameters())
        if version != self._weights_version:
            self.prefix_cache.clear()
            self._weights_version = version

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling) -> list[list[Completion]]:
        requests = check_requests(requests, sampling)
        self._check_weights()
        results: list[list[Completion]] = [[] for _ in requests]
        same: dict[tuple[int, ...], list[int]] = {}  # a prompt's requests, kept together: one prefill row
        for i, r in enumerate(requests):
            same.setdefault(r.prompt_ids, []).append(i)
        chunks: list[list[int]] = [[]]
        for group in sorted(same.values(), key=lambda g: len(requests[g[0]].prompt_ids)):  # less padding
            for i in group:
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
        rows: dict[tuple[int, ...], int] = {}  # one prefill row per distinct prompt
        row_of = [rows.setdefault(r.prompt_ids, len(rows)) for r in reqs]
        prompts = list(rows)
        request_of = torch.repeat_interleave(torch.arange(len(reqs)), torch.tensor([r.n for r in reqs])).tolist()
        samples = [(reqs[o], j) for o, j in zip(request_of, _ranks(request_of))]
        decoder = _Decoder(self, samples, sampling)
        room = max(decoder.limits)  # positions the decoding can add (its last token is never fed back)
        logits, cache, mask, cached = self._prefill(prompts, room)
        row_list = [row_of[o] for o in request_of]
        owner = torch.tensor(row_list)  # each sample's prefill row
        if len(owner) != len(prompts):  # the samples of a prompt decode from copies of its one prefill
            if self._plain_cache:
                for layer in cache.layers:
                    layer.select_rows(owner.to(self.device))
            else:
                cache.reorder_cache(owner.to(self.device))
        logits, prompt_mask = logits[owner], mask[owner]
        width = prompt_mask.shape[1]
        mask = torch.ones((len(owner), width + room), dtype=torch.long, device=self.device)
        mask[:, :width] = prompt_mask
        positions = torch.tensor([len(p) for p in prompts])[owner].to(self.device)  # of the next token
        step = 0
        while True:
            tokens = decoder.step(logits)
            if decoder.finished:
                break
            step += 1
            out = self.model(
                input_ids=tokens[:, None], attention_mask=mask[:, :width + step], position_ids=positions[:, None],
                past_key_values=cache, use_cache=True, logits_to_keep=1,
            )
            positions = positions + 1
            logits, cache = out.logits[:, -1].float(), out.past_key_values
        paid = {row: k for k, row in reversed(list(enumerate(row_list)))}  # a row's first sample computed it
        for k, ((r, _), o, row) in enumerate(zip(samples, request_of, row_list)):
            served = cached[row] if paid[row] == k else len(r.prompt_ids)
            results[chunk[o]].append(decoder.completion(k, cached=served))
        self._keep(cache, prompt_mask, samples, decoder)

    def _keep(self, cache, prompt_mask: torch.Tensor, samples, decoder: "_Decoder") -> None:
        """Put each sample's prompt and completion (but its last token, never fed back) in the prefix
        cache."""
        if self.prefix_cache.max_bytes == 0:
            return
        width = prompt_mask.shape[1]
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        for k, (r, _) in enumerate(samples):
            new = decoder.tokens[k][:-1]
            where = torch.cat([prompt_mask[k].nonzero()[:, 0].cpu(), width + torch.arange(len(new))])

            def gather(start, stop, k=k, where=where):
                idx = where[start:stop].to(self.device)
                return torch.stack([torch.stack([keys[k][:, idx], values[k][:, idx]])
                                    for keys, values in layers])

            self.prefix_cache.add(r.prompt_ids + tuple(new), gather)

    def _prefill(self, prompts: Sequence[Sequence[int]], room: int):
        """Forward pass over distinct prompts; returns the last logits, the key/value cache (with ``room``
        positions to decode into), its attention mask (one row per prompt) and how many tokens of each
        prompt were not computed here.

        Each prompt starts from its longest prefix in the prefix cache, or, where longer, from the prefix that
        every prompt of the batch shares (:func:`shared_prefix_length`), computed once here (the first prompt
        that uses it counts it as computed, the others as cached). A row of the cache reads
        ``padding | prefix | padding | rest``: the mask hides the padding, the position ids skip it. The
        prefixes are copied once, straight into the decoding buffers, and the forward pass writes the rests
        after them.
        """
        device = self.device
        limit = [len(p) - 1 for p in prompts]  # the last token is always computed: its logits start decoding
        hits = [self.prefix_cache.lookup_blocks(p, n) for p, n in zip(prompts, limit)]
        lengths = [sum(b.shape[3] for b in blocks) for blocks in hits]
        cached = list(lengths)
        shared = shared_prefix_length(prompts) if self._plain_cache else 0
        if any(c < shared for c in cached):
            ids = torch.tensor([list(prompts[0][:shared])], device=device)
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1)
            common = torch.stack([torch.stack([layer.keys[0], layer.values[0]])
                                  for layer in out.past_key_values.layers])
            users = [i for i, c in enumerate(cached) if c < shared]
            for i in users:
                hits[i], lengths[i] = [common], shared
                cached[i] = shared if i != users[0] else cached[i]
        head = max(lengths)
        rests = [p[c:] for p, c in zip(prompts, lengths)]
        width = max(len(r) for r in rests)
        past = None
        if self._plain_cache:
            past = DynamicCache(config=self.model.config)
            first = next((blocks[0] for blocks in hits if blocks), None)
            if first is None:
                past.layers = [_PreallocatedLayer(None, None, 0, room) for _ in past.layers]
            else:
                layers, _, heads, _, dim = first.shape
                buffers = first.new_zeros((layers, 2, len(prompts), heads, head + width + room, dim))
                for i, blocks in enumerate(hits):
                    if blocks:  # one copy of the joined blocks is faster than one per block
                        buffers[:, :, i, :, head - lengths[i]:head] = torch.cat(blocks, dim=3) if len(blocks) > 1 \
                            else blocks[0]
                past.layers = [_PreallocatedLayer(buffers[layer, 0], buffers[layer, 1], head, room)
                               for layer in range(layers)]
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), head + width), dtype=torch.long)
        position_ids = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, (r, c) in enumerate(zip(rests, lengths)):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, head - c:head] = 1
            mask[i, head + width - len(r):] = 1
            position_ids[i, width - len(r):] = torch.arange(c, c + len(r))
        mask = mask.to(device)
        out = self.model(
            input_ids=ids.to(device), attention_mask=mask, position_ids=position_ids.to(device),
            past_key_values=past, use_cache=True, logits_to_keep=1,  # last position only
        )
        return out.logits[:, -1].float(), out.past_key_values, mask, cached


class _PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer for one decoding batch: its keys and values live in buffers with room for
    every token the batch adds, so the prefill writes its rests after the prefixes and a decoding step
    writes one position, where transformers' :class:`DynamicLayer` copies the whole cache (``torch.cat``);
    ``keys`` and ``values`` are views of the filled part.

    ``keys`` and ``values``: buffers holding ``length`` positions already (the cached prefixes), with room
    for the prefill's rest and ``room`` more; None: allocated at the first update, with ``room`` more.
    """

    def __init__(self, keys: torch.Tensor | None, values: torch.Tensor | None, length: int, room: int):
        super().__init__()
        self.room = room
        self._buffers = [] if keys is None else [keys, values]
        if keys is not None:
            self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
            self._set(length)

    def _set(self, length: int) -> None:
        self.length = length
        self.keys, self.values = (buffer[:, :, :length] for buffer in self._buffers)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:  # nothing cached before the prefill: its rest opens the buffers
            rows, heads, length, dim = key_states.shape
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
            self._buffers = [key_states.new_zeros((rows, heads, length + self.room, dim)) for _ in range(2)]
            self.length = 0
        end = self.length + key_states.shape[-2]
        if end > self._buffers[0].shape[2]:
            raise RuntimeError(f"the decoding batch outgrew its cache ({end} > {self._buffers[0].shape[2]} positions)")
        for buffer, states in zip(self._buffers, (key_states, value_states)):
            buffer[:, :, self.length:end] = states
        self._set(end)
        return self.keys, self.values

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep ``rows`` (repeats allowed: a request's samples), each its own copy."""
        self._buffers = [buffer.index_select(0, rows) for buffer in self._buffers]
        self._set(self.length)


def _full_attention(model) -> bool:
    """Whether every layer of ``model``'s key/value cache is plain full attention (what the prefix cache
    can splice)."""
    try:
        return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)
    except Exception:  # noqa: BLE001 - a model this transformers cannot describe: no prefix cache
        return False


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
