"""Train an LLM agent with TRACE, or with any registered allocation policy at equal budget.

    trace-train --config cpu_demo                          # a tiny model learns guess-the-number on a CPU
    trace-train --config cpu_demo rollout.policy=grpo      # the same run with GRPO's uniform groups
    torchrun --nproc_per_node 8 -m trace_train.train --config math_qwen3_8b     # a GPU node

One step of ``main`` is the algorithm, one line each (the machinery lives in the modules named):

    pool       = sampler.next_pool()                        # candidate prompts (this rank's slice)
    batch      = engine.rollout(pool, predictor)            # predict V~; allocate roots, then prefixes; generate
    advantages = compute_advantages(forest, advantage)      # tree advantages (trace_theory)
    fit        = predictor update on node_targets(forest)   # a worker thread (predictors/fitting), if V~ is read
    update     = policy_loss(packed trees of batch, adv)     # clipped token-level PG (update/: loss, packing)
    sync weights; log(metrics); maybe evaluate, checkpoint  # metrics.jsonl, TensorBoard; atomic checkpoints

:func:`build_run` sets everything up (or resumes it: ``run/resume.py`` checks that the run directory and
the checkpoint hold this run); the config classes are in ``trace_train.configs``.
A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl``, ``tensorboard/``,
``checkpoints/`` and, at the end, ``hf/`` (the trained policy as a Hugging Face model). Starting a run whose directory has a checkpoint resumes it (same config required);
a non-finite loss stops the run with a checkpoint of the last good step and a one-line message. One run
per directory (``run.lock``); Ctrl-C and SIGTERM end after the step under way, with a checkpoint of it
and one line giving the command that resumes (exit 130 / 143); a step where more than
``max_env_failure_share`` of rollouts failed in their environment stops the run the same way (exit 1),
its first traceback in ``env_errors/`` (``docs/training.md``, "Run directories").
"""

from __future__ import annotations

import argparse
import dataclasses
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

from trace_theory import compute_advantages
from trace_theory.pipelined import Pending

from .backends import training_backend
from .backends.base import generator_asleep, pad_token_id
from .chat import ChatFormat
from .config_loader import config_to_dict, describe, load_config
from .configs import RolloutConfig, TrainConfig
from .data.sampler import PromptSampler
from .run.all_fail import AllFailWatch, advice
from .run.collapse import CollapseWatch
from .run.console import (Eta, eval_line, finished_line, line_buffered, metrics_line, progress, quiet_libraries,
                           resume_env, say, shows_bar)
from .run.heap import startup_objects_frozen
from .run.malloc import keep_freed_memory
from .preflight import check_device, check_model
from .predictors import PosteriorPredictor, build_predictor, predictor_from_state_dict
from .predictors.fitting import PredictorFit, attach_policy_states, check_one_predictor
from .rollout.batch import RolloutBatch
from .rollout.engine import RolloutEngine
from .rollout.env_calls import EnvCallsStuck
from .run.checkpoint import (Checkpoint, CheckpointError, check_world_size, clean_partial_checkpoints,
                             load_latest_checkpoint, restore_rng, save_checkpoint)
from .run.distributed import (DistInfo, GlobalRootAllocator, checkpoint_state_dict, full_optimizer_state_dict,
                              gather_objects, init_distributed, iter_full_tensors, load_full_optimizer_state_dict,
                              leave_distributed, max_over_ranks)
from .run.files import OutOfSpaceError, RunLock, writable_dir
from .run.metrics_log import MetricsLogger, read_metrics
from .run.policy import (checkpoint_activations, export, load_policy, load_policy_weights, load_sharded_policy,
                         model_path)
from .run.resume import check_config, resume_fingerprint, write_config
from .run.signals import RunInterrupted, StopOnSignal, finish_process
from .run.step_metrics import step_metrics
from .run.stops import EnvFailureError, LengthCutError, check_env_failures, check_length_cuts
from .run.evaluation import evaluate_held_out, own_eval_rows
from .run.step_state import StepState, apply_optimizer_overrides, set_engine_costs, state_digest, trajectory_fingerprint
from .run.threads import set_compute_threads
from .run.turns import thinking_warning, turn_limits_line
from .tasks import Task, build_task
from .update.optimizer_step import NonFiniteLossError
from .update.optimizer_step import policy_update as _policy_update
from .update.packing import training_batch_for

__all__ = ["TrainConfig", "Run", "build_run", "main", "PromptSampler", "NonFiniteLossError", "EnvFailureError",
           "LengthCutError",
           "RunInterrupted", "cli", "entry"]


# ---------------------------------------------------------------------------------------------------
# One step's pieces
# ---------------------------------------------------------------------------------------------------


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
    collapse: CollapseWatch = field(default_factory=lambda: CollapseWatch(eval_rollouts=1))
    """Warns when tokens per rollout or held-out success move the way a collapse does (``run/collapse.py``)."""
    all_fail: AllFailWatch = field(default_factory=lambda: AllFailWatch(eval_rollouts=1))  # run/all_fail.py
    warnings: list = field(default_factory=list)  # the all-fail watch's, printed after the step's line
    eta: Eta | None = None  # the time left, at the end of each step line where no progress bar shows it

    def checkpoint(self, step: int, state: StepState | None = None) -> Path | None:
        """Checkpoint ``step`` with the weights and optimiser of now and ``state`` (default: of now)."""
        state = state or StepState.capture(self)
        extra = {"predictor": state.predictor, "sampler": state.sampler, "engine_costs": state.engine_costs,
                 "eager_threshold": state.eager_threshold}
        weights = checkpoint_state_dict(self.policy, self.info)
        optimizer = full_optimizer_state_dict(self.policy, self.optimizer, self.info)
        if self.info.enabled:  # what differs between ranks: each rank's random states and cost estimates
            extra["ranks"] = gather_objects({"rng": state.rng, "engine_costs": state.engine_costs,
                                             "eager_threshold": state.eager_threshold,
                                             "predictor_digest": state_digest(state.predictor)}, self.info)
            check_one_predictor([r["predictor_digest"] for r in extra["ranks"]])
        pending = None  # pipelined expansion: every rank's pending step (pending.pkl), each rank its own
        if self.cfg.rollout.expansion == "pipelined":
            pending = gather_objects(state.pending, self.info)
        self.saved_step = step  # on every rank: whether the step is on disk decides what a failure does
        if not self.info.is_main:
            return None
        return save_checkpoint(Path(self.cfg.run_dir), step, policy=weights, optimizer=optimizer,
                               extra=extra, config_fingerprint=resume_fingerprint(self.cfg),
                               keep=self.cfg.keep_checkpoints, rng_state=state.rng,
                               trajectory_fingerprint=trajectory_fingerprint(self.cfg, resume_fingerprint),
                               pending=pending)

    def resume(self, ckpt: Checkpoint) -> None:
        check_world_size(ckpt, self.info.world_size)
        same = ckpt.config_fingerprint == resume_fingerprint(self.cfg) or (
            ckpt.trajectory_fingerprint is not None
            and ckpt.trajectory_fingerprint == trajectory_fingerprint(self.cfg, resume_fingerprint))
        if not same:
            raise ValueError(f"checkpoint {ckpt.path} was written under another config; use another run_dir "
                             "(only steps, optim.lr, optim.grad_clip, checkpointing and logging may change)")
        try:
            load_policy_weights(self.policy, ckpt.policy, self.info)
        except (KeyError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"{ckpt.path / 'policy.pt'}: does not fit this model ({(str(err).splitlines() or [type(err).__name__])[0][:300]})") from None
        try:
            load_full_optimizer_state_dict(self.policy, self.optimizer, ckpt.optimizer, self.info)
        except (KeyError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"{ckpt.path / 'optimizer.pt'}: does not fit this model's optimizer "
                                  f"({(str(err).splitlines() or [type(err).__name__])[0][:300]})") from None
        apply_optimizer_overrides(self.optimizer, self.cfg)  # a lowered optim.lr holds after the state is loaded
        try:
            self.predictor = predictor_from_state_dict(ckpt.extra["predictor"])
            self.sampler.load_state(ckpt.extra["sampler"])
            own = ckpt.extra
            if self.info.enabled:  # this rank's own states, not rank 0's
                own = ckpt.extra["ranks"][self.info.rank]
                restore_rng(own["rng"])
            set_engine_costs(self.engine, own["engine_costs"])
            self.engine.eager_threshold = own.get("eager_threshold")  # eager expansion's level (absent: older)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
            raise CheckpointError(f"{ckpt.path / 'extra.pt'}: does not hold this run's state "
                                  f"({type(err).__name__}: {err})") from None
        self.engine.pending = _own_pending(ckpt, self.info.rank, self.cfg)
        self.start_step = self.saved_step = ckpt.step
        _sync_weights(self)

    def evaluate(self, step: int) -> dict:
        """Held-out success at this step, when the config asks for it (``eval.every``)."""
        every = self.cfg.eval.every
        if not (every and self.task.eval_rows) or step % every:
            return {}
        return evaluate_held_out(self.eval_engine, own_eval_rows(self.task, self.cfg, self.info), step, self.info)

    def log(self, step: int, metrics: dict) -> None:
        """Log the row (rank 0), with the all-fail watch's fields added to ``metrics`` and its warning kept
        for the step's line (``run/all_fail.py``)."""
        if self.logger is not None and metrics:
            fields, said = self.all_fail.check(step, metrics)
            metrics.update(fields)
            self.warnings += said
            self.logger.log(step, metrics)


def _own_pending(ckpt: Checkpoint, rank: int, cfg: TrainConfig):
    """This rank's pending step of pipelined expansion from ``pending.pkl`` (None: nothing pending)."""
    if cfg.rollout.expansion != "pipelined":
        return None
    if ckpt.pending is None:
        raise CheckpointError(f"{ckpt.path / 'pending.pkl'}: missing; a checkpoint of a pipelined run holds it")
    if not (isinstance(ckpt.pending, list) and rank < len(ckpt.pending)):
        raise CheckpointError(f"{ckpt.path / 'pending.pkl'}: holds no pending step for rank {rank} (one per rank)")
    pending = ckpt.pending[rank]
    if pending is not None and not isinstance(pending, Pending):
        raise CheckpointError(f"{ckpt.path / 'pending.pkl'}: holds a {type(pending).__name__}, not a pending step")
    return pending


def build_run(cfg: TrainConfig) -> Run:
    """Set up (or resume) a run: task, policy, generation back end, rollout engines, predictor, sampler."""
    check_device(cfg.device), check_model(cfg.model.name_or_path)  # one line each, before anything loads
    info = init_distributed(cfg.device, cfg.distributed.timeout_s)
    set_compute_threads(cfg.backend.threads)
    if info.device == "cpu":  # the update's activations stay in the heap between steps (run.malloc)
        keep_freed_memory()
    torch.manual_seed(cfg.seed + info.rank)
    np.random.seed(cfg.seed + info.rank)
    run_dir = writable_dir(cfg.run_dir, "`run_dir`")
    started_before = (run_dir / RunLock.NAME).exists()  # a trace-train started here before (it may have failed)
    lock = _lock_run_dir(run_dir, info)
    try:
        return _build_run(cfg, info, run_dir, lock, started_before)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _lock_run_dir(run_dir: Path, info: DistInfo) -> RunLock | None:
    """One run per directory (rank 0 holds ``run.lock``); then remove what killed checkpoint writes left."""
    if not info.is_main:
        return None
    lock = RunLock(run_dir).acquire()
    clean_partial_checkpoints(run_dir)
    return lock


def _build_run(cfg: TrainConfig, info: DistInfo, run_dir: Path, lock: RunLock | None, started_before: bool) -> Run:
    # another run's directory is refused before anything loads; one a failed start left is taken over
    check_config(cfg, run_dir, announce=info.is_main, started_before=started_before)
    task = build_task(cfg.task, seed=cfg.seed, hold_out=cfg.eval.every > 0)
    if info.is_main:  # the data and the environment checked: only now the directory holds this run
        write_config(cfg, run_dir)
        print(task.describe(cfg.task.name), flush=True)
    path = model_path(cfg.model, cfg.run_dir, seed=cfg.seed, task=task) if info.is_main else None
    if info.enabled:
        paths = [path]
        torch.distributed.broadcast_object_list(paths, src=0)
        path = paths[0]
    # fp32 master weights; under FSDP built on the meta device and sharded, rank 0 broadcasting the weights,
    # so that each GPU only ever holds its shard (a whole fp32 8B policy is 32 GB), no rank but rank 0 holds a
    # full copy in host memory, and vLLM, built next, sizes its cache on a GPU without it
    compute = getattr(torch, cfg.model.dtype)
    if info.enabled:
        policy, tokenizer = load_sharded_policy(path, torch.float32, info, compute_dtype=compute,
                                                activation_checkpointing=cfg.model.activation_checkpointing)
    else:
        policy, tokenizer = load_policy(path, info.device, torch.float32)
        if cfg.model.activation_checkpointing:
            checkpoint_activations(policy)
    backend = training_backend(cfg, path, device=info.device, policy=policy, tokenizer=tokenizer, sharded=info.enabled)
    ref = None
    if cfg.algorithm.loss.kl_coef > 0:  # frozen, in model.dtype; under FSDP sharded like the policy
        if info.enabled:
            ref, _ = load_sharded_policy(path, compute, info, compute_dtype=compute)
        else:
            ref, _ = load_policy(path, info.device, compute)
        ref.requires_grad_(False).eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                  weight_decay=cfg.optim.weight_decay)
    chat = ChatFormat(backend.tokenizer, tools=task.make_env.tools, template_kwargs=cfg.rollout.chat_template_kwargs)
    if info.is_main:  # thinking and the turn limits, and a warning when thinking meets short turns
        print(turn_limits_line(cfg, backend.tokenizer), flush=True)
        if (warning := thinking_warning(cfg, backend.tokenizer)) is not None:
            say(f"trace-train: warning: {warning}")
    rollout = _rollout_config(cfg, task)
    engine = RolloutEngine(backend, task.make_env, rollout, chat=chat,
                           root_allocator=GlobalRootAllocator(info) if info.enabled else None)
    eval_engine = None
    if cfg.eval.every and (own := own_eval_rows(task, cfg, info)):  # this rank's share of the held-out prompts
        eval_engine = RolloutEngine(backend, task.make_env, cfg.eval.rollout_config(rollout, len(own)), chat=chat)
    sampler = PromptSampler(task.train_rows, cfg.rollout.pool_size, seed=cfg.seed, rank=info.rank,
                            world_size=info.world_size)
    run = Run(cfg, info, task, policy, tokenizer, ref, optimizer, backend, engine, eval_engine,
              build_predictor(cfg.predictor), sampler, logger=None, lock=lock)
    ckpt = load_latest_checkpoint(run_dir)
    if ckpt is not None:
        run.resume(ckpt)
        if info.is_main:
            print(f"trace-train: resuming from step {ckpt.step} of {run_dir}", file=sys.stderr)
    attach_policy_states(run.predictor, policy, distributed=info.enabled, compute_dtype=getattr(torch, cfg.model.dtype))
    if info.is_main:
        run.logger = MetricsLogger(run_dir, resume_step=run.start_step if ckpt is not None else None,
                                   tensorboard=cfg.tensorboard, wandb_project=cfg.wandb_project,
                                   config=config_to_dict(cfg))
        eval_rollouts = min(cfg.eval.prompts, len(task.eval_rows)) * cfg.eval.samples
        run.collapse = CollapseWatch(eval_rollouts=eval_rollouts)
        run.all_fail = AllFailWatch(eval_rollouts=eval_rollouts, advice=advice(
            tiny=cfg.model.name_or_path == "tiny", demonstrated=task.demonstration is not None,
            warm_steps=cfg.model.tiny_warm_steps))
        if ckpt is not None:
            rows = read_metrics(run.logger.path)
            run.collapse.replay(rows), run.all_fail.replay(rows)
    return run


# ---------------------------------------------------------------------------------------------------
# The run: one step is the algorithm's lines
# ---------------------------------------------------------------------------------------------------


def main(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or resume) training; returns the last step's metrics."""
    run = build_run(cfg)
    metrics: dict[str, Any] = {}
    stop = StopOnSignal(lambda: run.saved_step, announce=run.info.is_main)
    with startup_objects_frozen():  # the model, tokenizer and engines: full collections skip them
        try:
            if run.start_step == 0:
                _evaluate_start(run)
            for step in _progress(run):   # a bar with the time left on a terminal, else the step lines say it
                # what a checkpoint of the last good step holds if this one fails (none needed when it is on disk)
                before = StepState.capture(run) if run.saved_step != step else None
                t0 = time.perf_counter()
                batch = _guarded_rollout(run, step, before)  # candidate prompts; predict V~, allocate, generate
                if batch is None:               # pipelined expansion's first step fills the pipeline: nothing to train
                    _after_step(run, step + 1, None, _fill_metrics(run, step + 1, time.perf_counter() - t0), stop)
                    continue
                t1 = time.perf_counter()
                advantages = compute_advantages(batch.forest, cfg.algorithm.advantage)   # tree advantages
                sequences = training_batch_for(batch, advantages, cfg, pad_token_id=pad_token_id(run.tokenizer))
                fit = _start_fit(run, batch)    # predictor update (background), started after the Python-heavy
                t2 = time.perf_counter()        # packing so as not to contend with it
                update = _guarded_policy_update(run, sequences, fit, step, before)  # clipped policy gradient
                t3 = time.perf_counter()
                _sync_weights(run)                                                   # generator gets the new weights
                t4 = time.perf_counter()
                fitted = fit.result()
                times = {"prepare_seconds": t2 - t1, "update_seconds": t3 - t2, "sync_seconds": t4 - t3,
                         "fit_wait_seconds": time.perf_counter() - t4}
                metrics = step_metrics(batch, {**update, **times}, fitted, t1 - t0, time.perf_counter() - t1, run.info)
                metrics.update(run.evaluate(step + 1))
                run.log(step + 1, metrics)
                _after_step(run, step + 1, batch, metrics, stop)                      # print, check, checkpoint
        finally:
            _close(run, stop)
    _export_and_shut_down(run)
    if run.info.is_main:
        print(finished_line(cfg.steps, cfg.run_dir, cfg.model.name_or_path), file=sys.stderr)
    return metrics


def _guarded_rollout(run: Run, step: int, before: StepState | None) -> RolloutBatch | None:
    """:func:`_rollout`; when the environment's calls are stuck (``EnvCallsStuck``: too many calls past
    ``env_timeout_s`` at once, none returning), the run stops as for failing environments: a checkpoint of the
    last good step (the one on disk, or one written from ``before``) and one line."""
    try:
        return _rollout(run, step)
    except EnvCallsStuck as err:
        kept = run.saved_step == step
        saved = Path(run.cfg.run_dir) / "checkpoints" / f"step_{step:08d}" if kept else run.checkpoint(step, before)
        raise EnvFailureError(f"step {step + 1}: {err}; stopped with a checkpoint of step {step} at {saved}") from None


def _export_and_shut_down(run: Run) -> None:
    """Write ``hf/``; then, under torchrun, once every rank is done, tear a vLLM engine down before the
    process group is left (``VLLMBackend.shutdown``; it then destroys the group itself, and
    ``leave_distributed`` has nothing left to do): the run exits without a traceback per rank."""
    export(run.policy, run.tokenizer, Path(run.cfg.run_dir) / "hf", run.info)
    shutdown = getattr(run.backend, "shutdown", None)
    if run.info.enabled and callable(shutdown):
        torch.distributed.barrier()
        shutdown()


def _rollout(run: Run, step: int) -> RolloutBatch | None:
    """The batch step ``step`` trains: ``engine.rollout`` on the sampler's next pool, less the rollouts that
    ended by an environment fault (they count as not sampled, budget aside; unless
    ``algorithm.train_env_failures``). Pipelined expansion: the previous step's trees, completed by this
    step's wave; None on the first step (the pipeline fills). The run's last step drains the pipeline
    (grows the pending continuations and plants nothing; a run of one step plants, then drains), so that
    the last trees are trained too.

    Every step starts from an empty prefix cache (where the back end has one), so a resumed run computes
    what the uninterrupted one did: the pipeline's fill step changes no weights, and evaluation fills the
    cache between steps."""
    if run.backend.capabilities.prefix_cache_reset:
        run.backend.reset_prefix_cache()
    engine, cfg = run.engine, run.cfg
    seed = _step_seed(cfg.seed, step, run.info.rank)
    last = step == cfg.steps - 1
    if last and engine.pending is not None:
        batch = engine.drain(seed=seed)
    else:
        batch = engine.rollout(run.sampler.next_pool(), predictor=run.predictor, seed=seed)
        if batch is None and last:
            batch = engine.drain(seed=seed)
    if batch is not None and not cfg.algorithm.train_env_failures:
        batch = batch.without_env_failures()
    return batch


def _fill_metrics(run: Run, step: int, rollout_seconds: float) -> dict:
    """The logged row of pipelined expansion's first step: its wave planted trees, none is whole, no update
    (``pipeline_fill`` 1; the console prints "pipeline fill")."""
    metrics = {"pipeline_fill": 1.0, "rollout_seconds": rollout_seconds, "train_seconds": 0.0,
               **run.evaluate(step)}
    run.log(step, metrics)
    return metrics


def _evaluate_start(run: Run) -> None:
    """Held-out success before the first step: logged, printed, and the start the collapse watch compares with."""
    run.log(0, first := run.evaluate(0))
    if run.info.is_main and not run.cfg.quiet and eval_line(0, run.cfg.steps, first):
        say(eval_line(0, run.cfg.steps, first), file=sys.stdout)
    run.collapse.check(0, first)


def _close(run: Run, stop: StopOnSignal) -> None:
    """Put the signal handlers back, wait for the predictor fit, close the logs, release the run's lock."""
    stop.restore()
    run.workers.shutdown(wait=not stop.forced)  # a second signal waits for no predictor fit
    if run.logger is not None:
        run.logger.close()
    if run.lock is not None:
        run.lock.release()


def _after_step(run: Run, step: int, batch: RolloutBatch | None, metrics: dict, stop: StopOnSignal) -> None:
    """Print the step's line, stop on failing environments, checkpoint on schedule or on a signal (``batch``
    None: a pipeline fill, nothing trained)."""
    cfg = run.cfg
    if run.info.is_main and not cfg.quiet and cfg.log_every and step % cfg.log_every == 0:
        eta = run.eta.text(step) if run.eta is not None else None
        say(metrics_line(step, cfg.steps, metrics, lr=run.optimizer.param_groups[0]["lr"], eta=eta), file=sys.stdout)
    for warning in [*run.collapse.check(step, metrics), *run.warnings] if run.info.is_main else ():
        say(f"trace-train: warning: {warning}")
    run.warnings.clear()
    failed = None if batch is None else check_env_failures(run.cfg, run.info, step, batch, metrics)
    cut = None if batch is None or failed else check_length_cuts(run.cfg, step, metrics)
    stopping = max_over_ranks(int(stop.requested), run.info)  # every rank stops at the same step
    if failed or cut or stopping or step % cfg.checkpoint_every == 0 or step == cfg.steps:
        run.checkpoint(step)
    if failed:
        raise EnvFailureError(failed + f"; stopped with a checkpoint of step {step}")
    if cut:
        raise LengthCutError(cut + f"; stopped with a checkpoint of step {step}")
    if stopping:
        raise RunInterrupted(stop.signum, f"saved a checkpoint of step {step}")


def _guarded_policy_update(run: Run, sequences, fit: PredictorFit, step: int, before: StepState | None) -> dict:
    """:func:`_policy_update`, then the gradients freed while vLLM still sleeps (their memory, 4 P / W bytes,
    is vLLM's once it wakes: freed after the wake-up, both were held at once).
    A non-finite loss stops the run with a checkpoint of the last good step: the one on disk when it is of
    that step (never rewritten), else one written from ``before`` (the state captured before this step's
    rollout; no update was made, so the weights and optimiser are that step's)."""
    try:
        with generator_asleep(run.backend):  # vLLM with backend.sleep_during_update frees the GPU meanwhile
            update = _policy_update(run.policy, run.optimizer, sequences, run.cfg, run.info, ref=run.ref)
            run.optimizer.zero_grad(set_to_none=True)  # before vLLM wakes: its cache takes their memory back
        return update
    except NonFiniteLossError as err:
        fit.result()  # the fit's thread must be idle before anything is saved
        kept = run.saved_step == step
        saved = Path(run.cfg.run_dir) / "checkpoints" / f"step_{step:08d}" if kept else run.checkpoint(step, before)
        raise NonFiniteLossError(f"step {step + 1}: {err}; stopped with a checkpoint of step {step} at {saved}"
                                 f"{' (kept as written)' if kept else ''}. Lower optim.lr (or set optim.grad_clip) "
                                 "and run the same command again with it: the run resumes from that checkpoint.") from None


def _sync_weights(run: Run) -> None:
    """Copy the policy's weights into a generation back end that does not share them (vLLM, FSDP); one that
    shares them (transformers, one fp32 process) empties its prefix cache.

    vLLM takes them as a stream (``backends.vllm_backend.VLLMBackend.update_weights``): each parameter is
    gathered (under FSDP, its shards cast to ``model.dtype`` first), loaded, and freed before the next, so
    the sync's peak is one parameter, not a second full copy of the model."""
    if run.backend.shares_weights(run.policy):  # a transformers back end that shares the weights:
        run.backend.reset_prefix_cache()  # they changed in place, what its prefix cache holds is stale
    else:
        dtype = getattr(torch, run.cfg.model.dtype)  # the fp32 masters, rounded once for the generator
        weights = iter_full_tensors(run.policy, run.info, dtype)
        if not run.backend.capabilities.weight_streaming:
            weights = dict(weights)
        run.backend.update_weights(weights)


def _start_fit(run: Run, batch: RolloutBatch) -> PredictorFit:
    """The step's predictor fit (``predictors.fitting``): one predictor for the job under torchrun."""
    gather = (lambda obj: gather_objects(obj, run.info)) if run.info.enabled else None
    return PredictorFit(run.workers, run.predictor, batch, value_target=run.cfg.algorithm.value_target,
                        fits=run.cfg.fits_predictor, gather=gather)


def _rollout_config(cfg: TrainConfig, task) -> RolloutConfig:
    """The engine's config: ``cfg.rollout`` (its policy resolved once) with ``binary_rewards`` off where the
    task's rewards are graded."""
    if cfg.rollout.binary_rewards == (cfg.rollout.binary_rewards and task.binary_rewards):
        return cfg.rollout
    return dataclasses.replace(cfg.rollout, binary_rewards=False)


def _step_seed(seed: int, step: int, rank: int) -> int:
    return int(np.random.default_rng([seed, step, rank]).integers(0, 2**31 - 1))


def _progress(run: Run):
    """The steps left, in a progress bar where stderr is a terminal; without one, ``run.eta`` times them."""
    show = run.info.is_main and not run.cfg.quiet
    if not shows_bar(show):
        run.eta = Eta(run.start_step, run.cfg.steps)
    return progress(range(run.start_step, run.cfg.steps), start=run.start_step, total=run.cfg.steps, show=show)


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
    parser.add_argument("--verbose", action="store_true", help="transformers' and vLLM's INFO log lines too "
                        "(default: their warnings only)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. rollout.policy=grpo optim.lr=3e-5")
    args = parser.parse_intermixed_args(argv)  # overrides on both sides of --quiet
    user_env = resume_env()  # before anything sets them
    line_buffered()  # under nohup, | tee or > log each step line shows when printed, in order with stderr's
    quiet_libraries(args.verbose)
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
    except (ValueError, NonFiniteLossError, EnvFailureError, LengthCutError, OutOfSpaceError) as err:
        print(f"trace-train: {err}", file=sys.stderr)
        return 1
    except RunInterrupted as stop:
        resume = user_env + shlex.join([*(_invoked_as() if argv is None else ["trace-train"]),
                                        *(sys.argv[1:] if argv is None else argv)])
        name = "SIGTERM" if stop.signum == signal.SIGTERM else "Ctrl-C"
        say(f"trace-train: stopped by {name}; {stop}; to resume: {resume}")
        return 128 + stop.signum
    except KeyboardInterrupt:  # before the run started (loading, building)
        print("trace-train: stopped by Ctrl-C before the first step; nothing saved", file=sys.stderr)
        return 130
    leave_distributed()  # every rank ended well: leave together (a lone early exit could abort the last one)
    return 0


def _invoked_as() -> list[str]:
    """The command as typed: ``sys.argv[0]`` (``.venv/bin/trace-train``, a path to the script), or
    ``python -m trace_train.train`` when run as a module, so that the printed resume command runs when pasted."""
    first = sys.argv[0] if sys.argv and sys.argv[0] else "trace-train"
    if Path(first).name in ("train.py", "__main__.py") or first == "-m":
        return [sys.executable, "-m", "trace_train.train"]
    return [first]


def entry() -> None:
    """The ``trace-train`` command: :func:`cli`, then the process ends even if a stuck thread is left
    (``run.signals.finish_process``)."""
    raise SystemExit(finish_process(cli()))


if __name__ == "__main__":
    entry()
