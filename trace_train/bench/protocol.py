"""The pre-registered protocol of ``trace_train.bench.policies``: what is compared, on which seeds, at which
level, decided and written down before the runs; and the statistics that read the runs back.

    python -m trace_train.bench.protocol --pilot runs/pilot/mixed --effect 0.02   # paired seeds needed

* **Registration.** ``protocol.json`` in ``OUT/TASK/`` (:func:`register`) holds the task, the arms, the
  primary and secondary comparisons, alpha, the correction, the tuning and report seeds, the learning-rate
  grid, steps, token budget and evaluation size. It is written before any run; a later invocation whose
  protocol differs stops with one line naming the field, so two experiments never mix in one folder.
* **Fresh report seeds** (:func:`fresh_seeds`): ``--seeds fresh:N`` draws N seeds from a hash of the
  experiment (task, arms, ``--experiment`` name) in ``FRESH_SEEDS``, a range disjoint from the seeds
  0-199 of every earlier committed run and from the tuning seeds.
* **Seeds from a pilot** (:func:`seeds_needed`): the smallest N whose two-sided paired t-test at ``alpha``
  detects a mean difference ``effect`` with probability ``power``, the pilot's standard deviation of the
  paired differences standing for the truth; never fewer than ``MIN_SEEDS``.
* **Multiplicity** (:func:`holm`): the primary comparison (default TRACE minus GRPO in held-out gain at
  equal generated tokens) is tested unadjusted at ``alpha``; every other comparison of the report (the
  reference against each other arm, each TRACE variant against each other arm, and every pair at equal
  training time, the second reading) carries a Holm-adjusted p-value.
* **Evidence** (:func:`per_seed_rows`, :func:`compare`, :func:`verdict`): every run of the experiment as a
  row (seed, arm, rate, stage and each metric), from which :func:`compare` recomputes every comparison and
  :func:`verdict` the one-sentence conclusion; ``trace_train.bench.pool`` pools experiments from these rows.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
from pathlib import Path

import numpy as np
from scipy import stats

PROTOCOL_FILE = "protocol.json"
FRESH_SEEDS = (1_000_000, 2_000_000)
"""The range fresh report seeds are drawn from: clear of the seeds 0-199 that every run committed before the
protocol used, and of the small seeds people type."""
USED_BEFORE = range(0, 200)
MIN_SEEDS = 24
PILOT_SEEDS = 8
"""Below this many pilot seeds the power analysis says its spread is a rough estimate."""
ALPHA = 0.05
READINGS = {"gain": "at equal tokens", "gain_at_equal_time": "at equal training time"}
REGISTRATION = ("registered_at", "finished_runs_at_registration")
"""Fields of ``protocol.json`` about the registration itself, not the protocol: never compared."""
POOLABLE = ("experiment", "seeds", "seed_source", "tuning_seeds")
"""Protocol fields that may differ between experiments pooled by ``trace_train.bench.pool``."""
METRICS = ("success_start", "success_end", "gain", "gain_at_equal_time", "effective_ratio",
           "mixed_prompts_per_1k_rollouts", "mixed_prompts_per_1k_tokens", "contrast_pairs_per_1k_rollouts",
           "generated_tokens", "train_seconds", "mixed_prompts_per_second", "contrast_pairs_per_second")
"""The metrics of a per-seed row (``per_seed_rows``)."""


class ProtocolError(ValueError):
    """An invocation, or a set of files, that does not match its registered protocol."""


# ---------------------------------------------------------------------------------------------- seeds
def fresh_seeds(n: int, *, task: str, arms, experiment: str = "", avoid=()) -> list[int]:
    """``n`` distinct report seeds drawn from ``FRESH_SEEDS`` by a generator seeded with the SHA-256 of the
    experiment (``task``, the sorted ``arms``, ``experiment``), skipping ``avoid`` (the tuning seeds) and
    the seeds 0-199 used before: the same experiment draws the same seeds, another draws others."""
    if n < 1:
        raise ValueError(f"`n` must be at least 1, got {n}")
    key = json.dumps({"task": task, "arms": sorted(arms), "experiment": experiment}, sort_keys=True)
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))
    banned = set(avoid) | set(USED_BEFORE)
    seeds: list[int] = []
    while len(seeds) < n:
        seed = int(rng.integers(*FRESH_SEEDS))
        if seed not in banned and seed not in seeds:
            seeds.append(seed)
    return sorted(seeds)


def seed_spec(text: str) -> int | str:
    """One ``--seeds`` word: a seed, or ``fresh:N``."""
    if text.startswith("fresh:"):
        count = text.partition(":")[2]
        if not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"expected fresh:N with N >= 1, got {text!r}")
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a seed or fresh:N, got {text!r}") from None


# ----------------------------------------------------------------------------------------- statistics
def seeds_needed(pilot_differences, effect: float, alpha: float = ALPHA, power: float = 0.8,
                 minimum: int = MIN_SEEDS) -> int:
    """Paired seeds for a two-sided paired t-test at ``alpha`` to detect a mean difference ``effect`` with
    probability ``power``, the pilot's differences giving the standard deviation s.

    Power at n pairs: with d = |effect| / s, df = n - 1, c = t_{1 - alpha/2, df} and the noncentral t
    with noncentrality d sqrt(n), P(T > c) + P(T < -c); the smallest n >= 2 with power at least
    ``power``, then at least ``minimum``.
    """
    diffs = np.asarray(pilot_differences, dtype=float)
    if diffs.size < 2 or not np.all(np.isfinite(diffs)):
        raise ValueError(f"`pilot_differences` needs at least two finite values, got {diffs.tolist()}")
    if not effect or not np.isfinite(effect):
        raise ValueError(f"`effect` must be a nonzero finite difference, got {effect}")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"`alpha` and `power` must lie in (0, 1), got {alpha} and {power}")
    sd = float(diffs.std(ddof=1))
    if sd == 0:
        return max(2, minimum)
    d = abs(effect) / sd
    n = 2
    while _paired_power(n, d, alpha) < power:
        n += 1
        if n > 1_000_000:
            raise ValueError(f"more than a million seeds: effect {effect} against a spread of {sd:.3g}")
    return max(n, minimum)


def _paired_power(n: int, d: float, alpha: float) -> float:
    df, nc = n - 1, d * math.sqrt(n)
    c = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(c, df, nc) + stats.nct.cdf(-c, df, nc))


def holm(p_values: dict) -> dict:
    """Holm's step-down adjustment: sorted ascending, the i-th of m (from 0) becomes
    max over j <= i of min(1, (m - j) p_(j)); nan stays nan and does not count in m."""
    finite = sorted((p, k) for k, p in p_values.items() if np.isfinite(p))
    m, running, out = len(finite), 0.0, {k: float("nan") for k in p_values}
    for i, (p, key) in enumerate(finite):
        running = max(running, min(1.0, (m - i) * p))
        out[key] = running
    return out


def paired_difference(reference: dict, other: dict) -> dict | None:
    """``reference`` minus ``other`` ({seed: value}), paired over their shared seeds: mean, standard error,
    95% CI (Student t), paired t-test p-value, seeds; None under two shared seeds."""
    seeds = sorted(s for s in reference if s in other and np.isfinite(reference[s]) and np.isfinite(other[s]))
    if len(seeds) < 2:
        return None
    a, b = np.array([reference[s] for s in seeds]), np.array([other[s] for s in seeds])
    diff = a - b
    se = float(diff.std(ddof=1) / np.sqrt(diff.size))
    half = float(stats.t.ppf(0.975, diff.size - 1) * se)
    mean = float(diff.mean())
    p = float(stats.ttest_rel(a, b).pvalue) if se > 0 else (1.0 if mean == 0 else 0.0)
    return {"mean": mean, "stderr": se, "ci95": [mean - half, mean + half], "p_value": p, "seeds": len(seeds)}


# ----------------------------------------------------------------------------------------- protocol
def comparison_plan(arms, reference: str = "trace", against: str = "grpo",
                    variants=()) -> tuple[dict, list[dict]]:
    """The primary comparison (``reference`` minus ``against`` in gain at equal tokens) and the
    secondaries: ``reference`` minus every other arm, then each variant minus every arm it is not already
    compared with, each at equal tokens and then at equal training time, the primary's second reading
    included."""
    primary = {"reference": reference, "against": against, "metric": "gain"}
    pairs = [(reference, a) for a in arms if a != reference]
    for v in variants:
        pairs += [(v, a) for a in arms if a != v and (v, a) not in pairs and (a, v) not in pairs]
    secondary = [{"reference": r, "against": a, "metric": metric} for metric in READINGS for r, a in pairs
                 if (r, a, metric) != (reference, against, "gain")]
    return primary, secondary


def make_protocol(*, task: str, arms, primary: dict, secondary: list[dict], tuning_seeds, seeds,
                  seed_source: str, experiment: str, lrs, shared_lr, rates_given: dict, steps: int,
                  token_budget: int, eval_every: int, eval_prompts: int, eval_samples: int,
                  alpha: float = ALPHA) -> dict:
    """The protocol as a plain dict (``protocol.json``; the evidence's ``protocol``)."""
    return {"task": task, "arms": list(arms), "primary": primary, "secondary": secondary, "alpha": alpha,
            "correction": "holm", "experiment": experiment, "seed_source": seed_source,
            "tuning_seeds": list(tuning_seeds), "seeds": list(seeds), "lrs": list(lrs), "shared_lr": shared_lr,
            "rates_given": dict(rates_given), "steps": steps, "token_budget": token_budget,
            "eval_every": eval_every, "eval_prompts": eval_prompts, "eval_samples": eval_samples}


def first_difference(registered: dict, protocol: dict, skip=()) -> str | None:
    """The first field (in ``protocol``'s order) whose value differs between the two, else None."""
    skip = set(skip) | set(REGISTRATION)
    for key in [*protocol, *(k for k in registered if k not in protocol)]:
        if key not in skip and registered.get(key) != protocol.get(key):
            return key
    return None


def brief(value, limit: int = 120) -> str:
    """``value`` as JSON, cut to ``limit`` characters (one line, even for the list of secondaries)."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def register(folder: Path, protocol: dict) -> Path:
    """Write ``protocol.json`` into ``folder`` unless there is one; refuse (``ProtocolError``, one line
    naming the field) when the one there differs. Records when it was written and how many runs in the
    folder had already finished (0 for a protocol written before its runs)."""
    path = Path(folder) / PROTOCOL_FILE
    if path.exists():
        registered = json.loads(path.read_text())
        key = first_difference(registered, protocol)
        if key is not None:
            raise ProtocolError(
                f"{path} registers {key} = {brief(registered.get(key))}, this invocation has "
                f"{brief(protocol.get(key))}: use another --out (or --experiment) for another experiment")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**protocol, "registered_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "finished_runs_at_registration": len(list(path.parent.glob("*/result.json")))}
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(path)
    return path


# ------------------------------------------------------------------------------------------ evidence
def per_seed_rows(results: list[dict], stage: str) -> list[dict]:
    """One row per run: ``seed``, ``arm``, ``lr``, ``stage`` (``tuning``, ``report`` or ``shared``: the
    report seeds at the shared rate) and ``METRICS``. Per second of training time (``train_seconds``:
    generation, allocation, prediction, update, sync): mixed prompts and contrast pairs, from the run's
    totals (``mixed_prompts``, ``contrast_pairs``; results written before the totals were recorded and
    without their metrics give nan)."""
    rows = []
    for r in results:
        seconds = float(r.get("train_seconds", np.nan))
        row = {"seed": r["seed"], "arm": r["policy"], "lr": r["lr"], "stage": stage,
               "eval_prompts": r.get("eval_prompts"), "eval_samples": r.get("eval_samples")}
        for key in METRICS:
            row[key] = float(r.get(key, np.nan))
        for total, rate in (("mixed_prompts", "mixed_prompts_per_second"),
                            ("contrast_pairs", "contrast_pairs_per_second")):
            row[rate] = float(r[total]) / seconds if total in r and seconds > 0 else float("nan")
        rows.append(row)
    return rows


def eval_size_mismatch(rows: list[dict], protocol: dict) -> list[str]:
    """Runs whose recorded evaluation size differs from the protocol's (``ARM seed SEED: PROMPTS x SAMPLES``);
    results written before the size was recorded are not checked."""
    want = (protocol["eval_prompts"], protocol["eval_samples"])
    return [f"{r['arm']} seed {r['seed']}: {r['eval_prompts']} x {r['eval_samples']}" for r in rows
            if r.get("eval_prompts") is not None and (r["eval_prompts"], r["eval_samples"]) != want]


def compare(rows: list[dict], protocol: dict, stage: str = "report") -> dict:
    """Every comparison of ``protocol`` over the ``stage`` rows: the primary (``p_value`` tested at
    ``alpha`` as it is) and the secondaries with ``p_holm``, each with ``answer``: ``yes`` (the reference
    ahead, significant), ``no`` (behind, significant) or ``not significant``."""
    values: dict[tuple[str, str], dict] = {}
    for row in rows:
        if row["stage"] == stage:
            for metric in READINGS:
                values.setdefault((row["arm"], metric), {})[row["seed"]] = row[metric]
    alpha = protocol["alpha"]

    def one(c: dict) -> dict:
        gap = paired_difference(values.get((c["reference"], c["metric"]), {}),
                                values.get((c["against"], c["metric"]), {}))
        return {**c, **(gap or {"mean": np.nan, "stderr": np.nan, "ci95": [np.nan, np.nan], "p_value": np.nan,
                                 "seeds": 0})}

    primary = one(protocol["primary"])
    primary["answer"] = _answer(primary["mean"], primary["p_value"], alpha)
    secondary = [one(c) for c in protocol["secondary"]]
    adjusted = holm({i: c["p_value"] for i, c in enumerate(secondary)})
    for i, c in enumerate(secondary):
        c["p_holm"] = adjusted[i]
        c["answer"] = _answer(c["mean"], c["p_holm"], alpha)
    return {"primary": primary, "secondary": secondary}


def _answer(mean: float, p: float, alpha: float) -> str:
    if not np.isfinite(p):
        return "no paired seeds"
    if p >= alpha:
        return "not significant"
    return "yes" if mean > 0 else "no"


def _name(c: dict) -> str:
    return f"{c['reference']} minus {c['against']} {READINGS[c['metric']]}"


def verdict(comparisons: dict, alpha: float = ALPHA) -> str:
    """One sentence: the primary comparison with its CI and p (unadjusted, at ``alpha``), then each
    secondary's answer at its Holm-adjusted p."""
    p = comparisons["primary"]
    if not p["seeds"]:
        head = f"Primary ({_name(p)}): no paired seeds"
    else:
        lo, hi = p["ci95"]
        head = (f"Primary ({_name(p)}, unadjusted, alpha {alpha:g}): {p['mean']:+.3f} (95% CI {lo:+.3f} to "
                f"{hi:+.3f}, p = {p['p_value']:.3f}, {p['seeds']} paired seeds): {p['answer']}")
    tail = "; ".join(f"{_name(c)} {c['mean']:+.3f} (Holm p = {c['p_holm']:.3f}): {c['answer']}"
                     if c["seeds"] else f"{_name(c)}: no paired seeds" for c in comparisons["secondary"])
    return head + (f". Secondary, Holm-adjusted: {tail}." if tail else ".")


def conclusions(comparisons: dict, alpha: float = ALPHA) -> list[str]:
    """The verdict as printed lines: the primary, then one line per secondary, each saying its correction."""
    lines = []
    for c in [comparisons["primary"], *comparisons["secondary"]]:
        if not c["seeds"]:
            lines.append(f"{_name(c)}: no paired seeds")
            continue
        lo, hi = c["ci95"]
        which = (f"p = {c['p_value']:.3f}, primary, unadjusted at alpha {alpha:g}" if "p_holm" not in c else
                 f"p = {c['p_value']:.3f}, Holm-adjusted p = {c['p_holm']:.3f}")
        lines.append(f"{_name(c)}: {c['mean']:+.3f} (95% CI {lo:+.3f} to {hi:+.3f}, {which}, "
                     f"{c['seeds']} paired seeds): {c['answer']}")
    return lines


def evidence_part(rows: list[dict], protocol: dict) -> dict:
    """What the evidence file adds to the summary: ``protocol``, ``per_seed``, ``comparisons``, ``verdict``."""
    comparisons = compare(rows, protocol)
    return {"protocol": protocol, "per_seed": rows, "comparisons": comparisons,
            "verdict": verdict(comparisons, protocol["alpha"])}


# --------------------------------------------------------------------------------------- power (CLI)
def pilot_rows(path: Path) -> list[dict]:
    """A pilot's per-seed report rows: an evidence file's ``per_seed`` (stage ``report``), or the
    ``result.json`` files of a run folder ``OUT/TASK`` (when it holds a ``summary.json``, its report seeds
    at each arm's best rate; otherwise every run, each arm at one rate)."""
    path = Path(path)
    if path.is_file():
        data = json.loads(path.read_text())
        if "per_seed" not in data:
            raise ValueError(f"{path} has no per_seed rows (written before the protocol): pass its run folder")
        return [r for r in data["per_seed"] if r["stage"] == "report"]
    results = [json.loads(p.read_text()) for p in sorted(path.glob("*/result.json"))]
    if not results:
        raise ValueError(f"{path} holds no finished runs (*/result.json)")
    summary = path / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        results = [r for r in results if r["seed"] in s["seeds"] and r["lr"] == s["best_lr"].get(r["policy"])]
    rates: dict[str, set] = {}
    for r in results:
        rates.setdefault(r["policy"], set()).add(r["lr"])
    several = {p: sorted(v) for p, v in rates.items() if len(v) > 1}
    if several:
        raise ValueError(f"{path}: arms at several rates and no summary.json to choose one: {several}")
    return per_seed_rows(results, "report")


def cli(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trace_train.bench.protocol",
                                     description="Paired seeds needed, from a pilot's per-seed rows "
                                                 "(two-sided paired t-test).")
    parser.add_argument("--pilot", type=Path, required=True,
                        help="a pilot's evidence JSON (per_seed rows) or its run folder OUT/TASK")
    parser.add_argument("--effect", type=float, default=None,
                        help="the difference worth detecting (default: the pilot's mean difference)")
    parser.add_argument("--reference", default="trace")
    parser.add_argument("--against", default="grpo")
    parser.add_argument("--metric", choices=sorted(READINGS), default="gain")
    parser.add_argument("--alpha", type=float, default=ALPHA)
    parser.add_argument("--power", type=float, default=0.8)
    args = parser.parse_args(argv)
    try:
        rows = pilot_rows(args.pilot)
    except (ValueError, OSError, KeyError) as err:
        parser.error(f"--pilot: {err}")
    by = {arm: {r["seed"]: r[args.metric] for r in rows if r["arm"] == arm} for arm in (args.reference, args.against)}
    seeds = sorted(s for s in by[args.reference] if s in by[args.against])
    diffs = [by[args.reference][s] - by[args.against][s] for s in seeds]
    if len(diffs) < 2:
        parser.error(f"--pilot: {len(diffs)} paired seeds of {args.reference} and {args.against}; need at least 2")
    effect = args.effect if args.effect is not None else float(np.mean(diffs))
    try:
        n = seeds_needed(diffs, effect, alpha=args.alpha, power=args.power)
        raw = seeds_needed(diffs, effect, alpha=args.alpha, power=args.power, minimum=0)
    except ValueError as err:
        parser.error(str(err))
    print(f"pilot: {len(diffs)} paired seeds, {args.reference} minus {args.against} ({args.metric}) mean "
          f"{np.mean(diffs):+.4f}, sd {np.std(diffs, ddof=1):.4f}")
    print(f"to detect {effect:+.4f} at alpha {args.alpha:g} with power {args.power:g} (paired t, two-sided): "
          f"{raw} seeds; run {n} (at least {MIN_SEEDS}): --seeds fresh:{n}")
    if len(diffs) < PILOT_SEEDS:
        df = len(diffs) - 1
        factor = math.sqrt(stats.chi2.ppf(0.975, df) / stats.chi2.ppf(0.025, df))
        print(f"a pilot of {len(diffs)} seeds estimates the spread poorly (its 95% interval spans a factor of "
              f"{factor:.0f}): read {raw} as a rough guide and pilot {PILOT_SEEDS} seeds for a firmer one")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
