"""JSON from untrusted sources (a model's tool call, a retrieval server, a client request), bounded.

:func:`loads` turns every way a document can be bad into one ``ValueError`` naming the problem: invalid
JSON, invalid UTF-8, an integer with more digits than Python converts, and nesting deeper than
``max_depth`` (``json.loads`` itself raises ``RecursionError`` near the interpreter's recursion limit,
and any recursive walk of a value that deep would too). The depth of a value is counted without
recursion: a scalar has depth 0, a list or object one more than its deepest item.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["MAX_DEPTH", "loads", "depth"]

MAX_DEPTH = 32
"""The default nesting limit: far above any tool call or retrieval response (BFCL's deepest argument
nests 3 levels, a Search-R1 response 5)."""


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)``, or a ValueError if ``text`` is not JSON or nests deeper than ``max_depth``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {max_depth} levels") from None
    except UnicodeDecodeError:
        raise ValueError("JSON is not valid UTF-8") from None
    except ValueError as error:  # JSONDecodeError, and int() refusing a number with too many digits
        raise ValueError(f"invalid JSON ({error})") from None
    if depth(value) > max_depth:
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    return value


def depth(value: Any) -> int:
    """Nesting depth of a JSON value (lists and dicts), computed with an explicit stack."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            level += 1
            deepest = max(deepest, level)
            stack.extend((child, level) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
