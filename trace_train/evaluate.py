"""``trace-eval``: a model's score on math, multi-hop QA or BFCL v4 multi-turn, through the environments.

Every task is played ``k`` times by the rollout engine (GRPO's uniform rule with groups of exactly k,
no branching) in its environment, on the chosen back end, and scored by the benchmark's metric:

==========  ================  ====================================================================
benchmark   environment       reported (``summary.json``, ``metrics``)
==========  ================  ====================================================================
``math``    ``math_python``   ``accuracy`` (share of correct rollouts, mean@k), ``pass@k`` (k > 1: a
                              task counts when any of its k rollouts is correct)
``qa``      ``search_qa``     ``exact_match``, ``f1_match`` (the paper's exact match at F1 >= 0.3),
                              ``token_f1``: means over rollouts
``bfcl``    ``bfcl``          ``accuracy`` (the official checker), overall and per subset
==========  ================  ====================================================================

The output folder holds ``config.json`` (the resolved config), ``results.jsonl`` (one line per task:
id, rewards, and per rollout its metrics, turns, end reason, tokens and transcript) and
``summary.json``. A rerun skips the tasks already in ``results.jsonl``, so an interrupted evaluation
resumes; a folder written with another config (apart from ``limit`` and ``batch_size``) is refused.
A bad config fails with one ``ValueError`` before any model is loaded.

Examples::

    trace-eval --model Qwen/Qwen3-8B --benchmark math --data HuggingFaceH4/MATH-500 --k 4 \\
        --backend vllm --output-dir results/eval/math500
    trace-eval --model Qwen/Qwen3-8B --benchmark qa --data demo --output-dir results/eval/demo-qa
    trace-eval --model Qwen/Qwen3-8B --benchmark bfcl --subsets base,miss_func --split test \\
        --backend vllm --output-dir results/eval/bfcl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .backends.base import Sampling
from .config import config_from_dict, config_to_dict, safe_load
from .engine import RolloutConfig, RolloutEngine
from .envs.base import EpisodeLimits
from .envs.registry import EnvFactory, make_env_factory
from .envs.tooling import chat_format, observation_role_for
from .files import writable_dir

__all__ = ["EvalConfig", "main", "load_tasks", "summarize", "cli"]

BENCHMARKS = {"math": "math_python", "qa": "search_qa", "bfcl": "bfcl"}
BFCL_SPLITS = ("train", "test", "all")
DEFAULT_TURNS = {"math": 8, "qa": 8, "bfcl": 40}
DEFAULT_TOOL_CALLS = {"math": 8, "qa": 4}
DTYPES = ("auto", "float32", "bfloat16", "float16")
RESULTS, SUMMARY, CONFIG = "results.jsonl", "summary.json", "config.json"
_RESUMABLE = ("limit", "batch_size", "output_dir")  # may change between runs into one folder
_PATHS = ("model", "data", "corpus")
_EVAL_OWNS = frozenset({"policy", "pool_size", "roots", "continuations_per_root", "token_budget", "group_size",
                        "min_group", "dapo_target", "expansion_rounds", "temperature", "top_p", "limits",
                        "binary_rewards", "seed"})  # compared as resolved paths when they name local files
_DEVICE = re.compile(r"auto|cpu|mps|(cuda|xpu)(:\d+)?")


def _help(text: str, default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field whose ``--flag`` help is ``text``."""
    return field(default=default, default_factory=factory, metadata={"help": text})


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate and how; every field is a ``--flag`` of ``trace-eval`` (see ``metadata``)."""

    model: str = _help("Hugging Face model id or local directory (weights, config, tokenizer)")
    benchmark: str = _help("math, qa or bfcl")
    output_dir: str = _help("folder for config.json, results.jsonl and summary.json")
    data: str | None = _help("math: JSONL/Parquet file or Hub id with problem/answer; qa: questions file, "
                             "Hub id, or 'demo' (the bundled demo set); bfcl: unused", None)
    corpus: str | None = _help("qa: JSONL corpus for BM25 (default with data=demo: the demo corpus)", None)
    retriever_url: str | None = _help("qa: a Search-R1 retrieval server (.../retrieve) instead of BM25", None)
    split: str = _help("Hub split (math, qa); bfcl: train, test (the stored 80/20 split) or all", "test")
    data_subset: str | None = _help("Hub configuration name (e.g. distractor for HotpotQA)", None)
    subsets: tuple[str, ...] = _help("bfcl subsets, comma-separated",
                                     ("base", "long_context", "miss_func", "miss_param"))
    limit: int | None = _help("first LIMIT tasks (bfcl: per subset); None: all", None)
    k: int = _help("rollouts per task", 1)
    temperature: float = _help("sampling temperature (0: greedy)", 1.0)
    top_p: float = _help("nucleus sampling threshold", 1.0)
    backend: str = _help("hf (transformers) or vllm", "hf")
    dtype: str = _help("model dtype: auto, float32, bfloat16 or float16", "auto")
    device: str = _help("hf back end: torch device (auto: cuda when available, else cpu)", "auto")
    vllm_options: dict = _help("vllm back end: extra vllm.LLM arguments, e.g. {tensor_parallel_size: 2}",
                               factory=dict)
    rollout_options: dict = _help("any other field of the rollout engine's RolloutConfig, e.g. {schedule: "
                                  "lockstep, env_workers: 32, env_timeout_s: 60, chat_template_kwargs: {...}}",
                                  factory=dict)
    max_turns: int | None = _help("agent turns per rollout (default: math 8, qa 8, bfcl 40)", None)
    max_turn_tokens: int = _help("new tokens per turn", 1024)
    max_context_tokens: int = _help("prompt, actions and observations together", 16384)
    max_tool_calls: int | None = _help("math: python calls, qa: searches per rollout (default 8, 4)", None)
    topk: int = _help("qa: passages per search", 3)
    observation_role: str = _help("role of tool results: auto (tool if the template renders it), "
                                  "tool or user", "auto")
    enable_thinking: bool | None = _help("Qwen3 templates: thinking on or off (None: the template's "
                                         "default)", None)
    batch_size: int = _help("tasks per engine call", 32)
    seed: int = _help("sampling seed", 0)

    def __post_init__(self):
        if self.benchmark not in BENCHMARKS:
            raise ValueError(f"`benchmark` must be one of {list(BENCHMARKS)}, got {self.benchmark!r}")
        for name in ("model", "output_dir"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"`{name}` must be a non-empty string, got {getattr(self, name)!r}")
        for name in ("k", "max_turn_tokens", "max_context_tokens", "topk", "batch_size"):
            _positive(name, getattr(self, name))
        for name in ("limit", "max_turns", "max_tool_calls"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.backend not in ("hf", "vllm"):
            raise ValueError(f"`backend` must be 'hf' or 'vllm', got {self.backend!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"`dtype` must be one of {DTYPES}, got {self.dtype!r}")
        if self.observation_role not in ("auto", "tool", "user"):
            raise ValueError(f"`observation_role` must be auto, tool or user, got {self.observation_role!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"`seed` must be a non-negative integer, got {self.seed!r}")
        if not _DEVICE.fullmatch(str(self.device)):
            raise ValueError(f"`device` must be auto, cpu, cuda, cuda:N, mps or xpu, got {self.device!r}")
        Sampling(temperature=self.temperature, top_p=self.top_p)  # validates both
        if not isinstance(self.vllm_options, dict):
            raise ValueError(f"`vllm_options` must be a mapping, got {self.vllm_options!r}")
        _ = self.limits  # validates the episode limits
        self.rollout_config(pool_size=1, binary_rewards=True)  # validates rollout_options
        getattr(self, f"_check_{self.benchmark}")()

    def rollout_config(self, *, pool_size: int, binary_rewards: bool) -> RolloutConfig:
        """The engine config of one batch of ``pool_size`` tasks: k rollouts each (GRPO's flat groups, a
        group of 1 allowed), the sampling and limits above, and ``rollout_options`` for the rest."""
        if not isinstance(self.rollout_options, dict):
            raise ValueError(f"`rollout_options` must be a mapping, got {self.rollout_options!r}")
        fields = {f.name for f in dataclasses.fields(RolloutConfig)}
        unknown = sorted(set(self.rollout_options) - fields)
        if unknown:
            raise ValueError(f"`rollout_options`: {unknown[0]!r} is not a RolloutConfig field; fields: "
                             f"{', '.join(sorted(fields))}")
        owned = sorted(set(self.rollout_options) & _EVAL_OWNS)
        if owned:
            raise ValueError(f"`rollout_options`: {owned[0]!r} is set by trace-eval itself (use its own flags: "
                             "k, temperature, top_p, max_turns, max_turn_tokens, max_context_tokens, seed)")
        return RolloutConfig(policy="grpo", pool_size=pool_size, roots=self.k * pool_size,
                             continuations_per_root=0, group_size=self.k, min_group=1,
                             temperature=self.temperature, top_p=self.top_p, limits=self.limits,
                             binary_rewards=binary_rewards, seed=self.seed, **self.rollout_options)

    def _check_math(self):
        if not self.data:
            raise ValueError("benchmark math needs `data`: a JSONL/Parquet file or a Hub id with "
                             "problem/answer columns")
        self._no("corpus", "retriever_url")

    def _check_qa(self):
        if self.data is None:
            raise ValueError("benchmark qa needs `data`: a questions file, a Hub id, or 'demo'")
        if self.corpus is not None and self.retriever_url is not None:
            raise ValueError("give `corpus` or `retriever_url`, not both")
        if self.data != "demo" and self.corpus is None and self.retriever_url is None:
            raise ValueError("benchmark qa needs `corpus` (a JSONL file) or `retriever_url` unless data=demo")
        if self.corpus is not None and not Path(self.corpus).is_file():
            raise ValueError(f"the corpus {self.corpus!r} is not a file")

    def _check_bfcl(self):
        from .tools.bfcl import SUBSETS

        self._no("data", "corpus", "retriever_url", "max_tool_calls")
        if self.split not in BFCL_SPLITS:
            raise ValueError(f"bfcl `split` must be one of {BFCL_SPLITS}, got {self.split!r}")
        if not self.subsets or any(s not in SUBSETS for s in self.subsets):
            raise ValueError(f"`subsets` must be a non-empty list drawn from {SUBSETS}, got {self.subsets!r}")

    def _no(self, *names: str):
        for name in names:
            if getattr(self, name) is not None:
                raise ValueError(f"`{name}` does not apply to benchmark {self.benchmark}")

    @property
    def limits(self) -> EpisodeLimits:
        turns = self.max_turns or DEFAULT_TURNS[self.benchmark]
        return EpisodeLimits(max_turns=turns, max_turn_tokens=self.max_turn_tokens,
                             max_context_tokens=self.max_context_tokens)



def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}")


# ---------------------------------------------------------------------------------------------------
# Tasks, environment, back end
# ---------------------------------------------------------------------------------------------------


def load_tasks(config: EvalConfig) -> list[dict]:
    """The rows of the benchmark's tasks (each with a unique ``id``), in data set order."""
    try:
        rows = _load_rows(config)
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None
    if not rows:
        raise ValueError(f"no {config.benchmark} tasks were found in {config.data or config.subsets!r}")
    ids = [row["id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("task ids must be unique (resuming relies on them); give the data an id column")
    return rows


def _load_rows(config: EvalConfig) -> list[dict]:
    if config.benchmark == "math":
        from .data.math import load_math_problems
        from .envs.math_python import math_rows

        return math_rows(load_math_problems(config.data, split=config.split, subset=config.data_subset,
                                            limit=config.limit))
    if config.benchmark == "qa":
        from .data.qa import demo_paths, load_qa_examples
        from .envs.search_qa import qa_rows

        source = demo_paths()[1] if config.data == "demo" else config.data
        return qa_rows(load_qa_examples(source, split=config.split, subset=config.data_subset,
                                        limit=config.limit))
    from .envs.bfcl import bfcl_rows

    split = None if config.split == "all" else config.split
    return [row for subset in config.subsets for row in bfcl_rows([subset], split=split)[:config.limit]]


def _env_factory(config: EvalConfig, role: str) -> EnvFactory:
    options: dict[str, Any] = {"observation_role": role}
    if config.benchmark == "math":
        options["max_tool_calls"] = config.max_tool_calls or DEFAULT_TOOL_CALLS["math"]
    elif config.benchmark == "qa":
        from .data.qa import demo_paths

        corpus = config.corpus
        if corpus is None and config.retriever_url is None:
            corpus = str(demo_paths()[0])
        options.update(corpus=corpus, retriever_url=config.retriever_url, topk=config.topk,
                       max_searches=config.max_tool_calls or DEFAULT_TOOL_CALLS["qa"])
    return make_env_factory(BENCHMARKS[config.benchmark], options)


def _load_tokenizer(model: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load the tokenizer of model {model!r}: {error}") from None


def _check_prompts(rows: Sequence[dict], factory: EnvFactory, chat, limits: EpisodeLimits) -> None:
    """Every opening prompt must leave room to generate (else the engine would stop the whole run)."""
    lengths = [len(chat.prompt_ids(factory().reset(row))) for row in rows]
    too_long = [n for n in lengths if n >= limits.max_context_tokens]
    if too_long:
        raise ValueError(f"{len(too_long)} of {len(rows)} tasks have prompts of up to {max(too_long)} "
                         f"tokens, beyond `max_context_tokens` ({limits.max_context_tokens}): raise it")


def _load_backend(config: EvalConfig):
    if config.backend == "vllm":
        from .backends.vllm_backend import VLLMBackend

        return VLLMBackend(config.model, dtype=config.dtype, seed=config.seed,
                           max_model_len=config.max_context_tokens, **config.vllm_options)
    import torch

    from .backends.hf_backend import HFBackend

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "auto" if config.dtype == "auto" else getattr(torch, config.dtype)
    return HFBackend.from_pretrained(config.model, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------


def _task_records(batch, rows: Sequence[dict], factory: EnvFactory) -> list[dict]:
    """One record per row of an engine call: rewards, and per rollout its measures and transcript."""
    forest, nodes = batch.forest, batch.nodes
    leaves: dict[int, list[int]] = {}
    for leaf in forest.leaves.tolist():
        leaves.setdefault(int(forest.prompt[leaf]), []).append(leaf)
    records = []
    for prompt, row in enumerate(rows):
        samples = []
        for leaf in leaves[prompt]:
            path = forest.path_to_root(leaf)[::-1].tolist()
            env = factory()
            env.restore(nodes[leaf].snapshot)
            samples.append({
                "reward": float(forest.reward[leaf]), "metrics": env.metrics(), "turns": len(path) - 1,
                "end_reason": nodes[leaf].end_reason.value, "generated_tokens": int(forest.cost[path].sum()),
                "transcript": [m for n in path[1:] for m in nodes[n].messages],
            })
        extra = {"subset": row["subset"]} if "subset" in row else {}
        rewards = [s["reward"] for s in samples]
        records.append({"id": row["id"], **extra, "rewards": rewards, "samples": samples})
    return records


def summarize(benchmark: str, records: Sequence[dict], *, k: int) -> dict:
    """The benchmark's metrics (see the module table), the mean of every measure, turns and end reasons."""
    samples = [s for r in records for s in r["samples"]]
    means = {name: float(np.mean([s["metrics"][name] for s in samples])) for name in samples[0]["metrics"]}
    if benchmark == "math":
        metrics = {"accuracy": means["correct"]}
        if k > 1:
            metrics[f"pass@{k}"] = float(np.mean([max(s["metrics"]["correct"] for s in r["samples"])
                                                  for r in records]))
    elif benchmark == "qa":
        metrics = {name: means[name] for name in ("exact_match", "f1_match", "token_f1")}
    else:
        subsets = sorted({r["subset"] for r in records})
        metrics = {"accuracy": means["accuracy"], "per_subset": {
            s: float(np.mean([x["metrics"]["accuracy"] for r in records if r["subset"] == s
                              for x in r["samples"]])) for s in subsets}}
    end_reasons: dict[str, int] = {}
    for s in samples:
        end_reasons[s["end_reason"]] = end_reasons.get(s["end_reason"], 0) + 1
    return {"benchmark": benchmark, "tasks": len(records), "k": k, "samples": len(samples),
            "metrics": metrics, "means": means, "mean_turns": float(np.mean([s["turns"] for s in samples])),
            "mean_generated_tokens": float(np.mean([s["generated_tokens"] for s in samples])),
            "end_reasons": dict(sorted(end_reasons.items()))}


def _comparable(config: dict) -> dict:
    """A stored or current config with local paths made absolute (``x.jsonl`` equals ``/here/x.jsonl``)."""
    config = dict(config)
    for key in _PATHS:
        value = config.get(key)
        if isinstance(value, str) and Path(value).expanduser().exists():
            config[key] = str(Path(value).expanduser().resolve())
    return config


def _check_output(out: Path, config: EvalConfig) -> None:
    """Refuse a folder written with another config (``limit``, ``batch_size`` and the folder's spelling
    may change)."""
    stored = out / CONFIG
    if out.exists() and not out.is_dir():
        raise ValueError(f"`output_dir` {str(out)!r} is a file, not a folder")
    if not stored.exists():
        return
    try:
        previous = json.loads(stored.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{stored} cannot be read ({err}); choose another `output_dir` or remove it") from None
    previous, current = _comparable(previous), _comparable(config_to_dict(config))
    differs = sorted(key for key in set(previous) | set(current)
                     if key not in _RESUMABLE and previous.get(key) != current.get(key))
    if differs:
        raise ValueError(f"{out} holds results of another config (it differs in {', '.join(differs)}); "
                         "choose another `output_dir`")


def _read_results(path: Path) -> dict[str, dict]:
    """Records already written, by task id; a line cut off by an interruption is dropped from the file."""
    if not path.exists():
        return {}
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    if complete != text:
        path.write_text(complete)
    records = {}
    for number, line in enumerate(complete.splitlines(), start=1):
        try:
            record = json.loads(line)
            records[record["id"]] = record
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"{path}, line {number}: not a result record ({type(err).__name__}: {err}); "
                             "remove that line (or the file) and rerun to evaluate those tasks again") from None
    return records


# ---------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------


def _generate(config: EvalConfig, rows: list[dict], pending: list[dict], path: Path,
              done: dict[str, dict]) -> None:
    """Play the pending tasks in batches, appending their records to ``path`` (and ``done``)."""
    from tqdm.auto import tqdm

    tokenizer = _load_tokenizer(config.model)
    role = config.observation_role
    factory = _env_factory(config, observation_role_for(tokenizer) if role == "auto" else role)
    kwargs = dict(config.rollout_options.get("chat_template_kwargs") or {})
    if config.enable_thinking is not None:
        kwargs["enable_thinking"] = config.enable_thinking
    chat = chat_format(tokenizer, tools=factory.tools, template_kwargs=kwargs)
    _check_prompts(pending, factory, chat, config.limits)
    backend = _load_backend(config)  # the first expensive step: everything above has been checked
    position = {row["id"]: i for i, row in enumerate(rows)}
    bar = tqdm(total=len(rows), initial=len(rows) - len(pending), unit="task",
               desc=f"{config.benchmark} k={config.k}")
    with open(path, "a", encoding="utf-8") as results, bar:
        for first in range(0, len(pending), config.batch_size):
            chunk = pending[first:first + config.batch_size]
            rollouts = config.rollout_config(pool_size=len(chunk), binary_rewards=factory.binary_rewards)
            batch = RolloutEngine(backend, factory, rollouts, chat=chat).rollout(
                chunk, seed=config.seed * 1_000_003 + position[chunk[0]["id"]])
            for record in _task_records(batch, chunk, factory):
                results.write(json.dumps(record) + "\n")
                done[record["id"]] = record
            results.flush()
            bar.update(len(chunk))


def main(config: EvalConfig) -> dict:
    """Evaluate (resuming what ``config.output_dir`` already holds); returns and writes the summary."""
    start = time.perf_counter()
    if not isinstance(config, EvalConfig):
        raise ValueError(f"`config` must be an EvalConfig, got {type(config).__name__}")
    out = Path(config.output_dir)
    _check_output(out, config)
    rows = load_tasks(config)
    writable_dir(out, "`output_dir`")
    (out / CONFIG).write_text(json.dumps(config_to_dict(config), indent=2) + "\n")
    done = _read_results(out / RESULTS)
    pending = [row for row in rows if row["id"] not in done]
    if pending:
        _generate(config, rows, pending, out / RESULTS, done)
    summary = summarize(config.benchmark, [done[row["id"]] for row in rows], k=config.k)
    summary.update(model=config.model, evaluated_now=len(pending), runtime_s=time.perf_counter() - start)
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# ---------------------------------------------------------------------------------------------------
# Command line: flags are the fields of EvalConfig
# ---------------------------------------------------------------------------------------------------


def _parse_flag(hint: Any, raw: str, name: str = "") -> Any:
    """A flag's text as the field's type: strings stay text, tuples are comma lists, the rest is YAML
    read by trace-train's bounded loader (:func:`.config.safe_load`: alias bombs, huge integers and deep
    nesting are one ValueError naming the flag)."""
    if hint in (str, str | None):
        return None if hint is not str and raw in ("null", "None") else raw
    if hint == tuple[str, ...]:
        return [part.strip() for part in raw.split(",") if part.strip()]
    return safe_load(raw, f"--{name.replace('_', '-')}" if name else "a flag")


def cli(argv: Sequence[str] | None = None) -> int:
    """``trace-eval``: parse the flags into an :class:`EvalConfig` and run :func:`main`."""
    import typing

    parser = argparse.ArgumentParser(prog="trace-eval", description=__doc__.split("\n")[0].strip("`: "))
    hints = typing.get_type_hints(EvalConfig)
    for f in dataclasses.fields(EvalConfig):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = ""
        if not required:
            default = f" (default: {f.default_factory() if f.default is dataclasses.MISSING else f.default})"
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, required=required,
                            metavar=f.name.upper(), help=f.metadata["help"] + default)
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    args = vars(parser.parse_args(argv))
    print_config = args.pop("print_config")
    try:
        config = config_from_dict(EvalConfig, {k: _parse_flag(hints[k], v, k) for k, v in args.items()
                                               if v is not None})
        if print_config:
            print(json.dumps(config_to_dict(config), indent=2))
            return 0
        summary = main(config)
    except (ValueError, FileNotFoundError) as error:
        print(f"trace-eval: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(summary["metrics"], indent=2))
    print(f"results in {config.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
