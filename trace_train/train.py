"""Train an LLM agent with TRACE, or with any registered allocation policy at equal budget.

    trace-train --config cpu_demo                          # a tiny model learns guess-the-number on a CPU
    trace-train --config cpu_demo rollout.policy=grpo      # the same run with GRPO's uniform groups
    torchrun --nproc_per_node 8 -m trace_train.train --config math_qwen3_8b     # a GPU node

One step of ``main`` is the algorithm, one line each (the machinery lives in the modules named):

    pool       = sampler.next_pool()                        # candidate prompts (this rank's slice)
    batch      = engine.rollout(pool, predictor)            # predict V~; allocate roots, then prefixes; generate
    advantages = compute_advantages(forest, advantage)      # tree advantages (trace_theory)
    fit        = predictor update on node_targets(forest)   # on a worker thread, only if the policy reads V~
    update     = policy_loss(packed trees of batch, adv)     # clipped token-level PG (update/: loss, packing)
    sync weights; log(metrics); maybe evaluate, checkpoint  # metrics.jsonl, TensorBoard; atomic checkpoints

:func:`build_run` sets everything up (or resumes it); the config classes are in ``trace_train.configs``.
A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl``, ``tensorboard/``,
``checkpoints/`` and, at the end, ``hf/`` (the trained policy as a Hugging Face model). Starting a run whose directory has a checkpoint resumes it (same config required,
but ``steps``, ``optim.lr`` and ``optim.grad_clip`` may change); a non-finite loss stops the run with a
checkpoint of the last good step (never rewritten with the failed step's state) and a one-line message. One run
per directory (``run.lock``); Ctrl-C and SIGTERM end after the step under way, with a checkpoint of it
and one line giving the command that resumes (exit 130 / 143); a step where more than
``max_env_failure_share`` of rollouts failed in their environment stops the run the same way (exit 1),
its first traceback in ``env_errors/`` (``trace_train/README.md``, "Run directories").
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import shlex
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from trace_theory import compute_advantages, contrast_yield, node_targets, root_outcomes

from .backends import build_backend
from .backends.base import generator_asleep, pad_token_id
from .rollout.batch import History, RolloutBatch
from .run.checkpoint import (Checkpoint, CheckpointError, clean_partial_checkpoints, load_latest_checkpoint,
                             restore_rng, save_checkpoint)
from .config_loader import config_to_dict, describe, drop_removed, fingerprint, load_config  # noqa: F401
from .configs import RolloutConfig, TrainConfig
from .run.files import OutOfSpaceError, RunLock, subdir, write_file, writable_dir
from .run.distributed import (DistInfo, GlobalRootAllocator, checkpoint_state_dict, full_optimizer_state_dict,
                          full_state_dict, gather_objects, global_normaliser, init_distributed,
                          load_full_optimizer_state_dict, max_over_ranks, merge_metrics)
from .rollout.engine import RolloutEngine
from .run.signals import RunInterrupted, StopOnSignal, finish_process
from .run.step_state import (RESUME_OVERRIDES, StepState, apply_optimizer_overrides, describe_overrides,
                             set_engine_costs, state_digest, trajectory_fingerprint)
from .run.threads import set_compute_threads
from .envs.tooling import chat_format
from .update.loss import policy_loss
from .run.metrics_log import MetricsLogger
from .predictors import PosteriorPredictor, build_predictor, predictor_from_state_dict
from .update.packing import training_batch_for
from .tasks import Task, build_task

__all__ = ["TrainConfig", "Run", "build_run", "main", "PromptSampler", "NonFiniteLossError", "EnvFailureError",
           "RunInterrupted", "cli", "entry"]


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the run stopped after checkpointing the last good step."""


class EnvFailureError(RuntimeError):
    """Too many rollouts of a step ended in an environment failure; the run stopped after a checkpoint."""


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


DEMONSTRATED_ROWS = 256
"""The tiny model's warm start plays the scripted expert on at most this many (the first) training rows."""


def _model_path(cfg: TrainConfig, task: Task | None = None) -> str:
    """A directory or hub id both back ends can load; the tiny model is built into the run directory, warmed
    on the task's scripted expert over its first training rows where the task has one (``tiny.save_tiny``)."""
    if cfg.model.name_or_path != "tiny":
        return cfg.model.name_or_path
    from . import tiny

    path = Path(cfg.run_dir) / "tiny_model"
    if not tiny.is_complete(path):  # written whole or not at all (an older cut write is rebuilt)
        shown = None if task is None or task.demonstration is None else (
            task.make_env, task.train_rows[:DEMONSTRATED_ROWS], task.demonstration)
        tiny.save_tiny(path, seed=cfg.seed, warm_steps=cfg.model.tiny_warm_steps, demonstrations=shown)
    return str(path)


def _load_policy(path: str, cfg: TrainConfig, device: str, dtype: torch.dtype | None = None):
    """A model in ``dtype`` (default ``model.dtype``: what generators and the frozen reference run in; the
    trained policy passes float32, its master weights) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = dtype if dtype is not None else getattr(torch, cfg.model.dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def _build_backend(cfg: TrainConfig, path: str, policy, tokenizer, info: DistInfo):
    """The generation engine (``trace_train.backends.BACKENDS``). A single-process transformers back end
    shares the policy's weights."""
    if cfg.backend.kind == "vllm":
        extra = {k: v for k, v in {"max_model_len": cfg.backend.max_model_len,
                                   "kv_cache_memory_bytes": cfg.backend.kv_cache_memory_bytes,
                                   "gpu_memory_utilization": cfg.backend.gpu_memory_utilization}.items()
                 if v is not None}
        if info.device == "cpu" and cfg.backend.kv_cache_memory_bytes is None:
            extra = {**_cpu_kv_cache(cfg, path), **extra}
        return build_backend("vllm", path, dtype=cfg.model.dtype, seed=cfg.seed, device=info.device,
                             enforce_eager=cfg.backend.enforce_eager, sleep_mode=cfg.backend.sleep_during_update,
                             **extra)
    generator = policy
    if info.enabled or cfg.model.dtype != "float32":
        # FSDP shards the policy, and a bf16/fp16 generator is a copy of the fp32 masters: generate from a full
        # copy in model.dtype, refreshed after every update (_sync_weights)
        generator, _ = _load_policy(path, cfg, info.device)
    return build_backend("hf", path, dtype=cfg.model.dtype, seed=cfg.seed, device=info.device, weights=generator,
                         tokenizer=tokenizer, max_batch_size=cfg.backend.max_batch_size)


def _cpu_kv_cache(cfg: TrainConfig, path: str) -> dict:
    """vLLM-CPU engine options sized to one step (``backend.kv_cache_memory_bytes``'s docstring): without them
    vLLM-CPU reserves a fixed multi-GB cache whatever the model."""
    from transformers import AutoConfig

    from .backends.vllm_backend import kv_cache_bytes

    r = cfg.rollout
    context = cfg.backend.max_model_len or r.limits.max_context_tokens
    sequences = max(r.roots * (1 + r.continuations_per_root * r.expansion_rounds),
                    cfg.eval.prompts * cfg.eval.samples if cfg.eval.every else 1)
    size = kv_cache_bytes(AutoConfig.from_pretrained(path), cfg.model.dtype, sequences=sequences, context_tokens=context)
    return {"kv_cache_memory_bytes": size, "max_model_len": context}


def _shares_weights(backend, policy) -> bool:
    return getattr(backend, "model", None) is policy


# ---------------------------------------------------------------------------------------------------
# One step's pieces
# ---------------------------------------------------------------------------------------------------


def _histories(batch: RolloutBatch, nodes) -> list[History]:
    return [batch.history(int(n)) for n in nodes]


def _update_predictor(predictor: PosteriorPredictor, batch: RolloutBatch, value_target: str) -> dict:
    """Fit V~ to the recursive targets of every non-terminal node; add the roots' outcomes (the factual
    rewards of the rollouts sampled at each root, ``trace_theory.root_outcomes``) to the prompts' posteriors.
    Also returns the fit's wall and CPU (this thread's) seconds."""
    return _fit_predictor(predictor, _fit_inputs(batch, value_target))


def _fit_inputs(batch: RolloutBatch, value_target: str) -> tuple:
    """What one step teaches the predictor: (histories, targets, weights) of the non-terminal nodes and
    (histories, successes, failures) of the roots."""
    f = batch.forest
    nodes = np.flatnonzero(~f.is_leaf)
    values, weights = node_targets(f, value_target)
    roots, m, s = root_outcomes(f)
    return _histories(batch, nodes), values[nodes], weights[nodes], _histories(batch, roots), s, m - s


def _job_fit_inputs(batch: RolloutBatch, value_target: str, info: DistInfo) -> tuple:
    """Every rank's :func:`_fit_inputs`, concatenated in rank order, so that one predictor serves the job:
    every rank fits the same model on the same data (identical states; the global root allocation then
    compares predictions of one model). Runs in the main thread, as every collective must."""
    parts: list = [None] * info.world_size
    torch.distributed.all_gather_object(parts, _fit_inputs(batch, value_target))
    return (sum((list(p[0]) for p in parts), []), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), sum((list(p[3]) for p in parts), []),
            np.concatenate([p[4] for p in parts]), np.concatenate([p[5] for p in parts]))


def _fit_predictor(predictor: PosteriorPredictor, inputs: tuple) -> dict:
    t0, c0 = time.perf_counter(), time.thread_time()
    nodes, values, weights, roots, successes, failures = inputs
    metrics = predictor.update(nodes, values, weights)
    predictor.observe(roots, successes, failures)
    return {**metrics, "predictor_fit_seconds": time.perf_counter() - t0,
            "predictor_fit_cpu_seconds": time.thread_time() - c0}


class _PredictorFit:
    """The predictor update of one step, run on a worker thread while the policy updates.

    Safe because the two share no mutable state: the fit reads the batch (immutable once generated) and
    writes only the predictor; the policy update reads tensors built from the same batch and writes only
    the model and optimiser. Nothing reads the predictor before :meth:`result` (the next step's allocation
    and every checkpoint wait for it), so a run is bitwise the same as with the fit done inline. The work
    is NumPy/SciPy and the policy update is PyTorch, both of which release the GIL in their kernels.
    Policies that never read V~ (GRPO, DAPO, uniform trees) skip the fit, unless ``log_predictor`` asks
    for its calibration metrics.
    """

    def __init__(self, pool: ThreadPoolExecutor, run: "Run", batch: RolloutBatch):
        target = run.cfg.algorithm.value_target
        if not run.cfg.fits_predictor:
            self._future = None
        elif run.info.enabled:  # one predictor for the job: gather here, fit on the worker
            self._future = pool.submit(_fit_predictor, run.predictor, _job_fit_inputs(batch, target, run.info))
        else:
            if getattr(run.predictor, "needs_states", False):  # the policy's states, before it updates
                run.predictor.prepare(_fit_inputs(batch, target)[0])
            self._future = pool.submit(_update_predictor, run.predictor, batch, target)

    def result(self) -> dict:
        return self._future.result() if self._future is not None else {}


def _compute_precision(cfg: TrainConfig, info: DistInfo, device: torch.device):
    """Mixed precision on one device: the fp32 master weights compute in ``model.dtype`` under autocast
    (gradients and AdamW's moments stay fp32, so a step of lr 1e-6 is not rounded away). Under FSDP the
    shards' ``MixedPrecisionPolicy`` does the same (``distributed.shard_policy``); fp32 runs need neither."""
    dtype = getattr(torch, cfg.model.dtype)
    if info.enabled or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _policy_update(model, optimizer, seqs, cfg: TrainConfig, info: DistInfo, ref=None) -> dict:
    """Accumulate the loss over micro-batches, normalised by the global batch, then one optimiser step.
    ``seqs``: packed trees or per-leaf rows (``trace_train.update.packing.build_training_batch``)."""
    loss_cfg = cfg.algorithm.loss
    per_token = loss_cfg.aggregation == "token_mean"
    total = global_normaliser(seqs.normaliser(per_token), info)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    stats: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0}
    weight = 0.0  # this rank's share of the normaliser
    parts = seqs.micro_batches()
    # Under FSDP every rank must run every forward and backward (they gather and reduce together), so
    # ranks agree on the number of micro-batches and a rank out of data runs a zero-weight pass.
    n_micro = max_over_ranks(max(1, len(parts)), info)
    device = next(model.parameters()).device
    bad_loss = None  # a non-finite loss of this rank
    for i in range(n_micro):
        if i >= len(parts):
            ids = torch.full((1, 2), pad_token_id(model.config), dtype=torch.long, device=device)
            with _compute_precision(cfg, info, device):
                zero = model(input_ids=ids).logits.sum() * 0.0
            zero.backward()
            continue
        part = parts[i]
        sampled = dict(temperature=cfg.rollout.temperature, chunk_tokens=cfg.algorithm.logprob_chunk_tokens,
                       trained_only=True)  # the rollouts' distribution, in chunks (trace_train.update.logprobs)
        with _compute_precision(cfg, info, device):
            logp = part.logprobs(model, **sampled)
            ref_logp = None
            if ref is not None:
                with torch.no_grad():
                    ref_logp = part.logprobs(ref, **sampled)
        seq_ids = part.sequence_ids.to(device) if part.sequence_ids is not None else None
        loss, m = policy_loss(logp, part.old_logprobs.to(device), part.advantages.to(device),
                              part.loss_mask.to(device), loss_cfg, ref_logprobs=ref_logp,
                              token_weights=part.weights.to(device), sequence_ids=seq_ids)
        share = part.normaliser(per_token) / max(total, 1e-12)
        scaled = loss * share * info.world_size  # FSDP averages gradients over ranks
        if not torch.isfinite(loss) and bad_loss is None:
            bad_loss = float(loss.detach())  # raised below, once every rank knows: FSDP's backward is a collective
        scaled.backward()
        stats["loss"] += float(loss.detach()) * share * info.world_size
        for k in ("pg_loss", "kl", "clip_fraction"):  # weighted as the loss is, so packing cannot change them
            stats[k] += m[k] * share
        weight += share
    for k in ("pg_loss", "kl", "clip_fraction"):
        stats[k] /= max(weight, 1e-12)
    if max_over_ranks(bad_loss is not None, info):  # all ranks stop together, none is left in a collective
        raise NonFiniteLossError(f"loss is {bad_loss}" if bad_loss is not None else "loss is not finite on another rank")
    clip = cfg.optim.grad_clip or float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
    if not math.isfinite(grad_norm):
        raise NonFiniteLossError(f"gradient norm is {grad_norm}")
    optimizer.step()
    model.eval()
    stats["grad_norm"] = grad_norm
    stats["train_forward_tokens"], stats["train_unique_tokens"] = seqs.forward_tokens, seqs.unique_tokens
    return stats


def _evaluate(engine_eval: RolloutEngine, rows: list, step: int) -> dict:
    """Mean reward of fresh rollouts on the fixed held-out prompts (uniform groups, no predictor)."""
    batch = engine_eval.rollout(rows, seed=10_000_019 + step)
    f = batch.forest
    return {"eval_success": float(f.reward[f.leaves].mean())}


# ---------------------------------------------------------------------------------------------------
# Building a run
# ---------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """Everything a run holds, built (and resumed from its latest checkpoint) by :func:`build_run`."""

    cfg: TrainConfig
    info: DistInfo
    task: Task
    policy: Any
    tokenizer: Any
    ref: Any
    """Frozen reference policy for the KL penalty (None without one)."""
    optimizer: torch.optim.Optimizer
    backend: Any
    engine: RolloutEngine
    eval_engine: RolloutEngine | None
    predictor: PosteriorPredictor
    sampler: PromptSampler
    logger: MetricsLogger | None
    start_step: int = 0
    lock: RunLock | None = None
    saved_step: int | None = None
    """The step of the newest checkpoint on disk (None: none yet)."""
    workers: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "predictor-fit"))

    def checkpoint(self, step: int, state: StepState | None = None) -> Path | None:
        """Checkpoint ``step`` with the weights and optimiser of now and ``state`` (default: of now)."""
        state = state or StepState.capture(self)
        extra = {"predictor": state.predictor, "sampler": state.sampler, "engine_costs": state.engine_costs}
        weights = checkpoint_state_dict(self.policy, self.info)
        optimizer = full_optimizer_state_dict(self.policy, self.optimizer, self.info)
        if self.info.enabled:  # what differs between ranks: each rank's random states and cost estimates
            extra["ranks"] = gather_objects({"rng": state.rng, "engine_costs": state.engine_costs,
                                             "predictor_digest": state_digest(state.predictor)}, self.info)
            _check_one_predictor(extra["ranks"])
        self.saved_step = step  # on every rank: whether the step is on disk decides what a failure does
        if not self.info.is_main:
            return None
        return save_checkpoint(Path(self.cfg.run_dir), step, policy=weights, optimizer=optimizer,
                               extra=extra, config_fingerprint=resume_fingerprint(self.cfg),
                               keep=self.cfg.keep_checkpoints, rng_state=state.rng,
                               trajectory_fingerprint=trajectory_fingerprint(self.cfg, resume_fingerprint))

    def resume(self, ckpt: Checkpoint) -> None:
        same = ckpt.config_fingerprint == resume_fingerprint(self.cfg) or (
            ckpt.trajectory_fingerprint is not None
            and ckpt.trajectory_fingerprint == trajectory_fingerprint(self.cfg, resume_fingerprint))
        if not same:
            raise ValueError(f"checkpoint {ckpt.path} was written under another config; use another run_dir "
                             "(only steps, optim.lr, optim.grad_clip, checkpointing and logging may change)")
        _load_policy_weights(self.policy, ckpt.policy, self.info)
        load_full_optimizer_state_dict(self.policy, self.optimizer, ckpt.optimizer, self.info)
        apply_optimizer_overrides(self.optimizer, self.cfg)  # a lowered optim.lr holds after the state is loaded
        try:
            self.predictor = predictor_from_state_dict(ckpt.extra["predictor"])
            self.sampler.load_state(ckpt.extra["sampler"])
            own = ckpt.extra
            if self.info.enabled:  # this rank's own states, not rank 0's
                own = ckpt.extra["ranks"][self.info.rank]
                restore_rng(own["rng"])
            set_engine_costs(self.engine, own["engine_costs"])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
            raise CheckpointError(f"{ckpt.path / 'extra.pt'}: does not hold this run's state "
                                  f"({type(err).__name__}: {err})") from None
        self.start_step = self.saved_step = ckpt.step
        _sync_weights(self)

    def evaluate(self, step: int) -> dict:
        """Held-out success at this step, when the config asks for it (``eval.every``)."""
        every = self.cfg.eval.every
        if self.eval_engine is None or step % every:
            return {}
        return _evaluate(self.eval_engine, self.task.eval_rows[:self.cfg.eval.prompts], step)

    def log(self, step: int, metrics: dict) -> None:
        if self.logger is not None and metrics:
            self.logger.log(step, metrics)


def _predictor_digest(predictor) -> str:
    """A hash of the predictor's learned state (``run.step_state.state_digest``)."""
    return state_digest(predictor.state_dict())


def _check_one_predictor(ranks: list[dict]) -> None:
    """Refuse to checkpoint a job whose ranks hold different predictors (one V~ serves the whole job)."""
    digests = {r["predictor_digest"] for r in ranks}
    if len(digests) > 1:
        raise RuntimeError(f"the ranks' success predictors differ ({len(digests)} distinct states); every rank "
                           "must fit the same predictor to the same gathered targets")


def build_run(cfg: TrainConfig) -> Run:
    """Set up (or resume) a run: task, policy, generation back end, rollout engines, predictor, sampler."""
    info = init_distributed(cfg.device)
    set_compute_threads(cfg.backend.threads)
    torch.manual_seed(cfg.seed + info.rank)
    np.random.seed(cfg.seed + info.rank)
    run_dir = writable_dir(cfg.run_dir, "`run_dir`")
    lock = _lock_run_dir(run_dir, info)
    try:
        return _build_run(cfg, info, run_dir, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _attach_policy_states(run: Run) -> None:
    """Give a predictor that reads the policy's hidden states (``predictor.kind=probe``) the policy's forward.

    One process only: under FSDP the forward is a collective every rank must join with the same shapes,
    and each rank predicts its own pool."""
    if not getattr(run.predictor, "needs_states", False):
        return
    if run.info.enabled:
        raise ValueError(f"predictor.kind={run.cfg.predictor.kind} reads the policy's hidden states and runs on "
                         "one process for now (under FSDP that forward is a collective every rank must join in "
                         "step); with torchrun use predictor.kind=ngram or running_mean")
    from .predictors.hidden_states import PolicyStates

    run.predictor.attach(PolicyStates(run.policy, compute_dtype=getattr(torch, run.cfg.model.dtype)))


def _lock_run_dir(run_dir: Path, info: DistInfo) -> RunLock | None:
    """One run per directory (rank 0 holds ``run.lock``); then remove what killed checkpoint writes left."""
    if not info.is_main:
        return None
    lock = RunLock(run_dir).acquire()
    clean_partial_checkpoints(run_dir)
    return lock


def _build_run(cfg: TrainConfig, info: DistInfo, run_dir: Path, lock: RunLock | None) -> Run:
    _check_or_write_config(cfg, run_dir, info)

    task = build_task(cfg.task, seed=cfg.seed, hold_out=cfg.eval.every > 0)
    if info.is_main:
        print(task.describe(cfg.task.name), flush=True)
    path = _model_path(cfg, task) if info.is_main else None
    if info.enabled:
        paths = [path]
        torch.distributed.broadcast_object_list(paths, src=0)
        path = paths[0]
    policy, tokenizer = _load_policy(path, cfg, info.device, dtype=torch.float32)  # fp32 master weights
    backend = _build_backend(cfg, path, policy, tokenizer, info)
    if info.enabled:
        from .run.distributed import shard_policy

        shard_policy(policy, compute_dtype=getattr(torch, cfg.model.dtype))
    ref = None
    if cfg.algorithm.loss.kl_coef > 0:
        ref, _ = _load_policy(path, cfg, info.device)
        ref.requires_grad_(False).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                  weight_decay=cfg.optim.weight_decay)
    chat = chat_format(backend.tokenizer, tools=task.make_env.tools, template_kwargs=cfg.rollout.chat_template_kwargs)
    rollout = _rollout_config(cfg, task)
    engine = RolloutEngine(backend, task.make_env, rollout, chat=chat,
                           root_allocator=GlobalRootAllocator(info) if info.enabled else None)
    eval_engine = None
    if cfg.eval.every and task.eval_rows:
        eval_engine = RolloutEngine(backend, task.make_env, cfg.eval.rollout_config(rollout, len(task.eval_rows)),
                                    chat=chat)
    sampler = PromptSampler(task.train_rows, cfg.rollout.pool_size, seed=cfg.seed, rank=info.rank,
                            world_size=info.world_size)
    run = Run(cfg, info, task, policy, tokenizer, ref, optimizer, backend, engine, eval_engine,
              build_predictor(cfg.predictor), sampler, logger=None, lock=lock)
    ckpt = load_latest_checkpoint(run_dir)
    if ckpt is not None:
        run.resume(ckpt)
        if info.is_main:
            print(f"trace-train: resuming from step {ckpt.step} of {run_dir}", file=sys.stderr)
    _attach_policy_states(run)
    if info.is_main:
        run.logger = MetricsLogger(run_dir, resume_step=run.start_step if ckpt is not None else None,
                                   tensorboard=cfg.tensorboard, wandb_project=cfg.wandb_project,
                                   config=config_to_dict(cfg))
    return run


# ---------------------------------------------------------------------------------------------------
# The run: one step is the algorithm's lines
# ---------------------------------------------------------------------------------------------------


def main(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or resume) training; returns the last step's metrics."""
    run = build_run(cfg)
    metrics: dict[str, Any] = {}
    stop = StopOnSignal(lambda: run.saved_step, announce=run.info.is_main)
    try:
        if run.start_step == 0:
            run.log(0, run.evaluate(0))
        for step in _progress(range(run.start_step, cfg.steps), run.info, run.start_step, cfg.steps, cfg.quiet):
            # what a checkpoint of the last good step holds if this one fails (none needed when it is on disk)
            before = StepState.capture(run) if run.saved_step != step else None
            t0 = time.perf_counter()
            pool = run.sampler.next_pool()                                       # candidate prompts
            batch = run.engine.rollout(pool, predictor=run.predictor,            # predict V~, allocate roots and
                                       seed=_step_seed(cfg.seed, step, run.info.rank))  # prefixes, generate
            t1 = time.perf_counter()
            advantages = compute_advantages(batch.forest, cfg.algorithm.advantage)   # tree advantages
            sequences = training_batch_for(batch, advantages, cfg, pad_token_id=pad_token_id(run.tokenizer))
            fit = _PredictorFit(run.workers, run, batch)   # predictor update (background), started after the
            t2 = time.perf_counter()                       # Python-heavy packing so as not to contend with it
            update = _guarded_policy_update(run, sequences, fit, step, before)  # clipped policy gradient
            t3 = time.perf_counter()
            _sync_weights(run)                                                   # generator gets the new weights
            t4 = time.perf_counter()
            fitted = fit.result()
            times = {"prepare_seconds": t2 - t1, "update_seconds": t3 - t2, "sync_seconds": t4 - t3,
                     "fit_wait_seconds": time.perf_counter() - t4}
            metrics = _step_metrics(batch, {**update, **times}, fitted, t1 - t0, time.perf_counter() - t1, run.info)
            metrics.update(run.evaluate(step + 1))
            run.log(step + 1, metrics)
            _after_step(run, step + 1, batch, metrics, stop)                      # print, check, checkpoint
    finally:
        _close(run, stop)
    _export(run.policy, run.tokenizer, Path(cfg.run_dir) / "hf", run.info)
    if run.info.is_main:
        print(f"run finished: {cfg.steps} steps in {cfg.run_dir} (metrics.jsonl, checkpoints/, hf/ for "
              "trace-eval and vLLM)", file=sys.stderr)
    return metrics


def _close(run: Run, stop: StopOnSignal) -> None:
    """Put the signal handlers back, wait for the predictor fit, close the logs, release the run's lock."""
    stop.restore()
    run.workers.shutdown(wait=not stop.forced)  # a second signal waits for no predictor fit
    if run.logger is not None:
        run.logger.close()
    if run.lock is not None:
        run.lock.release()


def _after_step(run: Run, step: int, batch: RolloutBatch, metrics: dict, stop: StopOnSignal) -> None:
    """Print the step's line, stop on failing environments, checkpoint on schedule or on a signal."""
    cfg = run.cfg
    if run.info.is_main and not cfg.quiet and cfg.log_every and step % cfg.log_every == 0:
        from tqdm.auto import tqdm

        tqdm.write(_metrics_line(step, cfg.steps, metrics), file=sys.stdout)
    failed = _check_env_failures(run, step, batch, metrics)
    stopping = max_over_ranks(int(stop.requested), run.info)  # every rank stops at the same step
    if failed or stopping or step % cfg.checkpoint_every == 0 or step == cfg.steps:
        run.checkpoint(step)
    if failed:
        raise EnvFailureError(failed + f"; stopped with a checkpoint of step {step}")
    if stopping:
        raise RunInterrupted(stop.signum, f"saved a checkpoint of step {step}")


def _metrics_line(step: int, steps: int, m: dict) -> str:
    """``step 3/20  reward 0.41  eval 0.52  eff 0.63  yield/1k 12.5  tokens 1234  4.1 s``."""
    parts = [f"step {step}/{steps}", f"reward {m.get('reward_mean', float('nan')):.3f}"]
    if "eval_success" in m:
        parts.append(f"eval {m['eval_success']:.3f}")
    parts += [f"eff {m.get('effective_ratio', float('nan')):.2f}",
              f"mixed/1k {m.get('mixed_prompts_per_1k_rollouts', float('nan')):.1f}",
              f"tokens {int(m.get('generated_tokens', 0))}",
              f"{m.get('rollout_seconds', 0.0) + m.get('train_seconds', 0.0):.1f} s"]
    if m.get("env_failures"):
        parts.append(f"env failures {int(m['env_failures'])}")
    return "  ".join(parts)


def _check_env_failures(run: Run, step: int, batch: RolloutBatch, metrics: dict) -> str | None:
    """Warn above ``env_failure_warn_share``; above ``max_env_failure_share`` return the stop message.
    The first failure's traceback of this rank goes to ``run_dir/env_errors/step_N.txt``."""
    cfg = run.cfg
    share = metrics.get("env_failures", 0.0) / max(metrics.get("rollouts", 0.0), 1.0)
    if share <= cfg.env_failure_warn_share or not run.info.is_main:
        return None if share <= cfg.max_env_failure_share else "env failures on another rank"
    sample = batch.report.env_error_sample
    where = "(the failures ran on other ranks)"
    first = ""
    if sample:
        path = subdir(cfg.run_dir, "env_errors") / f"step_{step:08d}.txt"  # a planted file or link: one line
        write_file(path, sample)
        lines = [ln for ln in sample.strip().splitlines() if ln.strip()]
        first, where = lines[-1].strip() if len(lines) > 1 else lines[0], f"traceback in {path}"
    text = (f"step {step}: {int(metrics['env_failures'])} of {int(metrics['rollouts'])} rollouts ({share:.0%}) ended "
            f"in an environment failure: {first}; {where}")
    if share > cfg.max_env_failure_share:
        return text + f" (more than max_env_failure_share={cfg.max_env_failure_share})"
    from tqdm.auto import tqdm

    tqdm.write(f"trace-train: warning: {text}", file=sys.stderr)
    return None


def _guarded_policy_update(run: Run, sequences, fit: _PredictorFit, step: int, before: StepState | None) -> dict:
    """:func:`_policy_update`; a non-finite loss stops the run with a checkpoint of the last good step: the
    one on disk when it is of that step (never rewritten), else one written from ``before`` (the state
    captured before this step's rollout; no update was made, so the weights and optimiser are that step's)."""
    try:
        with generator_asleep(run.backend):  # vLLM with backend.sleep_during_update frees the GPU meanwhile
            return _policy_update(run.policy, run.optimizer, sequences, run.cfg, run.info, ref=run.ref)
    except NonFiniteLossError as err:
        fit.result()  # the fit's thread must be idle before anything is saved
        kept = run.saved_step == step
        saved = Path(run.cfg.run_dir) / "checkpoints" / f"step_{step:08d}" if kept else run.checkpoint(step, before)
        raise NonFiniteLossError(f"step {step + 1}: {err}; stopped with a checkpoint of step {step} at {saved}"
                                 f"{' (kept as written)' if kept else ''}. Lower optim.lr (or set optim.grad_clip) "
                                 "and run the same command again with it: the run resumes from that checkpoint.") from None


def _sync_weights(run: Run) -> None:
    """Copy the policy's weights into a generation back end that does not share them (vLLM, FSDP)."""
    if not _shares_weights(run.backend, run.policy):
        dtype = getattr(torch, run.cfg.model.dtype)  # the fp32 masters, rounded once for the generator
        weights = full_state_dict(run.policy, run.info, dtype)
        run.backend.update_weights({k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()})


def _export(policy, tokenizer, path: Path, info: DistInfo) -> None:
    """Save the trained policy as a Hugging Face model directory (what trace-eval and vLLM load)."""
    weights = checkpoint_state_dict(policy, info)
    if info.is_main:
        subdir(path.parent, path.name)  # hf/ planted as a file or a link: one line, not a silent non-export
        policy.save_pretrained(path, state_dict={k: v.detach().cpu() for k, v in weights.items()})
        tokenizer.save_pretrained(path)


# Fields that do not change what a run computes: a run may be resumed with other values of these.
_ADDED_SINKS = ("max_env_failure_share", "env_failure_warn_share", "log_every", "quiet")
_NOT_IN_FINGERPRINT = ("steps", "checkpoint_every", "keep_checkpoints", "tensorboard", "wandb_project", "run_dir",
                       *_ADDED_SINKS)


# Fields removed after checkpoints existed, hashed at the value every run had, so older runs still resume.
_REMOVED_IN_FINGERPRINT = {"predictor": {"seed": 0}}
# Fields added after checkpoints existed: left out of the hash while they hold the default every older run
# had, so older runs still resume (a run that sets another value is another trajectory, and hashes it).
_ADDED_IN_FINGERPRINT = {"predictor": {"probe_step": 1.0}, "rollout": {"expansion": "streamed"}}


def resume_fingerprint(cfg: TrainConfig) -> str:
    """A hash of everything that determines the run's trajectory (not its length, cadence or sinks).
    Fields added after checkpoints existed (``_ADDED_SINKS``, and ``_ADDED_IN_FINGERPRINT`` at their
    defaults) are left out, and removed ones (``_REMOVED_IN_FINGERPRINT``) put back at their old default,
    so older runs still resume."""
    plain = dataclasses.replace(cfg, **{k: getattr(TrainConfig(), k) for k in _NOT_IN_FINGERPRINT})
    data = {k: v for k, v in config_to_dict(plain).items() if k not in _ADDED_SINKS}
    for section, fields in _REMOVED_IN_FINGERPRINT.items():
        data[section] = {**data[section], **fields}
    for section, fields in _ADDED_IN_FINGERPRINT.items():
        data[section] = {k: v for k, v in data[section].items() if not (k in fields and v == fields[k])}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _check_or_write_config(cfg: TrainConfig, run_dir: Path, info: DistInfo) -> None:
    """Refuse a run directory that holds another run's ``config.yaml``; then write ours.

    Another run is one whose resume fingerprint differs (only steps, checkpointing and logging may
    change), whether or not it wrote a checkpoint: its config and metrics are never overwritten.
    """
    stored = run_dir / "config.yaml"
    if stored.exists():
        differs = _differing_fields(_stored_config(stored), config_to_dict(cfg))
        if differs:
            raise ValueError(f"{run_dir} holds another run (its config.yaml differs in {', '.join(differs)}); "
                             "use another run_dir (only steps, optim.lr, optim.grad_clip, checkpointing and "
                             "logging may change)")
        for change in describe_overrides(_stored_config(stored), config_to_dict(cfg)) if info.is_main else ():
            print(f"trace-train: resuming with {change}", file=sys.stderr)
    if info.is_main:
        write_file(stored, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))  # replaces a link, never follows


def _stored_config(path: Path) -> dict:
    """A stored ``config.yaml`` as plain data over the defaults: nothing in it is resolved or imported
    (a planted ``task.name: file.py:attr`` is compared as a string, never run)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path.parent} holds a config.yaml that cannot be read ({type(err).__name__}); "
                         "use another run_dir") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path.parent} holds a config.yaml that is not a mapping; use another run_dir")
    return _merged(config_to_dict(TrainConfig()), drop_removed(data, TrainConfig.REMOVED))


def _merged(defaults: dict, data: dict) -> dict:
    out = dict(defaults)
    for key, value in data.items():
        sub = defaults.get(key)
        is_section = isinstance(sub, dict) and isinstance(value, dict) and key not in ("env", "rows")
        out[key] = _merged(sub, value) if is_section else value
    return out


def _differing_fields(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted names of the leaves where two nested config dicts differ (ignoring run length and sinks)."""
    out = []
    for key in sorted(set(a) | set(b)):
        name = prefix + key
        if (not prefix and key in _NOT_IN_FINGERPRINT) or name in RESUME_OVERRIDES:
            continue
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differing_fields(x, y, name + ".")
        elif x != y:
            out.append(name)
    return out


def _load_policy_weights(policy, state: dict, info: DistInfo) -> None:
    if not info.enabled:
        policy.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(policy, state, options=StateDictOptions(full_state_dict=True))


def _rollout_config(cfg: TrainConfig, task) -> RolloutConfig:
    """The engine's config: ``cfg.rollout`` with ``binary_rewards`` off where the task's rewards are graded."""
    return dataclasses.replace(cfg.rollout, binary_rewards=cfg.rollout.binary_rewards and task.binary_rewards)


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
        "generation_seconds": report.generation_seconds,
        "env_seconds": report.env_seconds,
        "generator_idle_share": report.generator_idle_share,
        "samples_in_flight": report.samples_in_flight,
        "generation_polls": float(report.generation_polls),
        "streamed_expansion": float(report.streamed),
        **{f"{k}_seconds": v for k, v in report.phase_seconds.items()},  # + allocation, forest building, envs' resets:
        "allocation_seconds": max(report.seconds - sum(report.phase_seconds.values()), 0.0),  # what the phases leave
        "env_failures": float(report.end_reasons.get("env_error", 0) + report.end_reasons.get("env_timeout", 0)),
        **{k: float(v) for k, v in update.items()},
    }
    by_depth = batch.metrics()["rollouts_by_anchor_depth"]
    scalars.update({f"rollouts_at_depth_{d}": float(n) for d, n in enumerate(by_depth)})
    counts = ("prompts", "rollouts", "continuations", "generated_tokens", "prompt_tokens",
              "train_forward_tokens", "train_unique_tokens", "env_failures",
              *(k for k in scalars if k.startswith("rollouts_at_depth_")))
    merged = merge_metrics(scalars, report.rollouts, info, sums=counts)
    # one predictor for the job, fitted on every rank's targets: its metrics are already global
    return {**merged, **{k: float(v) for k, v in predictor_metrics.items()}}


def _progress(steps, info: DistInfo, start: int, total: int, quiet: bool = False):
    if not info.is_main or quiet:
        return steps
    from tqdm.auto import tqdm

    return tqdm(steps, initial=start, total=total, desc="train", unit="step")


# ---------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------


def cli(argv=None) -> int:
    from .config_loader import available_presets

    parser = argparse.ArgumentParser(
        prog="trace-train", description="Train an LLM agent with TRACE.", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config fields (set in a YAML file or as dotted.key=value):\n\n" + describe(TrainConfig))
    parser.add_argument("--config", help=f"a preset ({', '.join(available_presets())}) or a YAML file")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no per-step metrics lines")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. rollout.policy=grpo optim.lr=3e-5")
    args = parser.parse_intermixed_args(argv)  # overrides on both sides of --quiet
    try:
        cfg = load_config(TrainConfig, args.config, [*args.overrides, *(["quiet=true"] if args.quiet else [])])
    except ValueError as err:
        print(f"trace-train: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), end="")
        return 0
    try:
        main(cfg)
    except (ValueError, NonFiniteLossError, EnvFailureError, OutOfSpaceError) as err:
        print(f"trace-train: {err}", file=sys.stderr)
        return 1
    except RunInterrupted as stop:
        resume = shlex.join(["trace-train", *(sys.argv[1:] if argv is None else argv)])
        name = "SIGTERM" if stop.signum == signal.SIGTERM else "Ctrl-C"
        print(f"trace-train: stopped by {name}; {stop}; to resume: {resume}", file=sys.stderr)
        return 128 + stop.signum
    except KeyboardInterrupt:  # before the run started (loading, building)
        print("trace-train: stopped by Ctrl-C before the first step; nothing saved", file=sys.stderr)
        return 130
    return 0


def entry() -> None:
    """The ``trace-train`` command: :func:`cli`, then the process ends even if a stuck thread is left
    (``run.signals.finish_process``)."""
    raise SystemExit(finish_process(cli()))


if __name__ == "__main__":
    entry()
