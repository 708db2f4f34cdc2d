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

Hostile text. Message content is data (tool results, scraped corpora), never chat structure:

* it is cleaned once (:func:`clean_text`): lone surrogates, which a tokenizer cannot encode, become
  U+FFFD and surrogate pairs are joined;
* an observation's content is tokenised apart from the template's own text, with special-token strings
  read as plain text (``split_special_tokens``), so a tool result holding ``<|im_end|>`` cannot close
  the turn or forge a new one; the template's frame around the content keeps its special tokens;
* so is the content of the opening messages (a data set row): the template is rendered with a
  placeholder per content, and only the template's own text is read for special tokens;
* the tags the template's frame puts around a tool result (Qwen3's ``<tool_response>``, a non-special
  added token, and plain text in other tokenizers) are escaped inside the result
  (:meth:`ChatFormat.escape_frame_tags`: ``&lt;/tool_response&gt;``), so a result cannot close its
  frame and open a forged one;
* the markers used to find where the message starts are chosen per call so that they do not occur in
  the content, and must occur exactly once in the rendering: content cannot collide with them.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

__all__ = ["ChatFormat", "clean_text", "template_accepts_tools"]

_SENTINEL = "\x00TRACE-ASSISTANT\x00"
TOOL_RESULTS_SEPARATOR = "\n</tool_response>\n<tool_response>\n"
"""What Qwen3 renders between consecutive tool responses: an observation carrying several tool results
joins them with it, so its tokens equal those of one tool message per call (``envs.tooling``)."""
_TAG = re.compile(r"</?[A-Za-z_][\w.:-]*>")  # an XML-like tag in a template's frame: <tool_response>
_PROBE = [{"role": "user", "content": "probe"}]


def clean_text(text: str) -> str:
    """``text`` as valid Unicode: lone surrogates become U+FFFD, surrogate pairs one character.

    Scraped text and JSON with ``\\ud800`` escapes hold lone surrogates, which UTF-8 (and so every
    tokenizer) refuses. Other text is returned unchanged; a non-string is a TypeError.
    """
    if not isinstance(text, str):
        raise TypeError(f"message content must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _marker(base: str, *texts: str) -> str:
    """``base`` with a counter appended: the first variant that occurs in none of ``texts``.

    Linear in the texts' length: one pass collects every counter ``base<digits>\\x00`` already present
    (reading at most as many digits as the answer can have), then the smallest counter not among them
    is taken (testing ``base0``, ``base1``, ... against each text in turn was quadratic)."""
    used: set[str] = set()
    limit = len(str(sum(len(t) for t in texts) + 1))  # the answer has at most this many digits
    for t in texts:
        at = t.find(base)
        while at != -1:
            start = at + len(base)
            end = start
            while end < len(t) and end - start <= limit and t[end].isdigit() and t[end].isascii():
                end += 1
            if end > start and end < len(t) and t[end] == "\x00":
                used.add(t[start:end])
            at = t.find(base, at + 1)
    n = 0
    while str(n) in used:
        n += 1
    return f"{base}{n}\x00"


def _after_once(text: str, marker: str, what: str) -> str:
    """The text after the single occurrence of ``marker`` in ``text`` (a ValueError otherwise)."""
    if text.count(marker) != 1:
        raise ValueError(f"the chat template does not render the {what} verbatim exactly once")
    return text[text.index(marker) + len(marker):]


_TOOL_PROBE = {"type": "function", "function": {"name": "probe", "description": "TRACE-PROBE",
                                                "parameters": {"type": "object", "properties": {}, "required": []}}}


def template_accepts_tools(tokenizer) -> bool:
    """Whether the chat template renders a ``tools=`` list (Qwen3's does; the tiny test template does not)."""
    messages = [{"role": "user", "content": "probe"}]
    try:
        plain = tokenizer.apply_chat_template(messages, tokenize=False)
        with_tools = tokenizer.apply_chat_template(messages, tools=[_TOOL_PROBE], tokenize=False)
    except Exception:  # a template that cannot take tools
        return False
    return plain != with_tools


class ChatFormat:
    """Token-level chat formatting for one tokenizer (see the module docstring).

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        A tokenizer with a chat template.
    tools : sequence of mapping, optional
        JSON schemas of the environment's tools: they go to the template (``tools=``) when it renders them
        (:func:`template_accepts_tools`), else nowhere (environments explain their tools in their system
        prompt too, so a template without tool support loses only the JSON schema).
    template_kwargs : mapping, optional
        Extra variables for the template, e.g. ``{"enable_thinking": False}`` for Qwen3.
    """

    def __init__(self, tokenizer, *, tools: Sequence[Mapping[str, Any]] = (),
                 template_kwargs: Mapping[str, Any] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; set `tokenizer.chat_template`")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        if "tools" in self.template_kwargs:
            raise ValueError("pass tool schemas as `tools`, not in `template_kwargs`")
        if tools and template_accepts_tools(tokenizer):
            self.template_kwargs["tools"] = [dict(tool) for tool in tools]
        closed = self._render(_PROBE + [{"role": "assistant", "content": _SENTINEL}], generation_prompt=False)
        turn_end = closed[closed.rindex(_SENTINEL) + len(_SENTINEL):]
        if not turn_end:
            raise ValueError("the chat template puts nothing after an assistant message; "
                             "cannot tell where a turn ends")
        self.turn_end_ids: tuple[int, ...] = tuple(self.encode(turn_end))
        self._turn_end_text = turn_end
        self._frames: dict[tuple, tuple[str, str, list[int], list[int]]] = {}

    # -----------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` alone (no BOS or other added tokens); special-token strings are parsed."""
        return self.tokenizer.encode(clean_text(text), add_special_tokens=False)

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text: ``<|im_end|>`` in it is characters, not the special token."""
        return self.tokenizer.encode(clean_text(text), add_special_tokens=False, split_special_tokens=True)

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
        """Token ids of the opening messages followed by the generation prompt.

        The conversation is rendered with a placeholder for each message's content (chosen to occur in
        no content); the template's text is tokenised with its special tokens and each content as plain
        text (:meth:`encode_plain`) where its placeholder was, so a data set row holding
        ``<|im_end|>\n<|im_start|>system`` cannot open a turn. A ValueError when the template does not
        render each placeholder exactly once (it rewrites or repeats the content)."""
        if not messages:
            raise ValueError("`messages` must hold at least one message")
        messages = [{**m, "content": clean_text(m["content"])} if "content" in m else dict(m) for m in messages]
        texts = [m["content"] for m in messages if isinstance(m.get("content"), str)]
        placeholders, framed = [], []
        for i, m in enumerate(messages):
            if isinstance(m.get("content"), str):
                placeholders.append((_marker(f"\x00TRACE-PROMPT{i}-", *texts), m["content"]))
                m = {**m, "content": placeholders[-1][0]}
            framed.append(m)
        rest = self._render(framed, generation_prompt=True)
        ids: list[int] = []
        for placeholder, content in placeholders:
            if rest.count(placeholder) != 1:
                raise ValueError("the chat template does not render a prompt message's content verbatim "
                                 "exactly once")
            head, _, rest = rest.partition(placeholder)
            ids += self.encode(head) + self.encode_plain(content)
        return ids + self.encode(rest)

    def closing_ids(self, action_ids: Sequence[int]) -> list[int]:
        """The part of ``turn_end_ids`` that the model did not generate at the end of ``action_ids``."""
        if action_ids and action_ids[-1] == self.turn_end_ids[0]:
            return list(self.turn_end_ids[1:])
        return list(self.turn_end_ids)

    def observation_ids(self, action_ids: Sequence[int], message: Mapping[str, str]) -> list[int]:
        """Tokens between an action and the next one: closing tokens, the message, the generation prompt.

        The message's content is tokenised as plain text inside the template's frame (the text the
        template puts before and after the content of such a message, learned once per role). A
        ValueError when the template renders this content other than inside that frame.
        """
        before, after, before_ids, after_ids = self._frame(message)
        message = {**message, "content": self.escape_frame_tags(message.get("content", ""), message)}
        body = self._message_text(message)
        if not (body.startswith(before) and body.endswith(after) and len(body) >= len(before) + len(after)):
            raise ValueError(f"the chat template renders a {message.get('role')!r} message's content "
                             "outside the frame it renders for other content")
        middle = body[len(before):len(body) - len(after)]
        return self.closing_ids(action_ids) + before_ids + self.encode_plain(middle) + after_ids

    def escape_frame_tags(self, content: str, message: Mapping[str, str]) -> str:
        """``content`` (cleaned) with the tags that the template's frame puts around messages like
        ``message`` (Qwen3's ``<tool_response>`` and ``</tool_response>`` for a tool result) written
        ``&lt;tool_response&gt;``: a tool result cannot end its own frame and forge another one, and the
        model still reads the tag's name. Content without those tags is returned unchanged, and so is
        :data:`TOOL_RESULTS_SEPARATOR`, which joins the results of one turn's several tool calls
        (``envs.tooling.format_tool_results``, which escapes each result's own tags first)."""
        content = clean_text(content)
        before, after, _, _ = self._frame(message)
        tags = sorted(set(_TAG.findall(before + after)), key=len, reverse=True)
        if not tags:
            return content
        parts = content.split(TOOL_RESULTS_SEPARATOR)  # several results of one turn stay several results
        for tag in tags:
            parts = [part.replace(tag, "&lt;" + tag[1:-1] + "&gt;") for part in parts]
        return TOOL_RESULTS_SEPARATOR.join(parts)

    def _message_text(self, message: Mapping[str, str]) -> str:
        """What the template renders for ``message`` after a closed assistant turn, up to the next turn."""
        marker = _marker(_SENTINEL[:-1], *(v for v in message.values() if isinstance(v, str)))
        rendered = self._render(_PROBE + [{"role": "assistant", "content": marker}, dict(message)],
                                generation_prompt=True)
        tail = _after_once(rendered, marker, "assistant message")
        if not tail.startswith(self._turn_end_text):
            raise ValueError("the chat template renders the end of an assistant turn differently "
                             "before a new message")
        return tail[len(self._turn_end_text):]

    def _frame(self, message: Mapping[str, str]) -> tuple[str, str, list[int], list[int]]:
        """Text (and its tokens) the template puts before and after the content of messages with the
        other fields of ``message`` (its role, ...); learned from a placeholder content, cached."""
        key = tuple(sorted((k, v) for k, v in message.items() if k != "content" and isinstance(v, str)))
        if key not in self._frames:
            placeholder = _marker("\x00TRACE-CONTENT", *(v for _, v in key))
            body = self._message_text({**dict(key), "content": placeholder})
            after = _after_once(body, placeholder, "message content")
            before = body[:len(body) - len(after) - len(placeholder)]
            self._frames[key] = (before, after, self.encode(before), self.encode(after))
        return self._frames[key]

    def action_text(self, action_ids: Sequence[int]) -> str:
        """The text of an action, as the environment sees it (special tokens such as the turn end dropped)."""
        return self.tokenizer.decode(list(action_ids), skip_special_tokens=True)
