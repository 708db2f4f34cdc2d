"""trace-figures end to end: every figure and the report from quick results; one-line errors on bad files."""

import json
import re
import subprocess
import sys

import pytest

from figures import FIGURES
from figures.claims import SECTIONS
from figures.cli import main, report_or_errors
from figures.report import heading_anchor
from figures.data import Results

PAPER_NUMBERS = ("26.8%", "60.6%", "42.8%", "52.3%", "42.4%", "47.8%")


def test_renders_every_figure_and_writes_a_report_with_every_section(results_copy, capsys):
    assert main(["--results", str(results_copy)]) == 0
    out = capsys.readouterr().out
    figures = results_copy / "figures"
    for name in FIGURES:
        assert (figures / f"{name}.png").stat().st_size > 0 and (figures / f"{name}.pdf").stat().st_size > 0
    report = (results_copy / "REPORT.md").read_text()
    assert out.splitlines()[-1] == f"report:  {results_copy / 'REPORT.md'}"
    for number, section in enumerate(SECTIONS, start=1):
        summary = json.loads((results_copy / section.experiment / "summary.json").read_text())
        assert f"## {number}. {section.title}" in report
        assert summary["claim"] in report and summary["result"] in report
    for name in FIGURES:
        assert f"](figures/{name}.png)" in report and f"](figures/{name}.pdf)" in report
    for number in PAPER_NUMBERS:
        assert number in report
    assert report.count("**Held: ") == len(SECTIONS)
    headings = {heading_anchor(ln.lstrip("#").strip()) for ln in report.splitlines() if ln.startswith("## ")}
    links = re.findall(r"\]\(#([^)]+)\)", report)
    assert len(links) == len(SECTIONS) and set(links) <= headings, sorted(set(links) - headings)


@pytest.mark.parametrize("heading, anchor", [
    ("8. Repeated expansion (beyond the paper)", "8-repeated-expansion-beyond-the-paper"),  # GitHub's slug
    ("10. Sensitivity to predictor noise, pool and informativeness",
     "10-sensitivity-to-predictor-noise-pool-and-informativeness"),
    ("3. TRACE vs GRPO: equal turns", "3-trace-vs-grpo-equal-turns"),
])
def test_report_links_are_githubs_heading_anchors(heading, anchor):
    assert heading_anchor(heading) == anchor


def test_every_figure_belongs_to_exactly_one_section():
    placed = [name for section in SECTIONS for name in section.figures]
    assert sorted(placed) == sorted(FIGURES)


def test_one_figure_renders_without_a_report(results_copy, tmp_path, capsys):
    assert main(["--results", str(results_copy), "--out", str(tmp_path / "out"), "effective_ratio"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "effective_ratio.pdf",
        "effective_ratio.png",
    ]
    assert not (results_copy / "REPORT.md").exists()


def test_list_names_every_figure_and_its_experiment(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(FIGURES)


def _corrupt_csv(path):
    path.write_bytes(b"\x00\xff garbage\n\x01,\x02\n")


def _drop_column(path):
    lines = path.read_text().splitlines()
    path.write_text("\n".join(",".join(line.split(",")[:5]) for line in lines) + "\n")


def _corrupt_json(path):
    path.write_text('{"claim": "truncated')


def _wrong_type(path):
    data = json.loads(path.read_text())
    data["held"] = "perhaps"
    path.write_text(json.dumps(data))


def _wrong_headline(path):
    data = json.loads(path.read_text())
    data["headline"]["prefix_conditioning"] = [1, 2]
    path.write_text(json.dumps(data))


def _no_metric(path):
    lines = path.read_text().splitlines()
    path.write_text("\n".join(line for line in lines if "rollout_share_depth_0" not in line) + "\n")


CASES = [
    ("effective_ratio", "results.csv", "missing", lambda p: p.unlink(), ["effective_ratio"]),
    ("effective_ratio", "results.csv", "not a readable CSV", _corrupt_csv, ["effective_ratio"]),
    ("effective_ratio", "results.csv", "not a readable CSV", lambda p: p.write_text(""), ["effective_ratio"]),
    ("effective_ratio", "results.csv", "no column `value`", _drop_column, ["effective_ratio"]),
    ("effective_ratio", "results.csv", "rollout_share_depth_0", _no_metric, ["budget_allocation"]),
    ("effective_ratio", "config.json", "missing", lambda p: p.unlink(), ["effective_ratio"]),
    ("learning_curves", "summary.json", "not readable JSON", _corrupt_json, ["learning_curves"]),
]


@pytest.mark.parametrize(("experiment", "file", "reason", "corrupt", "names"), CASES)
def test_a_bad_file_gives_one_line_naming_it(results_copy, capsys, experiment, file, reason, corrupt, names):
    path = results_copy / experiment / file
    corrupt(path)
    assert main(["--results", str(results_copy), *names]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"trace-figures: error: {path}: {err[0].split(f'{path}: ', 1)[1]}"]
    assert reason in err[0]
    assert not (results_copy / "REPORT.md").exists()


@pytest.mark.parametrize(
    ("experiment", "reason", "corrupt"),
    [
        ("target_bias", "`held` must be a JSON bool", _wrong_type),
        ("propositions", "unexpected `headline`", _wrong_headline),
        ("ablation", "missing", lambda p: p.unlink()),
    ],
)
def test_a_bad_summary_stops_the_report_with_one_line_naming_it(results_copy, experiment, reason, corrupt):
    """Summaries no figure reads are checked by the report (rendered here without figures, to stay fast)."""
    path = results_copy / experiment / "summary.json"
    corrupt(path)
    report, errors = report_or_errors(Results(results_copy), {}, 0.0)
    assert report is None and len(errors) == 1
    assert errors[0].startswith(f"{path}: ") and reason in errors[0] and "\n" not in errors[0]
    assert not (results_copy / "REPORT.md").exists()


def test_the_command_prints_no_traceback(results_copy):
    path = results_copy / "ablation" / "results.csv"
    _corrupt_csv(path)
    out = subprocess.run(
        [sys.executable, "-m", "figures.cli", "--results", str(results_copy), "ablation", "budget_shape"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.splitlines() == [out.stderr.strip()] and str(path) in out.stderr
    assert "Traceback" not in out.stderr


def test_unknown_figure_and_missing_folder_are_one_line_errors(tmp_path, capsys):
    assert main(["--results", str(tmp_path), "nope"]) == 2
    assert main(["--results", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "unknown figure 'nope'" in err[0] and f"{tmp_path / 'absent'}: no such results folder" in err[1]
