"""Extracting the final answer from a model's response.

Two formats are recognised:

- the answer tag ``<answer>...</answer>`` (Search-R1's format; the last complete tag counts), and
- LaTeX ``\\boxed{...}`` or ``\\fbox{...}`` with balanced braces, or the short form ``\\boxed 5``
  (the last one counts).

For math, :func:`extract_math_answer` prefers the answer tag, and inside it a ``\\boxed{}`` if there
is one; without a tag it takes the last box in the whole response. For QA, the answer is the tag's text.

Both read a response in linear time, however many tags or boxes are left unclosed (the environments run
them on every action a model writes).
"""

from __future__ import annotations

import re

from ..tools.tool_calls import tag_spans

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{|\\boxed +([^\s$]+)")


def extract_answer_tag(text: str) -> str | None:
    """Stripped content of the last complete ``<answer>...</answer>``, or None."""
    _check_text(text)
    spans, _ = tag_spans(text, "<answer>", "</answer>")
    return text[spans[-1][0] + len("<answer>") : spans[-1][1] - len("</answer>")].strip() if spans else None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces) or ``\\boxed x``, or None."""
    _check_text(text)
    found, closing = None, None
    for match in _BOX.finditer(text):
        if match.group(1) is not None:
            found = match.group(1)
            continue
        closing = _closing_braces(text) if closing is None else closing
        if match.end() - 1 in closing:
            found = text[match.end() : closing[match.end() - 1]]
    return None if found is None else found.strip()


def _closing_braces(text: str) -> dict[int, int]:
    """Position of each ``{`` -> position of the ``}`` that balances it (every brace counts), one pass."""
    closing, open_positions = {}, []
    for brace in re.finditer(r"[{}]", text):
        if brace.group() == "{":
            open_positions.append(brace.start())
        elif open_positions:
            closing[open_positions.pop()] = brace.start()
    return closing


def extract_math_answer(text: str) -> str | None:
    """The final math answer: the answer tag (its box if it has one), else the last box, else None."""
    tagged = extract_answer_tag(text)
    if tagged is not None:
        boxed = extract_boxed(tagged)
        return boxed if boxed is not None else tagged
    return extract_boxed(text)


def _check_text(text: str) -> None:
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a str, got {type(text).__name__}")
