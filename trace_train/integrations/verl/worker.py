"""The ``_run_prompt`` override: one prompt's sessions grown as a TRACE tree inside verl's V1 agent loop.

:class:`TraceAgentLoopWorker` is verl's ``AgentLoopWorkerTQ`` (TransferQueue) with one method replaced.
For a training prompt that the ``trace`` trainer submitted (it carries ``__trace_step__``, the name of the
step's coordinator actor, and ``__trace_prompt__``, its pool index), :meth:`_run_prompt` pops
``__rollout_n__`` = m, runs :func:`~.tree_growth.grow_tree` with ``trace_tool_agent`` sessions
(:func:`~.agent_loop.run_trace_session`: rewards computed at once by verl's reward loop, since the
continuations depend on them) and puts one trajectory per session into TransferQueue, keyed
``{uid}_{session_id}_0`` as verl's own sessions are, with the tree fields in ``extra_fields``. A tree that
fails puts no trajectory and tags its prompt ``failure``, as verl's own failed group: the sync replay
buffer samples it with nothing to materialise (or refills it with ``sync_refill_failed_groups``). Other prompts
(validation, or a prompt without a step) run verl's ``_run_prompt`` unchanged.

:class:`TraceAgentLoopManager` is ``AgentLoopManagerTQ`` with these workers:
``actor_rollout_ref.rollout.agent.agent_loop_manager_class=trace_train.integrations.verl.worker.TraceAgentLoopManager``.
"""

from __future__ import annotations

import logging

import hydra
import numpy as np
import ray
import transfer_queue as tq

from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from .agent_loop import AGENT_LOOP, TraceToolAgentLoop, run_trace_session
from .tree_growth import grow_tree

__all__ = ["TraceAgentLoopWorker", "TraceAgentLoopManager", "RemoteCoordinator", "prompt_row"]

logger = logging.getLogger(__name__)

STEP_KEY, PROMPT_KEY = "__trace_step__", "__trace_prompt__"
"""Per-prompt fields the ``trace`` trainer adds: the coordinator actor's name and the prompt's pool index."""


STEP_FIELDS = frozenset({"uid", "global_steps", "index", "agent_name", "session_id", "validate", "__rollout_n__",
                         "__do_sample__", STEP_KEY, PROMPT_KEY})
"""Per-prompt fields that change from step to step or name one sample, never its task family."""


def prompt_row(fields: dict) -> dict:
    """The row our predictors read a prompt's family from (``family_of``), the same at its opening and at
    every prefix, in every step: ``{"family": data_source}`` when the prompt has one, else its short scalar
    fields minus :data:`STEP_FIELDS` (``global_steps`` in the family would keep per-family means from ever
    carrying over to the next step)."""
    if fields.get("data_source") is not None:
        return {"family": str(fields["data_source"])}
    return {k: v for k, v in fields.items() if isinstance(v, (str, int, float, bool)) and k not in STEP_FIELDS}


class RemoteCoordinator:
    """The step's coordinator actor, awaited: each call awaits the actor's object ref, so a tree waiting for
    the step's other trees holds one of the actor's threads (``max_concurrency``), never a thread of this
    worker's event loop or its default executor (:mod:`.tree_growth`)."""

    def __init__(self, name: str):
        self.handle = ray.get_actor(name)

    async def expand(self, tree, reward, histories):
        return await self.handle.expand.remote(tree, reward, histories)

    async def rest(self, tree):
        return await self.handle.rest.remote(tree)

    async def finish(self, tree, parent, reward, origin, cost=None, histories=None):
        return await self.handle.finish.remote(tree, parent, reward, origin, cost, histories)

    async def fail(self, tree, reason):
        return await self.handle.fail.remote(tree, reason)

    async def tree_of(self, prompt):
        return await self.handle.tree_of.remote(prompt)


class TraceAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):
    """``AgentLoopWorkerTQ`` whose ``_run_prompt`` grows TRACE trees (module docstring)."""

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        step = prompt.pop(STEP_KEY, None)
        pool_index = prompt.pop(PROMPT_KEY, None)
        if step is None or trajectory["validate"]:
            return await super()._run_prompt(prompt, sampling_params, trajectory, trace)
        uid = prompt["uid"]
        await tq.async_kv_put(key=uid, partition_id="train", tag={"status": "running"})
        coordinator, tree, put = None, None, []
        try:
            n = int(prompt.pop("__rollout_n__"))
            prompt.pop("__do_sample__", None)
            coordinator = RemoteCoordinator(str(step))
            tree = await coordinator.tree_of(int(pool_index))
            leaves = await grow_tree(self._session_runner(prompt, sampling_params, trajectory, int(pool_index)),
                                     coordinator, tree, n, tree_id=uid)
            fields = {k: v for k, v in prompt.items() if k != "agent_name"}  # what verl's sessions store
            for leaf in leaves:
                leaf.output.extra_fields.update(leaf.fields)
                put.append(f"{uid}_{leaf.session_id}_0")
                await self._agent_loop_postprocess(leaf.output, False, **fields, session_id=leaf.session_id)
            status = "finished"
        except Exception as error:  # noqa: BLE001 - verl's contract: a failed group is tagged, not raised
            logger.exception(f"TRACE tree of prompt {uid} failed: {error}")
            status = "failure"
            if put:  # a part of a tree would not rebuild into one: none of its trajectories is trained
                await tq.async_kv_clear(keys=put, partition_id="train")
            if coordinator is not None and tree is not None:  # dropped; a no-op if grow_tree already said so
                await coordinator.fail(tree, f"prompt {uid}: {type(error).__name__}: {error}")
        await tq.async_kv_put(key=uid, partition_id="train", tag={"status": status})

    def _session_runner(self, prompt: dict, sampling_params: dict, trajectory: dict, pool_index: int):
        row = prompt_row(prompt)

        async def run_session(start, session_id: int):
            kwargs = {**prompt, "session_id": session_id}
            loop = hydra.utils.instantiate(
                config=_agent_loop_registry[prompt.get("agent_name", AGENT_LOOP)],
                trainer_config=DictConfigWrap(config=self.config), server_manager=self.llm_client,
                tokenizer=self.tokenizer, processor=self.processor, hf_model_type=self.hf_model_type,
                dataset_cls=self.dataset_cls, data_config=DictConfigWrap(self.config.data), tools=ToolListWrap(self.tools))
            if not isinstance(loop, TraceToolAgentLoop):
                raise ValueError(f"agent loop {prompt.get('agent_name')!r} cannot branch: TRACE needs {AGENT_LOOP!r}")

            async def score(output):
                await self._compute_score([output], kwargs=kwargs)
                if output.reward_score is None:
                    raise ValueError("TRACE needs each session's reward while the step runs: use verl's reward "
                                     "loop (a rule-based reward, or a reward model with its own resource pool)")
                return output.reward_score

            kwargs.pop("agent_name", None)
            return await run_trace_session(loop, sampling_params, kwargs, start, prompt=pool_index, row=row,
                                           score=score)

        return run_session


class TraceAgentLoopManager(AgentLoopManagerTQ):
    """``AgentLoopManagerTQ`` with :class:`TraceAgentLoopWorker` workers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # sets verl's worker class; the workers are made later, in create()
        self.agent_loop_workers_class = _TRACE_WORKER


_TRACE_WORKER = ray.remote(TraceAgentLoopWorker)
