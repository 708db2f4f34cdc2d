"""Tiny models and tokenizers built locally, for tests, benchmarks and the CPU demo.

Nothing here downloads anything: the tokenizer is a byte-level BPE trained in a second on text of the
guess-the-number task (and of a task's demonstrations when it has a scripted expert), with Qwen3's
special tokens and a Qwen3-style chat template; the model is a
randomly initialised Qwen3 architecture small enough to train on a CPU. ``head_dim`` defaults to 32,
the smallest vLLM's CPU attention accepts.
"""

from __future__ import annotations

import os
from typing import Iterable

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "build_tokenizer", "build_model", "save_tiny", "play_demonstrations",
           "demonstration_transcript", "warm_start"]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")

# Qwen3's layout (ChatML turns, tool results wrapped in <tool_response> inside a user turn, an empty
# think block after the generation prompt when thinking is disabled), without its tool-call machinery.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def _default_corpus() -> list[str]:
    """Text of the guess-the-number task: prompts, feedback and numbers, enough for useful merges."""
    from .envs.guess_number import GuessNumberEnv, make_rows

    texts = []
    for high in (4, 8, 16, 32, 64, 100):
        for row in make_rows(8, high=high, max_guesses=6, seed=high):
            env = GuessNumberEnv()
            texts.extend(m["content"] for m in env.reset(row))
            for guess in range(1, high + 1, max(1, high // 6)):
                if env.snapshot().done:
                    break
                texts.append(env.step(str(guess)).observation)
            env.reset(row)
            texts.append(env.step("no idea").observation)
    texts.extend(str(i) for i in range(0, 1000))
    texts.extend(["system", "user", "assistant", "<tool_response>", "</tool_response>"] * 50)
    return texts


def build_tokenizer(corpus: Iterable[str] | None = None, *, vocab_size: int = 512):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with Qwen3's special tokens and chat template.

    Any text round-trips (bytes are the base alphabet). Training is deterministic for a given corpus.
    ``eos_token`` is ``<|im_end|>`` and ``pad_token`` is ``<|endoftext|>``, as in Qwen3.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus) if corpus is not None else _default_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:]),
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def build_model(tokenizer, *, hidden_size: int = 64, layers: int = 2, heads: int = 2, kv_heads: int = 1,
                head_dim: int = 32, intermediate_size: int = 128, max_positions: int = 2048, seed: int = 0):
    """A randomly initialised float32 ``Qwen3ForCausalLM`` sized for ``tokenizer`` (tied embeddings)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if head_dim < 32:
        raise ValueError(f"`head_dim` must be at least 32 (vLLM's CPU attention rejects less), "
                         f"got {head_dim}")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny(path: str | os.PathLike, *, seed: int = 0, warm_steps: int = 0, demonstrations=None,
              **model_kwargs) -> str:
    """Build a tokenizer and a model, warm-start it for ``warm_steps`` steps (:func:`warm_start`), and save
    both to ``path`` (a directory that vLLM and transformers load). Returns the path.

    ``demonstrations``: ``(make_env, rows, demonstration)``, a task's environment factory, training rows
    and scripted expert (``TaskSpec.demonstration``). The tokenizer then also learns the text of those
    episodes and the warm start replays them (:func:`play_demonstrations`); without it the tokenizer and
    the warm start are those of guess-the-number."""
    path = os.fspath(path)
    episodes = play_demonstrations(*demonstrations) if demonstrations is not None else None
    corpus = None if episodes is None else _default_corpus() + [text for episode in episodes
                                                                 for text in _episode_texts(episode)]
    tokenizer = build_tokenizer(corpus)
    model = build_model(tokenizer, seed=seed, **model_kwargs)
    if warm_steps:
        transcripts = None if episodes is None else [demonstration_transcript(tokenizer, e) for e in episodes]
        warm_start(model, tokenizer, steps=warm_steps, seed=seed, transcripts=transcripts)
    _save_atomically(path, model, tokenizer)
    return path


def _save_atomically(path: str, model, tokenizer) -> None:
    """Write model and tokenizer to a temporary sibling folder renamed to ``path`` once complete, so an
    interrupted write never leaves a ``path`` that looks like a model (an incomplete one is replaced)."""
    import shutil
    import tempfile

    target = os.path.abspath(path)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(target)}.")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.chmod(tmp, 0o755)
        if os.path.islink(target) or os.path.isfile(target):
            raise ValueError(f"{target} is a link or a file, not a model folder; remove it")
        if os.path.isdir(target):  # an incomplete folder left by an older, interrupted write
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a whole tiny model (written by :func:`save_tiny`: the tokenizer comes last) with
    no damaged file (:func:`damaged_file`)."""
    return (all(os.path.isfile(os.path.join(path, name)) for name in ("config.json", "tokenizer_config.json"))
            and damaged_file(path) is None)


def damaged_file(path: str | os.PathLike) -> str | None:
    """``"<file>: <why>"`` for the first file of model folder ``path`` that cannot be read whole (a JSON file
    that does not parse, a safetensors file whose header is cut or does not cover the file), else None.
    Reads only the JSON files and each safetensors header, not the weights."""
    import json

    from safetensors import safe_open

    for name in sorted(os.listdir(path)):
        file = os.path.join(path, name)
        try:
            if name.endswith(".json"):
                with open(file, encoding="utf-8") as f:
                    json.load(f)
            elif name.endswith(".safetensors"):
                with safe_open(file, framework="numpy"):
                    pass
        except Exception as error:  # noqa: BLE001 - any failure to read it means damaged
            return f"{file}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
    return None


def guess_transcripts(tokenizer, n: int, *, high: int = 16, max_guesses: int = 5, seed: int = 0):
    """``n`` guess-the-number episodes played by a random guesser, as (token ids, loss mask) pairs.

    The guesser picks uniformly among the numbers still possible, so every transcript is a valid,
    well-formatted game; masks are 1 on the assistant's tokens only. Built with
    :class:`~.chat.ChatFormat` exactly as the rollout engine builds contexts.
    """
    import numpy as np

    from .chat import ChatFormat
    from .envs.guess_number import GuessNumberEnv, make_rows

    chat, rng = ChatFormat(tokenizer), np.random.default_rng(seed)
    out = []
    for row in make_rows(n, high=high, max_guesses=max_guesses, seed=seed):
        env = GuessNumberEnv()
        ids = chat.prompt_ids(env.reset(row))
        mask = [0] * len(ids)
        low, top = row["low"], row["high"]
        while True:
            guess = int(rng.integers(low, top + 1))
            action = chat.encode(str(guess)) + [chat.turn_end_ids[0]]
            ids, mask = ids + action, mask + [1] * len(action)
            result = env.step(str(guess))
            if result.done:
                break
            low, top = (guess + 1, top) if guess < row["target"] else (low, guess - 1)
            obs = chat.observation_ids(action, {"role": "user", "content": result.observation})
            ids, mask = ids + obs, mask + [0] * len(obs)
        out.append((ids, mask))
    return out


def play_demonstrations(make_env, rows, demonstration) -> list[tuple[list, list]]:
    """Each row's scripted episode played through a fresh environment: ``(opening messages, [(action,
    StepResult), ...])``, stopping where the environment says the episode is done."""
    episodes = []
    for row in rows:
        env = make_env()
        opening, steps = env.reset(row), []
        for action in demonstration(row):
            steps.append((action, env.step(action)))
            if steps[-1][1].done:
                break
        episodes.append((opening, steps))
    return episodes


def _episode_texts(episode) -> list[str]:
    opening, steps = episode
    return [m["content"] for m in opening] + [text for action, result in steps
                                              for text in (action, result.observation)]


def demonstration_transcript(tokenizer, episode) -> tuple[list[int], list[int]]:
    """One played episode as (token ids, loss mask), built with :class:`~.chat.ChatFormat` as the
    rollout engine builds contexts (observations in the role the environment gave them); the mask is 1 on
    the actions' tokens and their turn end."""
    from .chat import ChatFormat

    chat = ChatFormat(tokenizer)
    opening, steps = episode
    ids = chat.prompt_ids(opening)
    mask = [0] * len(ids)
    for action, result in steps:
        action_ids = chat.encode(action) + [chat.turn_end_ids[0]]
        ids, mask = ids + action_ids, mask + [1] * len(action_ids)
        if result.done:
            break
        obs = chat.observation_ids(action_ids, {"role": result.role, "content": result.observation})
        ids, mask = ids + obs, mask + [0] * len(obs)
    return ids, mask


def warm_start(model, tokenizer, *, steps: int = 100, batch_size: int = 16, lr: float = 3e-3, seed: int = 0,
               high: int = 16, max_guesses: int = 5, transcripts=None) -> list[float]:
    """Supervised warm start, so a tiny model acts in the task's format from its first step.

    Without ``transcripts``: random-guesser games (:func:`guess_transcripts`). After it, the model answers
    with a number and ends its turn; which number it picks is still far from optimal, so rewards are mixed
    and there is something left for RL to learn. With ``transcripts`` ((ids, mask) pairs, e.g. from
    :func:`demonstration_transcript`): batches drawn from them with replacement. Returns the losses.
    """
    import numpy as np
    import torch

    if transcripts is None:
        data = guess_transcripts(tokenizer, steps * batch_size, high=high, max_guesses=max_guesses, seed=seed)
    else:
        if not transcripts:
            raise ValueError("`transcripts` is empty: the task has no training rows to demonstrate")
        draw = np.random.default_rng([seed, 3]).integers(0, len(transcripts), steps * batch_size)
        data = [transcripts[i] for i in draw]
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for step in range(steps):
        batch = data[step * batch_size:(step + 1) * batch_size]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (seq, mask) in enumerate(batch):
            ids[i, :len(seq)] = torch.tensor(seq)
            attention[i, :len(seq)] = 1
            labels[i, :len(seq)] = torch.where(torch.tensor(mask) == 1, torch.tensor(seq), -100)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses
