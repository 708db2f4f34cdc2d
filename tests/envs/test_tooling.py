"""Shared tool-environment pieces, checked against Qwen3's own chat template (as quoted by bfcl-eval)."""

from __future__ import annotations

import copy

import pytest

from trace_train.envs.math_python import PYTHON_TOOL
from trace_train.envs.search_qa import SEARCH_TOOL
from trace_train.chat import ChatFormat, template_accepts_tools
from trace_train.envs.tooling import (
    format_tool_results,
    observation_role_for,
    qwen3_tools_block,
    visible_text,
)

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "calling"}]


@pytest.mark.parametrize("action, visible", [
    ("plain", "plain"),
    ("<think>x <tool_call></think>answer", "answer"),
    ("<think>a</think>b<think>c</think>d", "bd"),
    ("reasoning opened by the prompt</think>\n\nthe action", "\n\nthe action"),
    ("the action<think>cut off", "the action"),
])
def test_visible_text_drops_reasoning(action, visible):
    assert visible_text(action) == visible


def test_tool_results_render_as_qwen3_renders_one_tool_message_per_call(qwen3_tokenizer):
    separate = CHAT + [{"role": "tool", "content": "A"}, {"role": "tool", "content": "B\nC"}]
    joined = CHAT + [{"role": "tool", "content": format_tool_results(["A", "B\nC"], "tool")}]
    render = qwen3_tokenizer.apply_chat_template
    assert render(joined, tokenize=False) == render(separate, tokenize=False)
    as_user = CHAT + [{"role": "user", "content": format_tool_results(["A", "B\nC"], "user")}]
    assert render(as_user, tokenize=False) == render(separate, tokenize=False)  # same text, role user
    with pytest.raises(ValueError, match="observation_role"):
        format_tool_results(["A"], "system")
    with pytest.raises(ValueError, match="at least one"):
        format_tool_results([], "tool")


def test_the_bfcl_system_prompt_is_qwen3s_tools_section(qwen3_tokenizer):
    tools = [PYTHON_TOOL, SEARCH_TOOL]
    rendered = qwen3_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools,
                                                   tokenize=False)
    assert rendered.startswith(f"<|im_start|>system\n{qwen3_tools_block(tools)}<|im_end|>\n<|im_start|>user")


def test_template_probes(qwen3_tokenizer, tiny_tokenizer):
    assert observation_role_for(qwen3_tokenizer) == "tool" and template_accepts_tools(qwen3_tokenizer)
    assert observation_role_for(tiny_tokenizer) == "tool" and not template_accepts_tools(tiny_tokenizer)
    other = copy.deepcopy(tiny_tokenizer)
    other.chat_template = (  # refuses the tool role
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool role') }}"
        "{% endif %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}")
    assert observation_role_for(other) == "user"
    other.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'tool' %}{{ m['content'] }}{% endif %}{% endfor %}")
    assert observation_role_for(other) == "user"  # drops tool messages silently
    other.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert observation_role_for(other) == "tool"  # shows their content


def test_chat_format_passes_tools_only_to_templates_that_render_them(qwen3_tokenizer, tiny_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    qwen = ChatFormat(qwen3_tokenizer, tools=[PYTHON_TOOL], template_kwargs={"enable_thinking": False})
    text = qwen3_tokenizer.decode(qwen.prompt_ids(messages))
    assert text.startswith(f"<|im_start|>system\nBe brief.\n\n{qwen3_tools_block([PYTHON_TOOL])}<|im_end|>")
    assert qwen.template_kwargs == {"enable_thinking": False, "tools": [PYTHON_TOOL]}
    tiny = ChatFormat(tiny_tokenizer, tools=[PYTHON_TOOL])
    assert tiny.template_kwargs == {} and "# Tools" not in tiny_tokenizer.decode(tiny.prompt_ids(messages))
    with pytest.raises(ValueError, match="`tools`"):
        ChatFormat(tiny_tokenizer, template_kwargs={"tools": [PYTHON_TOOL]})
