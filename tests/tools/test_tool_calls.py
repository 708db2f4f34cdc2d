import ast
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_train.tools.tool_calls import MalformedToolCall, ToolCall, parse_tool_calls

identifiers = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True).filter(
    lambda s: (
        s
        not in {
            "if",
            "in",
            "is",
            "or",
            "as",
            "for",
            "def",
            "del",
            "and",
            "not",
            "try",
            "with",
            "else",
            "elif",
            "from",
            "pass",
            "class",
            "while",
            "yield",
            "break",
            "raise",
            "async",
            "await",
            "global",
            "import",
            "lambda",
            "return",
            "assert",
            "except",
            "finally",
            "continue",
            "nonlocal",
        }
    )
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


def _block(payload) -> str:
    return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


@given(name=identifiers, arguments=st.dictionaries(identifiers, json_values, max_size=4))
def test_call_string_round_trips_through_python_literals(name, arguments):
    [call] = parse_tool_calls("thinking...\n" + _block({"name": name, "arguments": arguments}))
    assert call == ToolCall(name, arguments)
    tree = ast.parse(call.to_call_string(), mode="eval").body
    assert isinstance(tree, ast.Call) and tree.func.id == name and not tree.args
    assert {kw.arg: ast.literal_eval(kw.value) for kw in tree.keywords} == arguments


def test_several_calls_in_order_and_bfcl_format():
    text = (
        _block({"name": "cd", "arguments": {"folder": "document"}})
        + "\n"
        + _block({"name": "mv", "arguments": {"source": "a.txt", "destination": "temp"}})
    )
    calls = parse_tool_calls(text)
    assert [c.to_call_string() for c in calls] == [
        "cd(folder='document')",
        "mv(source='a.txt',destination='temp')",
    ]


def test_arguments_given_as_a_json_string_and_compact_blocks():
    text = '<tool_call>{"name": "ls", "arguments": "{\\"a\\": true}"}</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("ls", {"a": True})]


def test_no_calls():
    assert parse_tool_calls("The answer is 42.") == []


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("<tool_call>{not json}</tool_call>", "is not valid JSON"),
        ('<tool_call>["cd"]</tool_call>', 'must be a JSON object with a string "name"'),
        (
            '<tool_call>{"name": "os.system(\'x\')#", "arguments": {}}</tool_call>',
            "is not a valid function name",
        ),
        ('<tool_call>{"name": "cd", "arguments": {"x=1)#": 2}}</tool_call>', "is not a valid argument name"),
        (
            '<tool_call>{"name": "cd", "arguments": {"from": 2}}</tool_call>',
            "'from' is not a valid argument name",
        ),
        ('<tool_call>{"name": "cd", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "cd", "arguments": "nope"}</tool_call>', "are not a JSON object"),
        ('<tool_call>{"name": "cd", "arguments": {"x": NaN}}</tool_call>', "NaN or Infinity"),
        ('<tool_call>{"name": "cd", "arguments": {}}', "never closed"),
    ],
)
def test_malformed_calls_become_error_observations(block, message):
    [call] = parse_tool_calls(block)
    assert isinstance(call, MalformedToolCall) and message in call.error and call.error.startswith("Error:")


def test_malformed_call_keeps_its_place_among_good_ones():
    text = _block({"name": "a", "arguments": {}}) + "<tool_call>oops</tool_call>" + _block({"name": "b"})
    kinds = [type(c).__name__ for c in parse_tool_calls(text)]
    assert kinds == ["ToolCall", "MalformedToolCall", "ToolCall"]


def test_text_must_be_a_string():
    with pytest.raises(TypeError, match="`text` must be a str, got NoneType"):
        parse_tool_calls(None)
