"""Loaders: one function for local JSONL/Parquet files and Hub-style data set ids (a local repo folder)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trace_train.data.loading import load_rows
from trace_train.data.math import load_math_problems
from trace_train.data.qa import QAExample, demo_paths, load_demo_questions, load_qa_examples


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "hf-cache"


def test_deepscaler_style_jsonl(tmp_path, cache):
    path = _jsonl(
        tmp_path / "train.jsonl",
        [
            {"problem": "What is 1+1?", "answer": "2", "solution": "It is \\boxed{2}."},
            {"problem": "Compute 3/6.", "answer": "\\frac{1}{2}", "solution": "..."},
        ],
    )
    problems = load_math_problems(path, cache_dir=cache)
    assert [(p.id, p.problem, p.answer) for p in problems] == [
        ("0", "What is 1+1?", "2"),
        ("1", "Compute 3/6.", "\\frac{1}{2}"),
    ]


def test_aime_style_parquet_with_capitalised_fields_and_integer_answers(tmp_path, cache):
    path = tmp_path / "aime.parquet"
    pq.write_table(
        pa.table({"ID": ["2024-I-1", "2024-I-2"], "Problem": ["p1", "p2"], "Answer": [204, 25]}), path
    )
    problems = load_math_problems(path, cache_dir=cache)
    assert [(p.id, p.answer) for p in problems] == [("2024-I-1", "204"), ("2024-I-2", "25")]


def test_amc_style_question_field_and_explicit_mapping(tmp_path, cache):
    path = _jsonl(tmp_path / "amc.jsonl", [{"question": "q", "answer": 27.0, "target": "9"}])
    assert load_math_problems(path, cache_dir=cache)[0].answer == "27.0"
    assert load_math_problems(path, answer_field="target", cache_dir=cache)[0].answer == "9"


def test_answer_from_a_boxed_solution(tmp_path, cache):
    path = _jsonl(tmp_path / "math.jsonl", [{"problem": "p", "solution": "so \\boxed{\\frac{3}{4}}."}])
    assert load_math_problems(path, cache_dir=cache)[0].answer == "\\frac{3}{4}"


def test_hub_style_repository_folder_with_splits(tmp_path, cache):
    repo = tmp_path / "repo"
    repo.mkdir()
    _jsonl(repo / "train.jsonl", [{"problem": "train problem", "answer": "1"}])
    _jsonl(
        repo / "test.jsonl", [{"problem": "test problem", "answer": "2"}, {"problem": "t2", "answer": "3"}]
    )
    problems = load_math_problems(repo, split="test", limit=1, cache_dir=cache)
    assert [(p.problem, p.answer) for p in problems] == [("test problem", "2")]


def test_load_rows_limit_and_errors(tmp_path, cache):
    path = _jsonl(tmp_path / "rows.jsonl", [{"a": i} for i in range(5)])
    assert load_rows(path, limit=2, cache_dir=cache) == [{"a": 0}, {"a": 1}]
    with pytest.raises(FileNotFoundError, match="missing.jsonl' does not exist"):
        load_rows(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="`limit` must be a non-negative integer or None, got -1"):
        load_rows(path, limit=-1)
    (tmp_path / "rows.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match="must end in .jsonl, .json or .parquet"):
        load_rows(tmp_path / "rows.csv")


def test_missing_fields_name_the_columns(tmp_path, cache):
    path = _jsonl(tmp_path / "bad.jsonl", [{"text": "x", "label": "y"}])
    with pytest.raises(ValueError, match=r"no problem field found .* columns are \['label', 'text'\]"):
        load_math_problems(path, cache_dir=cache)
    with pytest.raises(ValueError, match="answer field 'nope' is not a column"):
        load_math_problems(path, problem_field="text", answer_field="nope", cache_dir=cache)
    empty = _jsonl(tmp_path / "empty_answer.jsonl", [{"problem": "p", "answer": ""}])
    with pytest.raises(ValueError, match="row 0: the answer \\('answer'\\) is empty"):
        load_math_problems(empty, cache_dir=cache)


def test_hotpotqa_hub_layout(tmp_path, cache):
    row = {
        "id": "5a8b57f25542995d1e6f1371",
        "question": "Which magazine was started first?",
        "answer": "Arthur's Magazine",
        "type": "comparison",
        "level": "medium",
        "supporting_facts": {
            "title": ["Arthur's Magazine", "First for Women", "Arthur's Magazine"],
            "sent_id": [0, 0, 1],
        },
        "context": {"title": ["Arthur's Magazine"], "sentences": [["Arthur's Magazine was ..."]]},
    }
    [example] = load_qa_examples(_jsonl(tmp_path / "hotpot.jsonl", [row]), cache_dir=cache)
    assert example == QAExample(
        "5a8b57f25542995d1e6f1371",
        "Which magazine was started first?",
        ("Arthur's Magazine",),
        ("Arthur's Magazine", "First for Women"),
    )


def test_2wiki_original_layout(tmp_path, cache):
    row = {
        "_id": "13f5ad2c088c11ebbd6fac1f6bf848b6",
        "type": "compositional",
        "question": "Who is the mother of the director of film Polish-Russian War?",
        "answer": "Małgorzata Braunek",
        "supporting_facts": [["Polish-Russian War (film)", 1], ["Xawery Żuławski", 2]],
        "context": [["Xawery Żuławski", ["Xawery Żuławski is a Polish film director."]]],
    }
    [example] = load_qa_examples(_jsonl(tmp_path / "2wiki.jsonl", [row]), cache_dir=cache)
    assert example.id == "13f5ad2c088c11ebbd6fac1f6bf848b6" and example.answers == ("Małgorzata Braunek",)
    assert example.supporting_titles == ("Polish-Russian War (film)", "Xawery Żuławski")


def test_search_r1_layout_with_golden_answer_lists(tmp_path, cache):
    path = tmp_path / "nq_hotpotqa.parquet"
    pq.write_table(
        pa.table(
            {
                "id": ["train_0"],
                "question": ["who sang x?"],
                "golden_answers": [["Alice", "Alice Cooper"]],
                "data_source": ["nq"],
            }
        ),
        path,
    )
    [example] = load_qa_examples(path, cache_dir=cache)
    assert example.answers == ("Alice", "Alice Cooper") and example.supporting_titles == ()


def test_squad_answers_dict(tmp_path, cache):
    path = _jsonl(
        tmp_path / "squad.jsonl",
        [{"id": "a", "question": "q?", "answers": {"text": ["x", "y"], "answer_start": [0, 5]}}],
    )
    assert load_qa_examples(path, cache_dir=cache)[0].answers == ("x", "y")


def test_demo_set_is_consistent():
    corpus_path, _ = demo_paths()
    corpus = {row["id"]: row for row in map(json.loads, corpus_path.read_text().splitlines())}
    questions = load_demo_questions()
    raw = [json.loads(line) for line in demo_paths()[1].read_text().splitlines()]
    assert 30 <= len(corpus) <= 60 and 10 <= len(questions) <= 20
    for example, row in zip(questions, raw, strict=True):
        gold_ids = [hop["doc_id"] for hop in row["hops"]]
        assert len(gold_ids) == 2 and all(doc in corpus for doc in gold_ids)
        assert example.supporting_titles == tuple(corpus[doc]["title"] for doc in gold_ids)
        assert any(answer in corpus[gold_ids[1]]["text"] for answer in example.answers), example.id


def test_a_local_jsonl_loads_without_the_generating_split_bar(tmp_path, capfd):
    """Issue 54: the bar showed before every run and every trace-eval on a local file (even before an error)."""
    import datasets

    from trace_train.data.loading import load_rows

    was_on = datasets.is_progress_bar_enabled()
    datasets.enable_progress_bars()  # as in a fresh process (another test's cli may have turned them off)
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n')
    assert load_rows(path, cache_dir=tmp_path / "cache") == [{"a": 1}, {"a": 2}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{"b": "x"}\n')  # JSON objects whose columns differ: datasets fails while generating
    try:
        load_rows(bad, cache_dir=tmp_path / "cache")
    except ValueError:
        pass
    err = capfd.readouterr().err
    assert "Generating" not in err and "examples/s" not in err, err
    assert datasets.is_progress_bar_enabled()  # put back for the caller's own data sets
    if not was_on:
        datasets.disable_progress_bars()
