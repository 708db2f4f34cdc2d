"""The math preset's Python tool as a verl ``BaseTool``: our sandbox, persistent across calls, restorable.

``python(code)`` runs ``code`` in ``trace_train.tools.sandbox.PythonSession`` (the same sandbox and limits as
the ``math_python`` environment). The session's state -- the cells run so far -- lives in the trajectory's
``agent_data.extra_fields["trace_python_cells"]``, which the ``trace_tool_agent`` loop snapshots with the
tokens at every prefix, so a continuation resumes the interpreter exactly where its prefix left it (the
sandbox replays the cells; see ``PythonSession``). Declared in ``python_tool.yaml``
(``actor_rollout_ref.rollout.multi_turn.tool_config_path``). Its ``config`` holds verl's ``type`` and any
field of ``SandboxLimits`` (``wall_seconds``, ``cpu_seconds``, ``memory_bytes``, ..., ``namespaces``, default
"require"), as ``task.env.sandbox`` does; every one is applied, and an unknown key is refused in one line
when the tool is built.
"""

from __future__ import annotations

import asyncio
from dataclasses import fields
from typing import Any, Mapping

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from trace_train.tools.sandbox import PythonSession, SandboxLimits

__all__ = ["PythonTool", "CELLS", "sandbox_limits"]

CELLS = "trace_python_cells"
VERL_KEYS = ("type",)
"""Keys of a tool's ``config`` that are verl's own, not the sandbox's."""


def sandbox_limits(config: Mapping[str, Any] | None) -> SandboxLimits:
    """The ``SandboxLimits`` of a tool ``config``: every key but :data:`VERL_KEYS`, ``namespaces`` "require"
    unless given; an unknown key or a bad value is a ``ValueError`` naming it."""
    given = {key: value for key, value in dict(config or {}).items() if key not in VERL_KEYS}
    known = [field.name for field in fields(SandboxLimits)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"the python tool's config has unknown key(s) {unknown}: it takes verl's `type` and the "
                         f"fields of SandboxLimits ({', '.join(known)})")
    return SandboxLimits(**{"namespaces": "require", **given})


class PythonTool(BaseTool):
    """``python(code)``: one cell of a persistent sandboxed session (module docstring)."""

    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self.limits = sandbox_limits(config)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: the python tool needs a non-empty string `code`."), 0.0, {}
        agent_data = kwargs.get("agent_data")
        fields = agent_data.extra_fields if agent_data is not None else {}
        session = PythonSession(limits=self.limits)
        session.restore(tuple(fields.get(CELLS, ())))
        result = await asyncio.to_thread(session.run, code)
        fields[CELLS] = list(session.snapshot())
        return ToolResponse(text=result.observation()), 0.0, {"status": result.status}
