"""Eager expansion (``"eager"``): continuations committed at the bare rollouts' turn boundaries.

Continuations are committed by the expected utility before the outcome is known
(:mod:`trace_theory.eager`), each bare rollout spending its own even share of 1 - reserve of its tree's
budget m_i N, so the decisions do not depend on the order rollouts report in; what a rollout leaves goes
to its last prefix when it ends (the root's top-ups for a one-turn rollout). Once every bare rollout of
a tree has ended, the policy's own outcome-aware pass places the tree's reserve and what its rollouts
left (``policy.place_own_budgets``, from the committed counts); once every tree has, the pooled pass
(``policy.place_leftover``) and the top-ups place what some trees could not. The two passes together are
``allocate_prefixes``, so with a reserve of 1 (no turn-boundary decision at all) the decisions are the
barrier's node for node: that is streamed expansion (:mod:`.streamed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..allocate import PrefixAllocation
from ..eager import EagerPlan, offline_level, prior_level, rollout_budgets, threshold_spend
from ..forest import RolloutForest
from ..policies import AllocationPolicy, top_up_roots
from .base import EXPANSIONS, Expansion, Settled
from .events import Branch, Predict, checked_prediction

__all__ = ["Eager", "TreeDecisions"]


@dataclass(frozen=True, repr=False)
class Eager(Expansion):
    """Eager expansion with the settings of ``plan`` (:class:`~trace_theory.eager.EagerPlan`)."""

    plan: EagerPlan = field(default_factory=EagerPlan)
    name: str = "eager"
    streams = True

    @property
    def decides_as_barrier(self) -> bool:
        """With the whole budget in reserve (streamed), the two passes are ``allocate_prefixes``."""
        return self.plan.reserve >= 1.0

    def events(self, policy, m_tree, per_root, tree_cost, root_v) -> "TreeDecisions":
        return TreeDecisions(policy, m_tree, per_root, tree_cost, self.plan, root_v)

    def settle(self, events: "TreeDecisions", forest: RolloutForest, anchors: np.ndarray) -> Settled:
        events.check(forest, anchors)
        v, kappa, _, alloc, top_ups = events.result
        fields = dict(node_phase=events.phase, phase_ids=anchors, early_top_ups=events.early_top_ups.copy())
        if events.boundaries:
            level, spent = events.level()
            fields.update(eager_threshold=events.threshold, eager_level=level, eager_spent=spent,
                          eager_lag=self.plan.lag)
        return Settled(v, kappa, int(alloc.k.sum()), top_ups + events.early_top_ups, fields)


@EXPANSIONS.register("eager")
def eager(*, reserve: float = 0.0, threshold: float | None = None, objective: str = "additive", lag: int = 1) -> Eager:
    """Eager expansion (the module); the settings are :class:`~trace_theory.eager.EagerPlan`'s."""
    return Eager(EagerPlan(reserve=reserve, threshold=threshold, objective=objective, lag=lag))


class TreeDecisions:
    """One step's decisions from a world's events (:class:`~.events.PlantEvents`; see the module).

    ``turn_boundary`` and ``rollout_ended`` commit at most the rollout's eager budget by the threshold rule;
    ``tree_ended`` is the policy's own pass on the tree (its reserve and what its rollouts left),
    ``rest`` the pooled pass and the top-ups."""

    def __init__(self, policy: AllocationPolicy, m_tree: np.ndarray, per_root: int, tree_cost: np.ndarray | None,
                 plan: EagerPlan, root_v: np.ndarray | None = None):
        self.policy, self.m_tree, self.budget, self.tree_cost = policy, m_tree, per_root * m_tree, tree_cost
        self.plan = plan
        self.eager_budget = plan.eager_budget(self.budget)
        self.left = [b.astype(float) for b in rollout_budgets(self.eager_budget, m_tree)]
        self.boundaries = bool(self.eager_budget.sum())  # reserve 1: no decision at a boundary (streamed)
        threshold = plan.threshold
        if threshold is None and self.boundaries:
            v0 = np.full(len(m_tree), 0.5) if root_v is None else np.asarray(root_v, dtype=float)
            threshold = prior_level(v0, m_tree, [b.copy() for b in self.left])
        self.threshold = threshold
        self.decided: dict[int, tuple] = {}
        """tree -> (factual rewards, v, concentration, price, k, unspent, committed, committed at ends)."""
        self.result: tuple | None = None
        """After :meth:`rest`: (v, concentration, first pass, whole allocation, top-ups)."""
        self.commits: dict[int, dict[tuple[int, int], list]] = {}
        """tree -> {(rollout, depth): [v, concentration, price, k at boundaries, k at the end]}."""
        self.stay: dict[tuple[int, int], tuple[float, float]] = {}
        self.reported: dict[tuple[int, int], int] = {}
        """(tree, rollout) -> the prefixes it has reported (its depth so far)."""
        self.finished: set[tuple[int, int]] = set()
        self.rewards: dict[tuple[int, int], float] = {}
        self.early_top_ups = np.zeros(len(m_tree), dtype=np.int64)

    # ---- turn boundaries and rollout ends -------------------------------------------------------

    def turn_boundary(self, tree: int, rollout: int, depth: int, predict: Predict) -> tuple[Branch, ...]:
        """Continuations to start now (at this prefix, or with ``lag`` 1 at the one before, now that the
        factual branch's next prediction is known)."""
        tree, rollout, depth = int(tree), int(rollout), int(depth)
        if not 0 <= tree < len(self.budget) or not 0 <= rollout < int(self.m_tree[tree]) or tree in self.decided:
            raise ValueError(f"the world committed at tree {tree}, rollout {rollout}: not a running bare rollout")
        seen = self.commits.setdefault(tree, {})
        if depth != 1 + self.reported.get((tree, rollout), 0) or (tree, rollout) in self.finished:
            raise ValueError(f"the world must commit at each rollout's prefixes in depth order; tree {tree}, "
                             f"rollout {rollout} reported depth {depth}")
        if not self.boundaries:
            seen[rollout, depth] = None
            self.reported[tree, rollout] = depth
            return ()
        v, kappa, price = self._asked(tree, 1, predict)
        seen[rollout, depth] = [float(v[0]), None if kappa is None else float(kappa[0]),
                                None if price is None else float(price[0]), 0, 0]
        self.reported[tree, rollout] = depth
        if self.plan.lag == 0:
            return self._decide(tree, rollout, depth, float(v[0]))
        return self._decide(tree, rollout, depth - 1, float(v[0])) if depth > 1 else ()

    def _decide(self, tree: int, rollout: int, depth: int, later: float) -> tuple[Branch, ...]:
        """The threshold rule at the rollout's prefix at ``depth``, the factual branch now at ``later``."""
        row = self.commits[tree][rollout, depth]
        unit = 1.0 if row[2] is None else row[2]
        s1, s0 = self.stay.get((tree, rollout), (1.0, 1.0))
        k, spent = threshold_spend(row[0], unit, self.left[tree][rollout], self.threshold, v_later=later,
                                   max_per_anchor=self.policy.max_per_anchor, objective=self.plan.objective,
                                   stay=(s1, s0))
        k = int(k)
        self.left[tree][rollout] -= spent
        self.stay[tree, rollout] = (s1 * row[0] ** k, s0 * (1.0 - row[0]) ** k)
        row[3] += k
        return (Branch(depth, k),) if k else ()

    def rollout_ended(self, tree: int, rollout: int, length: int, reward: float) -> tuple[Branch, ...]:
        """With ``lag`` 1 the rule at its last prefix (r known: the paper's flip), then what it left of its
        eager budget, all as continuations from that last prefix (depth length - 1; at the root when
        length = 1: top-ups), started at once. From there a continuation ends at most one turn after the
        longest bare rollout could, so the step stays one episode deep."""
        tree, rollout, length = int(tree), int(rollout), int(length)
        seen = self.commits.get(tree, {})
        if tree in self.decided or length != 1 + self.reported.get((tree, rollout), 0) or (
                (tree, rollout) in self.finished):
            raise ValueError(f"the world must report each bare rollout's end once, after its {length - 1} "
                             f"prefixes; tree {tree}, rollout {rollout}")
        self.finished.add((tree, rollout))
        self.rewards[tree, rollout] = float(reward)
        if not self.boundaries:
            return ()
        out = []
        if self.plan.lag == 1 and length > 1:
            out += self._decide(tree, rollout, length - 1, float(reward))
        left = self.left[tree][rollout]
        if length == 1:
            k = int(np.floor(left + 1e-9))  # a top-up is one rollout of the prompt
            self.early_top_ups[tree] += k
            self.left[tree][rollout] -= k
            return (Branch(0, k),) if k else ()
        row = seen[rollout, length - 1]
        unit = 1.0 if row[2] is None else row[2]
        k = int(np.floor(left / unit * (1.0 + 1e-9) + 1e-9))
        if self.policy.max_per_anchor is not None:
            k = min(k, self.policy.max_per_anchor - row[3])
        row[4] += k
        self.left[tree][rollout] -= k * unit
        return tuple(out) + ((Branch(length - 1, k),) if k else ())

    # ---- a tree's end and the rest --------------------------------------------------------------

    def tree_ended(self, tree: int, reward, predict: Predict) -> np.ndarray:
        """The policy's own pass on the tree's anchors within its budget, from what was committed."""
        policy, tree = self.policy, int(tree)
        if not 0 <= tree < len(self.budget) or tree in self.decided:
            raise ValueError(f"the world must expand each of its {len(self.budget)} trees once, got tree {tree}")
        reward = np.asarray(reward, dtype=float).reshape(-1)
        n = reward.size
        v, kappa, price = self._predictions(tree, n, predict)
        start, at_end, budget = self._committed(tree, n)
        first = policy.place_own_budgets(v, reward, np.zeros(n, dtype=np.int64), np.array([budget]),
                                         cost=price, start=start)
        self.decided[tree] = (reward, v, kappa, price, start + first.k, int(first.unspent[0]), start, at_end)
        return first.k.copy()

    def _asked(self, tree: int, n: int, predict: Predict):
        """(v, concentration, price) at ``n`` prefixes of ``tree``, asked of the world."""
        policy, price = self.policy, None
        if not (policy.predicts_prefixes and n):
            return np.full(n, 0.5), None, None
        guess = checked_prediction(predict(concentration=policy.posterior), n, policy)
        if guess.cost is not None and self.tree_cost is not None:
            price = guess.cost / self.tree_cost[tree]
        return guess.v, guess.concentration, price

    def _predictions(self, tree, n, predict):
        """At the tree's end: the predictions its commits were given, in anchor order (asked once per prefix)."""
        if not (self.boundaries and self.policy.predicts_prefixes and n):
            return self._asked(tree, n, predict)
        rows = self._ordered(tree, n)
        v = np.array([r[0] for r in rows])
        kappa = np.array([r[1] for r in rows]) if self.policy.posterior else None
        price = np.array([r[2] for r in rows]) if rows[0][2] is not None else None
        return v, kappa, price

    def _ordered(self, tree: int, n: int) -> list:
        seen = self.commits.get(tree, {})
        if len(seen) != n:
            raise ValueError(f"the world committed at {len(seen)} prefixes of tree {tree} but expands {n} anchors")
        return [seen[key] for key in sorted(seen)]

    def _committed(self, tree: int, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Continuations already committed at the tree's anchors (all; those at their rollout's end), and the
        budget left for its own pass."""
        if not self.boundaries:
            return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), int(self.budget[tree])
        rows = self._ordered(tree, n)
        at_end = np.array([r[4] for r in rows], dtype=np.int64)
        k = np.array([r[3] for r in rows], dtype=np.int64) + at_end
        price = np.array([1.0 if r[2] is None else r[2] for r in rows])
        spent = float(np.dot(k, price)) + float(self.early_top_ups[tree])
        if self.plan.reserve == 0:  # never wait: what buys no whole continuation at a rollout's end is not spent
            return k, at_end, 0
        return k, at_end, int(np.floor(self.budget[tree] - spent + 1e-9))

    def rest(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """What some trees could not place, pooled over every anchor, and the top-ups: (top-ups per tree,
        more continuations per anchor of each tree)."""
        n_trees = len(self.budget)
        missing = sorted(set(range(n_trees)) - set(self.decided))
        if missing or self.result is not None:
            raise ValueError(f"the world must call rest() once, after expanding every tree (trees {missing} "
                             f"of its {n_trees} were not)" if missing else "the world must call rest() once")
        parts = [self.decided[t] for t in range(n_trees)]
        reward = np.concatenate([p[0] for p in parts])
        v = np.concatenate([p[1] for p in parts])
        kappa = np.concatenate([p[2] for p in parts if p[0].size]) if self.policy.posterior and v.size else None
        priced = [p[3] is not None for p in parts if p[0].size]
        price = np.concatenate([p[3] for p in parts if p[0].size]) if priced and all(priced) else None
        first = PrefixAllocation(np.concatenate([p[4] for p in parts]).astype(np.int64),
                                 np.array([p[5] for p in parts], dtype=np.int64))
        alloc = self.policy.place_leftover(v, reward, first, cost=price) if v.size else first
        top_ups = np.zeros(n_trees, dtype=np.int64)
        if alloc.unspent.sum():
            top_ups = top_up_roots(self.m_tree, int(alloc.unspent.sum())) - self.m_tree
        early = np.concatenate([p[6] for p in parts]).astype(np.int64)
        at_end = np.concatenate([p[7] for p in parts]).astype(np.int64)
        self.phase = np.stack([early - at_end, at_end, first.k - early, alloc.k - first.k], axis=1)
        self.result = (v, kappa, first, alloc, top_ups)
        bounds = np.cumsum([0] + [p[0].size for p in parts])
        more = alloc.k - first.k
        return top_ups.copy(), [more[a:b].copy() for a, b in zip(bounds[:-1], bounds[1:])]

    # ---- after the world returned ----------------------------------------------------------------

    def check(self, forest: RolloutForest, anchors: np.ndarray) -> None:
        """That the world reported the anchors of ``forest`` (per tree, in order, with their rewards)."""
        if self.result is None:
            self.rest()  # raises: some tree was not expanded, or rest() was not called
        per_tree = np.bincount(forest.tree_index[anchors], minlength=len(self.budget))
        factual = forest.reward[forest.factual_leaf[anchors]]
        reported = [self.decided[t][0] for t in range(len(self.budget))]
        if [r.size for r in reported] != per_tree.tolist() or not np.array_equal(np.concatenate(reported), factual):
            raise ValueError("the world's anchors per tree (rollout order, factual rewards) differ from its forest's")

    def level(self) -> tuple[float, float]:
        """(offline level of this step's prefixes at the eager budget, budget committed by the rule)."""
        v, later, price, rollout, budgets, spent = [], [], [], [], [], 0.0
        n_rollouts = 0
        for tree in range(len(self.budget)):
            b = rollout_budgets(self.eager_budget[tree:tree + 1], self.m_tree[tree:tree + 1])[0]
            rows = sorted((key, row) for key, row in self.commits.get(tree, {}).items() if row is not None)
            for i, ((j, d), row) in enumerate(rows):
                v.append(row[0]), price.append(1.0 if row[2] is None else row[2]), rollout.append(n_rollouts + j)
                nxt = rows[i + 1] if i + 1 < len(rows) else None
                if self.plan.lag == 0:
                    later.append(row[0])
                elif nxt is not None and nxt[0][0] == j:
                    later.append(nxt[1][0])
                else:
                    later.append(self.rewards.get((tree, j), row[0]))
                spent += row[3] * price[-1]  # what the rule committed (not what rollouts left at their end)
            budgets.append(b)
            n_rollouts += b.size
        if not v:
            return (self.threshold if self.threshold is not None else 0.0), spent
        flat = np.concatenate(budgets).astype(float)
        level = offline_level(np.array(v), np.array(price), np.array(rollout), flat, float(self.eager_budget.sum()),
                              max_per_anchor=self.policy.max_per_anchor, objective=self.plan.objective,
                              v_later=np.array(later))
        return level, spent
