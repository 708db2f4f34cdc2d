"""Hostile results files: deep nesting, NaN or infinities where a number is needed are one line naming
the file, never a traceback or a wrong figure (issue 24)."""

import json

import pytest

from figures.cli import main, report_or_errors
from figures.data import MAX_DEPTH, Results

DEEP = "[" * 100_000 + "]" * 100_000


def _set(key, raw):
    def corrupt(path):
        text = json.dumps(json.loads(path.read_text()))
        assert f'"{key}": ' in text
        path.write_text(text.replace(f'"{key}": ', f'"{key}": {raw}, "{key}_was": ', 1))
    return corrupt


def _csv_value(raw):
    def corrupt(path):
        lines = path.read_text().splitlines()
        header = lines[0].split(",")
        cells = lines[1].split(",")
        cells[header.index("value")] = raw
        path.write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
    return corrupt


CASES = [
    ("config.json", _set("warmup", "NaN"), "holds NaN, which trace-sim never writes"),
    ("config.json", _set("warmup", "Infinity"), "holds Infinity, which trace-sim never writes"),
    ("config.json", _set("warmup", "null"), "`warmup` must be a number, found None"),
    ("config.json", _set("warmup", '"3"'), "`warmup` must be a number, found '3'"),
    ("config.json", _set("warmup", DEEP), f"nested deeper than {MAX_DEPTH} levels"),
    ("config.json", _set("warmup", "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)),
     f"nested deeper than {MAX_DEPTH} levels"),
    ("summary.json", _set("runtime_s", "NaN"), "holds NaN, which trace-sim never writes"),
    ("summary.json", _set("headline", DEEP), f"nested deeper than {MAX_DEPTH} levels"),
    ("results.csv", _csv_value("inf"), "line 2: column `value` holds an infinite value"),
    ("results.csv", _csv_value("-inf"), "line 2: column `value` holds an infinite value"),
]


@pytest.mark.parametrize(("file", "corrupt", "reason"), CASES)
def test_a_hostile_results_file_is_one_line_naming_it(results_copy, capsys, file, corrupt, reason):
    path = results_copy / "effective_ratio" / file
    corrupt(path)
    if file == "summary.json":  # read by the report (checked here without rendering every figure)
        report, err = report_or_errors(Results(results_copy), {}, 0.0)
        assert report is None
        err = [f"trace-figures: error: {e}" for e in err]
    else:
        assert main(["--results", str(results_copy), "effective_ratio"]) == 2
        err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"trace-figures: error: {path}: ") and reason in err[0]
    assert "\n" not in err[0] and not (results_copy / "REPORT.md").exists()


def test_all_nan_results_are_an_error_not_an_empty_figure(results_copy, capsys):
    """Issue 34: every `value` cell empty (NaN, a missing value): one line naming the file, exit 2, no figure."""
    path = results_copy / "effective_ratio" / "results.csv"
    lines = path.read_text().splitlines()
    column = lines[0].split(",").index("value")
    rows = [line.split(",") for line in lines[1:]]
    for cells in rows:
        cells[column] = ""
    path.write_text("\n".join([lines[0], *(",".join(cells) for cells in rows)]) + "\n")
    out = results_copy / "figs"
    assert main(["--results", str(results_copy), "--out", str(out), "effective_ratio"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"trace-figures: error: {path}: every `value` a figure reads from it is missing (NaN): "
                   "nothing to draw (rerun the experiment)"]
    assert not (out / "effective_ratio.png").exists()
