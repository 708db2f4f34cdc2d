"""Success predictors measured online on real rollouts: Brier, ECE and AUC at roots and anchors, and fit cost.

    python -m trace_train.bench.predictor                      # collect 80 TRACE steps of cpu_demo's mixed games (~2 min), replay
    python -m trace_train.bench.predictor --kinds running_mean ngram_adam200 ngram ngram:steps_per_update=50 probe
    python -m trace_train.bench.predictor --task qa              # a tool task: the demo questions with BM25 search

**Collect** (once; cached in ``--out``/stream.pkl): the ``cpu_demo`` preset on ``--task``: the mixed-difficulty games
(``bench_policies``'s ``--task mixed``) with TRACE, recording what each step's predictor fit received
(every non-terminal node's history with its recursive target and weight) and each step's evaluation
data: the policy's last-layer states of every history, taken in the main thread before the step's update
(what ``predictor.kind=probe`` reads; their forward's seconds are the probe's state cost per step), the roots
with the rewards of the rollouts sampled at them (``root_outcomes``) and every prefix
anchor of a bare rollout with the reward its own rollout reached (``factual_leaf``), a Bernoulli draw of
the prefix's true value drawn before any allocation looked at it.

**Replay** every predictor kind on the same stream, online: at step t it predicts the roots (first, as
the engine does) and the anchors of step t *before* it learns step t's targets, then ``update`` and
``observe`` run and are timed (process CPU seconds, one thread). Scores are over rollouts: a root
predicted p with s successes out of m counts as m outcomes. Kinds are ``predictor.kind`` names, or
``NAME:field=value,...`` to override config fields (e.g. ``ngram:fit=adam`` is the dense Adam fit of
before this benchmark's change; ``ngram_adam200`` is a shorthand for it).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import time
from pathlib import Path

import numpy as np
from scipy.stats import rankdata

from trace_theory import brier_score, expected_calibration_error, node_targets, root_outcomes

from . import origin

MIXED_ROWS = "{low: 1, highs: [2, 6, 64], max_guesses: 3}"  # bench_policies.TASKS["mixed"]
TASKS = {
    "mixed": [f"task.rows={MIXED_ROWS}"],
    # A tool task: the 12 bundled two-hop questions with BM25 search over the demo corpus. The tiny model is
    # warmed on the scripted expert's episodes of these very questions (search each supporting title, then
    # answer), 200 steps: it then calls the tool in format and succeeds on ~1 in 4 episodes, unevenly across
    # questions, so that there is something to predict. Rewards: exact match.
    "qa": ["task.name=search_qa", "task.train=demo", "task.rows={}", "model.tiny_warm_steps=200",
           "rollout.pool_size=12", "rollout.limits={max_turns: 4, max_turn_tokens: 48, max_context_tokens: 2048}"],
}
SHORTHANDS = {"ngram_adam200": "ngram:fit=adam"}


def auc(pred, label) -> float:
    """Area under the ROC curve: P(pred of a success > pred of a failure), ties counted half (Mann-Whitney)."""
    pred, label = np.asarray(pred, float), np.asarray(label, bool)
    n1, n0 = int(label.sum()), int((~label).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    ranks = rankdata(pred)
    return float((ranks[label].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def collect(out: Path, steps: int, seed: int = 0, task: str = "mixed") -> list[dict]:
    """Run TRACE with the ``cpu_demo`` preset on ``TASKS[task]`` for ``steps`` steps, recording each step's
    predictor data."""
    from .. import train as train_module
    from ..config_loader import load_config
    from ..predictors.fitting import histories
    from ..predictors.hidden_states import PolicyStates
    from ..predictors.probe import state_key

    path = out / "stream.pkl"
    if path.exists():
        stream = pickle.loads(path.read_bytes())
        if len(stream) >= steps and all("states" in step for step in stream):
            return stream[:steps]
    stream: list[dict] = []
    original = train_module._start_fit

    def recording(run, batch):
        """Records the step's predictor data, and the policy's states of every history in it, in the main
        thread before the policy updates (what ``predictor.kind=probe`` would have read at that step)."""
        f = batch.forest
        nodes = np.flatnonzero(~f.is_leaf)
        values, weights = node_targets(f, run.cfg.algorithm.value_target)
        roots, m, s = root_outcomes(f)
        anchors = f.prefix_anchors()
        step = {
            "fit": (histories(batch, nodes), values[nodes], weights[nodes]),
            "roots": (histories(batch, roots), s, m - s),
            "anchors": (histories(batch, anchors), f.reward[f.factual_leaf[anchors]]),
        }
        seqs = {state_key(h.token_ids): list(h.token_ids) for part in ("fit", "roots", "anchors")
                for h in step[part][0]}
        t0 = time.perf_counter()
        states = PolicyStates(run.policy)(list(seqs.values())) if seqs else np.zeros((0, 0))
        step["state_seconds"] = time.perf_counter() - t0
        step["states"] = dict(zip(seqs, states))
        stream.append(step)
        return original(run, batch)

    cfg = load_config(train_module.TrainConfig, "cpu_demo", [
        f"run_dir={out / 'run'}", f"seed={seed}", f"steps={steps}", "rollout.policy=trace", "eval.every=0",
        "tensorboard=false", f"checkpoint_every={steps}", *TASKS[task]])
    train_module._start_fit = recording
    try:
        train_module.main(cfg)
    finally:
        train_module._start_fit = original
    out.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(stream))
    return stream


def parse_kind(spec: str):
    """``NAME`` or ``NAME:field=value,...`` -> a fresh predictor of that kind."""
    import yaml

    from ..predictors import PredictorConfig, build_predictor

    spec = SHORTHANDS.get(spec, spec)
    name, _, rest = spec.partition(":")
    fields = {"kind": name}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        fields[key] = yaml.safe_load(value)
    return build_predictor(PredictorConfig(**fields))


def replay(stream: list[dict], spec: str) -> dict:
    """One kind, online over the stream (module docstring); returns its scores and mean fit cost."""
    from ..predictors.probe import state_key

    predictor = parse_kind(spec)
    root_p, root_y, anchor_p, anchor_y, cpu, wall = [], [], [], [], [], []
    for step in stream:
        if predictor.needs_states:  # the states of the policy at this step
            predictor.attach(lambda seqs, table=step["states"]: np.stack([table[state_key(q)] for q in seqs]))
        hists, s, f = step["roots"]
        p = np.asarray(predictor(hists))
        root_p.append(np.repeat(np.concatenate([p, p]), np.concatenate([s, f]).astype(int)))
        root_y.append(np.repeat(np.r_[np.ones_like(p), np.zeros_like(p)], np.concatenate([s, f]).astype(int)))
        a_hists, a_y = step["anchors"]
        if len(a_hists):
            anchor_p.append(np.asarray(predictor(a_hists)))
            anchor_y.append(np.asarray(a_y, float))
        c0, w0 = time.process_time(), time.perf_counter()
        predictor.update(*step["fit"])
        predictor.observe(*step["roots"])
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    out = {"kind": spec, "steps": len(stream)}
    for where, ps, ys in (("roots", root_p, root_y), ("anchors", anchor_p, anchor_y)):
        p, y = np.concatenate(ps), np.concatenate(ys)
        out.update({f"{where}_n": int(p.size), f"{where}_brier": brier_score(p, y),
                    f"{where}_ece": expected_calibration_error(p, y), f"{where}_auc": auc(p, y),
                    f"{where}_constant_brier": float(y.var())})
    out["fit_cpu_s"] = float(np.mean(cpu[1:] if len(cpu) > 1 else cpu))
    out["state_s"] = float(np.mean([step["state_seconds"] for step in stream])) \
        if predictor.needs_states else 0.0
    out["fit_wall_s"] = float(np.mean(wall[1:] if len(wall) > 1 else wall))
    return out


def table(results: list[dict]) -> str:
    lines = ["| predictor kind | roots Brier | roots ECE | roots AUC | anchors Brier | anchors ECE | anchors AUC | "
             "fit CPU-s / step | states s / step |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['kind']} | {r['roots_brier']:.4f} | {r['roots_ece']:.4f} | {r['roots_auc']:.3f} | "
                     f"{r['anchors_brier']:.4f} | {r['anchors_ece']:.4f} | {r['anchors_auc']:.3f} | "
                     f"{r['fit_cpu_s']:.4f} | {r['state_s']:.4f} |")
    r = results[0]
    lines.append(f"| (constant: the outcomes' variance) | {r['roots_constant_brier']:.4f} | | 0.5 | "
                 f"{r['anchors_constant_brier']:.4f} | | 0.5 | | |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", choices=sorted(TASKS), default="mixed",
                        help="mixed: cpu_demo's mixed-difficulty games; qa: the demo questions with a search tool")
    parser.add_argument("--out", type=Path, default=None, help="default runs/bench_predictor (mixed), "
                        "runs/bench_predictor_qa (qa)")
    parser.add_argument("--kinds", nargs="+", default=["running_mean", "ngram", "probe"])
    args = parser.parse_args(argv)
    record = origin("trace_train.bench.predictor", argv)
    from ..run.threads import set_compute_threads

    set_compute_threads(1)
    out = args.out or Path("runs/bench_predictor" + ("" if args.task == "mixed" else f"_{args.task}"))
    stream = collect(out, args.steps, args.seed, args.task)
    print(f"stream: {len(stream)} steps, {sum(len(s['roots'][0]) for s in stream)} roots, "
          f"{sum(len(s['anchors'][0]) for s in stream)} anchors", flush=True)
    results = [replay(stream, kind) for kind in args.kinds]
    for r in results:
        print(json.dumps(r), flush=True)
    print(table(results))
    print(f"load average: {os.getloadavg()}")
    summary = {**record, "task": args.task, "steps": len(stream), "load_average": os.getloadavg(),
               "results": results}
    (out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"results: {out / 'results.json'}")
    return results


if __name__ == "__main__":
    main()
