"""The tree rollout engine: TRACE's two stages on real agents, for any registered allocation policy.

One call of :meth:`RolloutEngine.rollout` turns a candidate pool of data set rows into a batch of rollout
trees:

1. **Roots.** The predictor scores every candidate's opening history; the policy
   (``trace_theory.get_policy``) splits the budget (``AllocationPolicy.split``) and allocates group sizes
   (``AllocationPolicy.allocate_roots``). The bare rollouts of all selected prompts are generated
   together (:mod:`.scheduler`: each rollout's next turn is requested as soon as its environment has
   answered, and environments of different rollouts run concurrently).
2. **Prefixes.** For branching policies the predictor scores every non-terminal turn boundary of the bare
   rollouts (``RolloutForest.prefix_anchors``); ``AllocationPolicy.allocate_prefixes`` places the
   continuations within each prompt's budget m_i N; budget that no prefix can take becomes extra bare
   rollouts (``top_up_roots``). Continuations restore the environment snapshot of their prefix, extend its
   exact token ids, and are generated together with the top-ups.

DAPO-style dynamic sampling (a policy with ``dynamic_sampling``) runs rounds of stage 1 over fresh prompts
from the pool, as ``trace_theory.DynamicSamplingState`` decides, until it holds its target of mixed groups
or its budget is spent.

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
    DynamicSamplingState,
    ForestBuilder,
    Origin,
    RolloutBudget,
    RolloutForest,
    get_policy,
    top_up_roots,
)

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
    roots: int = 16
    """M: bare rollouts (a flat policy spends M (1 + N) of them instead)."""
    continuations_per_root: int = 1
    """N: continuations per bare rollout for branching policies."""
    token_budget: int | None = None
    """If set, M is derived from this many generated tokens (see :meth:`RolloutEngine.plan`)."""
    group_size: int = 8
    """G for the uniform and PCL root rules (and DAPO's rounds)."""
    dapo_target: int | None = None
    """Mixed groups DAPO tries to keep; default: half of the groups the budget pays for (at least 1)."""
    temperature: float = 1.0
    """Sampling temperature of every turn."""
    top_p: float = 1.0
    """Nucleus sampling threshold of every turn."""
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    """Turn, per-turn token and context limits (see :mod:`trace_train.envs.base`)."""
    binary_rewards: bool = True
    """Whether the verifier's rewards are 0/1 (checked by the forest); False allows graded rewards."""
    seed: int = 0
    """Seed of a call that passes none."""
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
        RolloutBudget(self.roots, self.continuations_per_root)  # validates M and N
        if self.token_budget is not None and (isinstance(self.token_budget, bool) or self.token_budget < 1):
            raise ValueError(f"`token_budget` must be a positive integer or None, got {self.token_budget!r}")
        policy.replace(group_size=self.group_size)  # validates G against the policy's other fields
        if self.dapo_target is not None and self.dapo_target < 1:
            raise ValueError(f"`dapo_target` must be at least 1, got {self.dapo_target}")
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
        return get_policy(self.policy, group_size=self.group_size)

    @property
    def needs_predictor(self) -> bool:
        p = self.allocation_policy
        return p.root_rule in ("active", "pcl") or p.prefix_rule == "active"


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
        ``root_allocator(policy, v, budget, rng, concentration) -> m`` replaces
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
        self.root_allocator = root_allocator or _allocate_roots_locally
        self.sampling = Sampling(temperature=config.temperature, top_p=config.top_p,
                                 max_new_tokens=config.limits.max_turn_tokens,
                                 stop_token_ids=self.chat.stop_token_ids)
        self.tokens_per_rollout: float | None = None
        """Generated tokens per bare rollout, averaged over calls (weight 1/2 on the latest), for ``plan``."""
        self.continuation_cost_ratio: float = 0.5
        """Tokens of a continuation relative to a bare rollout, averaged the same way from a prior of 0.5."""

    # -----------------------------------------------------------------------------------------------

    def plan(self) -> RolloutBudget:
        """The budget of the next call after the policy's split.

        With a rollout budget this is ``policy.split(RolloutBudget(M, N))``. With ``token_budget`` T,
        a flat policy gets M = T / L roots and a branching one M = T / (L (1 + N c)), where L is the
        average of tokens per bare rollout over earlier calls (initially half of ``max_turns *
        max_turn_tokens``) and c that of a continuation's tokens relative to a bare rollout's: equal
        tokens in expectation, with what was actually spent in the report.
        """
        cfg, policy = self.config, self.config.allocation_policy
        if cfg.token_budget is None:
            return RolloutBudget(*policy.split(RolloutBudget(cfg.roots, cfg.continuations_per_root)))
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


def _allocate_roots_locally(policy, v, budget, rng, concentration):
    """The default root allocator: this process's pool is the whole candidate pool."""
    return policy.allocate_roots(v, budget, rng=rng, concentration=concentration)


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
        self.predictions: dict[int, float] = {}
        self.rows: dict[int, Mapping[str, Any]] = {}
        self.next_seed = int(rng.integers(0, 2**30))
        self.counts = {"bare": 0, "continuation": 0, "top_up": 0, "rounds": 0}
        self.prefix_tokens = self.prefix_cached = 0
        self.end_reasons: dict[str, int] = {}
        self.stats_before = engine.backend.stats.copy()
        self.start = time.perf_counter()
        self.timeline = Timeline()
        self.rollout_env_seconds: list[float] = []
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

    def _predict(self, histories: list[History]) -> tuple[np.ndarray, np.ndarray | None]:
        if self.predictor is None:
            return np.full(len(histories), 0.5), None
        if not histories:
            return np.zeros(0), None
        v = np.asarray(self.predictor(histories), dtype=float)
        if v.shape != (len(histories),) or not np.all((v >= 0) & (v <= 1)):
            raise ValueError(f"the predictor must return {len(histories)} probabilities in [0, 1], got {v!r}")
        if not self.policy.posterior:
            return v, None
        return v, np.asarray(self.predictor.concentration(histories), dtype=float)

    # ---- the two stages ---------------------------------------------------------------------------

    def execute(self, planned: RolloutBudget) -> RolloutBatch:
        if self.policy.dynamic_sampling:
            self._dynamic_sampling(planned.total)
            return self._finish(planned)
        prompts = list(range(len(self.pool)))
        v, kappa = self._predict([self._history(i) for i in prompts])
        m = np.asarray(self.engine.root_allocator(self.policy, v, planned.roots, self.rng, kappa), dtype=np.int64)
        roots = self._add_roots(prompts, m, v)
        m = m[m > 0]
        self._grow([(root, "bare", int(k)) for root, k in zip(roots, m)])
        self.counts["rounds"] = 1
        if self.policy.branches and planned.continuations_per_root > 0 and roots:
            self._expand(roots, m, m * planned.continuations_per_root)
        return self._finish(planned)

    def _add_roots(self, prompts: list[int], m: np.ndarray, v: np.ndarray) -> list[int]:
        """A root per prompt with a positive group size; returns their node ids in prompt order."""
        roots = []
        for prompt, count, pred in zip(prompts, m, v):
            if count > 0:
                messages, ids, snapshot = self._opening(prompt)
                root = self.builder.add_root(prompt)
                self._append(root, -1, NodePayload((), (), "", tuple(ids), "", tuple(messages), snapshot))
                self.predictions[root] = float(pred)
                self.rows[prompt] = self.pool[prompt]
                roots.append(root)
        return roots

    def _dynamic_sampling(self, budget: int) -> None:
        """DAPO: rounds of G rollouts on fresh prompts (pool order) until the target of mixed groups."""
        g = self.policy.group_size
        state = DynamicSamplingState(target=self.cfg.dapo_target or max(1, budget // (2 * g)), group_size=g,
                                     budget=budget)
        drawn = 0
        while not state.done and drawn < len(self.pool):
            prompts = list(range(drawn, min(len(self.pool), drawn + state.next_round())))
            drawn += len(prompts)
            first_new = len(self.nodes)
            roots = self._add_roots(prompts, np.full(len(prompts), g), np.full(len(prompts), np.nan))
            self._grow([(root, "bare", g) for root in roots])
            leaves = [n for n in range(first_new, len(self.nodes)) if self.nodes[n].end_reason is not None]
            forest = self.builder.build()
            state = state.update(forest.prompt[leaves], forest.reward[leaves])
            self.counts["rounds"] += 1

    def _expand(self, roots: list[int], m: np.ndarray, budget: np.ndarray) -> None:
        """Stage 2: continuations from prefixes; budget no prefix can take goes to extra bare rollouts."""
        forest = self.builder.build()
        anchors = forest.prefix_anchors()
        group = np.searchsorted(np.asarray(roots), forest.root_of[anchors])  # dense prompt index per anchor
        v, _ = self._predict([self._history(int(forest.prompt[a]), int(a)) for a in anchors])
        self.predictions.update(zip(anchors.tolist(), v.tolist()))
        r = forest.reward[forest.factual_leaf[anchors]]
        alloc = self.policy.allocate_prefixes(v, r, group, budget, rng=self.rng)
        extra = top_up_roots(m, int(alloc.unspent.sum())) - m
        starts = [(root, "top_up", int(k)) for root, k in zip(roots, extra) if k > 0]
        starts += [(int(a), "continuation", int(k)) for a, k in zip(anchors, alloc.k) if k > 0]
        self._grow(starts)

    # ---- generation and environments ------------------------------------------------------------

    def _grow(self, starts: list[tuple[int, str, int]]) -> None:
        """Generate ``k`` rollouts from each ``(node, kind, k)`` (:func:`.scheduler.grow`)."""
        grow(self, starts)

    # ---- result -----------------------------------------------------------------------------------

    def _finish(self, planned: RolloutBudget) -> RolloutBatch:
        seconds = time.perf_counter() - self.start
        forest = self.builder.build()
        stats = self.engine.backend.stats.since(self.stats_before)
        predictions = np.full(len(forest), np.nan)
        for node, p in self.predictions.items():
            predictions[node] = p
        report = RolloutReport(
            policy=self.cfg.policy, planned=planned, rollouts=forest.n_leaves,
            bare_rollouts=self.counts["bare"] + self.counts["top_up"],
            continuations=self.counts["continuation"],
            top_up_rollouts=self.counts["top_up"], generated_tokens=int(forest.cost.sum()),
            prompt_tokens=stats.prompt_tokens, cached_prompt_tokens=stats.cached_prompt_tokens,
            continuation_prefix_tokens=self.prefix_tokens, continuation_prefix_cached=self.prefix_cached,
            rounds=self.counts["rounds"], end_reasons=dict(sorted(self.end_reasons.items())),
            seconds=seconds, **self.timeline.report(seconds),
            max_rollout_env_seconds=max(self.rollout_env_seconds, default=0.0),
        )
        return RolloutBatch(forest, tuple(self.nodes), dict(self.rows), predictions, report)
