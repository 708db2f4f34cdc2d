"""Qwen3-style tool calls: parsing model output into calls, and calls into BFCL call strings.

Format (the one Qwen3's chat template asks for; any number of blocks per turn, in order)::

    <tool_call>
    {"name": "cd", "arguments": {"folder": "document"}}
    </tool_call>

Whitespace around the JSON is free. ``arguments`` may also be a JSON string holding an object (some
models emit that). Each block becomes a :class:`ToolCall`, or a :class:`MalformedToolCall` whose
``error`` is the observation to show the model: invalid JSON, a missing or non-string ``name``, a name
or argument key that is not a Python identifier, non-object arguments, or a ``<tool_call>`` that is never
closed. Names and keys are checked because BFCL's checker evaluates call strings with ``eval``: only
``identifier(identifier=literal, ...)`` strings are ever produced (``tools.bfcl`` admits to the checker
only the names of the episode's API methods). The JSON is read by ``bounded_json.loads``: nesting deeper
than :data:`~trace_train.tools.bounded_json.MAX_DEPTH` levels is malformed, never a ``RecursionError``.

Blocks are found by :func:`tag_spans`, one left-to-right pass with ``str.find``: linear in the length of
the text however many tags are left unclosed (a lazy regex rescans to the end for each).
"""

from __future__ import annotations

import keyword
import math
from dataclasses import dataclass
from typing import Any

from . import bounded_json

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: a function name and its keyword arguments (JSON values)."""

    name: str
    arguments: dict[str, Any]

    def to_call_string(self) -> str:
        """The BFCL call string, e.g. ``cd(folder='document')`` (BFCL's own ``convert_to_function_call``)."""
        return f"{self.name}({','.join(f'{key}={value!r}' for key, value in self.arguments.items())})"


@dataclass(frozen=True)
class MalformedToolCall:
    """A block that could not be turned into a call; ``error`` is the observation for the model."""

    raw: str
    error: str


def parse_tool_calls(text: str) -> list[ToolCall | MalformedToolCall]:
    """All tool-call blocks of one model turn, in order; an empty list when there are none."""
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a str, got {type(text).__name__}")
    spans, unclosed = tag_spans(text, _OPEN, _CLOSE)
    calls: list[ToolCall | MalformedToolCall] = [
        _parse_block(text[start + len(_OPEN) : end - len(_CLOSE)]) for start, end in spans
    ]
    if unclosed is not None:
        error = "Error: <tool_call> was opened but never closed with </tool_call>."
        calls.append(MalformedToolCall(text[unclosed:], error))
    return calls


def tag_spans(text: str, open_tag: str, close_tag: str) -> tuple[list[tuple[int, int]], int | None]:
    """Spans ``(start, end)`` of the ``open_tag ... close_tag`` blocks of ``text``, and where an unclosed
    ``open_tag`` starts (None if every one is closed).

    The same blocks as the lazy regex ``open(.*?)close`` (DOTALL) finds, left to right; once an opening
    tag has no closing tag after it, no later one has either. Each character is read at most twice.
    """
    spans, position = [], 0
    while (start := text.find(open_tag, position)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            return spans, start
        position = end + len(close_tag)
        spans.append((start, position))
    return spans, None


def _parse_block(body: str) -> ToolCall | MalformedToolCall:
    raw = body.strip()
    try:
        payload = bounded_json.loads(raw)
    except ValueError as error:
        return MalformedToolCall(raw, f"Error: the tool call is not valid JSON: {error}.")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return MalformedToolCall(raw, 'Error: a tool call must be a JSON object with a string "name".')
    name, arguments = payload["name"], payload.get("arguments", {})
    if not _is_identifier(name):
        return MalformedToolCall(raw, f"Error: {name!r} is not a valid function name.")
    if isinstance(arguments, str):
        try:
            arguments = bounded_json.loads(arguments)
        except ValueError as error:
            return MalformedToolCall(raw, f'Error: the "arguments" of {name} are not a JSON object: {error}.')
    if not isinstance(arguments, dict):
        return MalformedToolCall(raw, f'Error: the "arguments" of {name} must be a JSON object.')
    if bounded_json.depth(arguments) >= bounded_json.MAX_DEPTH:  # the call object adds one level
        return MalformedToolCall(raw, f"Error: the tool call is not valid JSON: JSON nested deeper than "
                                      f"{bounded_json.MAX_DEPTH} levels.")
    bad = [key for key in arguments if not _is_identifier(key)]
    if bad:
        return MalformedToolCall(raw, f"Error: {bad[0]!r} is not a valid argument name for {name}.")
    if not _finite(arguments):
        return MalformedToolCall(raw, f"Error: the arguments of {name} contain NaN or Infinity.")
    return ToolCall(name, arguments)


def _is_identifier(name: str) -> bool:
    return name.isidentifier() and name.isascii() and not keyword.iskeyword(name)


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    if isinstance(value, list):
        return all(_finite(item) for item in value)
    return True
