"""What a run's turns can hold: thinking, the turn limit, and the share of turns the limit cut.

A Qwen3-style model *thinks* when its chat template leaves the ``<think>`` block to it (Qwen3's template
does unless ``enable_thinking`` is false, when it writes an empty ``<think>\\n\\n</think>`` after the
generation prompt). A thinking model writes thousands of tokens before its answer or tool call, so a turn
limit of 1-2k tokens cuts most turns inside ``<think>``: the action never reaches the environment, the
rollout ends with end reason ``turn_tokens`` and reward 0, nearly every group fails alike and the step has
no gradient. Hence, at start-up, one line stating thinking and the limits (:func:`turn_limits_line`) and a
warning when thinking is on and ``rollout.limits.max_turn_tokens`` < :data:`THINKING_TURN_TOKENS`
(:func:`thinking_warning`); in every step, the share of turns cut by length (:func:`length_cut_counts`;
``length_cut_share`` = cut turns / turns), which stops the run above ``max_length_cut_share``.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["THINKING_TURN_TOKENS", "template_thinks", "thinking_warning", "turn_limits_line", "length_cut_counts"]

THINKING_TURN_TOKENS = 8192
"""Shortest turn limit at which a thinking turn usually ends by itself (Qwen3's card suggests 32,768 output
tokens for thinking; its reasoning on competition math often runs past 4k)."""


def template_thinks(tokenizer, template_kwargs: Mapping[str, Any] | None = None) -> bool:
    """Whether a generation prompt rendered with ``template_kwargs`` leaves a ``<think>`` block to the model:
    the template branches on ``enable_thinking`` and it is not false, or its generation prompt opens
    ``<think>`` without closing it."""
    template = getattr(tokenizer, "chat_template", None) or ""
    kwargs = dict(template_kwargs or {})
    if "enable_thinking" in template:
        return kwargs.get("enable_thinking", True) is not False
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "probe"}], tokenize=False,
                                             add_generation_prompt=True, **kwargs)
    except Exception:  # noqa: BLE001 - a template that cannot render a plain message decides nothing here
        return False
    tail = text.rsplit("probe", 1)[-1]
    return "<think>" in tail and "</think>" not in tail


def _thinks(cfg, tokenizer) -> bool:
    """:func:`template_thinks` for the run's model; the local tiny model (``model.name_or_path: tiny``) was
    warm-started on answers without a think block and never opens one, whatever its Qwen3-style template says."""
    return cfg.model.name_or_path != "tiny" and template_thinks(tokenizer, cfg.rollout.chat_template_kwargs)


def thinking_warning(cfg, tokenizer) -> str | None:
    """The one-line warning of a run whose model thinks with turns shorter than :data:`THINKING_TURN_TOKENS`
    (None when thinking is off or the turns are long enough)."""
    limit = cfg.rollout.limits.max_turn_tokens
    if not _thinks(cfg, tokenizer) or limit >= THINKING_TURN_TOKENS:
        return None
    return (f"thinking is on (the chat template leaves <think> to the model) and turns stop at {limit} tokens "
            f"(rollout.limits.max_turn_tokens): most turns will be cut inside <think> (reward 0, no gradient); set "
            f"rollout.chat_template_kwargs.enable_thinking=false or max_turn_tokens >= {THINKING_TURN_TOKENS}")


def turn_limits_line(cfg, tokenizer) -> str:
    """The start-up line: thinking on or off, and the turn, per-turn token and context limits."""
    limits = cfg.rollout.limits
    thinking = "on" if _thinks(cfg, tokenizer) else "off"
    return (f"trace-train: thinking {thinking}; up to {limits.max_turns} turns of at most {limits.max_turn_tokens} "
            f"tokens each, {limits.max_context_tokens} tokens of context; a step stops the run when more than "
            f"{cfg.max_length_cut_share:.0%} of its turns are cut by length")


def length_cut_counts(batch) -> tuple[int, int]:
    """(turns, turns cut by length) of a rollout batch: every non-root node is one turn; a turn is cut when
    the back end stopped it at the turn limit (``finish_reason`` "length"; its rollout ended by
    ``turn_tokens`` or ``context``)."""
    turns = cut = 0
    for node in batch.nodes:
        if node.finish_reason is None:  # a root: the prompt, no turn
            continue
        turns += 1
        cut += node.finish_reason == "length"
    return turns, cut
