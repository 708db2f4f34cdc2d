"""Token-level chat formatting: exact ids per turn, never re-tokenising history."""

from __future__ import annotations

import numpy as np
import pytest

from trace_train.chat import ChatFormat
from trace_train.tiny import build_tokenizer

OPENING = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "Guess from 1 to 8."}]


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(build_tokenizer())


def test_turn_end_is_learned_from_the_template(chat):
    tok = chat.tokenizer
    assert tok.convert_ids_to_tokens(list(chat.turn_end_ids)) == ["<|im_end|>", "Ċ"]
    assert chat.stop_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)


def test_appended_turns_equal_the_rendered_conversation(chat):
    """prompt + action + observation + action ... is the template's rendering of the whole conversation."""
    end = chat.turn_end_ids[0]
    ids = chat.prompt_ids(OPENING)
    messages = list(OPENING)
    for action, observation in [("4", "Higher. 2 guesses left."), ("6", "Lower. 1 guess left."), ("5", None)]:
        action_ids = chat.encode(action) + [end]
        assert chat.action_text(action_ids) == action
        ids += action_ids
        messages.append({"role": "assistant", "content": action})
        if observation is not None:
            message = {"role": "user", "content": observation}
            ids += chat.observation_ids(action_ids, message)
            messages.append(message)
    rendered = chat.tokenizer.apply_chat_template(messages, tokenize=False)
    assert ids == chat.encode(rendered)[: len(ids)]
    assert chat.encode(rendered)[len(ids) :] == list(chat.turn_end_ids[1:])  # the newline after the last turn


def test_a_cut_turn_is_closed_by_tokens_the_model_did_not_generate(chat):
    cut = chat.encode("12")  # no <|im_end|>: the turn hit its token limit
    obs = chat.observation_ids(cut, {"role": "user", "content": "Lower."})
    assert obs[: len(chat.turn_end_ids)] == list(chat.turn_end_ids)
    finished = cut + [chat.turn_end_ids[0]]
    assert chat.observation_ids(finished, {"role": "user", "content": "Lower."}) == obs[1:]


def test_tool_messages_use_the_template_layout(chat):
    ids = chat.observation_ids(chat.encode("x") + [chat.turn_end_ids[0]], {"role": "tool", "content": "42"})
    assert (
        chat.tokenizer.decode(ids)
        == "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_kwargs_reach_the_template(chat):
    plain = chat.tokenizer.decode(chat.prompt_ids(OPENING))
    no_think = ChatFormat(chat.tokenizer, template_kwargs={"enable_thinking": False})
    assert chat.tokenizer.decode(no_think.prompt_ids(OPENING)) == plain + "<think>\n\n</think>\n\n"


def test_a_tokenizer_without_a_template_is_rejected():
    tok = build_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatFormat(tok)
    with pytest.raises(ValueError, match="at least one message"):
        ChatFormat(build_tokenizer()).prompt_ids([])


def _marker_by_trial(base, *texts):
    n = 0
    while any(f"{base}{n}\x00" in t for t in texts):
        n += 1
    return f"{base}{n}\x00"


def test_the_marker_search_equals_trial_and_error_and_reads_a_crafted_prompt_once():
    """Issue 34: ``chat._marker`` finds the counter trial and error would, in one pass (a prompt holding
    every counter up to 30 000 took quadratic time before)."""
    from trace_train.chat import _marker

    base = "\x00M"
    rng = np.random.default_rng(0)
    cases = [(), ("",), ("plain",), (f"{base}0\x00",), (f"{base}0\x00{base}1\x00", f"{base}2\x00"),
             (f"{base}00\x00{base}01\x00",), (f"{base}1\x00",), (f"{base}{base}0\x00",), (f"{base}0",),
             (f"{base}12\x00x", "".join(f"{base}{i}\x00" for i in range(12)))]
    for _ in range(200):
        parts = [rng.choice([base, "0", "1", "2", "\x00", "x", "10"]) for _ in range(rng.integers(0, 30))]
        cases.append(("".join(parts), "".join(reversed(parts))))
    for texts in cases:
        assert _marker(base, *texts) == _marker_by_trial(base, *texts), texts
    crafted = "".join(f"{base}{i}\x00" for i in range(30_000))  # about 300 kB
    assert _marker(base, crafted) == f"{base}30000\x00"
