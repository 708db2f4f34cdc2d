"""Allocation policies: TRACE and the baselines it is compared with, registered by name.

Every policy answers the same three questions with the same signatures, so the simulator and the
trainer run any of them from a config string:

* ``split(budget)``: how a :class:`RolloutBudget` of M (1 + N) leaves is divided between root rollouts
  and continuations. Flat policies spend everything on roots; tree policies keep M roots and N
  continuations per root rollout (PAPER.md, "Budget shape").
* ``allocate_roots(v, budget, *, rng, concentration=None)``: group size per candidate prompt.
* ``allocate_prefixes(v, r, prompt, budget, *, rng)``: continuations per anchor (a non-terminal prefix
  of a bare rollout), per prompt budgets (the "active" rule is :func:`allocate_prefixes`, the one
  entry point of prefix allocation); budget that a prompt cannot use goes to the other prompts'
  anchors, and what is left after that is returned as ``unspent`` for the caller to spend on roots
  (see :func:`top_up_roots`).

============================  ===============  ===============  =====================================
name                          roots            prefixes         what it stands for
============================  ===============  ===============  =====================================
``grpo``                      uniform          none             GRPO: G rollouts per prompt
``dapo``                      uniform, rounds  none             DAPO dynamic sampling (see below)
``pilot_commit``              pilot, commit    none             Pilot-Commit (see below)
``pcl``                       v nearest 0.5    none             PCL-style prompt filtering
``root_only``                 active           none             TRACE stage 1 alone
``random_prefix``             uniform          random           TreePO / Tree-GRPO-style expansion
``uniform_tree``              uniform          uniform          ablation: uniform root + prefix
``active_root_uniform_prefix`` active          uniform          ablation
``prefix_only``               uniform          active           TRACE stage 2 alone
``trace``                     active           active           TRACE
``trace_beta``                active (Beta)    active           TRACE with the posterior utility
``trace_tokens``              active (priced)  active (priced)  TRACE priced in tokens (see below)
============================  ===============  ===============  =====================================

A policy is a name plus a root rule and a prefix rule, registered functions with one signature each
(:data:`ROOT_RULES`, :data:`PREFIX_RULES`), plus its settings. "uniform" roots take the prompts in pool
order (the sampler's random order), G = ``group_size`` each; "active" roots are :func:`allocate_roots`,
"active" prefixes :func:`allocate_prefixes`. Each rule says whether it reads predictions, so callers ask
the policy (``needs_predictor``, ``predicts_roots``, ``predicts_prefixes``) instead of comparing names.

**Priced in tokens** (``price="tokens"``, the ``trace_tokens`` entry): the rules are handed the price
of one unit (``cost``: a rollout of each candidate, a continuation from each anchor, in the unit of the
budget) and maximise the same utilities under sum c m <= budget instead of sum m = budget
(:func:`allocate_roots`, :func:`allocate_prefixes` with ``cost``), so the budget buys the most mixed
outcomes per token: a continuation from a deep prefix is cheap. Without ``cost`` (a world that does
not know its costs) such a policy is rollout-priced; rollout-priced policies never read ``cost``.

DAPO oversamples and filters, which needs rounds of generation: the ``dapo`` entry sets
``dynamic_sampling``, and :func:`trace_theory.step.run_step` runs the rounds with
:mod:`trace_theory.dynamic_sampling` (target: :meth:`AllocationPolicy.dynamic_target`).

Pilot-Commit (Kim et al., 2026, arXiv 2605.26606) reads outcomes too: the ``pilot_commit`` entry sets
``pilot`` = p, and :func:`trace_theory.step.run_step` plants p rollouts for each of the first
n = min(pool, floor(``pilot_share`` B / p)) prompts (default share 1/2: with p = 2, twice GRPO's G = 8
batch of prompts), then commits: each prompt whose pilot success rate s / p lies strictly inside
``pilot_band`` (lo, hi) (default (0, 1): a mixed pilot) grows to G rollouts, its pilot kept in its group,
in pool order while the rest of the budget pays for it; budget left over tops up the committed groups
(none committed: every piloted group). Every rollout counts, so it spends exactly B rollouts, as every
other policy does (:func:`trace_theory.dynamic_sampling.commit_counts`).

Adding a policy touches this file only: register its rules (``@root_rule(name, predicts=...)``,
``@prefix_rule(name, predicts=..., randomised=...)``) if they are new, then ``_register`` the policy.
The simulator, the trainer and the shared property tests pick it up by name; figures give a policy
without a colour of its own a default style.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from . import _checks
from ._registry import Registry
from .allocate import PrefixAllocation, _allocate_roots, _prefix_inputs, allocate_prefixes, check_root_budget

__all__ = [
    "RolloutBudget", "AllocationPolicy", "POLICIES", "ROOT_RULES", "PREFIX_RULES", "RootRule", "PrefixRule",
    "get_policy", "top_up_roots", "RootAllocator",
]


# ---------------------------------------------------------------------------------------------------
# Rules: how roots and prefixes are chosen, registered by name with one signature each
# ---------------------------------------------------------------------------------------------------


@runtime_checkable
class RootAllocator(Protocol):
    """What allocates a step's roots: ``root_allocator(policy, v, budget, *, rng, concentration, cost=None)
    -> m``, the group size per candidate of this process's pool.

    The default (``trace_theory.step``) is ``policy.allocate_roots`` over the local pool; the distributed
    trainer's (``trace_train.run.distributed.GlobalRootAllocator``) allocates over every rank's pool together
    and returns this rank's share. ``cost`` is the price of one rollout per candidate for a token-priced
    policy (None: every rollout costs 1), as :meth:`AllocationPolicy.allocate_roots` takes it.
    """

    def __call__(self, policy: "AllocationPolicy", v: np.ndarray, budget: int, *, rng: np.random.Generator,
                 concentration: np.ndarray | None, cost: np.ndarray | None = None) -> np.ndarray: ...


@dataclass(frozen=True)
class RootRule:
    """A root rule: ``allocate(policy, v, budget, *, concentration, cost) -> m``, group size per candidate.

    ``v`` is validated, ``budget`` a non-negative integer and ``concentration`` the Beta concentration
    per candidate for a posterior policy (None otherwise); ``m`` must sum to ``budget``. ``cost`` is the
    price of one rollout per candidate for a token-priced policy (None otherwise); then sum c m <= budget.
    """

    allocate: Callable[..., np.ndarray]
    predicts: bool
    """Whether the rule reads ``v`` (then the caller must predict the candidate pool)."""
    priced: bool = False
    """Whether the rule can price in tokens (reads ``cost``)."""


@dataclass(frozen=True)
class PrefixRule:
    """A prefix rule: ``place(policy, v, r, prompt, budget, *, start, rng, cost) -> PrefixAllocation``.

    One pass over the anchors: per prompt, place ``budget`` continuations on its anchors, counting from
    ``start`` already placed, at most ``policy.max_per_anchor`` in all per anchor; return what could not
    be placed. The inputs are checked (:meth:`AllocationPolicy.allocate_prefixes`). ``cost`` is the
    price of one continuation per anchor for a token-priced policy (None otherwise).
    """

    place: Callable[..., PrefixAllocation]
    predicts: bool
    """Whether the rule reads ``v`` (then the caller must predict the anchors)."""
    randomised: bool = False
    """Whether the rule draws from ``rng`` (then the allocation is not a function of the inputs)."""
    reads_outcomes: bool = False
    """Whether placement depends on the factual rewards ``r`` (outcome-dependent branching)."""
    priced: bool = False
    """Whether the rule can price in tokens (reads ``cost``)."""


ROOT_RULES: Registry[RootRule] = Registry("root rule")
PREFIX_RULES: Registry[PrefixRule] = Registry("prefix rule")


def root_rule(name: str, *, predicts: bool, priced: bool = False):
    """Register ``allocate`` as the root rule ``name``."""

    def decorator(allocate):
        ROOT_RULES.add(name, RootRule(allocate, predicts, priced))
        return allocate

    return decorator


def prefix_rule(name: str, *, predicts: bool, randomised: bool = False, reads_outcomes: bool = False,
                priced: bool = False):
    """Register ``place`` as the prefix rule ``name``."""

    def decorator(place):
        PREFIX_RULES.add(name, PrefixRule(place, predicts, randomised, reads_outcomes, priced))
        return place

    return decorator


@dataclass(frozen=True)
class RolloutBudget:
    """A rollout budget in the paper's shape: M root rollouts and N continuations per root rollout.

    The total, M (1 + N) leaves, is what every policy spends; flat policies spend all of it on roots.
    """

    roots: int
    """M: bare rollouts sampled from the prompts."""
    continuations_per_root: int = 0
    """N: continuations per bare rollout, sampled from its prefixes."""

    def __post_init__(self):
        _checks.count("roots", self.roots)
        _checks.count("continuations_per_root", self.continuations_per_root)

    @property
    def total(self) -> int:
        return self.roots * (1 + self.continuations_per_root)


@dataclass(frozen=True)
class AllocationPolicy:
    """One way of spending a rollout budget: a name, a root rule, a prefix rule and their settings.

    Callers ask the policy what it needs (:attr:`needs_predictor`, :attr:`predicts_roots`,
    :attr:`predicts_prefixes`, :attr:`posterior`, :attr:`branches`, :attr:`dynamic_sampling`) rather
    than switching on rule names; :func:`trace_theory.step.run_step` runs any policy.
    """

    name: str
    root_rule: str
    """A name in :data:`ROOT_RULES`: "uniform" (pool order), "pcl" (predicted v nearest 0.5), "active"."""
    prefix_rule: str | None = None
    """None (no branching) or a name in :data:`PREFIX_RULES`: "uniform", "random", "active"."""
    group_size: int = 8
    """Rollouts per selected prompt for the "uniform" and "pcl" root rules (GRPO's G)."""
    min_group: int = 2
    """Smallest non-zero group; 2 is the smallest that can be mixed."""
    max_group: int | None = None
    """Largest group per prompt (None: no cap)."""
    max_per_anchor: int | None = None
    """Cap on continuations per prefix (None: no cap)."""
    posterior: bool = False
    """Use the Beta-posterior utility for roots; then ``concentration`` must be passed."""
    dynamic_sampling: bool = False
    """DAPO-style rounds of oversampling and filtering (run by :func:`trace_theory.step.run_step`)."""
    dapo_target: int | None = None
    """Mixed groups a dynamic-sampling batch aims to keep; None: :meth:`dynamic_target`'s default."""
    pilot: int | None = None
    """Pilot-Commit: rollouts per prompt in the pilot (p); None: the policy runs no pilot."""
    pilot_band: tuple[float, float] = (0.0, 1.0)
    """Pilot-Commit: the open band (lo, hi) of pilot success rates s / p whose prompts are committed to
    groups of ``group_size``; (0, 1): prompts whose pilot mixed."""
    pilot_share: float = 0.5
    """Pilot-Commit: share of the budget spent on pilots (it fixes how many prompts are piloted)."""
    price: str = "rollouts"
    """Unit the rules price the budget in: "rollouts" (every rollout costs 1; the paper) or "tokens" (the
    ``cost`` of a rollout or continuation where the caller passes one; see the module)."""

    def __post_init__(self):
        if self.root_rule not in ROOT_RULES:
            raise ValueError(f"`root_rule` must be one of {tuple(ROOT_RULES)}, got {self.root_rule!r}")
        if self.prefix_rule is not None and self.prefix_rule not in PREFIX_RULES:
            known = (None, *PREFIX_RULES)
            raise ValueError(f"`prefix_rule` must be one of {known}, got {self.prefix_rule!r}")
        if _checks.count("group_size", self.group_size) < 1:
            raise ValueError(f"`group_size` must be at least 1, got {self.group_size}")
        if _checks.count("min_group", self.min_group) < 1:
            raise ValueError(f"`min_group` must be at least 1, got {self.min_group}")
        if self.max_group is not None and _checks.count("max_group", self.max_group) < self.min_group:
            raise ValueError(f"`max_group` ({self.max_group}) must be at least `min_group` ({self.min_group})")
        if self.max_per_anchor is not None:
            _checks.count("max_per_anchor", self.max_per_anchor)
        if self.dynamic_sampling and (self.branches or self.predicts_roots):
            raise ValueError("dynamic sampling is defined for uniform roots without branching")
        self._check_pilot()
        if self.price not in PRICES:
            raise ValueError(f"`price` must be one of {PRICES}, got {self.price!r}")
        if self.price == "tokens":
            rules = [ROOT_RULES[self.root_rule]] + ([PREFIX_RULES[self.prefix_rule]] if self.branches else [])
            if self.posterior or not all(rule.priced for rule in rules):
                raise ValueError(
                    f"`price=\"tokens\"` needs rules that read `cost` (root rule \"active\", prefix rule None or "
                    f"\"active\") and no posterior; policy {self.name!r} has {self.root_rule!r}, {self.prefix_rule!r}"
                    f"{' with a posterior' if self.posterior else ''}")
        if self.dapo_target is not None:
            if not self.dynamic_sampling:
                raise ValueError(
                    f"`dapo_target` is a setting of dynamic sampling; policy {self.name!r} has none")
            if _checks.count("dapo_target", self.dapo_target) < 1:
                raise ValueError(f"`dapo_target` must be at least 1, got {self.dapo_target}")

    def _check_pilot(self) -> None:
        band = self.pilot_band
        if isinstance(band, list) and len(band) == 2:  # a band read from YAML or a command line
            band = tuple(band)
            object.__setattr__(self, "pilot_band", band)
        if not (isinstance(band, (tuple, list)) and len(band) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in band)
                and 0.0 <= band[0] < band[1] <= 1.0):
            raise ValueError(f"`pilot_band` must be two rates (lo, hi) with 0 <= lo < hi <= 1, got {band!r}")
        share = self.pilot_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share <= 1.0:
            raise ValueError(f"`pilot_share` must be a share of the budget in (0, 1], got {share!r}")
        if self.pilot is None:
            if tuple(band) != (0.0, 1.0) or share != 0.5:
                raise ValueError("`pilot_band` and `pilot_share` are settings of Pilot-Commit; "
                                 f"policy {self.name!r} sets no `pilot`")
            return
        if _checks.count("pilot", self.pilot) < 1 or self.pilot >= self.group_size:
            raise ValueError(f"`pilot` must lie in [1, group_size) = [1, {self.group_size}), got {self.pilot}")
        if self.dynamic_sampling or self.branches or self.root_rule != "uniform" or self.price != "rollouts":
            raise ValueError("Pilot-Commit is defined for uniform roots priced in rollouts, without branching "
                             f"or dynamic sampling; policy {self.name!r} has root rule {self.root_rule!r}, "
                             f"prefix rule {self.prefix_rule!r}, price {self.price!r}")

    # -----------------------------------------------------------------------------------------------

    @property
    def pilot_commits(self) -> bool:
        """Whether the policy runs a pilot and commits to the prompts whose pilot lies in its band."""
        return self.pilot is not None

    @property
    def reads_root_outcomes(self) -> bool:
        """Whether the step decides its roots from the outcomes of earlier rollouts of the same step (DAPO's
        rounds, Pilot-Commit's pilot): the driver runs the rounds and the rewards must be 0/1."""
        return self.dynamic_sampling or self.pilot_commits

    @property
    def branches(self) -> bool:
        """Whether the policy samples continuations from prefixes (a second stage)."""
        return self.prefix_rule is not None

    @property
    def predicts_roots(self) -> bool:
        """Whether the root rule reads predicted values of the candidate prompts."""
        return ROOT_RULES[self.root_rule].predicts

    @property
    def predicts_prefixes(self) -> bool:
        """Whether the prefix rule reads predicted values of the anchors."""
        return self.branches and PREFIX_RULES[self.prefix_rule].predicts

    @property
    def branches_on_outcomes(self) -> bool:
        """Whether where continuations go depends on the factual rewards of the bare rollouts."""
        return self.branches and PREFIX_RULES[self.prefix_rule].reads_outcomes

    @property
    def priced_in_tokens(self) -> bool:
        """Whether the rules read the ``cost`` of a rollout and of a continuation (``price="tokens"``)."""
        return self.price == "tokens"

    @property
    def needs_predictor(self) -> bool:
        """Whether any of the policy's rules reads a prediction."""
        return self.predicts_roots or self.predicts_prefixes

    @property
    def deterministic(self) -> bool:
        """Whether the allocation is a function of the inputs alone (no random number generator)."""
        return not (self.branches and PREFIX_RULES[self.prefix_rule].randomised)

    def replace(self, **changes) -> "AllocationPolicy":
        """A copy with fields changed (validated), e.g. ``get_policy("grpo").replace(group_size=16)``."""
        return dataclasses.replace(self, **changes)

    def split(self, budget: RolloutBudget) -> tuple[int, int]:
        """(root rollouts, continuations per root rollout) for this policy at equal total budget."""
        if self.branches:
            return budget.roots, budget.continuations_per_root
        return budget.total, 0

    def dynamic_target(self, budget: int) -> int:
        """Mixed groups a dynamic-sampling batch of ``budget`` rollouts aims for.

        ``dapo_target`` if set, else max(1, budget // (2 G)): half of the groups the budget pays for.
        DAPO trains on a fixed number of mixed groups and generates as many rounds as it takes to fill
        them (its recipe generates about three groups per group trained). At equal generation budget
        the trained batch must therefore be smaller than the budget's B / G groups: with B / G the first
        round already spends everything and dynamic sampling reduces to GRPO plus a filter. Half leaves
        one round's worth of budget for resampling and is exactly paid for at a keep rate of 1/2.
        """
        budget = _checks.count("budget", budget)
        if self.dapo_target is not None:
            return self.dapo_target
        return max(1, budget // (2 * self.group_size))

    def allocate_roots(self, v, budget, *, rng=None, concentration=None, cost=None) -> np.ndarray:
        """Group size per candidate prompt, summing to ``budget``.

        ``cost`` (price of one rollout per candidate, in the unit of ``budget``) is read by a policy
        priced in tokens, which then spends sum c m <= ``budget``; other policies ignore it.
        """
        v = _checks.probabilities("v", _checks.vector("v", v))  # the checks of every root rule's inputs
        budget = _checks.count("budget", budget)
        if self.posterior and concentration is None:
            raise ValueError(f"policy {self.name!r} uses the Beta-posterior utility: pass `concentration`")
        if self.posterior:
            concentration = _checks.per_item("concentration", concentration, len(v), _checks.positive).astype(float)
        if self.price == "tokens" and cost is not None:
            cost = _checks.per_item("cost", cost, len(v), _checks.positive).astype(float)
        else:
            cost = None
        return ROOT_RULES[self.root_rule].allocate(self, v, budget,
                                                   concentration=concentration if self.posterior else None,
                                                   cost=cost)

    def allocate_prefixes(self, v, r, prompt, budget, *, rng=None, cost=None) -> PrefixAllocation:
        """Continuations per anchor; per-prompt budgets, leftovers pooled across prompts, then returned.

        Two passes: :meth:`place_own_budgets` (each prompt's budget on its own anchors), then
        :meth:`place_leftover` (what some prompts could not place, on every anchor). ``cost`` (price of
        one continuation per anchor, in the unit of ``budget``: rollouts of the anchor's prompt) is read
        by a policy priced in tokens; other policies ignore it.
        """
        first = self.place_own_budgets(v, r, prompt, budget, rng=rng, cost=cost)
        return self.place_leftover(v, r, first, rng=rng, cost=cost)

    def place_own_budgets(self, v, r, prompt, budget, *, rng=None, cost=None, start=None) -> PrefixAllocation:
        """The first pass of :meth:`allocate_prefixes`: each prompt's ``budget`` on its own anchors.

        For a non-randomised rule (:attr:`streams_prefixes`) a prompt's counts depend on its own anchors
        only, so this pass can run prompt by prompt as each tree's bare rollouts end (the step driver's
        streamed expansion, :func:`trace_theory.step.run_step`) and equals the pass over all prompts.
        ``start``: continuations already committed at each anchor (eager expansion's, at turn
        boundaries); the pass continues their gains and returns only the counts it adds.
        """
        v, r, prompt, budget, cost, rule = self._prefix_pass_inputs(v, r, prompt, budget, rng, cost)
        start = np.zeros(len(v), dtype=np.int64) if start is None else np.asarray(start, dtype=np.int64)
        if self.max_per_anchor is not None and (start > self.max_per_anchor).any():
            raise ValueError(f"`start` must not exceed `max_per_anchor` ({self.max_per_anchor})")
        return rule.place(self, v, r, prompt, budget, start=start, rng=rng, cost=cost)

    def place_leftover(self, v, r, first: PrefixAllocation, *, rng=None, cost=None) -> PrefixAllocation:
        """The second pass of :meth:`allocate_prefixes`: ``first.unspent`` pooled on every anchor.

        Continues from ``first.k`` (``first`` is :meth:`place_own_budgets` over all anchors); returns the
        whole allocation, with what is still unspent reported against the prompts that gave it up, in
        prompt order.
        """
        leftover = int(np.sum(first.unspent))
        if leftover == 0 or len(first.k) == 0:
            return first
        zeros = np.zeros(len(first.k), dtype=np.int64)
        v, r, _, _, cost, rule = self._prefix_pass_inputs(v, r, zeros, np.array([leftover]), rng, cost)
        second = rule.place(self, v, r, zeros, np.array([leftover]), start=first.k, rng=rng, cost=cost)
        still = int(second.unspent[0])
        unspent = np.minimum(first.unspent, np.maximum(0, still - (np.cumsum(first.unspent) - first.unspent)))
        return PrefixAllocation(k=first.k + second.k, unspent=unspent.astype(np.int64))

    @property
    def streams_prefixes(self) -> bool:
        """Whether :meth:`place_own_budgets` can run tree by tree (a branching, non-randomised rule)."""
        return self.branches and not PREFIX_RULES[self.prefix_rule].randomised

    def _prefix_pass_inputs(self, v, r, prompt, budget, rng, cost):
        """A prefix pass's inputs, checked, the price kept only for a token-priced policy, and the rule."""
        if not self.branches:
            raise ValueError(f"policy {self.name!r} does not branch from prefixes")
        v, r, prompt, budget = _prefix_inputs(v, r, prompt, budget)
        rule = PREFIX_RULES[self.prefix_rule]
        if rule.randomised and rng is None:
            raise ValueError(f"policy {self.name!r} is randomised: pass `rng` (a numpy.random.Generator)")
        if self.price == "tokens" and cost is not None:
            cost = _checks.positive("cost", _checks.vector("cost", cost))
            _checks.same_length(v=v, cost=cost)
        else:
            cost = None
        return v, r, prompt, budget, cost, rule


# ---------------------------------------------------------------------------------------------------
# The registered rules
# ---------------------------------------------------------------------------------------------------


@root_rule("uniform", predicts=False)
def _uniform_roots(policy, v, budget, *, concentration, cost):
    """Groups of about G for the first prompts in pool order (the sampler's random order)."""
    return _groups_in_order(policy, np.arange(len(v)), budget)


@root_rule("pcl", predicts=True)
def _pcl_roots(policy, v, budget, *, concentration, cost):
    """Groups of about G for the prompts whose predicted v is nearest 0.5 (PCL-style filtering)."""
    return _groups_in_order(policy, np.lexsort((np.arange(len(v)), np.abs(v - 0.5))), budget)


@root_rule("active", predicts=True, priced=True)
def _active_roots(policy, v, budget, *, concentration, cost):
    """TRACE stage 1: :func:`~trace_theory.allocate.allocate_roots` (the posterior utility with kappa;
    priced in tokens with ``cost``), on the inputs :meth:`AllocationPolicy.allocate_roots` checked."""
    if cost is not None:
        return _allocate_roots(v, budget, policy.min_group, policy.max_group, None, cost)
    return _allocate_roots(v, budget, policy.min_group, policy.max_group, concentration, None)


def _groups_in_order(policy, order: np.ndarray, budget: int) -> np.ndarray:
    max_group = max(budget, policy.min_group) if policy.max_group is None else policy.max_group
    counts = _even_groups(len(order), budget, policy.group_size, policy.min_group, max_group)
    m = np.zeros(len(order), dtype=np.int64)
    m[order[: len(counts)]] = counts
    return m


@prefix_rule("uniform", predicts=False)
def _uniform_prefixes(policy, v, r, prompt, budget, *, start, rng, cost):
    """Round-robin over each prompt's anchors in anchor order."""
    return _spread(prompt, budget, _room(policy, start), None)


@prefix_rule("random", predicts=False, randomised=True)
def _random_prefixes(policy, v, r, prompt, budget, *, start, rng, cost):
    """Round-robin over each prompt's anchors in a random order (TreePO / Tree-GRPO-style)."""
    return _spread(prompt, budget, _room(policy, start), rng)


@prefix_rule("active", predicts=True, reads_outcomes=True, priced=True)
def _active_prefixes(policy, v, r, prompt, budget, *, start, rng, cost):
    """TRACE stage 2: :func:`~trace_theory.allocate.allocate_prefixes`, the largest flip gains q^k (1 - q)
    (per token with ``cost``)."""
    if cost is not None:
        return allocate_prefixes(v, r, prompt, budget, max_per_anchor=policy.max_per_anchor, start=start,
                                 cost=cost)
    return allocate_prefixes(v, r, prompt, budget, max_per_anchor=policy.max_per_anchor, start=start)


def _room(policy, start: np.ndarray) -> np.ndarray:
    """Continuations each anchor can still take under ``policy.max_per_anchor`` (inf: no cap)."""
    return (np.inf if policy.max_per_anchor is None else float(policy.max_per_anchor)) - start


def _even_groups(n: int, budget: int, group_size: int, min_group: int, max_group: int) -> np.ndarray:
    """Group sizes for the first s prompts: as even as possible, the group nearest ``group_size``.

    s = round(budget / group_size), then moved just enough to respect ``min_group`` and ``max_group``.
    """
    if budget == 0:
        return np.zeros(0, dtype=np.int64)
    check_root_budget(n, budget, min_group, max_group)
    s = min(n, max(1, (2 * budget + group_size) // (2 * group_size)))  # round(budget / G), half up
    s = min(s, budget // min_group)  # every chosen prompt needs at least min_group
    s = max(s, -(-budget // max_group))  # and none may exceed max_group
    base, extra = divmod(budget, s)
    return np.where(np.arange(s) < extra, base + 1, base).astype(np.int64)


def _spread(prompt, budget, room, rng) -> PrefixAllocation:
    """Spread each prompt's budget over its anchors: round-robin in anchor order, or in random order.

    Passes repeat: in each, every anchor with room takes one unit while its prompt still needs some, so
    counts within a prompt differ by at most one (unless capped).
    """
    n_groups, n = len(budget), len(prompt)
    room = np.minimum(np.asarray(room, dtype=float), float(budget.max(initial=0)))
    target = np.minimum(budget, np.bincount(prompt, weights=room, minlength=n_groups)).astype(np.int64)
    k = np.zeros(n, dtype=np.int64)
    remaining = target.copy()
    order = np.argsort(prompt, kind="stable")
    while remaining.any():
        open_ = order[(k[order] < room[order]) & (remaining[prompt[order]] > 0)]
        if rng is not None:
            open_ = open_[rng.permutation(open_.size)]
            open_ = open_[np.argsort(prompt[open_], kind="stable")]
        g = prompt[open_]
        rank = np.arange(open_.size) - np.searchsorted(g, g)
        give = open_[rank < remaining[g]]
        k[give] += 1
        remaining -= np.bincount(prompt[give], minlength=n_groups)
    return PrefixAllocation(k=k, unspent=budget - target)


def top_up_roots(m, extra) -> np.ndarray:
    """Add ``extra`` rollouts to the active groups of ``m`` (m > 0), round-robin in prompt order.

    The caller spends prefix budget that no anchor could take (single-turn rollouts) this way, so that
    equal-budget comparisons stay equal. Adding to an existing group never breaks ``min_group``.

    Examples
    --------
    >>> top_up_roots([0, 3, 2], 3).tolist()
    [0, 5, 3]
    """
    m = _checks.counts("m", _checks.vector("m", m, dtype=None))
    extra = _checks.count("extra", extra)
    active = np.flatnonzero(m > 0)
    if extra and active.size == 0:
        raise ValueError("`m` has no active group to add rollouts to")
    out = m.copy()
    if extra:
        base, rest = divmod(extra, active.size)
        out[active] += base
        out[active[:rest]] += 1
    return out


PRICES = ("rollouts", "tokens")
"""Units a policy can price its budget in (:attr:`AllocationPolicy.price`)."""

POLICIES: Registry[AllocationPolicy] = Registry("allocation policy")


def _register(policy: AllocationPolicy) -> None:
    POLICIES.add(policy.name, policy)


_register(AllocationPolicy("grpo", "uniform"))
_register(AllocationPolicy("dapo", "uniform", dynamic_sampling=True))
_register(AllocationPolicy("pilot_commit", "uniform", pilot=2))
_register(AllocationPolicy("pcl", "pcl"))
_register(AllocationPolicy("root_only", "active"))
_register(AllocationPolicy("random_prefix", "uniform", "random"))
_register(AllocationPolicy("uniform_tree", "uniform", "uniform"))
_register(AllocationPolicy("active_root_uniform_prefix", "active", "uniform"))
_register(AllocationPolicy("prefix_only", "uniform", "active"))
_register(AllocationPolicy("trace", "active", "active"))
_register(AllocationPolicy("trace_beta", "active", "active", posterior=True))
_register(AllocationPolicy("trace_tokens", "active", "active", price="tokens"))


def get_policy(name: str, **changes) -> AllocationPolicy:
    """The registered policy ``name``, with optional field changes (``group_size=16``, ...)."""
    policy = POLICIES[name]
    return policy.replace(**changes) if changes else policy
