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
* **Predictor**: fitted after each step on the step's forest exactly as our trainer fits it
  (``trace_train.train._fit_predictor``: ``node_targets`` of every non-terminal node, root outcomes into the
  prompts' posteriors); its ``state_dict`` is saved with verl's checkpoint as ``trace_predictor.pkl`` in the
  ``global_step_<n>`` folder and loaded on resume.

Sync mode only, ``parameter_sync_step`` 1: the allocation decides one step's rollouts for one update. Past
its construction the trainer reports ``trainer_mode == "sync"`` to verl's code, which branches on it
(replay buffer, prompt persistence).
"""

from __future__ import annotations

import os
import pickle
import uuid
from dataclasses import dataclass

import numpy as np
import ray
import transfer_queue as tq
from omegaconf import OmegaConf

from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

from trace_theory import Prediction, RolloutBudget

from .coordinator import StepCoordinator, fit_predictor_on_step
from .estimator import CURRENT_TRACE_FIELDS
from .worker import PROMPT_KEY, STEP_KEY

__all__ = ["TraceSettings", "TracePPOTrainer", "PREDICTOR_FILE", "save_predictor", "load_predictor", "submitted_batch",
           "openings_of"]

PREDICTOR_FILE = "trace_predictor.pkl"


@dataclass(frozen=True)
class TraceSettings:
    """The ``trace:`` block: ``policy``, ``roots`` M and ``continuations_per_root`` N per step, ``group_size``,
    ``predictor`` kind, ``value_target`` and ``seed`` (meanings as in ``trace_train.configs``)."""

    policy: str = "trace"
    roots: int = 1024
    continuations_per_root: int = 2
    group_size: int = 8
    predictor: str = "ngram"
    value_target: str = "leaf_weighted"
    seed: int = 0

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

    prompts = batch["raw_prompt"]
    sources = batch["data_source"] if "data_source" in batch.keys() else None
    out = []
    for i in range(len(prompts)):
        messages = prompts[i]
        messages = tuple(dict(m) for m in (messages.tolist() if hasattr(messages, "tolist") else messages))
        row = {} if sources is None else {"family": str(sources[i])}
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
        actor = ray.remote(StepCoordinator).options(name=name, max_concurrency=max(64, 4 * pool))
        coordinator = actor.remote(self.trace_policy, self.trace_budget, pool, PredictorAtHistories(self.predictor),
                                   openings, seed=self.trace.seed + self.global_steps)
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
        batch = super()._step_once(metrics, timing_raw, self._submitted or sample_batch_size)
        self._fit_predictor(metrics)
        return batch

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
        for coordinator, _ in self._coordinators:
            record, histories = ray.get(coordinator.record_with_histories.remote())
            fit = fit_predictor_on_step(self.predictor, record, histories, value_target=self.trace.value_target)
            metrics.update({f"trace/{k}": v for k, v in fit.items()})
            metrics.update({f"trace/rollouts_{k}": float(v) for k, v in record.counts.items()})
            ray.kill(coordinator)
        self._coordinators = []

    def _save_checkpoint(self):
        super()._save_checkpoint()
        save_predictor(self.predictor, self.config.trainer.default_local_dir, self.global_steps)

    def _load_checkpoint(self):
        super()._load_checkpoint()
        predictor = load_predictor(self.config.trainer.default_local_dir)
        if predictor is not None:
            self.predictor = predictor


def save_predictor(predictor, checkpoint_dir: str, step: int) -> str:
    """Write ``predictor.state_dict()`` into verl's ``global_step_<step>`` folder; returns the file."""
    folder = os.path.join(checkpoint_dir, f"global_step_{step}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, PREDICTOR_FILE)
    with open(path + ".tmp", "wb") as fh:
        pickle.dump(predictor.state_dict(), fh)
    os.replace(path + ".tmp", path)  # a crash mid-write leaves the previous file
    return path


def load_predictor(checkpoint_dir: str):
    """The predictor of verl's latest checkpoint under ``checkpoint_dir`` (None: none saved one)."""
    from trace_train.predictors import predictor_from_state_dict

    folder = checkpoint_dir if os.path.isabs(checkpoint_dir) else os.path.join(os.getcwd(), checkpoint_dir)
    latest = find_latest_ckpt_path(folder)
    path = latest and os.path.join(latest, PREDICTOR_FILE)
    if not path or not os.path.exists(path):
        return None
    with open(path, "rb") as fh:
        return predictor_from_state_dict(pickle.load(fh))
