"""The house style gives every policy its own look; the figures' statistics and paper numbers agree with the
simulator's."""

import numpy as np
import pandas as pd
import pytest

from figures import paper
from figures.data import seed_summary
from figures.style import OKABE_ITO, POLICY_COLOURS, arm_style, ci95
from simulations.experiments.base import summarise
from simulations.experiments.common import PAPER_GRPO_RATIO, PAPER_TRACE_RATIO
from trace_theory import POLICIES


def test_every_styled_policy_has_its_own_okabe_ito_look():
    styled = [p for p in POLICY_COLOURS if p in POLICIES]
    assert set(POLICY_COLOURS.values()) <= set(OKABE_ITO.values())
    looks = {(arm_style(p).colour, arm_style(p).hatch, arm_style(p).linestyle) for p in styled}
    assert len(looks) == len(styled)


def test_a_policy_without_a_colour_gets_the_default_look_distinct_from_every_styled_one():
    new, variant = arm_style("pcl_tree"), arm_style("pcl_tree[oracle]")
    assert new.colour == OKABE_ITO["grey"] and new.label == "pcl_tree" and variant.label == "pcl_tree[oracle]"
    styled = {(arm_style(p).colour, arm_style(p).hatch, arm_style(p).linestyle) for p in POLICY_COLOURS}
    assert (new.colour, new.hatch, new.linestyle) not in styled and new.linestyle != variant.linestyle


def test_a_variant_keeps_its_policy_colour_and_changes_line_and_hatch():
    base, oracle, estimator = arm_style("trace"), arm_style("trace[oracle]"), arm_style("trace+local")
    assert base.colour == oracle.colour == estimator.colour
    assert len({base.linestyle, oracle.linestyle, estimator.linestyle}) == 3
    assert len({base.hatch, oracle.hatch, estimator.hatch}) == 3
    assert "oracle" in oracle.label and "local" in estimator.label


def test_an_unknown_arm_is_drawn_in_grey_under_its_own_name():
    style = arm_style("something_new[x]")
    assert style.colour == OKABE_ITO["grey"] and style.label == "something_new[x]"


def test_seed_summary_equals_the_simulators_summarise():
    rng = np.random.default_rng(0)
    table = pd.DataFrame(
        {
            "arm": np.repeat(["a", "b"], 12),
            "seed": np.tile(np.repeat([0, 1, 2], 4), 2),
            "value": rng.random(24),
        }
    )
    ours, theirs = seed_summary(table, ["arm"]), summarise(table, ["arm"])
    pd.testing.assert_frame_equal(ours, theirs[ours.columns])


def test_confidence_interval_uses_student_t_over_seeds():
    assert ci95(1.0, 10_000) == pytest.approx(1.96, abs=1e-3)
    assert ci95(1.0, 2) == pytest.approx(12.706, abs=1e-3)
    assert ci95(np.array([1.0, 2.0]), np.array([2, 10_000])) == pytest.approx([12.706, 3.920], abs=1e-3)


def test_the_paper_numbers_are_the_simulators():
    assert (paper.GRPO_RATIO, paper.TRACE_RATIO) == (PAPER_GRPO_RATIO, PAPER_TRACE_RATIO)
