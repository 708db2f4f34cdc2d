"""The claims of the method the report checks: for each, the experiment that tests it, its figures, and
the numbers worth setting side by side (the paper's, where it has one, and ours).

Our numbers are read from each experiment's ``summary.json`` (``headline`` and ``details``); a number
missing from a summary (a smaller or custom run) is left out of the table rather than guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import paper

Row = tuple[str, str, str]
"""(quantity, the paper's number, ours)."""
NONE = "-"


def _num(data, *keys) -> float | None:
    """``data[k1][k2]...`` as a float, or None when a key is missing or the value is not a number."""
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return float(data) if isinstance(data, (int, float)) and not isinstance(data, bool) else None


def _pm(data, key: str, spec: str = ".1%") -> str | None:
    """``mean ± stderr`` of ``data[key]`` (and ``data[key + '_stderr']``), or None when missing."""
    mean, se = _num(data, key), _num(data, f"{key}_stderr")
    if mean is None:
        return None
    return format(mean, spec) + (f" ± {format(se, spec)}" if se is not None else "")


def _rows(candidates) -> list[Row]:
    return [(q, p, ours) for q, p, ours in candidates if ours is not None]


def _contrast(summary: dict) -> list[Row]:
    head = summary["headline"]
    return _rows(
        (f"largest |z| over bins, {check.replace('_', ' ')}", "identity, no number", _fmt_z(head.get(check)))
        for check in head
    )


def _fmt_z(entry) -> str | None:
    z, bins = _num(entry, "max_abs_z"), _num(entry, "bins")
    return None if z is None else f"{z:.2f}" + (f" over {bins:.0f} bins" if bins is not None else "")


def _propositions(summary: dict) -> list[Row]:
    head = summary["headline"]
    rows = []
    for s, entry in head.get("prefix_conditioning", {}).items():
        root, prefix = _num(entry, "brier_rate_root_deepest"), _num(entry, "brier_rate_prefix_deepest")
        if root is not None and prefix is not None:
            rows.append(
                (
                    f"Brier score of the group's success rate at the deepest prefix, {s}",
                    NONE,
                    f"from the root {root:.4f}, from the prefix {prefix:.4f}",
                )
            )
    names = {
        "roots": "expected mixed groups, active / uniform roots",
        "prefixes": "expected flipped anchors, active / uniform prefixes",
    }
    for stage, gains in head.get("active_over_uniform", {}).items():
        listed = ", ".join(
            f"x{v:.2f} ({k.replace('=', ' ')})" for k, v in gains.items() if _num(gains, k) is not None
        )
        rows.append((names.get(stage, stage), NONE, listed or None))
    return _rows(rows)


def _yield_rows(head: dict, arms=("grpo", "pcl", "root_only", "trace")) -> list[Row]:
    """Mixed prompts per 1,000 rollouts and per 1,000 turns, per arm: reported before any ratio."""
    rows = []
    for metric, unit in (("mixed_prompts_per_1k_rollouts", "rollouts"), ("mixed_prompts_per_1k_turns", "turns")):
        listed = [f"{a} {_pm(head[a], metric, '.1f')}" for a in arms if _num(head.get(a), metric) is not None]
        if listed:
            rows.append((f"mixed prompts per 1,000 {unit} (filtering cannot inflate it)", NONE, "; ".join(listed)))
    return rows


def _effective_ratio(summary: dict) -> list[Row]:
    head = summary["headline"]
    c = summary["details"].get("conditions", {})
    where = (
        f" (feature noise {c['feature_noise']:g}, pool {c['pool_factor']:g}x, informativeness {c['informativeness']:g})"
        if {"feature_noise", "pool_factor", "informativeness"} <= c.keys()
        else ""
    )
    rows = _yield_rows(head) + [
        (
            "effective ratio, GRPO (calibrated)",
            f"{paper.GRPO_RATIO:.1%}",
            _pm(head.get("grpo"), "effective_ratio"),
        ),
        (
            f"effective ratio, TRACE (learned predictor){where}",
            f"{paper.TRACE_RATIO:.1%}",
            _pm(head.get("trace"), "effective_ratio"),
        ),
        ("effective ratio, TRACE (oracle V)", NONE, _pm(head.get("trace[oracle]"), "effective_ratio")),
    ]
    grpo, trace = head.get("grpo", {}), head.get("trace", {})
    g, t = _num(grpo, "mixed_prompts_at_equal_turns"), _num(trace, "mixed_prompts_at_equal_turns")
    if g is not None and t is not None:
        rows.append(("mixed prompts per batch at equal turns, TRACE vs GRPO", NONE, f"{t:.0f} vs {g:.0f}"))
    return _rows(rows)


def _ablation(summary: dict) -> list[Row]:
    head = summary["headline"]
    names = {
        "uniform_tree": "uniform roots + uniform prefixes",
        "active_root_uniform_prefix": "active roots + uniform prefixes",
        "prefix_only": "uniform roots + active prefixes",
        "trace": "active roots + active prefixes (TRACE)",
    }
    rows = [
        (
            f"effective ratio, {name}",
            f"{paper.ABLATION_RATIO[arm]:.1%}" if arm in paper.ABLATION_RATIO else NONE,
            _pm(head.get(arm), "effective_ratio"),
        )
        for arm, name in names.items()
    ]
    shapes = summary["details"].get("budget_shapes", {})
    rows += [
        (
            f"effective ratio, TRACE at (M, N) = ({m}, {n})",
            f"{value:.1%}",
            _pm(shapes.get(f"M={m},N={n}"), "effective_ratio"),
        )
        for (m, n), value in paper.SHAPE_RATIO.items()
    ]
    by_pool = summary["details"].get("budget_shapes_by_pool", {})
    for mode, shapes in by_pool.items():
        cells = [
            f"({m}, {n}) {_pm(shapes.get(f'M={m},N={n}'), 'mixed_prompts_per_1k_rollouts', '.0f')} per 1,000 "
            f"rollouts, ratio {_pm(shapes.get(f'M={m},N={n}'), 'effective_ratio')}"
            for m, n in paper.SHAPE_RATIO
            if f"M={m},N={n}" in shapes
        ]
        paper_mode = mode == summary["details"].get("budget_shapes_pool_mode")
        rows.append(
            (
                f"TRACE by budget shape, pool: {mode.replace('_', ' ')}{' (the paper’s set-up)' if paper_mode else ''}",
                "42.4%, 47.8%, 52.3%" if paper_mode else NONE,
                "; ".join(cells) or None,
            )
        )
    return _rows(rows)


def _learning_curves(summary: dict) -> list[Row]:
    head, details = summary["headline"], summary["details"]
    g, t = head.get("grpo", {}), head.get("trace", {})
    reported = (
        f"accuracy {paper.MATH_ACCURACY['grpo']:.1f} -> {paper.MATH_ACCURACY['trace']:.1f} (math, Qwen3-8B)"
    )
    rows = [("initial J (uniform policy)", NONE, _fmt(_num(details, "initial_success")))]
    if _num(g, "final_success") is not None and _num(t, "final_success") is not None:
        rows.append(
            ("final J, GRPO -> TRACE", reported, f"{g['final_success']:.3f} -> {t['final_success']:.3f}")
        )
    for view, entry in details.get("paired", {}).items():
        diff, se = _num(entry, "trace_minus_grpo"), _num(entry, "stderr")
        if diff is not None:
            rows.append(
                (
                    f"TRACE minus GRPO, paired, {view.replace('_', ' ')}",
                    "+1.1 points (accuracy)" if view == "equal_rollouts" else NONE,
                    f"{diff:+.3f}" + (f" ± {se:.3f}" if se is not None else ""),
                )
            )
    best = max(
        (a for a in head if _num(head[a], "final_success") is not None),
        key=lambda a: head[a]["final_success"],
        default=None,
    )
    if best:
        rows.append(("best final J, shared learning rate", NONE, f"{best} {head[best]['final_success']:.3f}"))
    return _rows(rows) + _tuned_rows(details.get("tuned", {}))


def _gap_text(entry: dict, arm: str) -> str | None:
    gap, score = entry.get("gap", {}).get(arm), entry.get("score", {})
    if gap is None or arm not in score or "trace" not in score:
        return None
    return (
        f"{gap['mean']:+.3f} ± {gap['stderr']:.3f} (lr {score['trace']['lr']:g} vs {score[arm]['lr']:g})"
    )


def _tuned_rows(tuned: dict) -> list[Row]:
    """TRACE minus GRPO, PCL and root-only per normalisation and view: own best rates next to the shared one."""
    rows = []
    for norm, entry in tuned.items():
        if not (isinstance(entry, dict) and "equal_rollouts" in entry):
            continue
        for view in ("equal_rollouts", "equal_turns"):
            for arm in ("grpo", "pcl", "root_only"):
                best, shared = _gap_text(entry[view]["best"], arm), _gap_text(entry[view]["shared"], arm)
                if best is None:
                    continue
                rows.append(
                    (
                        f"TRACE minus {arm.replace('_', '-')}, step / {norm.replace('_', ' ')}, {view.replace('_', ' ')}",
                        "+1.1 points (accuracy)" if (arm, view, norm) == ("grpo", "equal_rollouts", "leaves") else NONE,
                        f"own best rates {best}; shared rate {shared}",
                    )
                )
    return rows


def _fmt(value: float | None, spec: str = ".3f") -> str | None:
    return None if value is None else format(value, spec)


def _predictor_quality(summary: dict) -> list[Row]:
    head, details = summary["headline"], summary["details"]
    sweep = {k: v for k, v in head.items() if k.startswith("trace[noisy]") and k.endswith("temperature=1")}
    rows = [
        (
            f"effective ratio, noisy oracle, {k.removeprefix('trace[noisy] ').replace('=', ' ')}",
            NONE,
            _pm(v, "effective_ratio"),
        )
        for k, v in sweep.items()
    ]
    rows += [
        ("effective ratio, GRPO", NONE, _pm(head.get("grpo"), "effective_ratio")),
        ("effective ratio, TRACE (learned predictor)", NONE, _pm(head.get("trace"), "effective_ratio")),
        (
            "noise at which the noisy oracle matches the learned predictor",
            NONE,
            _fmt(_num(details, "learned_equivalent_noise"), ".2f"),
        ),
        (
            "Spearman correlation, Brier score vs effective ratio",
            NONE,
            _fmt(_num(details, "spearman_brier_vs_ratio"), ".2f"),
        ),
    ]
    return _rows(rows)


def _target_bias(summary: dict) -> list[Row]:
    head = summary["headline"]
    rows = []
    for arm, entry in head.items():
        for method in ("leaf_weighted", "own_branches"):
            z = _num(entry, f"{method}_weighted_bias_max_bin_z")
            rows.append(
                (
                    f"{method.replace('_', '-')} target, largest |bias| / SE over V bins, {arm}",
                    NONE,
                    _fmt(z, ".1f"),
                )
            )
    return _rows(rows)


def _expansion_rounds(summary: dict) -> list[Row]:
    """Per arm and R: effective ratio at equal rollouts; rollouts, mixed prompts, contrast pairs at equal turns."""
    rows = []
    for arm, by_r in summary["headline"].items():
        for r, entry in by_r.items():
            rows += [
                (f"effective ratio, {arm}, R = {r[1:]} (equal rollouts)", NONE,
                 _pm(entry, "effective_ratio")),
                (f"rollouts per batch, {arm}, R = {r[1:]} (equal turns)", NONE,
                 _fmt(_num(entry, "rollouts_at_equal_turns"), ".0f")),
                (f"mixed prompts per batch, {arm}, R = {r[1:]} (equal turns)", NONE,
                 _pm(entry, "mixed_prompts_at_equal_turns", ".0f")),
                (f"contrast pairs per rollout, {arm}, R = {r[1:]} (equal turns)", NONE,
                 _pm(entry, "contrast_pairs_per_rollout_at_equal_turns", ".2f")),
            ]
    return _rows(rows)


def _sensitivity(summary: dict) -> list[Row]:
    head, details = summary["headline"], summary["details"]
    d = details.get("default", {})
    default = f"noise={d.get('noise', 1):g},pool={d.get('pool_factor', 2):g},s={d.get('informativeness', 0.3):g}"
    rows = _yield_rows({a: head[a].get(default, {}) for a in head})
    ratio, mixed = details.get("trace_range", {}).get("effective_ratio"), details.get("trace_range", {}).get(
        "mixed_prompts_per_1k_rollouts"
    )
    if mixed:
        rows.append(("TRACE mixed prompts per 1,000 rollouts over noise 0.5-4 and pools 1x-4x", NONE, f"{mixed[0]:.0f}-{mixed[1]:.0f}"))
    if ratio:
        rows.append(
            (
                "TRACE effective ratio over noise 0.5-4 and pools 1x-4x",
                f"{paper.TRACE_RATIO:.1%} (one setting)",
                f"{ratio[0]:.1%}-{ratio[1]:.1%}",
            )
        )
    rows.append(("effective ratio, GRPO", f"{paper.GRPO_RATIO:.1%}", _pm(details.get("grpo_default"), "effective_ratio")))
    for factor, noise in details.get("noise_at_paper_ratio_by_pool_factor", {}).items():
        rows.append(
            (
                f"feature noise at which TRACE's ratio is the paper's 60.6%, pool {factor}x",
                NONE,
                "not crossed" if noise is None else f"{noise:.2f}",
            )
        )
    return _rows(rows)


def _regime_map(summary: dict) -> list[Row]:
    head, details = summary["headline"], summary["details"]
    rows = []
    for world, views in head.items():
        cells = []
        for view in ("equal_rollouts", "equal_tokens_kappa=0", "equal_tokens_kappa=1"):
            if view not in views:
                continue
            listed = ", ".join(
                f"{arm.replace('_', '-')} {g['mean']:+.3f} ± {g['stderr']:.3f}"
                for arm, g in views[view]["gap"].items()
                if arm in ("root_only", "pcl")
            )
            cells.append(f"{view.replace('_', ' ')}: {listed}")
        pays = details.get("pays", {}).get(world, {})
        views = [v.replace("_", " ") for v, ok in pays.items() if ok]
        verdict = (
            "pays"
            if pays.get("equal_rollouts") and pays.get("equal_tokens_kappa=0")
            else (f"pays only at {', '.join(views)}" if views else "does not pay")
        )
        rows.append((f"TRACE minus, best against best, {world} ({verdict})", NONE, "; ".join(cells) or None))
    return _rows(rows)


def _eager_expansion(summary: dict) -> list[Row]:
    details = summary["details"]
    rows = []
    for key, cell in details.get("regime", {}).items():
        predictor, spread, arm = key.split("/")
        if predictor != "learned" or arm not in ("eager_0.0", "eager_0.25", "pipelined"):
            continue
        name = "pipelined (one-step-off continuations)" if arm == "pipelined" else arm.replace('_', ' reserve ')
        rows.append((f"{name}, learned predictor, {spread} spread: share of lazy TRACE's "
                     "contrast pairs per 1k turns; critical path minus GRPO's",
                     NONE, f"{cell['pairs_kept']:.0%}; {cell['critical_path_over_grpo']:+.2f} turns"))
    waiting = details.get("value_of_waiting", {})
    if waiting:
        rows.append(("value of waiting (contrast pairs eager loses at reserve 0), by predictor/spread", NONE,
                     ", ".join(f"{k} {v:+.0%}" for k, v in waiting.items())))
    for view in ("equal_turns", "equal_critical_path"):
        learn = details.get("learning", {}).get(view)
        if learn:
            rows.append((f"tree MDP, eager reserve 0 minus, best rates, {view.replace('_', ' ')}", NONE,
                         ", ".join(f"{a} {g['mean']:+.3f} ± {g['stderr']:.3f}" for a, g in learn["gap"].items())))
            if learn.get("pipelined_gap"):
                rows.append((f"tree MDP, pipelined minus, best rates, {view.replace('_', ' ')}", NONE,
                             ", ".join(f"{a} {g['mean']:+.3f} ± {g['stderr']:.3f}"
                                       for a, g in learn["pipelined_gap"].items())))
    return _rows(rows)


@dataclass(frozen=True)
class Section:
    """One claim of the method: the experiment that tests it, its figures and how to read its numbers."""

    experiment: str
    title: str
    figures: tuple[str, ...]
    numbers: Callable[[dict], list[Row]]


SECTIONS = (
    Section(
        "contrast_identities",
        "The contrast identities",
        ("contrast_potential", "mixed_probability"),
        _contrast,
    ),
    Section(
        "propositions",
        "The propositions: prefix conditioning and active allocation",
        ("propositions",),
        _propositions,
    ),
    Section(
        "effective_ratio",
        "Effective ratio at equal budget",
        ("effective_ratio", "budget_allocation"),
        _effective_ratio,
    ),
    Section("ablation", "Ablation and budget shape", ("ablation", "budget_shape"), _ablation),
    Section(
        "learning_curves",
        "Learning curves in a tree MDP, best against best",
        ("learning_curves", "learning_rates"),
        _learning_curves,
    ),
    Section(
        "predictor_quality",
        "Predictor quality against allocation quality",
        ("predictor_quality",),
        _predictor_quality,
    ),
    Section("target_bias", "Bias of the recursive targets", ("target_bias",), _target_bias),
    Section(
        "expansion_rounds",
        "Repeated expansion (beyond the paper)",
        ("expansion_rounds",),
        _expansion_rounds,
    ),
    Section(
        "sensitivity",
        "Sensitivity to predictor noise, pool and informativeness",
        ("sensitivity",),
        _sensitivity,
    ),
    Section("regime_map", "Where tree expansion pays, beyond the paper", ("regime_map",), _regime_map),
    Section("eager_expansion", "Branching that never waits (eager expansion, beyond the paper)",
            ("eager_expansion",), _eager_expansion),
)
