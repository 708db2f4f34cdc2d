"""The trained policy on disk: where it loads from, loading it, its weights at a resume, its export."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from ..configs import ModelConfig
from .distributed import DistInfo, checkpoint_state_dict, load_full_weights
from .files import subdir

__all__ = ["DEMONSTRATED_ROWS", "model_path", "load_policy", "load_sharded_policy", "load_policy_weights",
           "checkpoint_activations", "export"]

DEMONSTRATED_ROWS = 256
"""The tiny model's warm start plays the scripted expert on at most this many (the first) training rows."""


def model_path(model: ModelConfig, run_dir: str | Path, *, seed: int, task=None) -> str:
    """A directory or hub id both back ends can load; the tiny model is built into the run directory, warmed
    on the task's scripted expert over its first training rows where the task has one (``tiny.save_tiny``)."""
    from .. import tiny

    if model.name_or_path != "tiny":
        if os.path.isdir(model.name_or_path) and (damaged := tiny.damaged_file(model.name_or_path)) is not None:
            raise ValueError(f"model.name_or_path: {damaged}; the model folder is damaged (copy or export it again)")
        return model.name_or_path
    path = Path(run_dir) / "tiny_model"
    if path.is_dir() and (damaged := tiny.damaged_file(path)) is not None:  # a write cut before the rename
        print(f"trace-train: {damaged}; the tiny model is rebuilt", file=sys.stderr)  # existed (older versions)
    if not tiny.is_complete(path):  # written whole or not at all (an older cut write is rebuilt)
        shown = None if task is None or task.demonstration is None else (
            task.make_env, task.train_rows[:DEMONSTRATED_ROWS], task.demonstration)
        tiny.save_tiny(path, seed=seed, warm_steps=model.tiny_warm_steps, demonstrations=shown)
    return str(path)


def load_policy(path: str, device: str, dtype: torch.dtype):
    """A model in ``dtype`` (generators and the frozen reference run in ``model.dtype``; the trained policy
    in float32, its master weights) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def load_sharded_policy(path: str, dtype: torch.dtype, info: DistInfo, *, compute_dtype: torch.dtype,
                        activation_checkpointing: bool = False):
    """The model of :func:`load_policy` sharded over the ranks (FSDP2, ``distributed.shard_policy``) on
    ``info.device``, without a full copy on any rank but rank 0's host.

    Every rank builds the model's structure on the meta device (no memory), shards it and allocates only its
    shards on its device (``to_empty``); rank 0 reads the weights (one full copy in host memory) and
    broadcasts them, each rank keeping its shard (``set_model_state_dict`` with ``broadcast_from_rank0``);
    the buffers a state dict leaves out (rotary frequencies) are sent the same way. Loading the whole
    model on every rank, as ``from_pretrained`` would, needs world x 32 GB of host memory for an fp32 8B
    policy. Returns (model, tokenizer)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from .distributed import shard_policy

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if activation_checkpointing:
        checkpoint_activations(model)
    shard_policy(model, compute_dtype=compute_dtype)
    model.to_empty(device=info.device)
    full, buffers = {}, {}
    if info.is_main:
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        full, buffers = loaded.state_dict(), dict(loaded.named_buffers())
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    persistent = set(model.state_dict())
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name not in persistent:
                if info.is_main:
                    buffer.copy_(buffers[name])
                torch.distributed.broadcast(buffer, src=0)
        if info.is_main:
            model.generation_config = loaded.generation_config  # its end-of-turn tokens, which the back end reads
    del full, buffers
    generation = [model.generation_config]
    torch.distributed.broadcast_object_list(generation, src=0)
    model.generation_config = generation[0]
    return model.eval(), AutoTokenizer.from_pretrained(path)


def checkpoint_activations(model) -> None:
    """``model.activation_checkpointing``: transformers' gradient checkpointing of every decoder layer,
    non-reentrant (works under FSDP2 and with inputs that need no gradient); no KV cache in training."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def load_policy_weights(policy, state: dict, info: DistInfo) -> None:
    """Load a checkpoint's full state dict into the policy (under FSDP each rank reads only its shards'
    rows: ``distributed.load_full_weights``)."""
    load_full_weights(policy, state, info)


def export(policy, tokenizer, path: Path, info: DistInfo) -> None:
    """Save the trained policy as a Hugging Face model directory (what trace-eval and vLLM load)."""
    weights = checkpoint_state_dict(policy, info)
    if info.is_main:
        subdir(path.parent, path.name)  # hf/ planted as a file or a link: one line, not a silent non-export
        policy.save_pretrained(path, state_dict={k: v.detach().cpu() for k, v in weights.items()})
        tokenizer.save_pretrained(path)
