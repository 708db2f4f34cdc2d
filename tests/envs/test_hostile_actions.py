"""Actions written to break the parser: each of the three tool environments answers with an observation,
never an exception (deeply nested JSON raised RecursionError out of ``step``), and reads adversarial
tag soup correctly."""

from __future__ import annotations

import json

import pytest

from .conftest import arithmetic_rows
from .scripted import DEMO

ROWS = {
    "math_python": arithmetic_rows(1, seed=3)[0],
    "search_qa": {"id": DEMO[0]["id"], "question": DEMO[0]["question"], "answers": DEMO[0]["golden_answers"]},
    "bfcl": {"id": "multi_turn_base_0"},
}
TOOL = {"math_python": ("python", "code"), "search_qa": ("search", "query"), "bfcl": ("cd", "folder")}
DEEP = 100_000


def _attacks(name: str) -> dict[str, str]:
    tool, argument = TOOL[name]
    return {
        "nested block": "[" * DEEP + "]" * DEEP,
        "nested argument": json.dumps({"name": tool, "arguments": {argument: "x"}}).replace(
            '"x"', "[" * DEEP + "]" * DEEP),
        "nested argument string": json.dumps({"name": tool, "arguments": "[" * DEEP + "]" * DEEP}),
        "nested object": '{"a": ' * DEEP + "1" + "}" * DEEP,
        "33 levels": json.dumps({"name": tool, "arguments": {argument: "x"}}).replace(
            '"x"', "[" * 31 + "]" * 31),
        "huge integer": json.dumps({"name": tool, "arguments": {argument: "x"}}).replace('"x"', "7" * 5000),
    }


@pytest.mark.parametrize("name", list(ROWS))
def test_hostile_json_in_a_tool_call_is_an_observation(name, factories):
    env = factories[name]()
    for attack, body in _attacks(name).items():
        env.reset(ROWS[name])
        result = env.step(f"<tool_call>{body}</tool_call>")
        assert result.invalid and not result.done, (name, attack)
        assert "Error: the tool call is not valid JSON" in result.observation or (
            "are not a JSON object" in result.observation), (name, attack)
        reason = "digits" if attack == "huge integer" else "nested deeper"
        assert reason in result.observation, (name, attack)


@pytest.mark.parametrize("name", list(ROWS))
def test_tag_soup_is_read_as_the_lazy_regexes_read_it(name, factories):
    """Thousands of unclosed tags around one real call (quadratic for the old regexes, 10 s at 100k
    characters): the reasoning is dropped and the one call outside it is seen."""
    tool, argument = TOOL[name]
    call = f"<tool_call>{json.dumps({'name': tool, 'arguments': {argument: 'x'}})}</tool_call>"
    env = factories[name]()
    env.reset(ROWS[name])
    soup = "<think>a</think>" * 2000 + call + "<tool_call>" * 10_000
    result = env.step(soup)
    results = result.observation.count("\n</tool_response>\n<tool_response>\n") + 1  # role "tool"
    assert result.invalid and result.observation.endswith("never closed with </tool_call>.") and results == 2
    env.reset(ROWS[name])
    hidden = env.step("<think>" * 10_000 + call)  # an unclosed <think> hides everything after it
    assert "never closed" not in hidden.observation and "<tool_response>" not in hidden.observation
    assert hidden.invalid or name == "bfcl"  # BFCL: a step without calls ends the turn
