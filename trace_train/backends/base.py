"""The generation back-end protocol: batched sampling from token-id prompts.

Both back ends (:mod:`.vllm_backend`, :mod:`.hf_backend`) implement :class:`GenerationBackend` with
the same semantics, so the rollout engine and the trainer never branch on which one runs:

* **Requests are token ids.** A :class:`GenerationRequest` holds a prompt as token ids and a number of
  samples ``n``; sample ``j`` of a request with seed ``s`` is drawn with seed ``s + j`` (vLLM's own rule
  for ``n > 1``), so each sample is reproducible on its own, whatever else is in the batch.
* **Stopping.** A sample stops at the tokenizer's EOS token, at any of ``Sampling.stop_token_ids`` or
  when its decoded text (special tokens skipped) first contains one of ``Sampling.stop``; the token that
  stopped it is part of ``token_ids``. ``finish_reason`` is "stop" then, and "length" when it ran out
  of new tokens. ``stop_reason`` is the stop string or stop token id that matched (None for EOS).
* **Log-probabilities** are those of the distribution each token was sampled from, one per generated
  token: log softmax(logits / temperature), after top-p where ``top_p < 1`` (vLLM's
  ``logprobs_mode="processed_logprobs"``); under greedy decoding (temperature 0) those of the raw
  logits. The trainer's forward divides by the same temperature (``trace_train.update.logprobs``), so the
  importance ratio compares one distribution with itself; it refuses ``top_p < 1``.
* **Prefix cache accounting.** Every completion says how many of its prompt tokens were served from a
  cache instead of being computed; :class:`GenerationStats` sums these over the back end's lifetime.
* **Weights.** :meth:`GenerationBackend.update_weights` loads a trainer's state dict (Hugging Face
  parameter names) in place; no cached state computed with the old weights survives it.

**Capabilities are declared, never probed.** Beyond ``generate`` and ``update_weights`` a back end says what
else it does in :attr:`GenerationBackend.capabilities` (:class:`Capabilities`: prefix-cache reset, its own
request stream, sleep and wake, weight streaming); callers read the declaration, and call the matching
method only where it is declared.

A back end may also take requests one at a time (:class:`RequestStream`): ``submit`` queues a request
under a caller's key and ``poll`` advances generation by one engine step and returns the requests that
finished. The vLLM back end does so through vLLM's request-level engine API (continuous batching:
requests submitted between steps join the running batch); :class:`BatchedStream` gives any back end the
same interface by generating everything queued in one ``generate`` call per ``poll``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Hashable, Mapping, Protocol, Sequence, runtime_checkable

__all__ = ["pad_token_id", "Sampling", "GenerationRequest", "Completion", "GenerationStats", "Capabilities",
           "GenerationBackend", "RequestStream", "BatchedStream", "request_stream", "generator_asleep"]


@dataclass(frozen=True)
class Sampling:
    """Sampling settings shared by the requests of one ``generate`` call."""

    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with probability at least ``top_p``."""
    max_new_tokens: int = 64
    """Default limit on generated tokens; a request may lower or raise it."""
    stop: tuple[str, ...] = ()
    """Stop strings, matched against the decoded text."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a sample (besides the tokenizer's EOS)."""

    def __post_init__(self):
        if not (self.temperature >= 0.0 and self.temperature < float("inf")):
            raise ValueError(f"`temperature` must be a finite number >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"`top_p` must lie in (0, 1], got {self.top_p!r}")
        _positive_int("max_new_tokens", self.max_new_tokens)
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if any(not s for s in self.stop):
            raise ValueError("`stop` strings must not be empty")


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (token ids) and how many samples to draw from it."""

    prompt_ids: tuple[int, ...]
    n: int = 1
    seed: int | None = None
    """Seed of sample 0; sample j uses ``seed + j``. None draws from the back end's own random state."""
    max_new_tokens: int | None = None
    """Overrides ``Sampling.max_new_tokens`` for this request."""

    def __post_init__(self):
        ids = self.prompt_ids if type(self.prompt_ids) is tuple else tuple(self.prompt_ids)
        if not set(map(type, ids)) <= {int}:  # numpy integers, bools, ...: plain ints (the check is cheaper)
            ids = tuple(map(int, ids))
        object.__setattr__(self, "prompt_ids", ids)
        if not self.prompt_ids:
            raise ValueError("`prompt_ids` must not be empty")
        _positive_int("n", self.n)
        bad_seed = isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0
        if self.seed is not None and bad_seed:
            raise ValueError(f"`seed` must be a non-negative integer or None, got {self.seed!r}")
        if self.max_new_tokens is not None:
            _positive_int("max_new_tokens", self.max_new_tokens)

    def new_tokens(self, sampling: Sampling) -> int:
        return sampling.max_new_tokens if self.max_new_tokens is None else self.max_new_tokens

    def sample_seed(self, j: int) -> int | None:
        return None if self.seed is None else self.seed + j


@dataclass(frozen=True)
class Completion:
    """One sample: its tokens, their log-probabilities under the sampling distribution, and why it ended."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    """"stop" or "length"."""
    stop_reason: str | int | None
    """The stop string or stop token id that ended the sample; None for EOS and for "length"."""
    cached_prompt_tokens: int
    """Prompt tokens of this sample served from a cache rather than computed."""


@dataclass
class GenerationStats:
    """Running totals of a back end (per sample: prompt tokens, cached prompt tokens, new tokens)."""

    samples: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_prompt_tokens

    def add(self, prompt_ids: Sequence[int], completion: Completion) -> None:
        self.samples += 1
        self.prompt_tokens += len(prompt_ids)
        self.cached_prompt_tokens += completion.cached_prompt_tokens
        self.generated_tokens += len(completion.token_ids)

    def copy(self) -> "GenerationStats":
        return dataclasses.replace(self)

    def since(self, earlier: "GenerationStats") -> "GenerationStats":
        """The totals accumulated after ``earlier`` (a copy taken before)."""
        fields = dataclasses.fields(self)
        return GenerationStats(*(getattr(self, f.name) - getattr(earlier, f.name) for f in fields))


@dataclass(frozen=True)
class Capabilities:
    """What a back end does beyond ``generate`` and ``update_weights`` (each False unless declared)."""

    prefix_cache_reset: bool = False
    """``reset_prefix_cache()`` empties a prefix cache kept across calls."""
    streaming: bool = False
    """``stream()`` returns the back end's own :class:`RequestStream` (continuous batching); otherwise
    callers get a :class:`BatchedStream` (:func:`request_stream`)."""
    sleep_wake: bool = False
    """``sleep()`` frees its GPU memory (KV cache, weights) until ``wake_up()`` restores it."""
    weight_streaming: bool = False
    """``update_weights`` takes an iterator of ``(name, tensor)`` pairs and loads each as it comes (a trainer
    then never holds a second full copy of the weights)."""


@runtime_checkable
class GenerationBackend(Protocol):
    """What the rollout engine and the trainer need from a generation engine (see the module docstring).

    Optional methods, called only where :attr:`capabilities` declares them (:class:`Capabilities`):
    ``reset_prefix_cache()``, ``stream() -> RequestStream``, ``sleep()`` and ``wake_up()``."""

    tokenizer: Any
    stats: GenerationStats
    capabilities: Capabilities

    def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling) -> list[list[Completion]]:
        """Sample every request; result ``[i][j]`` is sample ``j`` of request ``i``."""

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Load new weights in place (Hugging Face names); drop everything cached under the old ones."""

    def shares_weights(self, model: Any) -> bool:
        """Whether it generates from ``model``'s own parameters (then a weight update is in place already)."""


@runtime_checkable
class RequestStream(Protocol):
    """Request-level generation: submit requests as they become ready, collect them as they finish."""

    continuous: bool
    """True when requests submitted between polls join the running batch (vLLM); False when each poll
    generates what was queued as one batch (:class:`BatchedStream`)."""

    @property
    def pending(self) -> bool:
        """Whether submitted requests are still unfinished."""

    def submit(self, key: Hashable, request: GenerationRequest, sampling: Sampling) -> None:
        """Queue ``request``; ``poll`` returns its samples (as ``generate`` would) under ``key``."""

    def poll(self) -> list[tuple[Hashable, list[Completion]]]:
        """Advance generation (one engine step, or one batch) and return the requests now finished."""

    def close(self) -> None:
        """Drop every unfinished request (after an error, so that none is left in the engine)."""


class BatchedStream:
    """:class:`RequestStream` over any back end's ``generate``: each ``poll`` generates all queued requests
    as one batch (in submission order), so requests submitted during a poll wait for the next one."""

    continuous = False

    def __init__(self, backend: GenerationBackend):
        self.backend = backend
        self._queue: list[tuple[Hashable, GenerationRequest, Sampling]] = []

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def submit(self, key: Hashable, request: GenerationRequest, sampling: Sampling) -> None:
        if self._queue and sampling != self._queue[0][2]:
            raise ValueError("requests of one batch must share their `sampling`")
        self._queue.append((key, request, sampling))

    def poll(self) -> list[tuple[Hashable, list[Completion]]]:
        queue, self._queue = self._queue, []
        if not queue:
            return []
        completions = self.backend.generate([r for _, r, _ in queue], queue[0][2])
        return [(key, c) for (key, _, _), c in zip(queue, completions)]

    def close(self) -> None:
        self._queue = []


def pad_token_id(source) -> int:
    """The padding id of a tokenizer or a model's config: its pad token, else its end-of-sequence token
    (else 0)."""
    return source.pad_token_id if source.pad_token_id is not None else (source.eos_token_id or 0)


def request_stream(backend: GenerationBackend, *, batched: bool = False) -> RequestStream:
    """The back end's own request stream (``backend.stream()``) where it declares one
    (``capabilities.streaming``), else a :class:`BatchedStream`; ``batched=True`` always gives the latter
    (generation in lockstep batches)."""
    if not batched and backend.capabilities.streaming:
        return backend.stream()
    return BatchedStream(backend)


@contextlib.contextmanager
def generator_asleep(backend):
    """Inside the block a back end that declares ``capabilities.sleep_wake`` (vLLM with ``sleep_mode`` on a
    platform that supports it) holds no KV cache and no weights on the GPU; it is awake again after the
    block, also after an error. Other back ends (transformers, which shares the policy's weights) are left
    as they are."""
    if not backend.capabilities.sleep_wake:
        yield
        return
    backend.sleep()
    try:
        yield
    finally:
        backend.wake_up()


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}")


def check_requests(requests: Sequence[GenerationRequest], sampling: Sampling) -> list[GenerationRequest]:
    """Validate the arguments of ``generate`` (shared by the back ends)."""
    if not isinstance(sampling, Sampling):
        raise ValueError(f"`sampling` must be a Sampling, got {type(sampling).__name__}")
    requests = list(requests)
    for r in requests:
        if not isinstance(r, GenerationRequest):
            raise ValueError(f"`requests` must hold GenerationRequest objects, got {type(r).__name__}")
    return requests
