import ast
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_train.tools import bounded_json
from trace_train.tools.tool_calls import MalformedToolCall, ToolCall, parse_tool_calls, tag_spans

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


# ------------------------------------------------------------------ hostile input: depth and linear time

def test_nesting_is_bounded_and_never_raises():
    deep = "[" * 100_000 + "]" * 100_000
    for block in (deep, '{"name": "cd", "arguments": {"x": ' + deep + "}}",
                  json.dumps({"name": "cd", "arguments": deep}), '{"a": ' * 100_000 + "1" + "}" * 100_000):
        [call] = parse_tool_calls(f"<tool_call>{block}</tool_call>")
        assert isinstance(call, MalformedToolCall) and "nested deeper than 32 levels" in call.error
    at_limit = {"name": "cd", "arguments": {"x": json.loads("[" * 30 + "]" * 30)}}  # 32 levels in all
    assert parse_tool_calls(_block(at_limit)) == [ToolCall("cd", at_limit["arguments"])]
    over = {"name": "cd", "arguments": {"x": json.loads("[" * 31 + "]" * 31)}}
    assert isinstance(parse_tool_calls(_block(over))[0], MalformedToolCall)
    [huge] = parse_tool_calls('<tool_call>{"name": "cd", "arguments": {"x": ' + "9" * 5000 + "}}</tool_call>")
    assert isinstance(huge, MalformedToolCall) and "digits" in huge.error


def test_bounded_json_names_each_problem():
    for text, message in ((b'"\xff"', "not valid UTF-8"), ("{", "invalid JSON"), ("[[1]]", "deeper than 1"),
                          ("[" * 5000 + "]" * 5000, "deeper than 1")):
        with pytest.raises(ValueError, match=message):
            bounded_json.loads(text, max_depth=1)
    assert bounded_json.loads('{"a": [1, {"b": []}]}') == {"a": [1, {"b": []}]}
    assert [bounded_json.depth(v) for v in (1, [], {"a": [1, {"b": []}]}, [[], [[[]]]])] == [0, 1, 4, 4]


tags = st.lists(st.sampled_from(["<a>", "</a>", "<a", "a>", "x", "</", "\n"]), max_size=30).map("".join)


@given(tags)
def test_tag_spans_equal_the_lazy_regex(text):
    """The fast scan against the obvious implementation: re.finditer with a lazy DOTALL pattern."""
    matches = list(re.finditer(r"<a>(.*?)</a>", text, re.DOTALL))
    spans, unclosed = tag_spans(text, "<a>", "</a>")
    assert spans == [m.span() for m in matches]
    rest = text.find("<a>", matches[-1].end() if matches else 0)
    assert unclosed == (None if rest < 0 else rest)


class _CountingText(str):
    """A str whose ``find`` counts the characters it reads."""

    read = 0

    def find(self, sub, start=0, end=None):
        found = str.find(self, sub, start)
        self.read += (found + len(sub) if found >= 0 else len(self)) - start
        return found


@pytest.mark.parametrize("text", [
    "<a>" * 50_000, "<a>x" * 30_000 + "</a>", "</a>" * 50_000, "<a></a>" * 20_000 + "<a>" * 20_000,
])
def test_tag_spans_reads_each_character_at_most_twice(text):
    """Linear work however many tags stay unclosed (the lazy regex reads the rest of the text per tag)."""
    counted = _CountingText(text)
    tag_spans(counted, "<a>", "</a>")
    assert counted.read <= 2 * len(text)
