"""What the rollout engine produces: rollout trees with the exact tokens, text and state of every turn.

A :class:`RolloutBatch` pairs a ``trace_theory.RolloutForest`` (structure, rewards, costs) with one
:class:`NodePayload` per node. The turn that created a node is its parent's context followed by the
node's ``action_ids`` (generated, loss mask 1) and ``observation_ids`` (closing tokens, observation and
next generation prompt, loss mask 0); a root's payload holds the chat prompt. Concatenating payloads
along a path therefore gives exactly the tokens the model was conditioned on, branch points included.

A :class:`BatchBuilder` is the one owner of a batch while it grows: the forest builder, the payloads,
the pool rows. The engine plants roots in it, the scheduler (:mod:`.scheduler`) adds turns and rewards
to it, and :meth:`BatchBuilder.batch` freezes it into a :class:`RolloutBatch`. Both share
:class:`NodePaths`, the one implementation of a node's path, context, messages, trajectory and history.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from trace_theory import (ForestBuilder, Origin, RolloutBudget, RolloutForest, budget_by_depth, effective_ratio,
                          mixed_anchor_ratio)

from ..envs.base import EndReason, Message

__all__ = ["History", "Predictor", "NodePayload", "Trajectory", "RolloutReport", "NodePaths", "RolloutBatch",
           "BatchBuilder", "ENV_FAILURES"]

ENV_FAILURES = (EndReason.ENV_ERROR, EndReason.ENV_TIMEOUT)
"""End reasons of an infrastructure fault, not of the model's play (kept out of the loss by default)."""


@dataclass(frozen=True)
class History:
    """What a predictor sees of an anchor: the conversation up to a turn boundary."""

    prompt: int
    """Index of the row in the candidate pool."""
    row: Mapping[str, Any]
    depth: int
    """Turns taken (0 for a prompt)."""
    messages: tuple[Message, ...]
    """Opening messages, then one assistant message and one observation message per turn."""
    token_ids: tuple[int, ...]
    """The exact context the model would continue from."""


class Predictor(Protocol):
    """Maps histories to predicted success probabilities in [0, 1].

    A predictor used with a posterior policy (``trace_beta``) also has ``concentration(histories)``,
    the strength of its Beta posterior per history.
    """

    def __call__(self, histories: Sequence[History]) -> np.ndarray: ...


@dataclass(frozen=True)
class NodePayload:
    """The turn that created a node: parent's context + ``action_ids`` + ``observation_ids``.

    For a root, ``action_ids`` is empty and ``observation_ids`` is the chat prompt. A leaf has no
    ``observation_ids`` (nothing follows), but keeps the environment's last message in ``observation``.
    """

    action_ids: tuple[int, ...]
    """Tokens the model generated (loss mask 1), the turn-end token included when it produced one."""
    action_logprobs: tuple[float, ...]
    """Log-probability of each action token under the distribution it was sampled from (``backends.base``)."""
    action: str
    """The action as text (what the environment was given)."""
    observation_ids: tuple[int, ...]
    """Closing tokens, observation message and next generation prompt (loss mask 0)."""
    observation: str
    messages: tuple[Message, ...]
    """Messages this node adds to the conversation."""
    snapshot: Any
    """Environment state after the turn; a continuation from this node restores it."""
    finish_reason: str | None = None
    """The back end's finish reason for the action ("stop" / "length"); None for roots."""
    end_reason: EndReason | None = None
    """Why the rollout ended here (leaves only)."""

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.action_ids + self.observation_ids


@dataclass(frozen=True)
class Trajectory:
    """A root-to-node token sequence, ready for a policy-gradient loss."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    """1 on action tokens, 0 on prompt and observation tokens."""
    logprobs: np.ndarray
    """Generation-time log-probabilities on action tokens, 0 elsewhere."""
    node: np.ndarray
    """Id of the node whose turn produced each token (the root's id on prompt tokens)."""


@dataclass(frozen=True)
class RolloutReport:
    """The budget a call planned and what it actually spent."""

    policy: str
    planned: RolloutBudget
    """The budget in the paper's shape after the policy's split (M roots, N per root)."""
    rollouts: int
    """Leaves generated: the rollouts actually spent."""
    bare_rollouts: int
    """Rollouts sampled at roots, top-ups included."""
    continuations: int
    """Rollouts branched from prefixes."""
    top_up_rollouts: int
    """Bare rollouts added because no prefix could take part of the continuation budget."""
    generated_tokens: int
    """Sum of node costs."""
    prompt_tokens: int
    """Prompt tokens of all generation requests, per sample."""
    cached_prompt_tokens: int
    """Of those, served from the back end's prefix cache."""
    continuation_prefix_tokens: int
    """Prompt tokens of every continuation's first turn: the prefix it shares with its factual rollout."""
    continuation_prefix_cached: int
    """Of those, served from the prefix cache."""
    rounds: int
    """Rounds of root generation (1, or more under dynamic sampling)."""
    end_reasons: Mapping[str, int]
    seconds: float
    """Wall time of the call."""
    generation_seconds: float = 0.0
    """Time the back end was generating (:class:`~.scheduler.Timeline`)."""
    env_seconds: float = 0.0
    """Time at least one environment call was running."""
    overlap_seconds: float = 0.0
    """Time both were running at once."""
    env_call_seconds: float = 0.0
    """Environment calls' durations summed (more than ``env_seconds`` when calls ran concurrently)."""
    generator_idle_share: float = 0.0
    """1 - generation_seconds / seconds: the share of the call's wall time the generator had no work."""
    max_rollout_env_seconds: float = 0.0
    """The longest time one rollout spent in its environment: the least any schedule can take."""
    continuations_by_round: tuple[int, ...] = ()
    """Continuations placed in each expansion round (``rollout.expansion_rounds``)."""
    continuations_by_phase: tuple[int, ...] = ()
    """Streamed and eager: continuations by when they were placed (``trace_theory.step.StepRecord.node_phase``'s
    columns summed): at a turn boundary (eager), at a rollout's end (eager: what it left of its budget, from
    its last prefix), once its tree had ended, once every tree had. Empty for the other expansions."""
    top_ups_at_rollout_ends: int = 0
    """Eager: top-ups started when a one-turn bare rollout ended (``StepRecord.early_top_ups``; counted in
    ``top_up_rollouts`` too). With what starts at a rollout's end in ``continuations_by_phase``, the rollouts
    that can run one generation wave past the longest bare rollout: with ``rollout.eager_lag`` 0 nothing
    else starts later than its prefix formed."""
    env_error_sample: str | None = None
    """The call's first environment failure (end reason, rollout, exception type and message, then the
    traceback of an ``env_error``); None when every environment call succeeded."""
    phase_seconds: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Wall seconds of the call's phases: ``predict`` (V~ and kappa), ``bare_generation`` (planting the
    roots' rollouts; streamed, also the continuations started beside them), ``expansion_generation``
    (every later round: continuations, top-ups; streamed, what some trees could not place)."""
    streamed: bool = False
    """Whether each tree's continuations started as soon as its own bare rollouts ended
    (``rollout.expansion``; ``trace_theory.step.StepRecord.streamed``)."""
    expansion: str = "barrier"
    """What ran: "barrier", "streamed", "eager" or "pipelined" (``trace_theory.step.StepRecord.expansion``)."""
    samples_in_flight: float = 0.0
    """Samples the generator held, averaged over the time it generated (its occupancy)."""
    generation_polls: int = 0
    """Generation steps: batches (transformers) or engine steps (vLLM) the call took."""
    wave_tokens: int = 0
    """Tokens generated during the call (its generation wave). Pipelined expansion: this call's bare
    rollouts and the previous call's continuations, not the batch's ``generated_tokens``; otherwise equal."""
    stale_token_share: float = 0.0
    """Pipelined expansion: the share of the batch's generated tokens sampled in an earlier call, by the policy
    one update older than the one that generated the rest (its bare turns); 0 otherwise."""
    occupancy: tuple[tuple[float, int], ...] = ()
    """(seconds into the call, samples in flight) at the start of each generation step: the generator's
    occupancy over time (not logged in the metrics; ``trace_train.bench.barrier`` plots it)."""

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_prompt_tokens

    @property
    def continuation_prefix_hit_rate(self) -> float:
        """Share of continuation prefix tokens served from cache (NaN without continuations)."""
        if self.continuation_prefix_tokens == 0:
            return float("nan")
        return self.continuation_prefix_cached / self.continuation_prefix_tokens

    def as_dict(self) -> dict:
        """Plain JSON-ready values, derived ones included."""
        return dataclasses.asdict(self) | {"computed_prompt_tokens": self.computed_prompt_tokens,
                                           "continuation_prefix_hit_rate": self.continuation_prefix_hit_rate}


class NodePaths:
    """Root-to-node paths of a forest's nodes and what lies along them: the one implementation.

    A subclass holds ``nodes`` (a :class:`NodePayload` per node id) and ``rows`` (pool rows by prompt id)
    and says where each node hangs (:meth:`parent_of`) and which prompt it answers (:meth:`prompt_of`):
    :class:`BatchBuilder` while a batch grows, :class:`RolloutBatch` once it is built.
    """

    nodes: Sequence[NodePayload]
    rows: Mapping[int, Mapping[str, Any]]

    def parent_of(self, node: int) -> int:
        """The parent of ``node`` (-1 for a root)."""
        raise NotImplementedError

    def prompt_of(self, node: int) -> int:
        """The pool index of ``node``'s prompt."""
        raise NotImplementedError

    def path(self, node: int) -> list[int]:
        """Node ids from the root down to ``node``."""
        node = int(node)
        if not 0 <= node < len(self.nodes):
            raise ValueError(f"`node` must be a node id in [0, {len(self.nodes) - 1}], got {node}")
        path = [node]
        while (up := self.parent_of(path[-1])) != -1:
            path.append(up)
        return path[::-1]

    def context_ids(self, node: int) -> list[int]:
        """The exact token ids from the root's prompt through ``node``'s turn and observation."""
        return [t for n in self.path(node) for t in self.nodes[n].token_ids]

    def messages(self, node: int) -> list[Message]:
        """The conversation up to ``node``: opening messages, then each turn's messages."""
        return [m for n in self.path(node) for m in self.nodes[n].messages]

    def trajectory(self, node: int) -> Trajectory:
        """Tokens, loss mask, log-probabilities and producing node along the path to ``node``."""
        ids, mask, logp, owner = [], [], [], []
        for n in self.path(node):
            p = self.nodes[n]
            ids += p.action_ids + p.observation_ids
            mask += [1] * len(p.action_ids) + [0] * len(p.observation_ids)
            logp += list(p.action_logprobs) + [0.0] * len(p.observation_ids)
            owner += [n] * (len(p.action_ids) + len(p.observation_ids))
        return Trajectory(np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.int8),
                          np.asarray(logp, dtype=np.float64), np.asarray(owner, dtype=np.int64))

    def history(self, node: int) -> History:
        """What a predictor sees of ``node``: its prompt, row, depth, messages and exact context."""
        path = self.path(node)
        prompt = self.prompt_of(path[0])
        return History(prompt, self.rows[prompt], len(path) - 1,
                       tuple(m for n in path for m in self.nodes[n].messages),
                       tuple(t for n in path for t in self.nodes[n].token_ids))


@dataclass(frozen=True)
class RolloutBatch(NodePaths):
    """A forest of rollout trees with its payloads (indexed by node id) and predictions."""

    forest: RolloutForest
    nodes: tuple[NodePayload, ...]
    rows: Mapping[int, Mapping[str, Any]]
    """Pool rows by prompt id (the ids in ``forest.prompt``)."""
    predictions: np.ndarray
    """Predicted success probability of each node that was scored (roots, anchors), NaN elsewhere."""
    report: RolloutReport
    kept: np.ndarray | None = None
    """DAPO: the candidate prompts (ids in ``forest.prompt``) whose group mixed, the only ones the update
    trains on (``StepRecord.kept``); None for every other policy (every prompt is trained)."""

    def trained_nodes(self, *, train_env_failures: bool = False) -> np.ndarray:
        """Boolean per node: whether the update trains the node's turn.

        A turn is trained in the rollout that owns it (``forest.factual_leaf``), so it is left out when
        that rollout is: under DAPO when its prompt is not in :attr:`kept` (a uniform group, as in the
        simulator), and, unless ``train_env_failures``, when the rollout ended by an environment fault
        (:data:`ENV_FAILURES`: its reward 0 says nothing about the model). Only the loss changes here; the
        trainer first drops failed rollouts altogether (:meth:`without_env_failures`, unless
        ``algorithm.train_env_failures``), after which no leaf of the batch is a fault.
        """
        f = self.forest
        keep_leaf = np.ones(len(f), dtype=bool)
        if self.kept is not None:
            keep_leaf &= np.isin(f.prompt, np.asarray(self.kept, dtype=np.int64))
        if not train_env_failures:
            failed = [n for n in f.leaves.tolist() if self.nodes[n].end_reason in ENV_FAILURES]
            keep_leaf[failed] = False
        owner = f.factual_leaf
        return np.where(owner >= 0, keep_leaf[np.maximum(owner, 0)], False)

    def env_failed_leaves(self) -> np.ndarray:
        """Leaves whose rollout ended by an environment fault (:data:`ENV_FAILURES`)."""
        return np.asarray([n for n in self.forest.leaves.tolist() if self.nodes[n].end_reason in ENV_FAILURES],
                          dtype=np.int64)

    def without_env_failures(self) -> "RolloutBatch":
        """The batch as if the rollouts that ended by an environment fault had not been sampled.

        A failed rollout's reward 0 says nothing about the model, so it must not enter advantages, predictor
        targets, ``mixed``, DAPO's filter or the contrast metrics. Every node whose subtree holds no healthy
        leaf is removed: the failed rollout's chain below its last ancestor shared with a healthy rollout
        (the whole tree when no rollout of it is healthy). A shared trunk with healthy continuations stays,
        now owned (``forest.factual_leaf``, first children) by a healthy rollout, so both update layouts
        train it, weighted by its healthy leaves. Node ids are renumbered in their order; the report (the
        budget spent, ``end_reasons`` and so the ``env_failures`` count) is unchanged. DAPO's kept groups
        are those still mixed among their healthy rollouts. The batch itself when nothing failed.
        """
        failed = self.env_failed_leaves()
        if failed.size == 0:
            return self
        f = self.forest
        healthy = f.is_leaf.copy()
        healthy[failed] = False
        keep = np.flatnonzero(f.subtree_sum(healthy.astype(float)) > 0)
        new_id = np.full(len(f), -1, dtype=np.int64)
        new_id[keep] = np.arange(keep.size)
        parent = np.where(f.parent[keep] >= 0, new_id[np.maximum(f.parent[keep], 0)], -1)
        forest = RolloutForest(parent, f.prompt[keep], f.depth[keep], f.reward[keep], f.is_leaf[keep],
                               f.origin[keep], f.cost[keep], binary_rewards=f.binary_rewards)
        kept = self.kept
        if kept is not None and forest.n_leaves:
            leaves = forest.leaves
            ids, inverse = np.unique(forest.prompt[leaves], return_inverse=True)
            low, high = np.full(ids.size, np.inf), np.full(ids.size, -np.inf)
            np.minimum.at(low, inverse, forest.reward[leaves])
            np.maximum.at(high, inverse, forest.reward[leaves])
            kept = np.intersect1d(np.asarray(kept, dtype=np.int64), ids[low < high])  # still mixed
        elif kept is not None:
            kept = np.zeros(0, dtype=np.int64)
        return dataclasses.replace(self, forest=forest, nodes=tuple(self.nodes[i] for i in keep.tolist()),
                                   predictions=np.asarray(self.predictions)[keep], kept=kept)

    def parent_of(self, node: int) -> int:
        return int(self.forest.parent[node])

    def prompt_of(self, node: int) -> int:
        return int(self.forest.prompt[node])

    def metrics(self) -> dict[str, Any]:
        """Contrast and budget metrics of the forest (``trace_theory.metrics``), for logging."""
        f = self.forest
        return {
            "effective_ratio": effective_ratio(f),
            "mixed_anchor_ratio": mixed_anchor_ratio(f),
            "rollouts_by_anchor_depth": budget_by_depth(f).tolist(),
            "tokens_by_anchor_depth": budget_by_depth(f, unit="cost").tolist(),
        }


class BatchBuilder(NodePaths):
    """The one owner of a rollout batch while it grows: forest builder, payloads and pool rows.

    Node ids are given in the order nodes are added, and each node's payload is added with it. The
    engine adds roots (:meth:`add_root`), the scheduler adds turns (:meth:`add_turn`) and ends rollouts
    (:meth:`finish`); :meth:`build` is the forest so far and :meth:`batch` the finished batch.

    Parameters
    ----------
    binary_rewards : bool
        Whether rewards must be 0/1 (``trace_theory.ForestBuilder``).
    """

    def __init__(self, *, binary_rewards: bool = True):
        self._forest = ForestBuilder(binary_rewards=binary_rewards)
        self._parent: list[int] = []
        self._prompt: list[int] = []
        self.nodes: list[NodePayload] = []
        self.rows: dict[int, Mapping[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def parent_of(self, node: int) -> int:
        return self._parent[node]

    def prompt_of(self, node: int) -> int:
        return self._prompt[node]

    def add_root(self, prompt: int, row: Mapping[str, Any], messages: Sequence[Message],
                 prompt_ids: Sequence[int], snapshot: Any) -> int:
        """A root for pool row ``prompt`` with its opening messages, chat prompt ids and initial
        environment snapshot; returns its node id."""
        root = self._forest.add_root(prompt)
        self._add(root, -1, prompt, NodePayload((), (), "", tuple(prompt_ids), "", tuple(messages), snapshot))
        self.rows[prompt] = row
        return root

    def add_turn(self, parent: int, payload: NodePayload) -> int:
        """One turn below ``parent`` (its cost: the action's tokens); returns the new node's id."""
        node = self._forest.add_turn(parent, cost=len(payload.action_ids))
        self._add(node, parent, self._prompt[parent], payload)
        return node

    def finish(self, node: int, reward: float) -> None:
        """Record the terminal reward of the rollout that ends at ``node``."""
        self._forest.finish(node, reward)

    def copy_from(self, forest: RolloutForest, nodes: Sequence[NodePayload], rows: Mapping[int, Mapping[str, Any]],
                  keep: np.ndarray | None = None, *, prompt_shift: int = 0) -> None:
        """Add the nodes ``keep`` of ``forest`` (default: all; ids in increasing order, every node after its
        parent) with their payloads, origins, costs and rewards, renumbered in that order; each prompt id
        is shifted by ``prompt_shift`` (``rows`` are read at the old ids)."""
        keep = np.arange(len(forest)) if keep is None else np.asarray(keep, dtype=np.int64)
        new_id: dict[int, int] = {}
        for old in keep.tolist():
            up, prompt = int(forest.parent[old]), int(forest.prompt[old])
            if up == -1:
                node = self._forest.add_root(prompt + prompt_shift)
                self.rows[prompt + prompt_shift] = rows[prompt]
            else:
                node = self._forest.add_turn(new_id[up], origin=Origin(int(forest.origin[old])),
                                             cost=float(forest.cost[old]))
            self._add(node, -1 if up == -1 else new_id[up], prompt + prompt_shift, nodes[old])
            if forest.is_leaf[old] and up != -1:
                self._forest.finish(node, float(forest.reward[old]))
            new_id[old] = node

    def _add(self, node: int, parent: int, prompt: int, payload: NodePayload) -> None:
        assert node == len(self.nodes), "payloads are kept in node-id order"
        self._parent.append(parent)
        self._prompt.append(prompt)
        self.nodes.append(payload)

    def build(self) -> RolloutForest:
        """The forest grown so far."""
        return self._forest.build()

    def batch(self, forest: RolloutForest, predictions: np.ndarray, report: RolloutReport, *,
              kept: np.ndarray | None = None) -> RolloutBatch:
        """The finished batch of ``forest`` (this builder's last :meth:`build`)."""
        assert len(forest) == len(self.nodes), "the forest is this builder's"
        return RolloutBatch(forest, tuple(self.nodes), dict(self.rows), predictions, report, kept=kept)
