"""Every figure renders from quick results into a non-blank PNG and a PDF, reading only its own experiment."""

import shutil
import subprocess
import sys

import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread

from figures import FIGURES, figure_module
from figures.data import Results
from figures.render import render


@pytest.mark.parametrize("name", FIGURES)
def test_figure_renders_from_its_own_experiment_alone(name, quick_results, tmp_path):
    experiment = figure_module(name).EXPERIMENT
    alone = tmp_path / "results"
    shutil.copytree(quick_results / experiment, alone / experiment)  # no other experiment is there to read

    done = render(name, Results(alone), tmp_path / "figures")

    pixels = imread(done.png)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 1000  # a 7-inch figure at 200 dpi
    assert pixels[..., :3].std() > 0.05, "the PNG is blank"
    assert done.pdf.read_bytes()[:5] == b"%PDF-" and done.pdf.stat().st_size > 5_000
    assert len(done.caption) > 200 and "95%" in done.caption


def test_a_figure_module_runs_as_a_script(quick_results, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "figures.budget_shape",
            "--results",
            str(quick_results),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget_shape.pdf", "budget_shape.png"]


def test_the_same_results_give_the_same_pdf(quick_results, tmp_path):
    first = render("ablation", Results(quick_results), tmp_path / "a").pdf.read_bytes()
    second = render("ablation", Results(quick_results), tmp_path / "b").pdf.read_bytes()
    assert first == second


def test_the_blankness_check_can_fail(tmp_path):
    Figure(figsize=(7, 2)).savefig(tmp_path / "blank.png")
    assert imread(tmp_path / "blank.png")[..., :3].std() < 0.05
