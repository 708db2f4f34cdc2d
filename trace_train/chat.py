"""Chat formatting at the token level, through the tokenizer's own chat template.

A multi-turn context is built by appending token ids, never by re-rendering and re-tokenising the
conversation: the model's action tokens are kept exactly as sampled, and only new messages are
tokenised. This keeps every branch of a tree an exact token-level extension of its prefix, and avoids
the drift that re-tokenising brings (BPE merges across message boundaries, templates such as Qwen3's
that rewrite earlier assistant turns).

What the template says is learned once, from renders with a sentinel assistant message:

* ``turn_end_ids``: the tokens the template puts after an assistant message's content (``<|im_end|>``
  and a newline for Qwen3). Its first token ends a turn, so it is a stop token for generation.
* the tokens of a new message plus the generation prompt that follows it.

:meth:`ChatFormat.observation_ids` returns what goes between two actions: the rest of ``turn_end_ids``
that the model did not generate (just the newline when it stopped on ``<|im_end|>``, all of it when its
turn was cut), then the observation message and the next generation prompt. All of these tokens carry
loss mask 0.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["ChatFormat"]

_SENTINEL = "\x00TRACE-ASSISTANT\x00"
_PROBE = [{"role": "user", "content": "probe"}]


class ChatFormat:
    """Token-level chat formatting for one tokenizer (see the module docstring).

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        A tokenizer with a chat template.
    template_kwargs : mapping, optional
        Extra variables for the template, e.g. ``{"enable_thinking": False}`` for Qwen3.
    """

    def __init__(self, tokenizer, *, template_kwargs: Mapping[str, Any] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; set `tokenizer.chat_template`")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        closed = self._render(_PROBE + [{"role": "assistant", "content": _SENTINEL}], generation_prompt=False)
        turn_end = closed[closed.rindex(_SENTINEL) + len(_SENTINEL):]
        if not turn_end:
            raise ValueError("the chat template puts nothing after an assistant message; "
                             "cannot tell where a turn ends")
        self.turn_end_ids: tuple[int, ...] = tuple(self.encode(turn_end))
        self._turn_end_text = turn_end

    # -----------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` alone (no BOS or other added tokens)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _render(self, messages: Sequence[Mapping[str, str]], *, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt, **self.template_kwargs
        )

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Tokens that end an assistant turn: the first token of ``turn_end_ids`` and the tokenizer's EOS."""
        ids = {self.turn_end_ids[0]}
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))

    def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of the opening messages followed by the generation prompt."""
        if not messages:
            raise ValueError("`messages` must hold at least one message")
        return self.encode(self._render(messages, generation_prompt=True))

    def closing_ids(self, action_ids: Sequence[int]) -> list[int]:
        """The part of ``turn_end_ids`` that the model did not generate at the end of ``action_ids``."""
        if action_ids and action_ids[-1] == self.turn_end_ids[0]:
            return list(self.turn_end_ids[1:])
        return list(self.turn_end_ids)

    def observation_ids(self, action_ids: Sequence[int], message: Mapping[str, str]) -> list[int]:
        """Tokens between an action and the next one: closing tokens, the message, the generation prompt."""
        rendered = self._render(
            _PROBE + [{"role": "assistant", "content": _SENTINEL}, dict(message)], generation_prompt=True
        )
        tail = rendered[rendered.rindex(_SENTINEL) + len(_SENTINEL):]
        if not tail.startswith(self._turn_end_text):
            raise ValueError("the chat template renders the end of an assistant turn differently "
                             "before a new message")
        return self.closing_ids(action_ids) + self.encode(tail[len(self._turn_end_text):])

    def action_text(self, action_ids: Sequence[int]) -> str:
        """The text of an action, as the environment sees it (special tokens such as the turn end dropped)."""
        return self.tokenizer.decode(list(action_ids), skip_special_tokens=True)
