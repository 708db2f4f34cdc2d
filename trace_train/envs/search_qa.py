"""Multi-hop question answering with a search tool (Search-R1-style episodes).

A row holds ``question`` and ``answers`` (gold answers; :func:`qa_rows` turns the loaders' ``QAExample``
objects into rows). The opening messages are the system prompt, which explains the ``search`` tool, the
Qwen3 tool-call format and the answer format, and the question as the user message.

Each turn the action (its visible text, reasoning dropped) is read as:

* **tool calls**: each ``search(query=...)`` returns the top ``topk`` passages of the retriever in
  Search-R1's ``Doc i(Title: ...) text`` layout (``tools.search.SearchTool``); a retriever that fails
  gives an ``Error: ...`` result. Malformed blocks, other tool names or arguments get an error result
  (``invalid``); at most ``max_searches`` searches run per episode. An answer in a tool-call turn is
  ignored.
* **a final answer** ``<answer>...</answer>`` (no tool call): the episode ends.
* anything else: an error observation (role "user", ``invalid``); the episode goes on.

The retriever is shared by every instance and holds no episode state: BM25 over a local JSONL corpus
(``tools.search.BM25Retriever``) or a Search-R1 HTTP retrieval server (``HttpRetriever``), chosen by the
factory's config (``registry.search_qa``).

Reward (``reward``): ``"exact_match"`` (default; SQuAD-normalised exact match with any gold answer) or
``"token_f1"`` (the F1 itself, a graded reward in [0, 1]: the rollout engine then needs
``RolloutConfig(binary_rewards=False)``, see :attr:`SearchQAEnv.binary_rewards`). No answer scores 0.
:meth:`SearchQAEnv.metrics` reports both and ``f1_match`` (the paper's exact match at token F1 >= 0.3),
which is refused as a reward because it pays hedged answers ("yes no" against "yes"; ``verifiers.qa``).

Snapshots are :class:`QAState` values holding every search and its observation, so a restored episode
never queries the retriever again for what it already saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from ..tools.budget import ToolCallBudget
from ..tools.search import SearchTool
from ..verifiers.answers import extract_answer_tag
from ..verifiers.qa import REWARDS, check_reward, exact_match, f1_match, is_binary_reward, token_f1
from .base import Message, StepResult
from .tooling import (
    check_observation_role,
    format_tool_results,
    function_schema,
    run_tool_calls,
    visible_text,
)

__all__ = ["SearchQAEnv", "QAState", "SEARCH_TOOL", "REWARDS", "qa_rows", "qa_demonstration", "search_call"]

SEARCH_TOOL = function_schema(
    "search",
    "Search the knowledge base and return the most relevant passages.",
    {"query": {"type": "string", "description": "What to search for, in a few keywords."}},
    ["query"],
)
SYSTEM_PROMPT = (
    "Answer the question. The answer may need several facts: look them up one at a time with the "
    "`search` tool, which returns the {topk} most relevant passages of a knowledge base. To search, write\n"
    '<tool_call>\n{{"name": "search", "arguments": {{"query": "your keywords"}}}}\n</tool_call>\n'
    "and wait for the results. You may search at most {max_searches} times. When you know the answer, "
    "give it in a turn without tool calls, in a few words, as <answer>...</answer>, "
    "for example <answer>Paris</answer>."
)
NO_ACTION = (
    "Error: no tool call and no final answer. Search with a <tool_call> block, or give the final answer "
    "as <answer>...</answer>."
)


@dataclass(frozen=True)
class QAState:
    """The whole state of an episode (a snapshot is this value)."""

    question: str
    answers: tuple[str, ...]
    """Gold answers."""
    searches: tuple[tuple[str, str], ...] = ()
    """(query, observation) of every search that ran, in order."""
    answer: str | None = None
    """The final answer; None until the model answers."""

    @property
    def done(self) -> bool:
        return self.answer is not None


def qa_rows(examples: Iterable[Any]) -> list[dict]:
    """Rows for this environment from ``data.qa.QAExample`` objects (id, question, answers, and the titles of
    the supporting passages as ``supporting_titles`` where the data names them)."""
    return [{"id": e.id, "question": e.question, "answers": list(e.answers),
             **({"supporting_titles": list(e.supporting_titles)} if e.supporting_titles else {})}
            for e in examples]


def search_call(query: str) -> str:
    """The action text of one ``search`` call in the format the system prompt asks for."""
    return f"<tool_call>\n{json.dumps({'name': 'search', 'arguments': {'query': query}})}\n</tool_call>"


def qa_demonstration(row: Mapping[str, Any]) -> list[str]:
    """A scripted expert's episode (``TaskSpec.demonstration``): search the title of each supporting passage
    in order (the question itself where the row names none), then answer the first gold answer.

    It knows the answer, so a model warmed on it memorises the training rows; it exists so that a tiny
    model starts with well-formed tool calls and mixed success, not as a way to solve the task."""
    titles = list(row.get("supporting_titles") or []) or [str(row["question"])]
    return [search_call(title) for title in titles] + [f"<answer>{row['answers'][0]}</answer>"]


class SearchQAEnv:
    """The environment (see the module docstring).

    Parameters
    ----------
    search : SearchTool
        The search tool (a retriever and ``topk``), shared by all instances.
    reward : {"exact_match", "token_f1"}
        What :meth:`verify` returns; "token_f1" is graded (use ``binary_rewards=False`` in the engine).
    max_searches : int
        Searches per episode.
    observation_role : {"tool", "user"}
        Role of the search-result message (see ``tooling``).
    system_prompt : str, optional
        Replaces the default instructions; ``{topk}`` and ``{max_searches}`` in it are filled in.
    """

    concurrency_safe = True
    """Episodes keep their state in the instance; the shared SearchTool is read-only: BM25 retrieval only
    reads its index, and the HTTP client opens one connection per request (tests/envs/test_concurrency.py)."""

    def __init__(self, search: SearchTool, *, reward: str = "exact_match", max_searches: int = 4,
                 observation_role: str = "tool", system_prompt: str | None = None):
        if not isinstance(search, SearchTool):
            raise ValueError(f"`search` must be a SearchTool, got {type(search).__name__}")
        self.search, self.reward = search, check_reward(reward)
        self._budget = ToolCallBudget(max_searches)
        self.observation_role = check_observation_role(observation_role)
        self.system_prompt = (system_prompt or SYSTEM_PROMPT).format(topk=search.topk,
                                                                     max_searches=max_searches)
        self._state: QAState | None = None

    @property
    def binary_rewards(self) -> bool:
        """Whether :meth:`verify` returns only 0 or 1 (False for ``reward="token_f1"``)."""
        return is_binary_reward(self.reward)

    @property
    def state(self) -> QAState:
        if self._state is None:
            raise RuntimeError("call reset() or restore() before using the environment")
        return self._state

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        question, answers = row.get("question"), row.get("answers")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"QA rows need a non-empty str 'question'; got keys {sorted(row)}")
        answers = [answers] if isinstance(answers, str) else list(answers or [])
        if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise ValueError(f"QA rows need 'answers', a non-empty list of str; got {row.get('answers')!r}")
        question = question.strip()
        self.restore(QAState(question=question, answers=tuple(answers)))
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question}]

    def step(self, action: str) -> StepResult:
        if self.state.done:
            raise RuntimeError("the episode is over; reset() or restore() first")
        text = visible_text(action)
        ran: list[tuple[str, str]] = []

        def run(query: str) -> str:
            ran.append((query, self.search(query)))
            return ran[-1][1]

        results, invalid = run_tool_calls(text, "search", "query", self._budget, run)
        if results:
            self._state = replace(self.state, searches=self.state.searches + tuple(ran))
            return StepResult(format_tool_results(results, self.observation_role), role=self.observation_role,
                              invalid=invalid)
        answer = extract_answer_tag(text)
        if answer is not None:
            self._state = replace(self.state, answer=answer)
            return StepResult("Final answer received.", done=True)
        return StepResult(NO_ACTION, invalid=True)

    def verify(self) -> float:
        return self.metrics()[self.reward]

    def metrics(self) -> dict[str, float]:
        """``exact_match``, ``f1_match`` and ``token_f1`` of the final answer, ``answered``, ``searches``."""
        s = self.state
        return {"exact_match": exact_match(s.answer, s.answers), "f1_match": f1_match(s.answer, s.answers),
                "token_f1": token_f1(s.answer, s.answers), "answered": float(s.done),
                "searches": float(len(s.searches))}

    def snapshot(self) -> QAState:
        return self.state

    def restore(self, snapshot: QAState) -> None:
        if not isinstance(snapshot, QAState):
            raise ValueError(f"`snapshot` must be a QAState, got {type(snapshot).__name__}")
        self._budget.restore(len(snapshot.searches))
        self._state = snapshot
