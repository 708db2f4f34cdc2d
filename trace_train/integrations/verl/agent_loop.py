"""``trace_tool_agent``: verl's ``ToolAgentLoop`` that records every turn boundary and can start from one.

A *turn* is one assistant generation and the tool responses merged after it; the state after a turn whose
session goes on (the tool responses tokenised into the context, ready for the next generation) is a
prefix. At each one the loop keeps a snapshot of verl's own token-level state -- ``prompt_ids`` (the whole
context), ``response_mask``, ``response_logprobs``, the messages, the turn counters and ``extra_fields``
(where a tool keeps its session, e.g. :mod:`.python_tool`) -- so a continuation session started with
``__trace_start__=<snapshot>`` resumes at that state exactly: the same token ids, never re-rendered from
text (verl's Continuous-Token path produced them; this loop only copies them). After :meth:`run`,
``loop.trace_prefixes`` holds the session's snapshots, ``loop.trace_turn_starts`` the
response-token offset where each turn it generated begins and ``loop.trace_turn_tokens`` the tokens each
generated; ``loop.trace_start_depth`` is the depth it started from. Multimodal prompts are not supported.
"""

from __future__ import annotations

import copy
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop

__all__ = ["TraceToolAgentLoop", "AGENT_LOOP", "opening_tokens", "prefix_history", "run_trace_session"]

AGENT_LOOP = "trace_tool_agent"
"""The name this loop is registered under (``actor_rollout_ref.rollout.agent.default_agent_loop``)."""

_STATE = ("prompt_ids", "response_mask", "response_logprobs", "assistant_turns", "user_turns", "turn_scores",
          "tool_rewards", "extra_fields")
"""``AgentData`` fields a snapshot copies (with the messages); ``extra_fields`` carries tool state that lives in
the trajectory, e.g. the Python tool's cells (:mod:`.python_tool`)."""


@register(AGENT_LOOP)
class TraceToolAgentLoop(ToolAgentLoop):
    """``ToolAgentLoop`` with turn-boundary snapshots and resumption (module docstring)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        self.trace_start = kwargs.pop("__trace_start__", None)
        self.trace_start_depth = 0 if self.trace_start is None else int(self.trace_start["assistant_turns"])
        self.trace_prefixes: list[dict] = []
        self.trace_turn_starts: list[int] = []
        self.trace_turn_tokens: list[int] = []
        return await super().run(sampling_params, **kwargs)

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        if self.trace_start is None:
            return await super()._handle_pending_state(agent_data, sampling_params)
        if agent_data.image_data or agent_data.video_data or agent_data.audio_data:
            raise ValueError("trace_tool_agent cannot resume multimodal sessions")
        start = copy.deepcopy(self.trace_start)
        for name in _STATE:
            setattr(agent_data, name, start[name])
        agent_data.messages = start["messages"]
        return AgentState.GENERATING

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any],
                                       ignore_termination: bool = False) -> AgentState:
        self.trace_turn_starts.append(len(agent_data.response_mask))
        before = sum(agent_data.response_mask)
        state = await super()._handle_generating_state(agent_data, sampling_params, ignore_termination)
        self.trace_turn_tokens.append(sum(agent_data.response_mask) - before)
        return state

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        state = await super()._handle_processing_tools_state(agent_data)
        if state == AgentState.GENERATING:  # a turn boundary the session goes on from: a prefix
            snapshot = {name: copy.deepcopy(getattr(agent_data, name)) for name in _STATE}
            snapshot["messages"] = copy.deepcopy(agent_data.messages)
            self.trace_prefixes.append(snapshot)
        return state


def opening_tokens(tokenizer, *, tools=(), chat_template_kwargs=None, hf_model_type=None):
    """``tokens(messages) -> ids``: a prompt's opening as this loop renders it (verl's Continuous-Token
    builder with the tools' schemas, as ``ToolAgentLoop``'s first state does), what the predictor reads at
    the roots; the prefixes' token ids continue it. ``tools``: verl tool objects (``tool_schema``)."""
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    builder = create_continuous_token_builder(tokenizer, hf_model_type=hf_model_type,
                                              chat_template_kwargs=dict(chat_template_kwargs or {}))
    schemas = [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools]
    return lambda messages: list(builder.build_initial_tokens(list(messages), tools=schemas))


def prefix_history(snapshot: dict, *, prompt: int, row) -> Any:
    """What the predictor reads at a prefix (``trace_train.rollout.batch.History``): depth, messages, tokens."""
    from trace_train.rollout.batch import History

    return History(prompt, row, int(snapshot["assistant_turns"]), tuple(snapshot["messages"]),
                   tuple(snapshot["prompt_ids"]))


async def run_trace_session(loop: TraceToolAgentLoop, sampling_params: dict, kwargs: dict, start, *, prompt: int,
                            row, score) -> "Session":
    """One session of ``loop`` from ``start`` (None: the prompt; else a :class:`~.tree_growth.Prefix` whose
    state is a snapshot) as a :class:`~.tree_growth.Session`; ``await score(output)`` gives its reward.

    A continuation's output holds its prefix's tokens with response mask 0 (and log-probs kept), so every
    turn is trained once, in the session that generated it; turn starts past the response limit are dropped
    with their turns (verl truncates the response there)."""
    from .tree_growth import Prefix, Session

    state = None if start is None else start.state
    output = await loop.run(sampling_params, **({**kwargs, "__trace_start__": state} if state else kwargs))
    limit = len(output.response_mask)
    starts = [s for s in loop.trace_turn_starts if s < limit] or [0]
    turns = len(starts)
    if state is not None:
        keep = starts[0]
        output.response_mask = [0] * min(keep, limit) + list(output.response_mask[keep:])
    reward = float(await score(output))
    output.reward_score = reward
    prefixes = [Prefix(int(s["assistant_turns"]), s, prefix_history(s, prompt=prompt, row=row))
                for s in loop.trace_prefixes[:turns - 1]]
    tokens = [int(t) for t in loop.trace_turn_tokens[:turns]]
    return Session(turns, reward, prefixes, starts, output, tokens)
