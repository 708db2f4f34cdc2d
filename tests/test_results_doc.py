"""Numbers live once: every figure the README and ``docs/*.md`` quote from an evidence file agrees with it,
and every evidence file says which commit and command produced it.

A quoted figure carries a marker right after it,
``0.118<!-- evidence: benchmarks/predictor/qa.json#results.1.anchors_brier -->``: the file, then the path to the value (dict keys and list indices joined by dots; in a ``.jsonl`` file the
first index is the line). ``<!-- evidence-file: FILE -->`` sets the file for the markers after it that
name none (``<!-- evidence: #path -->``). A figure followed by ``%`` is compared as a percentage. The
figure must equal the value rounded to the digits shown.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EVIDENCE = sorted(p for p in (REPO / "benchmarks").rglob("*") if p.suffix in (".json", ".jsonl"))
DEFAULT = re.compile(r"<!--\s*evidence-file:\s*(?P<file>\S+)\s*-->")
MARKER = re.compile(r"(?P<number>[+-]?\d[\d,]*(?:\.\d+)?)(?P<percent>%?)[ \t]*"
                    r"<!--\s*evidence:\s*(?P<file>[^#\s]*)#(?P<path>\S+)\s*-->")
LOOSE = re.compile(r"<!--\s*evidence:")


def load(path: Path):
    """A JSON file's object, or a JSONL file's list of line objects."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


def lookup(data, path: str):
    """The value at a dotted path; a dict key may itself hold dots (the longest key that fits is taken)."""
    rest = path
    while rest:
        if isinstance(data, list):
            head, _, rest = rest.partition(".")
            data = data[int(head)]
            continue
        if not isinstance(data, dict):
            raise KeyError(f"{path!r}: {rest!r} goes below a {type(data).__name__}")
        keys = [k for k in data if rest == k or rest.startswith(k + ".")]
        if not keys:
            raise KeyError(f"{path!r}: no key {rest.split('.')[0]!r} among {sorted(data)[:12]}")
        key = max(keys, key=len)
        data, rest = data[key], rest[len(key) + 1:]
    return data


def quoted_figures(text: str) -> list[tuple[int, str, str, str, str]]:
    """(line, figure as written, percent sign, file, path) of every marker, in order; the file is the
    section default where the marker names none."""
    events = [(m.start(), "default", m) for m in DEFAULT.finditer(text)]
    events += [(m.start(), "figure", m) for m in MARKER.finditer(text)]
    default, found = "", []
    for start, kind, match in sorted(events, key=lambda e: e[0]):
        if kind == "default":
            default = match.group("file")
            continue
        line = text.count("\n", 0, start) + 1
        found.append((line, match.group("number"), match.group("percent"), match.group("file") or default,
                      match.group("path")))
    return found


def agrees(written: str, percent: str, value) -> bool:
    """The written figure equals the value rounded to the digits written (x100 after a percent sign)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    shown = float(written.replace(",", ""))
    decimals = len(written.split(".")[1]) if "." in written else 0
    scaled = value * 100 if percent else value
    return abs(shown - scaled) <= 0.5 * 10 ** -decimals + 1e-9


def check(doc: Path, root: Path = REPO) -> list[str]:
    """Every disagreement of one document, one line each (evidence paths relative to root)."""
    text = doc.read_text()
    problems = []
    figures = quoted_figures(text)
    markers = len(LOOSE.findall(re.sub(r"`[^`\n]*`", "", text)))  # a marker shown as code is an example
    if len(figures) != markers:
        problems.append(f"{doc.name}: {markers - len(figures)} evidence markers follow no figure")
    for line, written, percent, file, path in figures:
        where = f"{doc.relative_to(root)}:{line}"
        if not file:
            problems.append(f"{where}: {written} names no evidence file, and no evidence-file default precedes it")
            continue
        try:
            value = lookup(load(root / file), path)
        except (OSError, KeyError, IndexError, ValueError) as error:
            problems.append(f"{where}: {written}: cannot read {file}#{path}: {error}")
            continue
        if not agrees(written, percent, value):
            problems.append(f"{where}: {written}{percent} but {file}#{path} is {value!r}")
    return problems


def test_the_marker_parser_reads_figures_defaults_and_percentages():
    text = ("<!-- evidence-file: a.json -->\n| 1.02<!-- evidence: #x.y --> | 77.6%<!-- evidence: b.json#z -->"
            " | +0.014 <!-- evidence: #k.0 -->\n")
    assert quoted_figures(text) == [(2, "1.02", "", "a.json", "x.y"), (2, "77.6", "%", "b.json", "z"),
                                    (2, "+0.014", "", "a.json", "k.0")]
    nested = {"trace@eager:eager_lag=1": {"grpo": [0, {"p": 3}]}}
    assert lookup(nested, "trace@eager:eager_lag=1.grpo.1.p") == 3
    assert lookup({"a.b": {"c": 1}, "a": {"b": 2}}, "a.b.c") == 1
    assert agrees("1.02", "", 1.0155) and not agrees("1.02", "", 1.026)
    assert agrees("77.6", "%", 0.776) and agrees("-0.000", "", -0.00049) and agrees("1,177", "", 1176.8)
    assert not agrees("0.5", "", "0.5") and not agrees("1", "", True)


def test_a_figure_that_disagrees_with_its_file_is_reported(tmp_path):
    (tmp_path / "e.json").write_text(json.dumps({"ratio": 1.0445, "rows": [{"gain": 0.1319}]}))
    doc = tmp_path / "doc.md"
    doc.write_text("ok 1.04<!-- evidence: e.json#ratio -->, wrong 1.05<!-- evidence: e.json#ratio -->,\n"
                   "missing 2<!-- evidence: e.json#nope -->, row +0.132<!-- evidence: e.json#rows.0.gain -->\n"
                   "orphan <!-- evidence: e.json#ratio -->\n")
    problems = check(doc, tmp_path)
    assert len(problems) == 3, problems
    assert "1 evidence markers follow no figure" in problems[0]
    assert "doc.md:1: 1.05 but e.json#ratio is 1.0445" in problems[1]
    assert "no key 'nope'" in problems[2]


def test_the_results_page_quotes_its_figures_from_evidence_files():
    text = (REPO / "docs" / "results.md").read_text()
    assert len(quoted_figures(text)) >= 40, "docs/results.md lost its evidence markers"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_quoted_figure_agrees_with_its_evidence_file(doc):
    problems = check(doc)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_benchmarks_path_a_document_names_exists(doc):
    names = re.findall(r"\bbenchmarks/[\w./*{},-]*\w", doc.read_text())
    missing = sorted({n for n in names if not (REPO / n).exists() and not list(REPO.glob(n))})
    assert not missing, f"{doc.name} names evidence that is not there: {missing}"


def evidence_header(path: Path) -> dict:
    """The record that says where an evidence file came from: the object itself, or a JSONL file's first
    line."""
    data = load(path)
    return data[0] if path.suffix == ".jsonl" else data


@pytest.mark.parametrize("path", EVIDENCE, ids=lambda p: str(p.relative_to(REPO)))
def test_every_evidence_file_records_its_commit_command_and_load(path):
    header = evidence_header(path)
    assert isinstance(header, dict), f"{path}: the first record is not an object"
    commit = header.get("commit")
    assert isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,40}", commit), \
        f"{path.relative_to(REPO)} lacks `commit` (the commit whose code was measured)"
    name = path.relative_to(REPO)
    assert isinstance(header.get("command"), str) and header["command"], f"{name} lacks `command`"
    assert any(k in header for k in ("load", "load_average", "load_average_before")), \
        f"{name} lacks `load` (the load average, or null where unknown)"


def test_evidence_lives_in_folders_named_for_questions_not_rounds():
    folders = {p.parent.relative_to(REPO / "benchmarks") for p in EVIDENCE}
    assert EVIDENCE and all(len(f.parts) == 1 for f in folders), folders
    assert not [f for f in folders if re.search(r"round|^r\d+$", str(f))], folders


def test_the_readme_is_a_map_not_a_lab_notebook():
    text = (REPO / "README.md").read_text()
    lines = text.count("\n")
    assert lines <= 300, f"README.md has {lines} lines (at most 300; aim for 250): details go to docs/"
    rounds = re.findall(r"\bround\s+\d+", text, re.I)
    assert len(rounds) <= 3, f"README.md mentions rounds {rounds}: history goes to CHANGELOG.md"


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#{1,6}\s+(.+?)\s*$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


LINKED = [*DOCS, REPO / "CHANGELOG.md", REPO / "benchmarks" / "README.md", REPO / "trace_train" / "README.md"]


@pytest.mark.parametrize("doc", LINKED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(doc):
    text = doc.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)} links to nothing: {broken}"
