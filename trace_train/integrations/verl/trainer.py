"""``trainer.v1.trainer_mode=trace``: verl's sync V1 trainer with TRACE's root allocation, trees, advantages
and predictor.

What it adds to ``PPOTrainerSync`` (the ``trace:`` block of the config, :class:`TraceSettings`):

* **Root allocation, as a batch hook** (:meth:`TracePPOTrainer._submit_batch_to_rollout`): the step's pool is
  the dataloader batch (``data.train_batch_size`` prompts). A :class:`~.coordinator.StepCoordinator` actor
  (threaded, named per step) runs ``trace_theory.step.run_step`` with our predictor at the prompts'
  openings; the group sizes m it returns become each prompt's ``__rollout_n__``, prompts with m = 0 are not
  submitted, and the replay buffer is asked for exactly the submitted prompts (:meth:`_step_once`).
* **Trees**: each submitted prompt carries the coordinator's name and its pool index; the
  ``TraceAgentLoopWorker`` grows its tree (:mod:`.worker`).
* **Advantages**: :meth:`_compute_advantage` reads every trajectory's ``extra_fields`` and hands them to the
  ``trace*`` estimators (:mod:`.estimator`) for the duration of verl's own advantage step.
* **Refills and DAPO**: a later submission in the same step (verl refilling failed groups, or DAPO's
  filter asking for more prompts) of k prompts gets the budget's share for k prompts, M k / B roots
  (B = ``data.train_batch_size``, at least 1), not the whole step's budget.
* **Failures** (:meth:`_step_once`): a tree that fails drops its group, as verl drops a failed one, and
  the step goes on; a step where more than ``trace.max_failed_share`` of the trees failed stops before
  verl samples it, with one line naming the first error.
* **Predictor**: fitted after each step on the step's forest exactly as our trainer fits it
  (``trace_train.train._fit_predictor``: ``node_targets`` of every non-terminal node, root outcomes into the
  prompts' posteriors), failed trees left out.
* **Checkpoint, by verl's rules**: its ``state_dict`` is written as ``trace_predictor.pkl`` into the
  ``global_step_<n>`` folder *before* verl's own save, so it is there when verl writes
  ``latest_checkpointed_iteration.txt`` and calls its checkpoint callback (remote copies carry it); after
  the save, predictor files of folders older than the newest ``trainer.max_actor_ckpt_to_keep`` are
  removed. On resume it is read from the folder verl resumed from: none for ``resume_mode=disable`` or a
  fresh start, ``resume_from_path`` for ``resume_mode=resume_path``, the latest checkpoint for ``auto``.
* **Metrics** in verl's tracker (``trace/...``, :func:`step_metrics`): trees, failed trees, time the trees
  waited for each other, mixed-group share, predicted v and utility at the roots, predicted v at the
  prefixes, continuations per depth, rollouts by kind, and the predictor's fit.

Sync mode only, ``parameter_sync_step`` 1: the allocation decides one step's rollouts for one update. Past
its construction the trainer reports ``trainer_mode == "sync"`` to verl's code, which branches on it
(replay buffer, prompt persistence).
"""

from __future__ import annotations

import glob
import logging
import os
import pickle
import re
import uuid
from dataclasses import dataclass

import numpy as np
import ray
import transfer_queue as tq
from omegaconf import OmegaConf

from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

from trace_theory import Origin, Prediction, RolloutBudget
from trace_theory.allocate import root_utility

from .coordinator import StepCoordinator, fit_predictor_on_step
from .estimator import CURRENT_TRACE_FIELDS
from .worker import PROMPT_KEY, STEP_KEY

__all__ = ["TraceSettings", "TracePPOTrainer", "PREDICTOR_FILE", "save_predictor", "load_predictor", "submitted_batch",
           "openings_of", "resume_folder", "prune_predictors", "submission_budget", "step_metrics"]

logger = logging.getLogger(__name__)

PREDICTOR_FILE = "trace_predictor.pkl"

PREDICTOR_KINDS_IN_VERL = ("ngram", "running_mean")
"""Predictors the plugin can run: ``probe`` reads the policy's hidden states through an encoder our trainer
attaches, and verl's FSDP workers offer none to the trainer process."""


@dataclass(frozen=True)
class TraceSettings:
    """The ``trace:`` block: ``policy``, ``roots`` M and ``continuations_per_root`` N per step, ``group_size``,
    ``predictor`` kind, ``value_target`` and ``seed`` (meanings as in ``trace_train.configs``), and
    ``max_failed_share``: the share of a step's trees that may fail (each drops its group) before the step
    stops. Checked on construction, so a setting that cannot run fails before verl starts its workers."""

    policy: str = "trace"
    roots: int = 1024
    continuations_per_root: int = 2
    group_size: int = 8
    predictor: str = "ngram"
    value_target: str = "leaf_weighted"
    seed: int = 0
    max_failed_share: float = 0.25

    def __post_init__(self):
        if self.predictor not in PREDICTOR_KINDS_IN_VERL:
            why = (" (it reads the policy's hidden states, and verl's workers attach no encoder to the trainer's "
                   "predictor)" if self.predictor == "probe" else "")
            raise ValueError(f"trace.predictor={self.predictor!r} cannot run inside verl{why}; "
                             f"use one of {list(PREDICTOR_KINDS_IN_VERL)}")
        if not 0.0 <= float(self.max_failed_share) <= 1.0:
            raise ValueError(f"trace.max_failed_share must be in [0, 1], got {self.max_failed_share}")

    @classmethod
    def from_config(cls, block) -> "TraceSettings":
        block = {} if block is None else OmegaConf.to_container(block, resolve=True) if OmegaConf.is_config(block) \
            else dict(block)
        unknown = set(block) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown key(s) in the `trace:` block: {sorted(unknown)}")
        return cls(**block)

    def rollout_config(self):
        from trace_train.configs import RolloutConfig

        return RolloutConfig(policy=self.policy, roots=self.roots, continuations_per_root=self.continuations_per_root,
                             group_size=self.group_size, expansion="streamed")


class PredictorAtHistories:
    """``predict(histories, concentration)`` of a predictor (picklable: it travels to the coordinator actor)."""

    def __init__(self, predictor):
        self.predictor = predictor

    def __call__(self, histories, concentration: bool) -> Prediction:
        v = np.asarray(self.predictor(histories), dtype=float)
        kappa = np.asarray(self.predictor.concentration(histories), dtype=float) if concentration else None
        return Prediction(v, kappa)


def openings_of(batch, tokens=None) -> list:
    """The history of each prompt's opening (depth 0), as our predictors read it: its chat messages, the
    token ids ``tokens(messages)`` gives (:func:`~.agent_loop.opening_tokens`: as the agent loop renders them;
    none without it) and its ``data_source`` as the row's family."""
    from trace_train.rollout.batch import History

    from .worker import prompt_row

    prompts = batch["raw_prompt"]
    sources = batch["data_source"] if "data_source" in batch.keys() else None
    out = []
    for i in range(len(prompts)):
        messages = prompts[i]
        messages = tuple(dict(m) for m in (messages.tolist() if hasattr(messages, "tolist") else messages))
        row = prompt_row({} if sources is None else {"data_source": sources[i]})
        out.append(History(i, row, 0, messages, tuple(tokens(messages)) if tokens else ()))
    return out


def submitted_batch(batch, m, step_name: str):
    """The batch hook's output: the rows with m > 0, each with ``__rollout_n__`` = m, the step coordinator's
    name and its pool index (what :class:`~.worker.TraceAgentLoopWorker` reads)."""
    from verl.utils import tensordict_utils as tu

    m = np.asarray(m, dtype=np.int64)
    if m.shape != (len(batch),):
        raise ValueError(f"{len(batch)} prompts but {m.size} group sizes")
    keep = np.flatnonzero(m > 0)
    if keep.size < len(batch):
        batch = tu.index_select_tensor_dict(batch, keep.tolist())
    tu.assign_non_tensor_data(batch, STEP_KEY, step_name)
    tu.assign_non_tensor(batch, **{"__rollout_n__": m[keep].tolist(), PROMPT_KEY: keep.tolist()})
    return batch


@register_trainer("trace")
class TracePPOTrainer(PPOTrainerSync):
    """The sync V1 trainer with TRACE (module docstring)."""

    def __init__(self, config):
        super().__init__(config)
        from trace_train.predictors import PredictorConfig, build_predictor

        self.trace = TraceSettings.from_config(config.get("trace", None))
        rollout = self.trace.rollout_config()
        self.trace_policy = rollout.allocation_policy
        self.trace_budget = RolloutBudget(rollout.roots, rollout.continuations_per_root)
        self.predictor = build_predictor(PredictorConfig(kind=self.trace.predictor))
        self._coordinators: list = []
        """This step's (coordinator actor, pool openings), one per submission."""
        self._submitted = 0
        if self.parameter_sync_step != 1:
            raise ValueError("the trace trainer allocates one step's rollouts for one update: parameter_sync_step 1")

    def _build_replay_buffer(self):
        # verl picks its buffer (and more) by trainer_mode == "sync": this trainer is the sync one, so it
        # says so from here on (PPOTrainer.__init__ has just read `parameter_sync_step` under "trace": 1).
        self.trainer_mode = "sync"
        return super()._build_replay_buffer()

    # ---- root allocation: the batch hook --------------------------------------------------------------

    def _submit_batch_to_rollout(self, batch) -> int:
        pool = len(batch)
        openings = openings_of(batch, self._opening_tokens())
        name = f"trace_step_{self.global_steps}_{uuid.uuid4().hex[:8]}"
        # the first submission of a step is its batch; later ones (refills, DAPO) get their prompts' share
        budget = self.trace_budget if not self._coordinators else submission_budget(
            self.trace_budget, pool, int(self.config.data.train_batch_size))
        actor = ray.remote(StepCoordinator).options(name=name, max_concurrency=max(64, 4 * pool))
        coordinator = actor.remote(self.trace_policy, budget, pool, PredictorAtHistories(self.predictor),
                                   openings, seed=self.trace.seed + self.global_steps + 7919 * len(self._coordinators))
        m = np.asarray(ray.get(coordinator.start.remote()), dtype=np.int64)
        batch = submitted_batch(batch, m, name)
        keep = np.flatnonzero(m > 0)
        if not self._coordinators:  # the step's batch (a refill of failed groups replaces some of it)
            self._submitted = int(keep.size)
        self._coordinators.append((coordinator, openings))
        return super()._submit_batch_to_rollout(batch)

    def _opening_tokens(self):
        """The agent loop's rendering of openings (its tools' schemas included), built once."""
        if getattr(self, "_tokens", None) is None:
            from verl.tools.tool_registry import load_all_tools

            from .agent_loop import opening_tokens

            turn = self.config.actor_rollout_ref.rollout.multi_turn
            tools = load_all_tools(tool_config_path=turn.get("tool_config_path"),
                                   function_tool_path=turn.get("function_tool_path"))
            self._tokens = opening_tokens(self.tokenizer, tools=tools,
                                          chat_template_kwargs=self.config.data.get("apply_chat_template_kwargs", {}))
        return self._tokens

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int):
        self._stop_if_too_many_failed()
        batch = super()._step_once(metrics, timing_raw, self._submitted or sample_batch_size)
        self._fit_predictor(metrics)
        return batch

    def _stop_if_too_many_failed(self) -> None:
        """Once the step's trees have ended (verl's sampler waits for the same), stop the step in one line if
        more than ``trace.max_failed_share`` of them failed; fewer failures only drop their groups."""
        trees, failed, first = 0, 0, None
        for coordinator, _ in self._coordinators:
            ray.get(coordinator.record.remote())  # every tree has finished or failed
            report = ray.get(coordinator.failures.remote())
            trees, failed = trees + report["trees"], failed + len(report["failed"])
            first = first or report["first"]
        if trees and failed / trees > self.trace.max_failed_share:
            raise RuntimeError(f"TRACE step {self.global_steps}: {failed} of {trees} trees failed, more than "
                               f"trace.max_failed_share={self.trace.max_failed_share}; the first: {first}")

    # ---- advantages on the trees ----------------------------------------------------------------------

    def _compute_advantage(self, batch, metrics: dict):
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        fields = data.pop("extra_fields").tolist()  # in batch.keys order, as verl's own fetch below
        # verl's padding rows copy a real row's extra fields: they are not part of any tree
        fields = [None if tag.get("is_padding", False) else f for f, tag in zip(fields, batch.tags)]
        token = CURRENT_TRACE_FIELDS.set(fields)
        try:
            return super()._compute_advantage(batch, metrics)
        finally:
            CURRENT_TRACE_FIELDS.reset(token)

    # ---- the predictor: fit and checkpoint ----------------------------------------------------------

    def _fit_predictor(self, metrics: dict) -> None:
        """Our trainer's fit (:func:`~.coordinator.fit_predictor_on_step`) on each of the step's forests."""
        records, reports = [], []
        for coordinator, _ in self._coordinators:
            record, histories = ray.get(coordinator.record_with_histories.remote())
            report = ray.get(coordinator.failures.remote())
            fit = fit_predictor_on_step(self.predictor, record, histories, value_target=self.trace.value_target,
                                        failed=report["failed"])
            metrics.update({f"trace/{k}": v for k, v in fit.items()})
            records.append(record), reports.append(report)
            ray.kill(coordinator)
        if records:
            metrics.update(step_metrics(records, reports))
        self._coordinators = []

    def _save_checkpoint(self):
        trainer = self.config.trainer
        save_predictor(self.predictor, trainer.default_local_dir, self.global_steps)  # before verl marks it done
        super()._save_checkpoint()
        keep = 1 if trainer.get("remove_previous_ckpt_in_save", False) else trainer.get("max_actor_ckpt_to_keep")
        prune_predictors(trainer.default_local_dir, keep)

    def _load_checkpoint(self):
        super()._load_checkpoint()  # sets global_steps from the folder it resumed from (0: none)
        folder = resume_folder(self.config.trainer, self.global_steps)
        if folder is None:
            return
        predictor = load_predictor(folder)
        if predictor is None:
            logger.warning(f"TRACE: {folder} holds no {PREDICTOR_FILE} (a checkpoint of another trainer?); the "
                           f"predictor starts fresh")
            return
        self.predictor = predictor


def submission_budget(budget: RolloutBudget, prompts: int, batch_prompts: int) -> RolloutBudget:
    """A refill's or DAPO submission's budget: the step's M roots scaled to its prompts,
    max(1, floor(M prompts / B)) (B: ``data.train_batch_size``), N continuations per root as the step's."""
    roots = max(1, budget.roots * int(prompts) // max(1, int(batch_prompts)))
    return RolloutBudget(roots, budget.continuations_per_root)


def step_metrics(records, reports) -> dict:
    """What a verl user reads in the tracker about one step's allocation (``trace/...``), over the step's
    submissions (records and :meth:`~.coordinator.StepCoordinator.failures` reports):

    * ``trees``, ``failed_trees``, ``wait_trees_s`` (seconds trees spent waiting for the others, summed);
    * ``mixed_group_share``: share of the grown trees whose bare rollouts' rewards are not all equal;
    * ``root_v_mean``, ``root_utility`` (``root_utility(v, m)``, the root rule's objective at its choice),
      ``prefix_v_mean`` (where the rules predicted);
    * ``continuations_depth_<d>``: continuations started at a prefix of depth d; ``rollouts_<kind>``."""
    out = {"trace/trees": 0.0, "trace/failed_trees": 0.0, "trace/wait_trees_s": 0.0}
    mixed, grown, root_v, utility, prefix_v, depth_counts, kinds = 0, 0, [], 0.0, [], {}, {}
    for record, report in zip(records, reports):
        out["trace/trees"] += report["trees"]
        out["trace/failed_trees"] += len(report["failed"])
        out["trace/wait_trees_s"] += float(report["waited_s"])
        f = record.forest
        failed = set(report["failed"])
        bare = np.flatnonzero((f.origin == Origin.BARE) & f.is_leaf)
        for t in range(len(f.roots)):
            if t in failed:
                continue
            rewards = f.reward[bare[f.tree_index[bare] == t]]
            grown += 1
            mixed += int(rewards.size > 0 and rewards.min() != rewards.max())
        if record.prompt_v.size:
            root_v.extend(record.prompt_v.tolist())
            m = record.groups[record.prompt_ids]
            utility += float(np.sum(root_utility(record.prompt_v, m, concentration=record.prompt_concentration)))
        prefix_v.extend(np.asarray(record.node_v, dtype=float).tolist())
        starts = np.flatnonzero((f.origin == Origin.CONTINUATION) & (f.rollout_start == np.arange(len(f))))
        for n in starts.tolist():  # the first turn of each continuation: its parent is the prefix
            d = int(f.depth[f.parent[n]])
            depth_counts[d] = depth_counts.get(d, 0) + 1
        for k, v in record.counts.items():
            kinds[k] = kinds.get(k, 0) + int(v)
    out["trace/mixed_group_share"] = mixed / grown if grown else 0.0
    if root_v:
        out["trace/root_v_mean"], out["trace/root_utility"] = float(np.mean(root_v)), utility
    if prefix_v:
        out["trace/prefix_v_mean"] = float(np.mean(prefix_v))
    out.update({f"trace/continuations_depth_{d}": float(c) for d, c in sorted(depth_counts.items())})
    out.update({f"trace/rollouts_{k}": float(v) for k, v in kinds.items()})
    return out


def resume_folder(trainer_config, global_steps: int) -> str | None:
    """The ``global_step_<n>`` folder verl's ``_load_checkpoint`` resumed from, by its rules: None when it did
    not resume (``global_steps`` 0: ``resume_mode=disable`` or nothing saved), ``resume_from_path`` for
    ``resume_mode=resume_path``, else (``auto``) the latest checkpoint under ``default_local_dir``."""
    if int(global_steps) == 0 or trainer_config.resume_mode == "disable":
        return None
    if trainer_config.resume_mode == "resume_path":
        folder = str(trainer_config.resume_from_path)
    else:
        folder = find_latest_ckpt_path(_absolute(trainer_config.default_local_dir))
    return None if folder is None else _absolute(folder)


def _absolute(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def prune_predictors(checkpoint_dir: str, keep) -> list[str]:
    """Remove ``trace_predictor.pkl`` from every ``global_step_<n>`` folder but the newest ``keep`` (as verl
    prunes the actor's checkpoints with ``max_actor_ckpt_to_keep``; None or < 1 keeps all). Returns what
    it removed."""
    if not keep or int(keep) < 1:
        return []
    found = []
    for path in glob.glob(os.path.join(checkpoint_dir, "global_step_*", PREDICTOR_FILE)):
        step = re.fullmatch(r"global_step_(\d+)", os.path.basename(os.path.dirname(path)))
        if step:
            found.append((int(step.group(1)), path))
    removed = [path for _, path in sorted(found)[:-int(keep)]]
    for path in removed:
        os.remove(path)
    return removed


def save_predictor(predictor, checkpoint_dir: str, step: int) -> str:
    """Write ``predictor.state_dict()`` into verl's ``global_step_<step>`` folder; returns the file."""
    folder = os.path.join(checkpoint_dir, f"global_step_{step}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, PREDICTOR_FILE)
    with open(path + ".tmp", "wb") as fh:
        pickle.dump(predictor.state_dict(), fh)
    os.replace(path + ".tmp", path)  # a crash mid-write leaves the previous file
    return path


def load_predictor(folder: str):
    """The predictor saved in verl's checkpoint folder ``global_step_<n>`` (:func:`resume_folder`); None when
    that folder holds none."""
    from trace_train.predictors import predictor_from_state_dict

    path = os.path.join(_absolute(folder), PREDICTOR_FILE)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as fh:
        return predictor_from_state_dict(pickle.load(fh))
