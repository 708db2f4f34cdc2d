"""The verl Python tool applies every limit in its config and refuses unknown keys (issue 52, item 5)."""

from __future__ import annotations

import asyncio
import os

import pytest

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "trace_train", "integrations", "verl")


def _tool(verl, tmp_path, **settings):
    from omegaconf import OmegaConf
    from verl.tools.tool_registry import initialize_tools_from_config

    config = OmegaConf.load(os.path.join(HERE, "python_tool.yaml"))
    for key, value in {"namespaces": "auto", **settings}.items():
        config.tools[0].config[key] = value
    path = tmp_path / "tool.yaml"
    OmegaConf.save(config, path)
    (tool,) = initialize_tools_from_config(str(path))
    return tool


def _run(tool, code):
    class Trajectory:
        extra_fields: dict = {}

    agent = Trajectory()
    agent.extra_fields = {}
    response, _, info = asyncio.run(tool.execute("i", {"code": code}, agent_data=agent))
    return response.text, info["status"]


def test_a_wall_limit_in_the_config_stops_a_slower_cell(verl, tmp_path):
    tool = _tool(verl, tmp_path, wall_seconds=2)
    text, status = _run(tool, "import time\ntime.sleep(5)\nprint('finished')")
    assert status == "timeout" and "finished" not in text
    assert tool.limits.wall_seconds == 2


def test_every_limit_in_the_config_is_applied(verl, tmp_path):
    tool = _tool(verl, tmp_path, cpu_seconds=3, memory_bytes=1 << 29, max_output_bytes=100, seed=7)
    assert (tool.limits.cpu_seconds, tool.limits.memory_bytes, tool.limits.max_output_bytes, tool.limits.seed) == (
        3, 1 << 29, 100, 7)
    text, status = _run(tool, "print('x' * 1000)")
    assert status == "ok" and "[output truncated: 901 more bytes]" in text


def test_an_unknown_key_is_refused_in_one_line(verl, tmp_path):
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['wall_second'\].*fields of SandboxLimits"):
        _tool(verl, tmp_path, wall_second=2)
    with pytest.raises(ValueError, match="`wall_seconds` must be positive"):
        _tool(verl, tmp_path, wall_seconds=0)


def test_verls_own_key_is_not_a_limit_and_namespaces_default_to_require(verl):
    from trace_train.integrations.verl.python_tool import sandbox_limits

    assert sandbox_limits({"type": "native"}).namespaces == "require"
