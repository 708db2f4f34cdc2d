"""Answer extraction, math-verify checking, and the QA metrics."""

import re
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_train.tools.sandbox import run_python
from trace_train.verifiers.answers import extract_answer_tag, extract_boxed, extract_math_answer
from trace_train.verifiers.math import MathChecker, check_math_answer, math_answers_equal
from trace_train.verifiers.qa import exact_match, f1_match, normalize_answer, token_f1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{\frac{1}{2}} and finally \boxed{\frac{3}{4}}.", r"\frac{3}{4}"),
        (r"\boxed{\{1, \{2\}\}}", r"\{1, \{2\}\}"),
        (r"\fbox{7}", "7"),
        (r"the answer is \boxed 5.", "5."),
        (r"\boxed{unclosed", None),
        ("no box", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_answer_tag_takes_the_last_complete_tag():
    assert extract_answer_tag("<answer> Paris </answer> then <answer>Lyon</answer><answer>x") == "Lyon"
    assert extract_answer_tag("none") is None


def test_math_answer_prefers_the_tag_and_its_box():
    assert extract_math_answer(r"\boxed{1} <answer>2</answer>") == "2"
    assert extract_math_answer(r"<answer>so \boxed{3}</answer> \boxed{1}") == "3"
    assert extract_math_answer(r"\boxed{1} then \boxed{4}") == "4"
    assert extract_math_answer("nothing") is None


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("1/2", r"\frac{1}{2}"),
        ("0.5", r"\frac{1}{2}"),
        ("x=3", "3"),
        ("34.0", "34"),
        (r"\{2,1\}", r"\{1,2\}"),
        ("(0, 1]", "(0,1]"),
        ("2^{1/2}", r"\sqrt{2}"),
        (r"\dfrac{10}{2}", "5"),
    ],
)
def test_equivalent_answers_are_correct(prediction, gold):
    assert math_answers_equal(prediction, gold) == "correct"


@pytest.mark.parametrize(("prediction", "gold"), [("11", "10"), ("abc", "2"), (r"\frac{1}{3}", "0.34")])
def test_different_answers_are_wrong(prediction, gold):
    assert math_answers_equal(prediction, gold) == "wrong"


def test_check_math_answer_statuses():
    verdict = check_math_answer(r"Thus the total is \boxed{204}.", "204")
    assert verdict.correct and verdict.reward == 1.0 and verdict.extracted == "204"
    assert check_math_answer("I think 204", "204").status == "no_answer"
    assert check_math_answer(r"\boxed{205}", "204").reward == 0.0


def test_a_slow_comparison_times_out_and_the_checker_recovers():
    """Parsing a 20000-term sum takes far longer than a second; the worker is killed and replaced."""
    huge = "+".join(f"x_{{{i}}}" for i in range(20000))
    start = time.monotonic()
    assert math_answers_equal(huge, "1", timeout_seconds=1) == "timeout"
    assert time.monotonic() - start < 5
    assert math_answers_equal("2", "2") == "correct"


def test_scripted_agent_python_that_computes_the_answer_passes_math_verify():
    """The issue's scripted math agent: sandboxed code computes the answer, math-verify accepts it."""
    problem_gold = "\\frac{7}{12}"
    result = run_python("from fractions import Fraction\nprint(Fraction(1, 3) + Fraction(1, 4))")
    response = f"The tool says {result.stdout.strip()}, so the answer is \\boxed{{{result.stdout.strip()}}}."
    assert check_math_answer(response, problem_gold).correct


def test_checking_works_from_threads_and_a_private_checker_can_be_closed():
    results = []
    threads = [
        threading.Thread(target=lambda g=g: results.append(math_answers_equal("0.5", g)))
        for g in ("\\frac{1}{2}", "\\frac{1}{3}")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["correct", "wrong"]
    checker = MathChecker()
    assert checker.compare("x=3", "3") == "correct"
    checker.close()
    assert checker.compare("4", "3") == "wrong"
    checker.close()


def test_math_inputs_are_validated():
    with pytest.raises(ValueError, match="`gold` must be a non-empty str, got ''"):
        check_math_answer(r"\boxed{1}", "")
    with pytest.raises(ValueError, match="`timeout_seconds` must be positive, got 0"):
        math_answers_equal("1", "1", timeout_seconds=0)
    with pytest.raises(TypeError, match="`prediction` and `gold` must be str"):
        math_answers_equal(1, "1")
    with pytest.raises(TypeError, match="`text` must be a str, got int"):
        extract_boxed(3)


def test_squad_normalisation():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple a day") == "apple day"


def test_exact_match_and_f1_take_the_best_gold():
    assert exact_match("the Eiffel Tower", ["Louvre", "Eiffel Tower"]) == 1.0
    assert exact_match(None, "x") == 0.0
    assert token_f1("Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 * (2 / 4) * 1 / (2 / 4 + 1))
    assert token_f1("London", ["Paris", "London city"]) == pytest.approx(2 / 3)
    assert token_f1("the", "a") == 0.0


def test_f1_match_is_the_thresholded_f1():
    # F1("Nile river delta region", "Nile") = 2 * (1/4) * 1 / (1/4 + 1) = 0.4
    assert f1_match("Nile river delta region", "Nile") == 1.0
    assert f1_match("Nile river delta region", "Nile", threshold=0.5) == 0.0
    # F1 = 2 * (1/6) / (1/6 + 1) = 0.2857...
    assert f1_match("Nile and five other long words", "Nile") == 0.0


@given(st.text(max_size=30), st.lists(st.text(max_size=30), min_size=1, max_size=3))
def test_metric_ordering(prediction, golds):
    em, f1 = exact_match(prediction, golds), token_f1(prediction, golds)
    assert 0.0 <= f1 <= 1.0
    if em == 1.0 and normalize_answer(prediction):
        assert f1 == 1.0
    assert f1_match(prediction, golds) == float(f1 >= 0.3)


def test_qa_inputs_are_validated():
    with pytest.raises(ValueError, match="`golds` must be a str or a non-empty sequence of str"):
        exact_match("x", [])
    with pytest.raises(ValueError, match=r"`threshold` must be in \(0, 1\], got 0"):
        f1_match("x", "x", threshold=0)


# ---------------------------------------------------- adversarial responses: same answers, linear time

_LAZY_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{|\\boxed +([^\s$]+)")


def _obvious_boxed(text):
    """The old quadratic reading: from each box, count braces to the end of the text."""
    found = None
    for match in _BOX_START.finditer(text):
        if match.group(1) is not None:
            found = match.group(1)
            continue
        depth = 1
        for position in range(match.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[position], 0)
            if depth == 0:
                found = text[match.end():position]
                break
    return None if found is None else found.strip()


@given(st.lists(st.sampled_from(["\\boxed{", "\\boxed ", "\\fbox {", "{", "}", "x", " ", "$", "<answer>",
                                 "</answer>", "\n"]), max_size=16).map("".join))
def test_answer_extraction_equals_the_obvious_reading(text):
    matches = _LAZY_TAG.findall(text)
    assert extract_answer_tag(text) == (matches[-1].strip() if matches else None)
    assert extract_boxed(text) == _obvious_boxed(text)


def test_unclosed_tags_and_boxes_by_the_thousand():
    """100k characters of unclosed tags and boxes (the old readers took about 30 s on each)."""
    assert extract_answer_tag("<answer>" * 12_500 + "</answer> <answer>7</answer>") == "7"
    assert extract_answer_tag("<answer>" * 12_500) is None
    assert extract_boxed("\\boxed{" * 14_000 + "\\boxed{5}") == "5"
    assert extract_math_answer("\\boxed{" * 14_000) is None
