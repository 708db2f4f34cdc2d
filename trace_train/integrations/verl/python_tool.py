"""The math preset's Python tool as a verl ``BaseTool``: our sandbox, persistent across calls, restorable.

``python(code)`` runs ``code`` in ``trace_train.tools.sandbox.PythonSession`` (the same sandbox and limits as
the ``math_python`` environment). The session's state -- the cells run so far -- lives in the trajectory's
``agent_data.extra_fields["trace_python_cells"]``, which the ``trace_tool_agent`` loop snapshots with the
tokens at every prefix, so a continuation resumes the interpreter exactly where its prefix left it (the
sandbox replays the cells; see ``PythonSession``). Declared in ``python_tool.yaml``
(``actor_rollout_ref.rollout.multi_turn.tool_config_path``); ``config.namespaces`` as in ``SandboxLimits``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from trace_train.tools.sandbox import PythonSession, SandboxLimits

__all__ = ["PythonTool", "CELLS"]

CELLS = "trace_python_cells"


class PythonTool(BaseTool):
    """``python(code)``: one cell of a persistent sandboxed session (module docstring)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: the python tool needs a non-empty string `code`."), 0.0, {}
        agent_data = kwargs.get("agent_data")
        fields = agent_data.extra_fields if agent_data is not None else {}
        session = PythonSession(limits=SandboxLimits(namespaces=self.config.get("namespaces", "require")))
        session.restore(tuple(fields.get(CELLS, ())))
        result = await asyncio.to_thread(session.run, code)
        fields[CELLS] = list(session.snapshot())
        return ToolResponse(text=result.observation()), 0.0, {"status": result.status}
