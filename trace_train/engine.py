"""The tree rollout engine: TRACE's two stages on real agents, for any registered allocation policy.

One call of :meth:`RolloutEngine.rollout` turns a candidate pool of data set rows into a batch of rollout
trees. The algorithm (which prompts get how many rollouts, which prefixes get continuations, top-ups,
repeated expansion rounds, DAPO's rounds) is ``trace_theory.step.run_step``, the very driver the
simulator runs; this module is the world that answers its questions:

* **predict** candidate prompts (their opening history) or nodes (the history up to a turn boundary)
  with the caller's predictor;
* **plant** roots and **grow** rollouts (bare, top-up, continuation) from nodes: generation batched
  across all of them turn by turn, environments restored from the start node's snapshot, and the exact
  token ids of every prefix extended, never re-tokenised. Turns are scheduled by :mod:`.scheduler`:
  each rollout's next turn is requested as soon as its environment has answered, and environments of
  different rollouts run concurrently.

The distributed trainer's allocation over every rank's pool is the driver's ``root_allocator`` hook.

The result is a :class:`~.batch.RolloutBatch`: a ``RolloutForest`` (node costs are the tokens generated
for each turn) and one :class:`~.batch.NodePayload` per node with the exact token ids, loss masks,
log-probabilities, text and environment snapshot, plus a :class:`~.batch.RolloutReport` of the budget
actually spent, in rollouts and in tokens, and of the prompt tokens the back end computed or served from
its prefix cache.

Every random choice comes from one ``numpy.random.Generator`` seeded by the call's ``seed``, and every
turn of every rollout gets its own sampling seed, so a call is reproducible on a given back end, in
whatever order generations and environment calls complete.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from trace_theory import (
    KINDS,
    ForestBuilder,
    Origin,
    Prediction,
    RolloutBudget,
    RolloutForest,
    get_policy,
    run_step,
)
from trace_theory.step import Starts, StepRecord

from .backends.base import GenerationBackend, Sampling
from .batch import History, NodePayload, Predictor, RolloutBatch, RolloutReport, Trajectory
from .chat import ChatFormat
from .envs.base import Environment, EpisodeLimits, Message
from .scheduler import SCHEDULES, Timeline, grow

__all__ = ["History", "Predictor", "NodePayload", "Trajectory", "RolloutReport", "RolloutBatch",
           "RolloutConfig", "RolloutEngine"]


# ---------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutConfig:
    """How one call of :meth:`RolloutEngine.rollout` spends its budget."""

    policy: str = "trace"
    """Allocation policy, by its name in ``trace_theory.POLICIES``."""
    pool_size: int = 16
    """Candidate prompts per call (per rank); the policy chooses among them (trace-train draws the pool)."""
    roots: int = 16
    """M: bare rollouts (over all ranks); a flat policy spends M (1 + N) of them instead."""
    continuations_per_root: int = 1
    """N: continuations per bare rollout for branching policies."""
    token_budget: int | None = None
    """If set, M is derived from this many generated tokens (see :meth:`RolloutEngine.plan`)."""
    group_size: int = 8
    """G for the uniform and PCL root rules (and DAPO's rounds)."""
    min_group: int | None = None
    """Smallest non-zero group (None: the policy's own, 2); trace-eval sets 1 to play every task k times."""
    dapo_target: int | None = None
    """Mixed groups DAPO tries to keep; None: ``AllocationPolicy.dynamic_target`` (half of the groups
    the budget pays for, at least 1). Only for a policy with dynamic sampling."""
    expansion_rounds: int = 1
    """R: rounds of prefix expansion for a branching policy (``trace_theory.step``; the paper: 1)."""
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
    """How turns are scheduled (:mod:`.scheduler`): "concurrent" (each rollout's next turn is requested
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
        policy = get_policy(self.policy)  # unknown names fail here, with the list of known ones
        if isinstance(self.pool_size, bool) or not isinstance(self.pool_size, int) or self.pool_size < 1:
            raise ValueError(f"`pool_size` must be a positive integer, got {self.pool_size!r}")
        RolloutBudget(self.roots, self.continuations_per_root)  # validates M and N
        if self.roots < 1:
            raise ValueError(f"`roots` must be at least 1 (M bare rollouts per step), got {self.roots}")
        if self.token_budget is not None and (isinstance(self.token_budget, bool) or self.token_budget < 1):
            raise ValueError(f"`token_budget` must be a positive integer or None, got {self.token_budget!r}")
        self.allocation_policy  # validates G, the smallest group and the DAPO target against the policy
        if isinstance(self.expansion_rounds, bool) or not isinstance(self.expansion_rounds, int) \
                or self.expansion_rounds < 1:
            raise ValueError(f"`expansion_rounds` must be a positive integer, got {self.expansion_rounds!r}")
        Sampling(temperature=self.temperature, top_p=self.top_p)  # validates both
        if not isinstance(self.limits, EpisodeLimits):
            raise ValueError(f"`limits` must be an EpisodeLimits, got {type(self.limits).__name__}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"`schedule` must be one of {SCHEDULES}, got {self.schedule!r}")
        workers = self.env_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"`env_workers` must be a positive integer, got {self.env_workers!r}")
        if self.env_timeout_s is not None and not 0 < self.env_timeout_s < float("inf"):
            raise ValueError(f"`env_timeout_s` must be a positive number of seconds or None, "
                             f"got {self.env_timeout_s!r}")
        if policy.dynamic_sampling and not self.binary_rewards:
            raise ValueError(f"policy {self.policy!r} keeps groups with mixed 0/1 rewards: "
                             "it needs binary_rewards=True")

    @property
    def allocation_policy(self):
        changes = {} if self.min_group is None else {"min_group": self.min_group}
        if self.dapo_target is not None:
            changes["dapo_target"] = self.dapo_target
        return get_policy(self.policy, group_size=self.group_size, **changes)

    @property
    def needs_predictor(self) -> bool:
        return self.allocation_policy.needs_predictor


# ---------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------


class RolloutEngine:
    """Grows rollout forests with a generation back end and an environment (see the module docstring).

    Parameters
    ----------
    backend : GenerationBackend
        Where tokens come from.
    make_env : callable
        Returns a fresh :class:`~.envs.base.Environment`; one is made per rollout.
    config : RolloutConfig
    chat : ChatFormat, optional
        Token-level chat formatting; defaults to the back end tokenizer's template.
    root_allocator : callable, optional
        ``root_allocator(policy, v, budget, *, rng, concentration) -> m`` replaces
        ``policy.allocate_roots(v, budget, rng=rng, concentration=concentration)``. The distributed
        trainer passes one that allocates the budget over the candidate pools of all ranks together
        (``trace_train.distributed.GlobalRootAllocator``).
    """

    def __init__(self, backend: GenerationBackend, make_env: Callable[[], Environment], config: RolloutConfig,
                 *, chat: ChatFormat | None = None, root_allocator: Callable | None = None):
        if not isinstance(config, RolloutConfig):
            raise ValueError(f"`config` must be a RolloutConfig, got {type(config).__name__}")
        self.backend = backend
        self.make_env = make_env
        self.config = config
        self.chat = chat or ChatFormat(backend.tokenizer)
        self.root_allocator = root_allocator
        self.sampling = Sampling(temperature=config.temperature, top_p=config.top_p,
                                 max_new_tokens=config.limits.max_turn_tokens,
                                 stop_token_ids=self.chat.stop_token_ids)
        self.tokens_per_rollout: float | None = None
        """Generated tokens per bare rollout, averaged over calls (weight 1/2 on the latest), for ``plan``."""
        self.continuation_cost_ratio: float = 0.5
        """Tokens of a continuation relative to a bare rollout, averaged the same way from a prior of 0.5."""

    # -----------------------------------------------------------------------------------------------

    def plan(self) -> RolloutBudget:
        """The budget of the next call, unsplit: ``run_step`` applies the policy's split (the report's
        ``planned`` is the split budget, from the step record).

        With a rollout budget this is ``RolloutBudget(M, N)``. With ``token_budget`` T,
        a flat policy gets M = T / L roots and a branching one M = T / (L (1 + N c)), where L is the
        average of tokens per bare rollout over earlier calls (initially half of ``max_turns *
        max_turn_tokens``) and c that of a continuation's tokens relative to a bare rollout's: equal
        tokens in expectation, with what was actually spent in the report.
        """
        cfg, policy = self.config, self.config.allocation_policy
        if cfg.token_budget is None:
            return RolloutBudget(cfg.roots, cfg.continuations_per_root)
        tokens = self.tokens_per_rollout or 0.5 * cfg.limits.max_turns * cfg.limits.max_turn_tokens
        n = cfg.continuations_per_root if policy.branches else 0
        roots = int(cfg.token_budget // (tokens * (1.0 + n * self.continuation_cost_ratio)))
        if roots < policy.min_group:
            raise ValueError(f"`token_budget` {cfg.token_budget} pays for {roots} rollouts of about "
                             f"{tokens:.0f} tokens; policy {cfg.policy!r} needs at least {policy.min_group}")
        return RolloutBudget(roots, n)

    def rollout(self, pool: Sequence[Mapping[str, Any]], *, predictor: Predictor | None = None,
                seed: int | None = None) -> RolloutBatch:
        """Allocate the budget over ``pool`` and generate the rollout trees (see the module docstring)."""
        cfg = self.config
        pool = list(pool)
        if not pool:
            raise ValueError("`pool` must hold at least one data set row")
        if predictor is None and cfg.needs_predictor:
            raise ValueError(f"policy {cfg.policy!r} allocates by predicted success: pass `predictor`")
        if cfg.allocation_policy.posterior and not hasattr(predictor, "concentration"):
            raise ValueError(f"policy {cfg.policy!r} needs a predictor with a "
                             "`concentration(histories)` method")
        run = _Run(self, pool, predictor, np.random.default_rng(cfg.seed if seed is None else seed))
        batch = run.execute(self.plan())
        self._learn_costs(batch)
        return batch

    def _learn_costs(self, batch: RolloutBatch) -> None:
        """Update the running token estimates used by :meth:`plan` (halving the weight of the past)."""
        f = batch.forest
        starts = f.starts_rollout
        bare = [_rollout_tokens(f, s) for s in np.flatnonzero(starts & (f.origin == Origin.BARE))]
        branch = [_rollout_tokens(f, s) for s in np.flatnonzero(starts & (f.origin == Origin.CONTINUATION))]
        if not bare:
            return
        mean = float(np.mean(bare))
        previous = mean if self.tokens_per_rollout is None else self.tokens_per_rollout
        self.tokens_per_rollout = 0.5 * (previous + mean)
        if branch and mean > 0:
            ratio = float(np.mean(branch)) / mean
            self.continuation_cost_ratio = 0.5 * (self.continuation_cost_ratio + ratio)


def _rollout_tokens(forest: RolloutForest, start: int) -> float:
    """Tokens of the rollout that begins at ``start``: its turns along first children."""
    total, node = 0.0, int(start)
    while node != -1:
        total += float(forest.cost[node])
        node = int(forest.first_child[node])
    return total


class _Run:
    """The state of one ``rollout`` call: the growing forest, its payloads and the accounting."""

    def __init__(self, engine: RolloutEngine, pool, predictor, rng: np.random.Generator):
        self.engine, self.cfg, self.chat = engine, engine.config, engine.chat
        self.policy = engine.config.allocation_policy
        self.pool, self.predictor, self.rng = pool, predictor, rng
        self.builder = ForestBuilder(binary_rewards=engine.config.binary_rewards)
        self.parent: list[int] = []
        self.nodes: list[NodePayload] = []
        self.rows: dict[int, Mapping[str, Any]] = {}
        self.nodes_prompt: dict[int, int] = {}
        self.next_seed = int(rng.integers(0, 2**30))
        self.counts = dict.fromkeys(KINDS, 0)  # also counted by the driver's record, which the report uses
        self.prefix_tokens = self.prefix_cached = 0
        self.end_reasons: dict[str, int] = {}
        self.stats_before = engine.backend.stats.copy()
        self.start = time.perf_counter()
        self.timeline = Timeline()
        self.rollout_env_seconds: list[float] = []
        self.env_error_sample: str | None = None  # the first env_error/env_timeout (set by the scheduler)
        self.phase_seconds = dict.fromkeys(("predict", "bare_generation", "expansion_generation"), 0.0)
        self._openings: dict[int, tuple[list[Message], list[int], Any]] = {}

    # ---- tree bookkeeping -------------------------------------------------------------------------

    def _path(self, node: int) -> list[int]:
        """Node ids from the root down to ``node``."""
        path = [node]
        while self.parent[path[-1]] != -1:
            path.append(self.parent[path[-1]])
        return path[::-1]

    def _context(self, node: int) -> list[int]:
        return [t for n in self._path(node) for t in self.nodes[n].token_ids]

    def _append(self, node: int, parent: int, payload: NodePayload) -> None:
        assert node == len(self.nodes), "payloads are kept in node-id order"
        self.parent.append(parent)
        self.nodes.append(payload)

    # ---- predictions ------------------------------------------------------------------------------

    def _opening(self, prompt: int):
        """Opening messages, prompt ids and initial snapshot of a pool row (computed once)."""
        if prompt not in self._openings:
            env = self.engine.make_env()
            messages = env.reset(self.pool[prompt])
            ids = self.chat.prompt_ids(messages)
            if len(ids) >= self.cfg.limits.max_context_tokens:
                raise ValueError(f"prompt {prompt} has {len(ids)} tokens; `max_context_tokens` is "
                                 f"{self.cfg.limits.max_context_tokens}")
            self._openings[prompt] = (messages, ids, env.snapshot())
        return self._openings[prompt]

    def _history(self, prompt: int, node: int | None = None) -> History:
        """The history of a pool row's opening (``node`` None) or of an existing node."""
        if node is None:
            messages, ids, _ = self._opening(prompt)
            return History(prompt, self.pool[prompt], 0, tuple(messages), tuple(ids))
        path = self._path(node)
        return History(prompt, self.pool[prompt], len(path) - 1,
                       tuple(m for n in path for m in self.nodes[n].messages), tuple(self._context(node)))

    def _predict(self, histories: list[History], concentration: bool) -> Prediction:
        if not histories:
            return Prediction(np.zeros(0), np.zeros(0) if concentration else None)
        t0 = time.perf_counter()
        v = np.asarray(self.predictor(histories), dtype=float)
        kappa = np.asarray(self.predictor.concentration(histories), dtype=float) if concentration else None
        self.phase_seconds["predict"] += time.perf_counter() - t0
        return Prediction(v, kappa)

    # ---- the driver's questions (trace_theory.step.World) -----------------------------------------

    def predict_prompts(self, prompts: np.ndarray, *, concentration: bool) -> Prediction:
        return self._predict([self._history(int(i)) for i in prompts], concentration)

    def predict_nodes(self, nodes: np.ndarray, *, concentration: bool) -> Prediction:
        return self._predict([self._history(self._prompt_of(int(n)), int(n)) for n in nodes], concentration)

    def plant(self, prompts: np.ndarray, counts: np.ndarray) -> RolloutForest:
        roots = self._add_roots(prompts.tolist())
        starts = [(root, "bare", int(k)) for root, k in zip(roots, counts)]
        t0 = time.perf_counter()
        if starts:
            self._grow(starts)
        self.phase_seconds["bare_generation"] += time.perf_counter() - t0
        return self.builder.build()

    def grow(self, starts: Starts) -> RolloutForest:
        t0 = time.perf_counter()
        if len(starts):
            self._grow(starts.tuples())
        self.phase_seconds["expansion_generation"] += time.perf_counter() - t0
        return self.builder.build()

    def _prompt_of(self, node: int) -> int:
        """The pool index of ``node``'s prompt."""
        return self.nodes_prompt[self._path(node)[0]]

    def execute(self, budget: RolloutBudget) -> RolloutBatch:
        record = run_step(self, self.policy, budget, pool=len(self.pool), rng=self.rng,
                          expansion_rounds=self.cfg.expansion_rounds,
                          root_allocator=self.engine.root_allocator)
        return self._finish(record)

    def _add_roots(self, prompts: list[int]) -> list[int]:
        """A root per prompt; returns their node ids in order."""
        roots = []
        for prompt in prompts:
            messages, ids, snapshot = self._opening(prompt)
            root = self.builder.add_root(prompt)
            self._append(root, -1, NodePayload((), (), "", tuple(ids), "", tuple(messages), snapshot))
            self.nodes_prompt[root] = prompt
            self.rows[prompt] = self.pool[prompt]
            roots.append(root)
        return roots

    # ---- generation and environments ------------------------------------------------------------

    def _grow(self, starts: list[tuple[int, str, int]]) -> None:
        """Generate ``k`` rollouts from each ``(node, kind, k)`` (:func:`.scheduler.grow`)."""
        grow(self, starts)

    # ---- result -----------------------------------------------------------------------------------

    def _finish(self, record: StepRecord) -> RolloutBatch:
        seconds = time.perf_counter() - self.start
        forest = record.forest
        stats = self.engine.backend.stats.since(self.stats_before)
        counts = record.counts
        report = RolloutReport(
            policy=self.cfg.policy, planned=record.planned, rollouts=forest.n_leaves,
            bare_rollouts=counts["bare"] + counts["top_up"], continuations=counts["continuation"],
            top_up_rollouts=counts["top_up"], generated_tokens=int(forest.cost.sum()),
            prompt_tokens=stats.prompt_tokens, cached_prompt_tokens=stats.cached_prompt_tokens,
            continuation_prefix_tokens=self.prefix_tokens, continuation_prefix_cached=self.prefix_cached,
            rounds=record.rounds, end_reasons=dict(sorted(self.end_reasons.items())),
            seconds=seconds, **self.timeline.report(seconds), continuations_by_round=record.continuations_by_round,
            max_rollout_env_seconds=max(self.rollout_env_seconds, default=0.0),
            env_error_sample=self.env_error_sample, phase_seconds=dict(self.phase_seconds),
        )
        return RolloutBatch(forest, tuple(self.nodes), dict(self.rows), record.node_predictions(), report,
                            kept=record.kept)
