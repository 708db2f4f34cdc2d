"""Pieces shared by the tool-using environments: reading an action, showing tool results, chat set-up.

Actions. A model turn is read after dropping its reasoning (:func:`visible_text`): Qwen3 thinks inside
``<think>...</think>``, and a tool call or answer written while thinking is not meant. Tool calls are
Qwen3's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks
(``trace_train.tools.tool_calls``).

Observations. The results of one turn's tool calls are one observation message (the engine appends one
message per turn), laid out exactly as Qwen3 lays out consecutive tool messages (:func:`format_tool_results`):

* role ``"tool"`` (the default of every environment): the chat template wraps the message in
  ``<tool_response>`` tags itself; several results are joined with the separator Qwen3 puts between
  consecutive tool responses (``chat.TOOL_RESULTS_SEPARATOR``), so the rendered tokens equal
  those of one tool message per call.

Either way a result's own ``<tool_response>`` tags are escaped first (``&lt;tool_response&gt;``): tool
output cannot close its frame or forge another result.
* role ``"user"``: for templates without a tool role; each result is wrapped in
  ``<tool_response>...</tool_response>`` by the environment, as Qwen3 renders tool results.

:func:`observation_role_for` picks the role a tokenizer's template renders; the engine's
:class:`~trace_train.chat.ChatFormat` takes the environment's tool schemas (``tools=``) and passes them to
the template when the template uses them.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

from ..chat import TOOL_RESULTS_SEPARATOR
from ..tools.budget import BUDGET_EXHAUSTED, ToolCallBudget
from ..tools.tool_calls import MalformedToolCall, parse_tool_calls, tag_spans

__all__ = ["OBSERVATION_ROLES", "check_observation_role", "visible_text", "function_schema",
           "format_tool_results", "qwen3_tools_block", "observation_role_for", "run_tool_calls"]

OBSERVATION_ROLES = ("tool", "user")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_RESPONSE_TAGS = ("<tool_response>", "</tool_response>")
_PROBE_TEXT = "\x00TRACE-PROBE\x00"


def check_observation_role(role: str) -> str:
    """``role`` if it is one of :data:`OBSERVATION_ROLES`, else a ValueError naming the choices."""
    if role not in OBSERVATION_ROLES:
        raise ValueError(f"`observation_role` must be one of {OBSERVATION_ROLES}, got {role!r}")
    return role


def visible_text(action: str) -> str:
    """The action without its reasoning.

    Complete ``<think>...</think>`` blocks are removed; text before a ``</think>`` without an opening tag
    is reasoning opened by the generation prompt (as some Qwen3 templates do) and is dropped; an unclosed
    ``<think>`` drops the rest of the turn. Linear in the length of ``action`` (``tag_spans``).
    """
    spans, _ = tag_spans(action, _THINK_OPEN, _THINK_CLOSE)
    starts, ends = [start for start, _ in spans] + [None], [0] + [end for _, end in spans]
    text = "".join(action[end:start] for end, start in zip(ends, starts))
    if _THINK_CLOSE in text:
        text = text.rsplit(_THINK_CLOSE, 1)[1]
    return text.split(_THINK_OPEN, 1)[0]


def function_schema(name: str, description: str, parameters: Mapping[str, Mapping[str, Any]],
                    required: Sequence[str]) -> dict:
    """An OpenAI-style function tool schema, the layout Qwen3's template and ``tools=`` expect."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: dict(v) for k, v in parameters.items()},
                       "required": list(required)},
    }}


def format_tool_results(results: Sequence[str], role: str) -> str:
    """The content of the one observation message that carries ``results`` (see the module docstring)."""
    check_observation_role(role)
    if not results:
        raise ValueError("`results` must hold at least one result")
    results = [_escape_response_tags(result) for result in results]
    if role == "tool":
        return TOOL_RESULTS_SEPARATOR.join(results)
    return "\n".join(f"<tool_response>\n{result}\n</tool_response>" for result in results)


def _escape_response_tags(result: str) -> str:
    """A tool result's own ``<tool_response>`` tags written ``&lt;tool_response&gt;``: it cannot close its
    frame and forge another result (tool output is data)."""
    for tag in _RESPONSE_TAGS:
        result = result.replace(tag, "&lt;" + tag[1:-1] + "&gt;")
    return result


def qwen3_tools_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tool section Qwen3's chat template writes into the system message for ``tools=``.

    Used where the tool list is part of the task (BFCL): the text equals Qwen3's rendering, and BFCL's
    own Qwen handler writes the same text (``json.dumps`` of each function document).
    """
    listing = "".join(f"\n{json.dumps(tool)}" for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
        f"{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def run_tool_calls(text: str, tool: str, argument: str, budget: ToolCallBudget,
                   run: Callable[[str], str]) -> tuple[list[str], bool]:
    """Run the calls of a one-tool environment (a tool ``tool`` taking one string ``argument``).

    Returns one result per ``<tool_call>`` block of ``text``, in order, and whether any block was
    invalid. A malformed block, another tool's name or other arguments get an error result and cost
    nothing; a valid call is charged to ``budget`` and runs through ``run(value)``, or gets
    ``BUDGET_EXHAUSTED`` when nothing is left. No calls: ``([], False)``.
    """
    results, invalid = [], False
    for call in parse_tool_calls(text):
        if isinstance(call, MalformedToolCall):
            results.append(call.error)
        elif call.name != tool:
            results.append(f"Error: there is no tool {call.name!r}; the only tool is {tool!r}.")
        elif set(call.arguments) != {argument} or not isinstance(call.arguments[argument], str):
            results.append(f'Error: {tool} takes exactly one argument, "{argument}", a string.')
        elif not budget.charge():
            results.append(BUDGET_EXHAUSTED)
            continue
        else:
            results.append(run(call.arguments[argument]))
            continue
        invalid = True
    return results, invalid


def observation_role_for(tokenizer) -> str:
    """``"tool"`` if the tokenizer's chat template renders a tool message's content, else ``"user"``."""
    messages = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": "probe"},
                {"role": "tool", "content": _PROBE_TEXT}]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # templates raise on roles they do not know, with many exception types
        return "user"
    return "tool" if _PROBE_TEXT in rendered else "user"
