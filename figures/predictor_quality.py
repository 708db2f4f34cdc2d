"""Predictor quality against allocation quality: TRACE guided by a noisy oracle of growing noise.

(a) Effective ratio against the noise of the predictor's logit, for over-, well- and under-confident
predictors (temperature), with GRPO, TRACE's learned predictor and the oracle as references.
(b) Mixed prompts per batch, what the allocator maximises. (c) Effective ratio against the predictor's
Brier score over every setting.
"""

from __future__ import annotations

import numpy as np

from .data import Results, seed_summary
from .style import OKABE_ITO, arm_style, ci95, new_figure, panel_label, percent

EXPERIMENT = "predictor_quality"
METRICS = ("effective_ratio", "mixed_prompts", "predictor_brier")
SWEEP = "trace[noisy]"
TEMPERATURE_LINES = {1.0: "-", 0.5: "--", 2.0: ":"}
MARKERS = "o^sDv"


def _temperature_style(t: float, i: int) -> dict:
    word = "calibrated" if t == 1 else ("over-confident" if t > 1 else "under-confident")
    return {
        "color": OKABE_ITO["vermillion"],
        "linestyle": TEMPERATURE_LINES.get(t, "-."),
        "marker": MARKERS[i % 5],
        "label": f"temperature {t:g} ({word})",
    }


def _references(ax, refs, metric: str) -> None:
    """GRPO and TRACE with its learned predictor as horizontal lines with 95% bands."""
    for arm in ("grpo", "trace"):
        if arm not in refs.index.get_level_values("arm"):
            continue
        row = refs.loc[(arm, metric)]
        style = arm_style(arm)
        half = ci95(row["stderr"], row["n"])
        label = f"{style.label} ({'no predictor' if arm == 'grpo' else 'learned predictor'})"
        ax.axhline(row["value"], color=style.colour, linewidth=1.0, label=label, zorder=1)
        ax.axhspan(row["value"] - half, row["value"] + half, color=style.colour, alpha=0.15, linewidth=0)


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.after_warmup(EXPERIMENT, metrics=METRICS, columns=("noise", "temperature"))
    table = table[table["metric"].isin(METRICS)]
    sweep = seed_summary(table[table["arm"] == SWEEP], ["temperature", "noise", "metric"])
    refs = seed_summary(table[table["arm"] != SWEEP], ["arm", "metric"]).set_index(["arm", "metric"])
    temperatures = sorted(sweep["temperature"].unique(), key=lambda t: (t != 1, t))
    noises = sorted(sweep["noise"].unique())
    position = dict(zip(noises, range(len(noises))))  # the sweep's levels, evenly spaced
    figure, (ax_ratio, ax_mixed, ax_brier) = new_figure(panels=3, height=3.0)
    for i, t in enumerate(temperatures):
        style = _temperature_style(t, i)
        for ax, metric in ((ax_ratio, "effective_ratio"), (ax_mixed, "mixed_prompts")):
            rows = sweep[(sweep["temperature"] == t) & (sweep["metric"] == metric)].sort_values("noise")
            ax.errorbar(
                rows["noise"].map(position),
                rows["value"],
                yerr=ci95(rows["stderr"], rows["n"]),
                markersize=4,
                **style,
            )
        pair = sweep[sweep["temperature"] == t].pivot_table(index="noise", columns="metric", values="value")
        ax_brier.plot(
            pair["predictor_brier"], pair["effective_ratio"], markersize=4, **{**style, "linestyle": "none"}
        )
    for ax, metric in ((ax_ratio, "effective_ratio"), (ax_mixed, "mixed_prompts")):
        _references(ax, refs, metric)
        ax.set_xticks(range(len(noises)), [f"{n:g}" for n in noises])
        ax.set_xlim(-0.3, len(noises) - 0.7)
        ax.set_xlabel("predictor noise (s.d., logit scale)")
    details = results.summary(EXPERIMENT)["details"]
    equivalent = details.get("learned_equivalent_noise")
    if equivalent is not None and ("trace", "effective_ratio") in refs.index:
        ax_ratio.plot(
            np.interp(equivalent, noises, range(len(noises))),
            refs.loc[("trace", "effective_ratio"), "value"],
            marker="*",
            markersize=11,
            color=OKABE_ITO["vermillion"],
            markeredgecolor="black",
            linestyle="none",
            zorder=6,
            label=f"learned = noise {equivalent:.2g}",
        )
    ax_ratio.set_ylim(0, 1)
    percent(ax_ratio)
    ax_ratio.set_ylabel("effective ratio (% of prompts mixed)")
    panel_label(ax_ratio, "a  effective ratio")
    ax_mixed.set_ylabel("mixed prompts per batch")
    ax_mixed.set_ylim(bottom=0)
    panel_label(ax_mixed, "b  mixed prompts")
    ax_brier.set_ylim(0, 1)
    percent(ax_brier)
    ax_brier.set_xlabel("predictor Brier score vs true V")
    ax_brier.set_ylabel("effective ratio")
    panel_label(ax_brier, "c  ratio vs Brier score")
    handles, labels = ax_ratio.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=7.5)

    config = results.config(EXPERIMENT, "roots", "continuations", "seeds", "warmup", "batches")
    rho = details.get("spearman_brier_vs_ratio")
    caption = (
        f"TRACE guided by a noisy oracle, logit v = temperature x logit V + noise x N(0, 1), at M = "
        f"{config['roots']}, N = {config['continuations']}; mean over {config['seeds']} seeds of batches "
        f"{config['warmup'] + 1}-{config['batches']}, 95% confidence intervals (bars and bands). (a) Effective "
        "ratio against the noise (the swept levels, evenly spaced; noise 0 at temperature 1 is the oracle); horizontal "
        "lines: GRPO and TRACE with its learned predictor"
        + (
            f", placed on the noise axis at the noise {equivalent:.2f} that matches its ratio (star)"
            if equivalent
            else ""
        )
        + ". (b) Mixed prompts per batch: an over-confident predictor (temperature 2) raises the ratio by "
        "concentrating the budget on fewer prompts, so fewer prompts mix. (c) Effective ratio against the "
        "predictor's Brier score for every setting"
        + (f" (Spearman correlation {rho:.2f})" if rho is not None else "")
        + "."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
