"""One TRACE step's decisions for trees that verl grows elsewhere: ``trace_theory.step.run_step``, streamed.

The coordinator is the step driver's world (:class:`~trace_theory.step.World`, streamed), the same driver
our engine (``trace_train.rollout.engine``) and the simulator call, so the decisions are one algorithm:

1. :meth:`StepCoordinator.start` runs ``run_step(..., expansion="streamed")`` on a thread. The driver predicts the
   pool's openings and allocates the roots; :meth:`start` returns the group sizes m, which the trainer's
   batch hook hands verl as each prompt's ``__rollout_n__`` (prompts with m = 0 are not submitted).
2. Each prompt's ``_run_prompt`` (:mod:`.tree_growth`) runs its m bare sessions and reports the tree's
   prefixes (rollout by rollout, by depth; each with its rollout's reward and its history) to
   :meth:`expand`, which returns the continuations per prefix of the driver's first pass (the tree's own
   budget m N) at once: trees expand as soon as their own bare sessions end, whatever the others do.
3. :meth:`rest` blocks until every tree has expanded, then returns this tree's share of the pooled pass
   (budget some trees could not place) and its root top-ups.
4. :meth:`finish` takes each tree's final shape; once every tree has reported, the driver completes and
   :meth:`record` returns its :class:`~trace_theory.step.StepRecord` (the step's forest, predictions and
   counts: what the predictor is fitted on).

**A failed tree drops its group, the step goes on** (as verl drops a failed group). A tree that cannot be
grown calls :meth:`fail`: it counts as expanded (with the anchors it reported, or none) and as finished
(a stand-in shape with those anchors' rewards, so the driver's checks hold), its unspent budget is lost,
and :meth:`failures` names it; the predictor is not fitted on it (:func:`fit_predictor_on_step`) and its
trajectories never reach the batch. Whether the step may go on is the trainer's call
(``trace.max_failed_share``). Only an error of the driver itself fails the step (every waiting call raises).

Tree j is the j-th prompt with m > 0, in pool order. Methods are thread-safe and block only where stated,
so one coordinator serves the sessions of every agent-loop worker: in verl it is a threaded Ray actor
(``ray.remote(max_concurrency=...)``, :mod:`.trainer`), whose blocking calls hold the actor's threads and
never the agent loop's (the worker awaits them); in-process, :class:`ThreadedCoordinator` runs them on the
coordinator's own bounded pool for the same reason.

**What the coordinator asks of ``trace_theory``**: ``run_step(world, policy, budget, pool=, rng=,
root_allocator=, expansion="streamed")`` with itself as the world (``predict_prompts``, and ``plant`` with
the streamed mode's events: ``events.tree_ended(tree, reward, predict)`` and ``events.rest()``), ``Prediction``,
``RolloutForest.from_parents`` and, for the fit, ``node_targets`` and ``root_outcomes``.

Policies: any registered one whose prefix rule streams (``policy.streams_prefixes``; the branching rules
``trace``, ``uniform``, ...) or that does not branch (``grpo``); one expansion round. A randomised prefix
rule or R > 1 needs the barrier, which verl's per-prompt sessions cannot give: refused in one line.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from trace_theory import Origin, Prediction, RolloutBudget, RolloutForest, node_targets, root_outcomes, run_step
from trace_theory.policies import AllocationPolicy
from trace_theory.step import StepRecord

__all__ = ["StepCoordinator", "ThreadedCoordinator", "fit_predictor_on_step"]

Predict = Callable[[Sequence, bool], Prediction]
"""``predict(histories, concentration) -> Prediction`` at prompts' openings (depth 0) or at prefixes."""


class StepCoordinator:
    """The decisions of one step over a pool of ``pool`` prompts (module docstring).

    Parameters
    ----------
    policy : AllocationPolicy
    budget : RolloutBudget
        M roots and N continuations per root, unsplit (``run_step`` splits).
    pool : int
    predict : callable
        ``predict(histories, concentration)`` (see :data:`Predict`).
    openings : sequence
        The history of each pool prompt's opening (what ``predict`` reads at the roots).
    seed : int
        Seeds the driver's generator (as the engine's ``rollout(seed=...)``).
    timeout : float
        Seconds any blocking call waits before it fails, naming what it waited for.
    """

    def __init__(self, policy: AllocationPolicy, budget: RolloutBudget, pool: int, predict: Predict,
                 openings: Sequence, *, seed: int, root_allocator=None, timeout: float = 3600.0):
        if policy.dynamic_sampling:
            raise ValueError(f"policy {policy.name!r} samples dynamically; in verl use its DAPO filter instead")
        if policy.pilot_commits:
            raise ValueError(f"policy {policy.name!r} runs a pilot and commits after it, which verl's per-prompt "
                             "sessions do not run; use trace-train")
        if policy.branches and not policy.streams_prefixes:
            raise ValueError(f"policy {policy.name!r} has a randomised prefix rule, which needs the barrier; "
                             "verl's per-prompt sessions run the streamed expansion only")
        if len(openings) != pool:
            raise ValueError(f"{pool} prompts but {len(openings)} openings")
        self.policy, self.budget, self.pool, self.predict_fn = policy, budget, int(pool), predict
        self.openings, self.seed, self.root_allocator, self.timeout = list(openings), int(seed), root_allocator, timeout
        self._lock = threading.Condition()
        self._m: np.ndarray | None = None
        self._active: np.ndarray | None = None
        self._expand = self._rest = None
        self._expanded: set[int] = set()
        self._rested: tuple | None = None
        self._trees: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._histories: dict[int, list] = {}
        self._record: StepRecord | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._reported: dict[int, np.ndarray] = {}
        """tree -> the rewards of the anchors it reported to :meth:`expand`."""
        self._failed: dict[int, str] = {}
        """tree -> why it failed, in the order trees failed."""
        self._waited = 0.0
        """Seconds trees spent in :meth:`rest` waiting for the step's other trees, summed."""

    # ---- the trainer's side ----------------------------------------------------------------------

    def start(self) -> np.ndarray:
        """Start the driver; returns m per pool prompt (blocks until the roots are allocated)."""
        if self._thread is not None:
            raise ValueError("a step coordinator runs one step: start() was called twice")
        self._thread = threading.Thread(target=self._drive, name="trace-step", daemon=True)
        self._thread.start()
        self._wait(lambda: self._m is not None, "the root allocation")
        return self._m.copy()

    def tree_of(self, prompt: int) -> int:
        """The tree index of pool prompt ``prompt`` (its rank among the prompts with m > 0)."""
        hit = np.flatnonzero(self._active == int(prompt))
        if hit.size != 1:
            raise ValueError(f"pool prompt {prompt} got no rollouts this step (m = 0): it has no tree")
        return int(hit[0])

    def record(self) -> StepRecord:
        """The driver's record, once every tree has finished (blocks)."""
        self._wait(lambda: self._record is not None, "every tree to finish")
        return self._record

    def record_with_histories(self) -> tuple[StepRecord, list]:
        """:meth:`record` and the history of every node of its forest (the roots': their openings)."""
        record = self.record()
        histories = []
        for t, prompt in enumerate(self._active.tolist()):
            node_histories = list(self._histories[t])
            node_histories[0] = self.openings[prompt]
            histories.extend(node_histories)
        return record, histories

    # ---- the sessions' side ----------------------------------------------------------------------

    def expand(self, tree: int, reward, histories: Sequence) -> np.ndarray:
        """Continuations per prefix of ``tree`` from the tree's own budget (rollout order, see the module)."""
        self._wait(lambda: self._m is not None, "the roots to be planted")  # plant sets _expand first
        reward = np.asarray(reward, dtype=float).reshape(-1)
        if len(histories) != reward.size:
            raise ValueError(f"tree {tree}: {reward.size} prefix rewards but {len(histories)} histories")
        with self._lock:
            if int(tree) in self._failed:
                raise RuntimeError(f"tree {tree} failed before its expansion: {self._failed[int(tree)]}")
            return self._expand_locked(int(tree), reward, histories)

    def _expand_locked(self, tree: int, reward: np.ndarray, histories: Sequence) -> np.ndarray:
        if self._expand is None:  # a policy that does not branch: nothing to place
            k = np.zeros(reward.size, dtype=np.int64)
        else:
            k = self._expand(tree, reward, lambda concentration: self._predict(histories, concentration))
        self._reported[tree] = reward
        self._expanded.add(tree)
        self._lock.notify_all()
        return np.asarray(k, dtype=np.int64)

    def rest(self, tree: int) -> tuple[int, np.ndarray]:
        """(top-ups at the root, more continuations per prefix) of ``tree``, once every tree has expanded."""
        n = len(self._active)
        began = time.monotonic()
        self._wait(lambda: len(self._expanded) == n, "every tree's expansion")
        with self._lock:
            self._waited += time.monotonic() - began
            if self._rest is None:
                return 0, np.zeros(0, dtype=np.int64)
            if self._rested is None:
                self._rested = self._rest()
            top_ups, more = self._rested
            return int(top_ups[int(tree)]), np.asarray(more[int(tree)], dtype=np.int64)

    def finish(self, tree: int, parent, reward, origin, cost=None, histories=None) -> None:
        """The final shape of ``tree`` in tree-local ids (0 the root, parents first): links, leaf rewards,
        origins (``trace_theory.Origin``), optionally tokens per turn and each node's history (None where
        there is none: the root, leaves), what the predictor is fitted on."""
        parent = np.asarray(parent, dtype=np.int64)
        cost = np.ones(parent.size) if cost is None else np.asarray(cost, dtype=float)
        histories = [None] * parent.size if histories is None else list(histories)
        if len(histories) != parent.size:
            raise ValueError(f"tree {tree}: {parent.size} nodes but {len(histories)} histories")
        with self._lock:
            if int(tree) in self._failed:  # it failed after all (another of its sessions): its stand-in stays
                return
            if int(tree) in self._trees:
                raise ValueError(f"tree {tree} finished twice")
            self._trees[int(tree)] = (parent, np.asarray(reward, dtype=float), np.asarray(origin, dtype=np.int8), cost)
            self._histories[int(tree)] = histories
            self._lock.notify_all()

    def fail(self, tree: int, reason: str) -> None:
        """Tree ``tree`` could not be grown (module docstring): it is dropped, the other trees go on. Never
        blocks; a second failure of the same tree is ignored."""
        self._wait(lambda: self._m is not None, "the roots to be planted")
        tree = int(tree)
        with self._lock:
            if tree in self._failed:
                return
            self._failed[tree] = str(reason)
            if tree not in self._expanded:  # it reports no anchors: its own budget tops up the others
                self._expand_locked(tree, np.zeros(0), [])
            if tree not in self._trees:
                self._trees[tree] = self._stand_in(tree)
                self._histories[tree] = [None] * self._trees[tree][0].size
            self._lock.notify_all()

    def failures(self) -> dict:
        """The trees that failed: ``{"trees": n, "failed": [tree, ...], "first": reason or None,
        "waited_s": seconds trees waited for each other in rest()}`` (never blocks)."""
        with self._lock:
            failed = list(self._failed)
            return {"trees": 0 if self._active is None else len(self._active), "failed": failed,
                    "first": self._failed[failed[0]] if failed else None, "waited_s": self._waited}

    def _stand_in(self, tree: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A failed tree's shape for the driver: its reported anchors (rewards in rollout order) as few bare
        rollouts as their runs of equal rewards, then one-turn bare rollouts (reward 0) up to its m."""
        reported = self._reported.get(tree, np.zeros(0))
        runs: list[list[float]] = []
        for r in reported.tolist():
            if runs and runs[-1][0] == r:
                runs[-1].append(r)
            else:
                runs.append([r])
        m = int(self._m[self._active[tree]])
        runs += [[]] * max(0, m - len(runs))
        parent, reward = [-1], [np.nan]
        for run in runs:  # a rollout with len(run) anchors: len(run) + 1 turns, its reward at the leaf
            parent.append(0)
            for _ in run:
                reward.append(np.nan)
                parent.append(len(parent) - 1)
            reward.append(run[0] if run else 0.0)
        origin = np.full(len(parent), Origin.BARE, dtype=np.int8)
        origin[0] = Origin.ROOT
        cost = np.ones(len(parent))
        cost[0] = 0.0
        return np.asarray(parent, dtype=np.int64), np.asarray(reward, dtype=float), origin, cost

    # ---- the driver's world (trace_theory.step.World) -----------------------------------------------

    def predict_prompts(self, prompts: np.ndarray, *, concentration: bool) -> Prediction:
        return self._predict([self.openings[int(i)] for i in prompts], concentration)

    def predict_nodes(self, nodes: np.ndarray, *, concentration: bool) -> Prediction:
        raise ValueError("the verl plugin expands each tree once, streamed; the barrier's predict_nodes is not used")

    def plant(self, prompts: np.ndarray, counts: np.ndarray, events=None) -> RolloutForest:
        """The roots; with streamed expansion's ``events`` (``trace_theory.expansion.PlantEvents``), each
        tree's :meth:`expand` and :meth:`rest` are its ``tree_ended`` and ``rest``."""
        if events is not None:
            if events.boundaries:
                raise ValueError("the verl plugin reports no turn boundaries: eager expansion is not supported")
            with self._lock:
                self._expand, self._rest = events.tree_ended, events.rest
        self._planted(prompts, counts)
        return self._forest()

    def grow(self, starts) -> RolloutForest:
        raise ValueError("the verl plugin grows continuations streamed only (one round, a streaming policy)")

    # ---- internals -------------------------------------------------------------------------------

    def _predict(self, histories, concentration: bool) -> Prediction:
        if not len(histories):
            return Prediction(np.zeros(0), np.zeros(0) if concentration else None)
        return self.predict_fn(list(histories), concentration)

    def _planted(self, prompts, counts) -> None:
        m = np.zeros(self.pool, dtype=np.int64)
        m[np.asarray(prompts, dtype=np.int64)] = counts
        with self._lock:
            self._m, self._active = m, np.asarray(prompts, dtype=np.int64)
            self._lock.notify_all()

    def _forest(self) -> RolloutForest:
        n = len(self._active)
        self._wait(lambda: len(self._trees) == n, "every tree to finish", driver=True)
        parent, reward, origin, cost, base = [], [], [], [], 0
        for t in range(n):
            p, r, o, c = self._trees[t]
            parent.append(np.where(p >= 0, p + base, -1)), reward.append(r), origin.append(o), cost.append(c)
            base += p.size
        if not n:
            return RolloutForest.from_parents(np.zeros(0, dtype=np.int64), np.zeros(0))
        forest = RolloutForest.from_parents(np.concatenate(parent), np.concatenate(reward),
                                            prompt=self._active, origin=np.concatenate(origin),
                                            cost=np.concatenate(cost), binary_rewards=False)
        return forest

    def _drive(self) -> None:
        try:
            record = run_step(self, self.policy, self.budget, pool=self.pool, rng=np.random.default_rng(self.seed),
                              root_allocator=self.root_allocator, expansion="streamed")
        except BaseException as error:  # noqa: BLE001 - re-raised in every waiting caller
            with self._lock:
                self._error = error
                self._lock.notify_all()
            return
        with self._lock:
            self._record = record
            self._lock.notify_all()

    def _wait(self, ready: Callable[[], bool], what: str, *, driver: bool = False) -> None:
        with self._lock:
            if not self._lock.wait_for(lambda: ready() or self._error is not None, self.timeout):
                raise TimeoutError(f"the TRACE step waited {self.timeout:.0f} s for {what}")
            if self._error is not None and not ready():
                raise RuntimeError(f"the TRACE step failed: {type(self._error).__name__}: "
                                   f"{self._error}") from self._error


class ThreadedCoordinator:
    """An in-process :class:`StepCoordinator` awaited as the Ray actor is: its blocking calls run on the
    coordinator's own pool of ``threads`` threads (default: one per pool prompt), never on the event loop's
    default executor, which verl's agent loop needs for its token merges and tool-parser decodes."""

    def __init__(self, coordinator: StepCoordinator, threads: int | None = None):
        self.coordinator = coordinator
        self.pool = ThreadPoolExecutor(max_workers=int(threads or max(1, coordinator.pool)),
                                       thread_name_prefix="trace-coordinator")

    async def _call(self, name: str, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, getattr(self.coordinator, name), *args)

    async def expand(self, tree, reward, histories):
        return await self._call("expand", tree, reward, histories)

    async def rest(self, tree):
        return await self._call("rest", tree)

    async def finish(self, tree, parent, reward, origin, cost=None, histories=None):
        return await self._call("finish", tree, parent, reward, origin, cost, histories)

    async def fail(self, tree, reason):
        return await self._call("fail", tree, reason)

    async def tree_of(self, prompt):
        return self.coordinator.tree_of(prompt)


def fit_predictor_on_step(predictor, record: StepRecord, histories: Sequence, *, value_target: str = "leaf_weighted",
                          failed: Sequence[int] = ()) -> dict:
    """Our trainer's predictor fit on one step's forest (``trace_train.train._fit_inputs``): the model on
    ``node_targets`` of every non-terminal non-root node, the roots' outcomes into the prompts' posteriors.
    ``histories`` are :meth:`StepCoordinator.record_with_histories`'; the trees in ``failed``
    (:meth:`StepCoordinator.failures`) are left out. Returns the fit's metrics."""
    f = record.forest
    kept = ~np.isin(f.tree_index, np.asarray(list(failed), dtype=np.int64))
    nodes = np.flatnonzero(~f.is_leaf & (f.parent != -1) & kept)
    values, weights = node_targets(f, value_target)
    roots, m, s = root_outcomes(f)
    keep_roots = kept[roots]
    roots, m, s = roots[keep_roots], m[keep_roots], s[keep_roots]
    metrics = predictor.update([histories[n] for n in nodes], values[nodes], weights[nodes])
    predictor.observe([histories[r] for r in roots], s, m - s)
    return metrics
