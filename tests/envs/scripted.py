"""Scripted agents: hand-written action sequences for known tasks, and how to play them.

Each agent is a list of actions (model turns as text, in the Qwen3 tool-call format the environments
read); :func:`play` feeds them to an environment and returns what it answered. No model is involved.
"""

from __future__ import annotations

import ast
import json

from trace_train.data.qa import demo_paths
from trace_train.envs.bfcl import bfcl_task

CORPUS, QUESTIONS = demo_paths()
DEMO = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]
"""The demo questions with their hops: the query that finds each gold passage, and its id."""
TITLES = {p["id"]: p["title"] for p in map(json.loads, CORPUS.read_text().splitlines())}

# Problems whose answer Python computes; the reference answers are written in another form on purpose,
# so that math-verify (not string equality) decides.
MATH = [
    ({"id": "sum", "problem": "What is the sum of the squares of the integers from 1 to 24?",
      "answer": "4900"},
     ["n = 24", "print(sum(i * i for i in range(1, n + 1)))"], "\\boxed{4900}"),
    ({"id": "frac", "problem": "Compute 1/3 + 1/6 as a fraction.", "answer": "\\frac{1}{2}"},
     ["from fractions import Fraction\nprint(Fraction(1, 3) + Fraction(1, 6))"], "<answer>1/2</answer>"),
    ({"id": "root", "problem": "What is the positive root of x^2 - 5x - 14 = 0?", "answer": "7"},
     ["import math\na, b, c = 1, -5, -14", "print((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a))"],
     "<answer>7</answer>"),
]


def tool_call(tool: str, /, **arguments) -> str:
    """One Qwen3 tool-call block."""
    return f"<tool_call>\n{json.dumps({'name': tool, 'arguments': arguments})}\n</tool_call>"


def math_actions(cells: list[str], answer: str) -> list[str]:
    """Run each cell with the python tool (with some reasoning around it), then answer."""
    return [f"<think>\nLet me compute.\n</think>\n\n{tool_call('python', code=cell)}" for cell in cells] + [
        f"The result is in. {answer}"
    ]


def qa_actions(question: dict) -> list[str]:
    """Search each hop's query, then answer with the first gold answer."""
    return [tool_call("search", query=hop["query"]) for hop in question["hops"]] + [
        f"<answer>{question['golden_answers'][0]}</answer>"
    ]


def bfcl_actions(task_id: str) -> list[str]:
    """BFCL's ground truth: each turn's calls in one step (if any), then a reply without calls."""
    task = bfcl_task(task_id)
    docs = {doc["name"]: doc for doc in task.functions_at(len(task.turns) - 1)}
    actions = []
    for calls in task.ground_truth:
        if calls:
            actions.append("\n".join(_bfcl_block(call, docs) for call in calls))
        actions.append("Done.")
    return actions


def _bfcl_block(call: str, docs: dict) -> str:
    """A ground-truth call string as a tool call; positional arguments take the documented names."""
    node = ast.parse(call, mode="eval").body
    names = list(docs[node.func.id]["parameters"]["properties"])
    arguments = {names[i]: ast.literal_eval(arg) for i, arg in enumerate(node.args)}
    arguments.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
    return tool_call(node.func.id, **arguments)


def play(env, actions: list[str]) -> list:
    """Step ``env`` through ``actions``; the StepResults."""
    return [env.step(action) for action in actions]
