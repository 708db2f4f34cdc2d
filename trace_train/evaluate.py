"""``trace-eval``: a model's score on any environment trace-train trains (math, QA, BFCL or your own).

Every task is played ``k`` times by the rollout engine (GRPO's uniform rule with groups of exactly k,
no branching) in its environment, on the chosen back end, and scored by the environment's metric.
``--benchmark`` (also spelled ``--task``) names the environment as ``trace-train``'s ``task.name`` does (a
registered name, an import path ``package.module:attribute`` or ``file.py:attribute``, or a
``trace_rl.environments`` entry point); ``math``, ``qa`` and ``bfcl`` stand for the registered environments
below. How an environment is evaluated (default turns, which flags apply, how its rows are read, its
metric) is the :class:`~.envs.spec.EvalSpec` in its task spec (``TaskSpec.evaluation``), declared next to it:

==============  ================  ====================================================================
benchmark       environment       reported (``summary.json``, ``metrics``)
==============  ================  ====================================================================
``math``        ``math_python``   ``accuracy`` (share of correct rollouts, mean@k), ``pass@k`` (k > 1: a
                                  task counts when any of its k rollouts is correct)
``qa``          ``search_qa``     ``exact_match``, ``f1_match`` (the paper's exact match at F1 >= 0.3),
                                  ``token_f1``: means over rollouts
``bfcl``        ``bfcl``          ``accuracy`` (the official checker), overall and per subset
any other       itself            ``mean_reward``, and ``pass@k`` (k > 1, 0/1 rewards); rows from ``--data``
==============  ================  ====================================================================

The output folder holds ``config.json`` (the resolved config), ``results.jsonl`` (one line per task:
id, rewards, and per rollout its metrics, turns, end reason, tokens and transcript) and
``summary.json``. A rerun skips the tasks already in ``results.jsonl``, so an interrupted evaluation
resumes; a folder written with another config (apart from ``limit`` and ``batch_size``) is refused.
A bad config fails with one ``ValueError`` before any model is loaded. ``trace-eval --help`` lists every
field of :class:`EvalConfig` with the docstring under it (``trace_train.config_loader.field_docs``).

Examples::

    trace-eval --model Qwen/Qwen3-8B --benchmark math --data HuggingFaceH4/MATH-500 --k 4 \\
        --backend vllm --output-dir results/eval/math500
    trace-eval --model Qwen/Qwen3-8B --benchmark qa --data demo --output-dir results/eval/demo-qa
    trace-eval --model Qwen/Qwen3-8B --benchmark bfcl --subsets base,miss_func --split test \\
        --backend vllm --output-dir results/eval/bfcl
    trace-eval --model runs/parity_game/hf --task examples/parity_game/parity_env.py:ParityEnv \\
        --data examples/parity_game/rows.jsonl --output-dir results/eval/parity
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .backends import BACKENDS, evaluation_backend
from .backends.base import Sampling
from .chat import ChatFormat
from .config_loader import config_from_dict, config_to_dict, field_docs, safe_load
from .configs import RolloutConfig
from .rollout.engine import RolloutEngine
from .envs.base import EndReason, EpisodeLimits
from .envs.registry import EnvFactory
from .envs.spec import EnvironmentSource, build_factory, find_environment
from .envs.tooling import observation_role_for
from .preflight import check_device, check_model
from .run.files import open_no_follow, write_file, writable_dir
from .tools import bounded_json

__all__ = ["EvalConfig", "main", "load_tasks", "summarize", "cli"]

BENCHMARKS = {"math": "math_python", "qa": "search_qa", "bfcl": "bfcl"}
"""Short names of the registered environments' benchmarks."""
DTYPES = ("auto", "float32", "bfloat16", "float16")
RESULTS, SUMMARY, CONFIG = "results.jsonl", "summary.json", "config.json"
_RESUMABLE = ("limit", "batch_size", "output_dir")  # may change between runs into one folder
_PATHS = ("model", "data", "corpus")  # compared as resolved paths when they name local files
_ENV_FLAGS = ("data", "corpus", "retriever_url", "max_tool_calls")  # apply per environment (EvalSpec.flags)
_GENERATED_ROWS = 64  # rows of a generating environment (guess_number) without --limit
_DEVICE = re.compile(r"auto|cpu|mps|(cuda|xpu)(:\d+)?")


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate and how; every field is a ``--flag`` of ``trace-eval`` (its help: the docstring)."""

    model: str
    """Hugging Face model id or local directory (weights, config, tokenizer)."""
    benchmark: str
    """math, qa, bfcl, or any environment trace-train trains: a registered name, an import path
    package.module:attribute (or file.py:attribute), or an entry point (also ``--task``)."""
    output_dir: str
    """Folder for config.json, results.jsonl and summary.json."""
    data: str | None = None
    """The tasks: a JSONL/Parquet file or Hub id (math: problem/answer; qa: questions, or 'demo', the bundled
    demo set; another environment: rows passed to its reset); bfcl: unused."""
    corpus: str | None = None
    """qa: JSONL corpus for BM25 (default with data=demo: the demo corpus)."""
    retriever_url: str | None = None
    """qa: a Search-R1 retrieval server (.../retrieve) instead of BM25."""
    split: str = "test"
    """Hub split of ``data``; bfcl: train, test (the stored 80/20 split) or all."""
    data_subset: str | None = None
    """Hub configuration name (e.g. distractor for HotpotQA)."""
    subsets: tuple[str, ...] = ("base", "long_context", "miss_func", "miss_param")
    """bfcl subsets, comma-separated."""
    limit: int | None = None
    """First LIMIT tasks (bfcl: per subset); None: all (a generating environment: 64)."""
    k: int = 1
    """Rollouts per task."""
    temperature: float = 1.0
    """Sampling temperature (0: greedy)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    backend: str = "hf"
    """hf (transformers) or vllm (``trace_train.backends.BACKENDS``)."""
    dtype: str = "auto"
    """Model dtype: auto, float32, bfloat16 or float16."""
    device: str = "auto"
    """hf back end: torch device (auto: cuda when available, else cpu)."""
    vllm_options: dict = field(default_factory=dict)
    """vllm back end: extra vllm.LLM arguments, e.g. {tensor_parallel_size: 2}."""
    rollout_options: dict = field(default_factory=dict)
    """Any other field of the rollout engine's RolloutConfig, e.g. {schedule: lockstep, env_workers: 32,
    env_timeout_s: 60, chat_template_kwargs: {...}}."""
    env_options: dict = field(default_factory=dict)
    """Options of the environment (trace-train's ``task.env``), over those the flags above set."""
    max_turns: int | None = None
    """Agent turns per rollout (default: the environment's; math 8, qa 8, bfcl 40)."""
    max_turn_tokens: int = 1024
    """New tokens per turn."""
    max_context_tokens: int = 16384
    """Prompt, actions and observations together."""
    max_tool_calls: int | None = None
    """math: python calls, qa: searches per rollout (default 8, 4)."""
    topk: int = 3
    """qa: passages per search."""
    observation_role: str = "auto"
    """Role of tool results: auto (tool if the template renders it), tool or user."""
    enable_thinking: bool | None = None
    """Qwen3 templates: thinking on or off (None: the template's default)."""
    batch_size: int = 32
    """Tasks per engine call."""
    seed: int = 0
    """Sampling seed."""

    def __post_init__(self):
        source = self.environment  # an unknown benchmark fails first
        for name in ("model", "output_dir"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"`{name}` must be a non-empty string, got {getattr(self, name)!r}")
        for name in ("k", "max_turn_tokens", "max_context_tokens", "topk", "batch_size"):
            _positive(name, getattr(self, name))
        for name in ("limit", "max_turns", "max_tool_calls"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.backend not in BACKENDS:
            raise ValueError(f"`backend` must be {' or '.join(map(repr, BACKENDS.names()))}, got {self.backend!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"`dtype` must be one of {DTYPES}, got {self.dtype!r}")
        if self.observation_role not in ("auto", "tool", "user"):
            raise ValueError(f"`observation_role` must be auto, tool or user, got {self.observation_role!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"`seed` must be a non-negative integer, got {self.seed!r}")
        if not _DEVICE.fullmatch(str(self.device)):
            raise ValueError(f"`device` must be auto, cpu, cuda, cuda:N, mps or xpu, got {self.device!r}")
        Sampling(temperature=self.temperature, top_p=self.top_p)  # validates both
        for name in ("vllm_options", "env_options"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"`{name}` must be a mapping, got {getattr(self, name)!r}")
        _ = self.limits  # validates the episode limits
        self.rollout_config(pool_size=1, binary_rewards=True)  # validates rollout_options
        evaluation = source.spec.evaluation
        if "data" in evaluation.flags and source.spec.data == "required" and not self.data:
            raise ValueError(f"benchmark {self.benchmark} needs `data`: {evaluation.data_help}")
        for name in _ENV_FLAGS:
            if name not in evaluation.flags and getattr(self, name) is not None:
                raise ValueError(f"`{name}` does not apply to benchmark {self.benchmark}")
        if evaluation.check is not None:
            evaluation.check(self)

    @property
    def environment(self) -> EnvironmentSource:
        """The environment ``benchmark`` names (``trace_train.envs.spec.find_environment``)."""
        name = BENCHMARKS.get(self.benchmark, self.benchmark)
        try:
            return find_environment(name)
        except ValueError as err:
            if isinstance(name, str) and ":" in name:
                raise
            raise ValueError(f"`benchmark` must be one of {list(BENCHMARKS)} or an environment trace-train "
                             f"trains ({err})") from None

    def _engine_fields(self, *, pool_size: int, binary_rewards: bool) -> dict[str, Any]:
        """The RolloutConfig fields trace-eval sets itself: k rollouts per task in GRPO's flat groups (a group
        of 1 allowed), no token budget, no expansion, and the sampling, limits and seed above."""
        return dict(policy="grpo", pool_size=pool_size, roots=self.k * pool_size, continuations_per_root=0,
                    token_budget=None, group_size=self.k, min_group=1, dapo_target=None, expansion_rounds=1,
                    temperature=self.temperature, top_p=self.top_p, limits=self.limits,
                    binary_rewards=binary_rewards, seed=self.seed)

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
        owned = self._engine_fields(pool_size=pool_size, binary_rewards=binary_rewards)
        taken = sorted(set(self.rollout_options) & set(owned))
        if taken:
            raise ValueError(f"`rollout_options`: {taken[0]!r} is set by trace-eval itself (use its own flags: "
                             "k, temperature, top_p, max_turns, max_turn_tokens, max_context_tokens, seed)")
        return RolloutConfig(**owned, **self.rollout_options)

    @property
    def limits(self) -> EpisodeLimits:
        turns = self.max_turns or self.environment.spec.evaluation.max_turns
        return EpisodeLimits(max_turns=turns, max_turn_tokens=self.max_turn_tokens,
                             max_context_tokens=self.max_context_tokens)


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}")


# ---------------------------------------------------------------------------------------------------
# Tasks, environment, back end
# ---------------------------------------------------------------------------------------------------


def load_tasks(config: EvalConfig) -> list[dict]:
    """The rows of the benchmark's tasks (each with a unique ``id``; rows without ids are numbered), in
    data set order."""
    try:
        rows = _load_rows(config)
    except FileNotFoundError as error:
        raise ValueError(str(error)) from None
    if not rows:
        raise ValueError(f"no {config.benchmark} tasks were found in {config.data or config.subsets!r}")
    if not any("id" in row for row in rows):
        rows = [{"id": str(i), **row} for i, row in enumerate(rows)]
    ids = [row.get("id") for row in rows]
    if None in ids or len(set(ids)) != len(ids):
        raise ValueError("task ids must be unique (resuming relies on them); give the data an id column")
    return rows


def _load_rows(config: EvalConfig) -> list[dict]:
    """The environment's own ``EvalSpec.rows``, else its task spec's ``rows`` on ``--data`` (as
    ``trace_train.tasks.load_rows`` reads held-out rows)."""
    spec = config.environment.spec
    if spec.evaluation.rows is not None:
        return spec.evaluation.rows(config)
    from .envs.spec import read_rows

    source = config.data or spec.default_sources[1]
    kwargs = dict(split=config.split, subset=config.data_subset, seed=config.seed)
    if spec.data == "generated":
        if source is not None:  # stored rows instead of generated ones
            return read_rows(source, size=config.limit, **kwargs)
        # the rows trace-train holds out with seed --seed: held-out prompts, never trained on (trace_train.tasks)
        from .tasks import _HELD_OUT_SEED, generated_rows, prompt_keys

        from_env = {name: config.env_options[name] for name in spec.env_row_options if name in config.env_options}
        make = lambda n: spec.rows(None, size=n, **{**kwargs, "seed": config.seed + _HELD_OUT_SEED},  # noqa: E731
                                   **{**spec.row_options, **from_env})
        factory = _env_factory(config, "user")
        return generated_rows(make, config.limit or _GENERATED_ROWS,
                              lambda rows: prompt_keys(factory, rows, spec.prompt_key), held_out=True,
                              what=f"benchmark {config.benchmark!r}")
    return spec.rows(source, size=config.limit, **kwargs, **spec.row_options)


def _env_factory(config: EvalConfig, role: str) -> EnvFactory:
    """The environment with the options its flags set, ``observation_role`` (where it takes one) and
    ``env_options`` over them."""
    source = config.environment
    evaluation = source.spec.evaluation
    options: dict[str, Any] = {}
    known = source.options()
    if known is None or "observation_role" in known:
        options["observation_role"] = role
    if evaluation.env_options is not None:
        options.update(evaluation.env_options(config))
    options.update(config.env_options)
    if source.spec.env_defaults is not None:
        options = source.spec.env_defaults(options)
    return build_factory(source, options)


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
    """The back end, from the registry ``trace-train`` builds its back ends from too (its entry maps this
    config onto the back end's options)."""
    return evaluation_backend(config)


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
            path = batch.path(leaf)
            sample = {
                "reward": float(forest.reward[leaf]), "metrics": {}, "turns": len(path) - 1,
                "end_reason": nodes[leaf].end_reason.value, "generated_tokens": int(forest.cost[path].sum()),
                "transcript": [m for n in path[1:] for m in nodes[n].messages],
            }
            if nodes[leaf].end_reason in _FAILED:  # no state to restore: a failure, scored 0 on every measure
                sample["env_failure"] = nodes[leaf].observation
            else:
                env = factory()
                env.restore(nodes[leaf].snapshot)
                sample["metrics"] = env.metrics() if hasattr(env, "metrics") else {}
            samples.append(sample)
        extra = {"subset": row["subset"]} if "subset" in row else {}
        rewards = [s["reward"] for s in samples]
        records.append({"id": row["id"], **extra, "rewards": rewards, "samples": samples})
    return records


_FAILED = (EndReason.ENV_ERROR, EndReason.ENV_TIMEOUT)
"""End reasons of rollouts whose environment failed: recorded with ``env_failure`` and no measures."""


class _ZeroIfMissing(dict):
    """Measures of a rollout: one its environment never reported (it failed) reads as 0."""

    def __missing__(self, key):
        return 0.0


def summarize(benchmark: str, records: Sequence[dict], *, k: int) -> dict:
    """The environment's metrics (``EvalSpec.metrics``; see the module table), the mean of every measure,
    turns and end reasons. A rollout whose environment failed (``env_failure``) counts as a failure: 0 on
    every measure."""
    records = [{**r, "samples": [{**s, "metrics": _ZeroIfMissing(s["metrics"])} for s in r["samples"]]}
               for r in records]
    samples = [s for r in records for s in r["samples"]]
    names = sorted({name for s in samples for name in s["metrics"]})
    means = _ZeroIfMissing({name: float(np.mean([s["metrics"][name] for s in samples])) for name in names})
    evaluation = find_environment(BENCHMARKS.get(benchmark, benchmark)).spec.evaluation
    metrics = evaluation.metrics(list(records), means, k=k)
    end_reasons: dict[str, int] = {}
    for s in samples:
        end_reasons[s["end_reason"]] = end_reasons.get(s["end_reason"], 0) + 1
    return {"benchmark": benchmark, "tasks": len(records), "k": k, "samples": len(samples),
            "metrics": metrics, "means": means, "mean_turns": float(np.mean([s["turns"] for s in samples])),
            "mean_generated_tokens": float(np.mean([s["generated_tokens"] for s in samples])),
            "end_reasons": dict(sorted(end_reasons.items())),
            "env_failures": sum(1 for s in samples if "env_failure" in s)}


def _comparable(config: dict) -> dict:
    """A stored or current config over the defaults (a field added since reads as its default) with local
    paths made absolute (``x.jsonl`` equals ``/here/x.jsonl``)."""
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(EvalConfig)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    config = json.loads(json.dumps({**defaults, **config}))
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
        previous = bounded_json.loads(stored.read_bytes())
        if not isinstance(previous, dict):
            raise ValueError("not a JSON object")
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
    text = path.read_text(errors="replace")
    complete = text[: text.rfind("\n") + 1]
    if complete != text:
        write_file(path, complete)  # replaces the file (a planted link included), never writes through it
    records = {}
    for number, line in enumerate(complete.splitlines(), start=1):
        try:
            record = bounded_json.loads(line, max_depth=64)
            if not (isinstance(record.get("samples"), list) and all(
                    isinstance(x, dict) and isinstance(x.get("metrics"), dict) for x in record["samples"])):
                raise ValueError("no list of samples with their metrics")
            records[record["id"]] = record
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise ValueError(f"{path}, line {number}: not a result record ({type(err).__name__}: {err}); "
                             "remove that line (or the file) and rerun to evaluate those tasks again") from None
    return records


# ---------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------


def _generate(config: EvalConfig, rows: list[dict], pending: list[dict], path: Path,
              done: dict[str, dict]) -> str | None:
    """Play the pending tasks in batches, appending their records to ``path`` (and ``done``); returns the
    traceback of the first environment failure, if any."""
    from tqdm.auto import tqdm

    check_device(config.device, "--device")  # one line each, before the model loads
    check_model(config.model, "--model")
    tokenizer = _load_tokenizer(config.model)
    role = config.observation_role
    factory = _env_factory(config, observation_role_for(tokenizer) if role == "auto" else role)
    kwargs = dict(config.rollout_options.get("chat_template_kwargs") or {})
    if config.enable_thinking is not None:
        kwargs["enable_thinking"] = config.enable_thinking
    chat = ChatFormat(tokenizer, tools=factory.tools, template_kwargs=kwargs)
    _check_prompts(pending, factory, chat, config.limits)
    backend = _load_backend(config)  # the first expensive step: everything above has been checked
    position = {row["id"]: i for i, row in enumerate(rows)}
    from .run.console import is_terminal

    bar = tqdm(total=len(rows), initial=len(rows) - len(pending), unit="task",
               desc=f"{config.benchmark} k={config.k}", disable=not is_terminal())  # plain output in a log file
    first_error = None
    fd = open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # a planted link: one line
    with os.fdopen(fd, "a", encoding="utf-8") as results, bar:
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
            first_error = first_error or batch.report.env_error_sample
    return first_error


def main(config: EvalConfig) -> dict:
    """Evaluate (resuming what ``config.output_dir`` already holds); returns and writes the summary."""
    start = time.perf_counter()
    if not isinstance(config, EvalConfig):
        raise ValueError(f"`config` must be an EvalConfig, got {type(config).__name__}")
    out = Path(config.output_dir)
    _check_output(out, config)
    rows = load_tasks(config)
    writable_dir(out, "`output_dir`")
    write_file(out / CONFIG, json.dumps(config_to_dict(config), indent=2) + "\n")
    done = _read_results(out / RESULTS)
    pending = [row for row in rows if row["id"] not in done]
    error = _generate(config, rows, pending, out / RESULTS, done) if pending else None
    summary = summarize(config.benchmark, [done[row["id"]] for row in rows], k=config.k)
    summary.update(model=config.model, evaluated_now=len(pending), runtime_s=time.perf_counter() - start)
    if error:
        lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
        summary["env_error_sample"] = lines[-1] if lines else error
    write_file(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    return summary


# ---------------------------------------------------------------------------------------------------
# Command line: flags are the fields of EvalConfig
# ---------------------------------------------------------------------------------------------------


def _parse_flag(hint: Any, raw: str, flag: str = "flag") -> Any:
    """A flag's text as the field's type: strings stay text, tuples are comma lists, the rest is YAML (read
    by the config loader's bounded reader)."""
    if hint in (str, str | None):
        return None if hint is not str and raw in ("null", "None") else raw
    if hint == tuple[str, ...]:
        return [part.strip() for part in raw.split(",") if part.strip()]
    return safe_load(raw, f"--{flag}")


def cli(argv: Sequence[str] | None = None) -> int:
    """``trace-eval``: parse the flags into an :class:`EvalConfig` and run :func:`main`."""
    import typing

    parser = argparse.ArgumentParser(prog="trace-eval", description=__doc__.split("\n")[0].replace("``", ""))
    hints = typing.get_type_hints(EvalConfig)
    docs = field_docs(EvalConfig)
    for f in dataclasses.fields(EvalConfig):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = ""
        if not required:
            default = f" (default: {f.default_factory() if f.default is dataclasses.MISSING else f.default})"
        flags = ["--" + f.name.replace("_", "-")] + (["--task"] if f.name == "benchmark" else [])
        parser.add_argument(*flags, dest=f.name, required=required, metavar=f.name.upper(),
                            help=docs[f.name] + default)
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    args = vars(parser.parse_args(argv))
    from .run.console import quiet_libraries

    quiet_libraries()  # transformers' and vLLM's logging at warnings (TRANSFORMERS_VERBOSITY etc. override)
    print_config = args.pop("print_config")
    try:
        config = config_from_dict(EvalConfig, {k: _parse_flag(hints[k], v, k.replace("_", "-"))
                                               for k, v in args.items() if v is not None})
        if print_config:
            print(json.dumps(config_to_dict(config), indent=2))
            return 0
        summary = main(config)
    except (ValueError, FileNotFoundError) as error:
        print(f"trace-eval: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(summary["metrics"], indent=2))
    print(f"results in {config.output_dir}")
    return _report_env_failures(summary, config.output_dir)


def _report_env_failures(summary: dict, output_dir: str) -> int:
    """Warn above the trainer's ``env_failure_warn_share``; above its ``max_env_failure_share`` (the share at
    which trace-train stops a run) exit 1: the score then says more about the environment than the model."""
    from .configs import TrainConfig

    reasons = summary.get("end_reasons", {})
    failed = reasons.get("env_error", 0) + reasons.get("env_timeout", 0)
    share = failed / max(summary.get("samples", 0), 1)
    limits = TrainConfig()
    if share <= limits.env_failure_warn_share:
        return 0
    text = (f"{failed} of {summary['samples']} rollouts ({share:.0%}) ended in an environment failure "
            f"({', '.join(f'{k} {v}' for k, v in reasons.items() if k in ('env_error', 'env_timeout') and v)}): "
            f"{summary.get('env_error_sample', 'see results.jsonl')}; end reasons in {output_dir}/{SUMMARY}")
    if share > limits.max_env_failure_share:
        print(f"trace-eval: error: {text} (more than trace-train's max_env_failure_share="
              f"{limits.max_env_failure_share}: the score is not the model's)", file=sys.stderr)
        return 1
    print(f"trace-eval: warning: {text}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
