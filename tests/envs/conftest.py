"""Fixtures of the environment tests: a tokenizer trained on the environments' text, Qwen3's chat
template, and a tiny Qwen3 taught the tool-call format on scripted episodes. Nothing is downloaded.

Torch runs on one thread while this package's model tests run (the ``torch`` fixture): the models are
tiny, and a second thread only adds contention on a shared 2-core machine (a 4x64 matmul then takes
15 ms instead of 5 us). The environment tests themselves need neither torch nor transformers.
"""

from __future__ import annotations

import copy
import textwrap
from importlib import resources

import numpy as np
import pytest

from trace_train.chat import ChatFormat
from trace_train.envs.registry import make_env_factory
from trace_train.tiny import CHAT_TEMPLATE, build_model, build_tokenizer

from .scripted import CORPUS, DEMO, bfcl_actions, play, qa_actions, tool_call

BFCL_IDS = ("multi_turn_base_105", "multi_turn_miss_func_116")


def arithmetic_rows(n: int, seed: int) -> list[dict]:
    """``n`` problems "What is a * b + c?" with their answers."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, (a, b, c) in enumerate(rng.integers(2, 30, size=(n, 3)).tolist()):
        rows.append({"id": f"arith{seed}-{i}", "problem": f"What is {a} * {b} + {c}?",
                     "answer": str(a * b + c)})
    return rows


def arithmetic_actions(row: dict) -> list[str]:
    expression = row["problem"][len("What is "):-1]
    return [tool_call("python", code=f"print({expression})"), f"<answer>{row['answer']}</answer>"]


@pytest.fixture(scope="package")
def torch():
    """torch on one thread while this package's tests run (the environments alone need no torch)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(threads)


@pytest.fixture(scope="package")
def factories():
    return {"math_python": make_env_factory("math_python"),
            "search_qa": make_env_factory("search_qa", {"corpus": str(CORPUS)}),
            "bfcl": make_env_factory("bfcl")}


@pytest.fixture(scope="package")
def episodes(factories):
    """Scripted episodes through the real environments: (factory name, row, actions)."""
    out = [("math_python", row, arithmetic_actions(row)) for row in arithmetic_rows(12, seed=1)]
    out += [("search_qa", {"id": q["id"], "question": q["question"], "answers": q["golden_answers"]},
             qa_actions(q)) for q in DEMO]
    out += [("bfcl", {"id": task_id}, bfcl_actions(task_id)) for task_id in BFCL_IDS]
    return out


@pytest.fixture(scope="package")
def tiny_tokenizer(factories, episodes):
    """A byte-level BPE (Qwen3 special tokens, the tiny chat template) trained on the episodes' text."""
    texts = []
    for name, row, actions in episodes:
        env = factories[name]()
        texts += [m["content"] for m in env.reset(row)] + actions
        texts += [r.observation for r in play(env, actions)]
    texts += [str(i) for i in range(1000)] + ["<tool_response>", "</tool_response>", "<tool_call>"] * 50
    return build_tokenizer(texts, vocab_size=2048)


@pytest.fixture(scope="package")
def qwen3_tokenizer(tiny_tokenizer):
    """The tiny tokenizer with Qwen3's chat template, read from the source of bfcl-eval's Qwen handler
    (its docstring quotes the template; the raw source keeps its escapes)."""
    source = (resources.files("bfcl_eval") / "model_handler/local_inference/qwen_fc.py").read_text()
    template = textwrap.dedent(source.split('"chat_template":', 1)[1].split('"""', 1)[0].strip("\n"))
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = template
    return tokenizer


def _transcript(chat: ChatFormat, env, row, actions):
    """Token ids and loss mask of a scripted episode, laid out exactly as the rollout engine lays it out."""
    ids = chat.prompt_ids(env.reset(row))
    mask = [0] * len(ids)
    for action in actions:
        action_ids = chat.encode(action) + [chat.turn_end_ids[0]]
        ids, mask = ids + action_ids, mask + [1] * len(action_ids)
        result = env.step(action)
        if result.done:
            break
        obs = chat.observation_ids(action_ids, {"role": result.role, "content": result.observation})
        ids, mask = ids + obs, mask + [0] * len(obs)
    return ids, mask


def _loss(torch, model, pad_id: int, batch):
    """Mean cross-entropy on the action tokens of ``batch`` ((ids, mask) pairs, right-padded)."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    target = torch.zeros((len(batch), width), dtype=torch.bool)
    for i, (seq, mask) in enumerate(batch):
        ids[i, :len(seq)], attention[i, :len(seq)] = torch.tensor(seq), 1
        target[i, :len(seq)] = torch.tensor(mask) == 1
    hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state
    chosen = target[:, 1:]  # the LM head only where there is a loss: most tokens are prompt
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[:, :-1][chosen]), ids[:, 1:][chosen])


@pytest.fixture(scope="package")
def tiny_dir(torch, tmp_path_factory, tiny_tokenizer, factories, episodes):
    """A tiny Qwen3 fine-tuned for a few seconds on the scripted episodes, saved to disk.

    It then writes tool calls and answers in the right format (math and QA), and ends its turns in
    BFCL's long prompts, with garbled content often enough that rewards and errors vary. BFCL
    transcripts (about 4k tokens each) join every fourth step only, to keep the set-up short.
    """
    assert tiny_tokenizer.chat_template == CHAT_TEMPLATE
    chat = ChatFormat(tiny_tokenizer)
    data = {name: [_transcript(chat, factories[name](), row, actions) for n, row, actions in episodes
                   if n == name] for name in factories}
    short = data["math_python"] + data["search_qa"]
    model = build_model(tiny_tokenizer, max_positions=16384, seed=0)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    order, pad = np.random.default_rng(0), tiny_tokenizer.pad_token_id
    for step in range(100):
        loss = _loss(torch, model, pad, [short[i] for i in order.choice(len(short), 8, replace=False)])
        if step % 4 == 0:
            loss = loss + _loss(torch, model, pad, [data["bfcl"][step // 4 % len(data["bfcl"])]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    path = tmp_path_factory.mktemp("tiny-tools")
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="package")
def hf_backend(torch, tiny_dir):
    from trace_train.backends.hf_backend import HFBackend

    return HFBackend.from_pretrained(tiny_dir)
