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
its first traceback in ``env_errors/`` (``trace_train/README.md``, "Run directories").
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from trace_theory import compute_advantages

from .backends import training_backend
from .backends.base import generator_asleep, pad_token_id
from .config_loader import config_to_dict, describe, load_config
from .configs import RolloutConfig, TrainConfig
from .data.sampler import PromptSampler
from .envs.tooling import chat_format
from .run.collapse import CollapseWatch
from .run.console import eval_line, metrics_line, progress, quiet_libraries, say
from .preflight import check_device, check_model
from .predictors import PosteriorPredictor, build_predictor, predictor_from_state_dict
from .predictors.fitting import PredictorFit, attach_policy_states, check_one_predictor
from .rollout.batch import RolloutBatch
from .rollout.engine import RolloutEngine
from .run.checkpoint import (Checkpoint, capture_rng, check_world_size, clean_partial_checkpoints,
                             load_latest_checkpoint, restore_rng, save_checkpoint)
from .run.distributed import (DistInfo, GlobalRootAllocator, checkpoint_state_dict, full_optimizer_state_dict,
                              gather_objects, init_distributed, iter_full_tensors, load_full_optimizer_state_dict,
                              max_over_ranks, shard_policy)
from .run.files import OutOfSpaceError, RunLock, reporting_full_disk, writable_dir
from .run.metrics_log import MetricsLogger, read_metrics
from .run.policy import checkpoint_activations, export, load_policy, load_policy_weights, model_path
from .run.resume import check_or_write_config, resume_fingerprint
from .run.step_metrics import step_metrics
from .run.threads import set_compute_threads
from .tasks import Task, build_task
from .update.optimizer_step import NonFiniteLossError
from .update.optimizer_step import policy_update as _policy_update
from .update.packing import training_batch_for

__all__ = ["TrainConfig", "Run", "build_run", "main", "PromptSampler", "NonFiniteLossError", "EnvFailureError",
           "RunInterrupted", "cli"]


class EnvFailureError(RuntimeError):
    """Too many rollouts of a step ended in an environment failure; the run stopped after a checkpoint."""


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM ended the run; ``signum`` says which, the message what was saved."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum


# ---------------------------------------------------------------------------------------------------
# One step's pieces
# ---------------------------------------------------------------------------------------------------


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
    collapse: CollapseWatch = field(default_factory=lambda: CollapseWatch(eval_rollouts=1))
    """Warns when tokens per rollout or held-out success move the way a collapse does (``run/collapse.py``)."""

    def checkpoint(self, step: int) -> Path | None:
        extra = {"predictor": self.predictor.state_dict(), "sampler": self.sampler.state(),
                 "engine_costs": (self.engine.tokens_per_rollout, self.engine.continuation_cost_ratio),
                 "eager_threshold": self.engine.eager_threshold}
        weights = checkpoint_state_dict(self.policy, self.info)
        optimizer = full_optimizer_state_dict(self.policy, self.optimizer, self.info)
        if self.info.enabled:  # what differs between ranks: each rank's random states and cost estimates
            extra["ranks"] = gather_objects({"rng": capture_rng(), "engine_costs": extra["engine_costs"],
                                             "eager_threshold": extra["eager_threshold"],
                                             "predictor_digest": self.predictor.digest()}, self.info)
            check_one_predictor([r["predictor_digest"] for r in extra["ranks"]])
        if not self.info.is_main:
            return None
        self.saved_step = step
        return save_checkpoint(Path(self.cfg.run_dir), step, policy=weights, optimizer=optimizer,
                               extra=extra, config_fingerprint=resume_fingerprint(self.cfg),
                               keep=self.cfg.keep_checkpoints)

    def resume(self, ckpt: Checkpoint) -> None:
        check_world_size(ckpt, self.info.world_size)
        if ckpt.config_fingerprint != resume_fingerprint(self.cfg):
            raise ValueError(f"checkpoint {ckpt.path} was written under another config; use another run_dir "
                             "(only steps, checkpointing and logging may change)")
        load_policy_weights(self.policy, ckpt.policy, self.info)
        load_full_optimizer_state_dict(self.policy, self.optimizer, ckpt.optimizer, self.info)
        self.predictor = predictor_from_state_dict(ckpt.extra["predictor"])
        self.sampler.load_state(ckpt.extra["sampler"])
        own = ckpt.extra
        if self.info.enabled:  # this rank's own states, not rank 0's
            own = ckpt.extra["ranks"][self.info.rank]
            restore_rng(own["rng"])
        self.engine.tokens_per_rollout, self.engine.continuation_cost_ratio = own["engine_costs"]
        self.engine.eager_threshold = own.get("eager_threshold")  # eager expansion's carried level (absent: older)
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


def build_run(cfg: TrainConfig) -> Run:
    """Set up (or resume) a run: task, policy, generation back end, rollout engines, predictor, sampler."""
    check_device(cfg.device), check_model(cfg.model.name_or_path)  # one line each, before anything loads
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


def _lock_run_dir(run_dir: Path, info: DistInfo) -> RunLock | None:
    """One run per directory (rank 0 holds ``run.lock``); then remove what killed checkpoint writes left."""
    if not info.is_main:
        return None
    lock = RunLock(run_dir).acquire()
    clean_partial_checkpoints(run_dir)
    return lock


def _build_run(cfg: TrainConfig, info: DistInfo, run_dir: Path, lock: RunLock | None) -> Run:
    check_or_write_config(cfg, run_dir, write=info.is_main)
    task = build_task(cfg.task, seed=cfg.seed, hold_out=cfg.eval.every > 0)
    if info.is_main:
        print(task.describe(cfg.task.name), flush=True)
    path = model_path(cfg.model, cfg.run_dir, seed=cfg.seed, task=task) if info.is_main else None
    if info.enabled:
        paths = [path]
        torch.distributed.broadcast_object_list(paths, src=0)
        path = paths[0]
    # fp32 master weights; under FSDP loaded on the CPU and sharded there, so that each GPU only ever holds
    # its shard (a whole fp32 8B policy is 32 GB) and vLLM, built next, sizes its cache on a GPU without it
    policy, tokenizer = load_policy(path, "cpu" if info.enabled else info.device, torch.float32)
    if cfg.model.activation_checkpointing:
        checkpoint_activations(policy)
    compute = getattr(torch, cfg.model.dtype)
    if info.enabled:
        shard_policy(policy, compute_dtype=compute).to(info.device)
    backend = training_backend(cfg, path, device=info.device, policy=policy, tokenizer=tokenizer, sharded=info.enabled)
    ref = None
    if cfg.algorithm.loss.kl_coef > 0:  # frozen, in model.dtype; under FSDP sharded like the policy
        ref, _ = load_policy(path, "cpu" if info.enabled else info.device, compute)
        ref.requires_grad_(False).eval()
        if info.enabled:
            shard_policy(ref, compute_dtype=compute).to(info.device)
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
    attach_policy_states(run.predictor, policy, distributed=info.enabled, compute_dtype=getattr(torch, cfg.model.dtype))
    if info.is_main:
        run.logger = MetricsLogger(run_dir, resume_step=run.start_step if ckpt is not None else None,
                                   tensorboard=cfg.tensorboard, wandb_project=cfg.wandb_project,
                                   config=config_to_dict(cfg))
        run.collapse = CollapseWatch(eval_rollouts=min(cfg.eval.prompts, len(task.eval_rows)) * cfg.eval.samples)
        if ckpt is not None:
            run.collapse.replay(read_metrics(run.logger.path))
    return run


# ---------------------------------------------------------------------------------------------------
# The run: one step is the algorithm's lines
# ---------------------------------------------------------------------------------------------------


def main(cfg: TrainConfig) -> dict[str, Any]:
    """Run (or resume) training; returns the last step's metrics."""
    run = build_run(cfg)
    metrics: dict[str, Any] = {}
    stop = _StopOnSignal(run)
    try:
        if run.start_step == 0:
            run.log(0, first := run.evaluate(0))
            if run.info.is_main and not cfg.quiet and eval_line(0, cfg.steps, first):
                say(eval_line(0, cfg.steps, first), file=sys.stdout)
            run.collapse.check(0, first)  # the start that held-out success is compared with
        for step in _progress(range(run.start_step, cfg.steps), run.info, run.start_step, cfg.steps, cfg.quiet):
            t0 = time.perf_counter()
            pool = run.sampler.next_pool()                                       # candidate prompts
            batch = run.engine.rollout(pool, predictor=run.predictor,            # predict V~, allocate roots and
                                       seed=_step_seed(cfg.seed, step, run.info.rank))  # prefixes, generate
            t1 = time.perf_counter()
            if not cfg.algorithm.train_env_failures:                             # a faulted rollout counts as
                batch = batch.without_env_failures()                             # not sampled (budget aside)
            advantages = compute_advantages(batch.forest, cfg.algorithm.advantage)   # tree advantages
            sequences = training_batch_for(batch, advantages, cfg, pad_token_id=pad_token_id(run.tokenizer))
            fit = _start_fit(run, batch)    # predictor update (background), started after the Python-heavy
            t2 = time.perf_counter()        # packing so as not to contend with it
            update = _guarded_policy_update(run, sequences, fit, step)          # clipped policy gradient
            run.optimizer.zero_grad(set_to_none=True)  # gradients' memory free while vLLM syncs and generates
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
    export(run.policy, run.tokenizer, Path(cfg.run_dir) / "hf", run.info)
    if run.info.is_main:
        print(f"run finished: {cfg.steps} steps in {cfg.run_dir} (metrics.jsonl, checkpoints/, hf/ for "
              "trace-eval and vLLM)", file=sys.stderr)
    return metrics


def _close(run: Run, stop: "_StopOnSignal") -> None:
    """Put the signal handlers back, wait for the predictor fit, close the logs, release the run's lock."""
    stop.restore()
    run.workers.shutdown(wait=True)
    if run.logger is not None:
        run.logger.close()
    if run.lock is not None:
        run.lock.release()


def _after_step(run: Run, step: int, batch: RolloutBatch, metrics: dict, stop: "_StopOnSignal") -> None:
    """Print the step's line, stop on failing environments, checkpoint on schedule or on a signal."""
    cfg = run.cfg
    if run.info.is_main and not cfg.quiet and cfg.log_every and step % cfg.log_every == 0:
        say(metrics_line(step, cfg.steps, metrics, lr=run.optimizer.param_groups[0]["lr"]), file=sys.stdout)
    for warning in run.collapse.check(step, metrics) if run.info.is_main else ():
        say(f"trace-train: warning: {warning}")
    failed = _check_env_failures(run, step, batch, metrics)
    stopping = max_over_ranks(int(stop.requested), run.info)  # every rank stops at the same step
    if failed or stopping or step % cfg.checkpoint_every == 0 or step == cfg.steps:
        run.checkpoint(step)
    if failed:
        raise EnvFailureError(failed + f"; stopped with a checkpoint of step {step}")
    if stopping:
        raise RunInterrupted(stop.signum, f"saved a checkpoint of step {step}")


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
        path = Path(cfg.run_dir) / "env_errors" / f"step_{step:08d}.txt"
        with reporting_full_disk(path):
            path.parent.mkdir(exist_ok=True)
            path.write_text(sample)
        lines = [ln for ln in sample.strip().splitlines() if ln.strip()]
        first, where = lines[-1].strip() if len(lines) > 1 else lines[0], f"traceback in {path}"
    text = (f"step {step}: {int(metrics['env_failures'])} of {int(metrics['rollouts'])} rollouts ({share:.0%}) ended "
            f"in an environment failure: {first}; {where}")
    if share > cfg.max_env_failure_share:
        return text + f" (more than max_env_failure_share={cfg.max_env_failure_share})"
    say(f"trace-train: warning: {text}")
    return None


class _StopOnSignal:
    """SIGINT and SIGTERM ask the run to stop after the current step (with a checkpoint of it); a second
    signal stops it at once (the newest checkpoint on disk is kept). Installed in the main thread only."""

    def __init__(self, run: Run):
        self.run, self.requested, self.signum, self._previous = run, False, 0, {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            saved = self.run.saved_step
            raise RunInterrupted(signum, "nothing saved since the start" if saved is None else
                                 f"nothing saved since step {saved} (its checkpoint is kept)")
        self.requested, self.signum = True, signum
        if self.run.info.is_main:
            say("trace-train: stopping after this step (signal again to stop at once)")

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def _guarded_policy_update(run: Run, sequences, fit: PredictorFit, step: int) -> dict:
    """:func:`_policy_update`; a non-finite loss stops the run with a checkpoint of the last good step."""
    try:
        with generator_asleep(run.backend):  # vLLM with backend.sleep_during_update frees the GPU meanwhile
            return _policy_update(run.policy, run.optimizer, sequences, run.cfg, run.info, ref=run.ref)
    except NonFiniteLossError as err:
        fit.result()  # never save the predictor mid-fit (as before the fit moved to a thread, it includes it)
        saved = run.checkpoint(step)
        raise NonFiniteLossError(f"step {step + 1}: {err}; stopped with a checkpoint of step {step} at "
                                 f"{saved}. Lower optim.lr or raise optim.grad_clip's strictness.") from None


def _sync_weights(run: Run) -> None:
    """Copy the policy's weights into a generation back end that does not share them (vLLM, FSDP).

    vLLM takes them as a stream (``backends.vllm_backend.VLLMBackend.update_weights``): each parameter is
    gathered (under FSDP, its shards cast to ``model.dtype`` first), loaded, and freed before the next, so
    the sync's peak is one parameter, not a second full copy of the model."""
    if getattr(run.backend, "model", None) is not run.policy:  # a transformers back end may share the weights
        dtype = getattr(torch, run.cfg.model.dtype)  # the fp32 masters, rounded once for the generator
        weights = iter_full_tensors(run.policy, run.info, dtype)
        if not getattr(run.backend, "streams_weights", False):
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


def _progress(steps, info: DistInfo, start: int, total: int, quiet: bool = False):
    return progress(steps, start=start, total=total, show=info.is_main and not quiet)


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
    args = parser.parse_args(argv)
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
    except (ValueError, NonFiniteLossError, EnvFailureError, OutOfSpaceError) as err:
        print(f"trace-train: {err}", file=sys.stderr)
        return 1
    except RunInterrupted as stop:
        resume = shlex.join([*(_invoked_as() if argv is None else ["trace-train"]),
                             *(sys.argv[1:] if argv is None else argv)])
        name = "SIGTERM" if stop.signum == signal.SIGTERM else "Ctrl-C"
        say(f"trace-train: stopped by {name}; {stop}; to resume: {resume}")
        return 128 + stop.signum
    except KeyboardInterrupt:  # before the run started (loading, building)
        print("trace-train: stopped by Ctrl-C before the first step; nothing saved", file=sys.stderr)
        return 130
    return 0


def _invoked_as() -> list[str]:
    """The command as typed: ``sys.argv[0]`` (``.venv/bin/trace-train``, a path to the script), or
    ``python -m trace_train.train`` when run as a module, so that the printed resume command runs when pasted."""
    first = sys.argv[0] if sys.argv and sys.argv[0] else "trace-train"
    if Path(first).name in ("train.py", "__main__.py") or first == "-m":
        return [sys.executable, "-m", "trace_train.train"]
    return [first]


if __name__ == "__main__":
    raise SystemExit(cli())
