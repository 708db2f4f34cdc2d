"""Multi-hop QA with search: scripted queries find the gold passages; rewards; snapshots never re-query."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_train.data.qa import QAExample
from trace_train.envs.search_qa import NO_ACTION, QAState, SearchQAEnv, qa_rows
from trace_train.tools.budget import BUDGET_EXHAUSTED
from trace_train.tools.retrieval_server import make_server, serve_in_background
from trace_train.tools.search import BM25Retriever, HttpRetriever, SearchTool
from trace_train.verifiers.qa import REWARDS, f1_match

from .scripted import CORPUS, DEMO, TITLES, play, qa_actions, tool_call


def row_of(question: dict) -> dict:
    return {"id": question["id"], "question": question["question"], "answers": question["golden_answers"]}


@pytest.fixture(scope="module")
def search():
    return SearchTool(BM25Retriever.from_jsonl(CORPUS), topk=3)


@pytest.mark.parametrize("question", DEMO, ids=[q["id"] for q in DEMO])
def test_the_right_queries_retrieve_the_gold_passages_and_the_right_answer_scores_one(search, question):
    env = SearchQAEnv(search)
    messages = env.reset(row_of(question))
    assert messages[1]["content"] == question["question"] and '"name": "search"' in messages[0]["content"]
    results = play(env, qa_actions(question))
    for hop, result in zip(question["hops"], results):
        assert result.role == "tool" and not result.done and not result.invalid
        assert f'Doc 1(Title: "{TITLES[hop["doc_id"]]}")' in result.observation
    assert results[-1].done and env.verify() == 1.0
    assert env.metrics() == {"exact_match": 1.0, "f1_match": 1.0, "token_f1": 1.0, "answered": 1.0,
                             "searches": 2.0}


@pytest.mark.parametrize("reward, expected", [("exact_match", 0.0), ("token_f1", 2 / 3)])
def test_reward_options(search, reward, expected):
    env = SearchQAEnv(search, reward=reward)
    env.reset({"question": "Where is Corwin Hale buried?", "answers": ["Elmsford Abbey"]})
    env.step("<answer>Elmsford</answer>")  # precision 1, recall 1/2: token F1 2/3, above 0.3
    assert env.verify() == pytest.approx(expected)
    assert env.binary_rewards == (reward != "token_f1")


def test_snapshots_hold_the_observations_and_restoring_never_queries_again(search):
    """Over a real HTTP retriever: after the server is gone, a restored episode continues unharmed."""
    server = make_server(search.retriever, default_topk=3)
    serve_in_background(server)
    host, port = server.server_address[:2]
    question = DEMO[0]
    env = SearchQAEnv(SearchTool(HttpRetriever(f"http://{host}:{port}/retrieve", timeout=30.0)))
    env.reset(row_of(question))
    actions = qa_actions(question)
    first = env.step(actions[0])
    snapshot = env.snapshot()
    second = env.step(actions[1])
    server.shutdown()
    server.server_close()
    assert snapshot.searches == ((question["hops"][0]["query"], first.observation),)
    fresh = SearchQAEnv(SearchTool(HttpRetriever(f"http://{host}:{port}/retrieve", timeout=30.0)))
    fresh.restore(env.snapshot())
    assert fresh.snapshot().searches[-1] == (question["hops"][1]["query"], second.observation)
    assert fresh.step(actions[2]).done and fresh.verify() == 1.0
    fresh.restore(snapshot)  # a branch that searches now: the retriever is down, which is an observation
    down = fresh.step(actions[1])
    assert down.observation.startswith("Error: search failed: retrieval server unreachable") and not down.done


def test_budget_malformed_calls_and_missing_answers_are_observations(search):
    env = SearchQAEnv(search, max_searches=1, observation_role="user")
    env.reset(row_of(DEMO[1]))
    first = env.step(tool_call("search", query="pendulum lantern"))
    assert first.observation.startswith("<tool_response>\nDoc 1")
    over = env.step(tool_call("search", query="Ivo Tarrant") + tool_call("lookup", query="x"))
    assert over.invalid and over.observation == (
        f"<tool_response>\n{BUDGET_EXHAUSTED}\n</tool_response>\n"
        "<tool_response>\nError: there is no tool 'lookup'; the only tool is 'search'.\n</tool_response>")
    plain = env.step("Korsbek")  # an answer without the tag is not an answer
    assert plain.observation == NO_ACTION and plain.invalid and plain.role == "user"
    assert env.snapshot() == QAState(DEMO[1]["question"], ("Korsbek",), env.snapshot().searches, None)
    assert len(env.snapshot().searches) == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(list("<>/{}\":, ab") + ["tool_call", "answer", "search", "query", "\n"]),
                max_size=40))
def test_no_action_raises(search, pieces):
    env = SearchQAEnv(search)
    env.reset(row_of(DEMO[0]))
    result = env.step("".join(pieces))
    assert result.observation and env.verify() in (0.0, 1.0)


def test_rows_and_arguments_are_validated(search):
    rows = qa_rows([QAExample("q", "Who?", ("A", "B"))])
    assert rows == [{"id": "q", "question": "Who?", "answers": ["A", "B"]}]
    env = SearchQAEnv(search)
    with pytest.raises(ValueError, match="'answers'"):
        env.reset({"question": "Who?", "answers": []})
    with pytest.raises(ValueError, match="'question'"):
        env.reset({"query": "Who?", "answers": ["A"]})
    assert env.reset({"question": "Who?", "answers": "A"}) and env.snapshot().answers == ("A",)
    with pytest.raises(ValueError, match="reward"):
        SearchQAEnv(search, reward="accuracy")
    with pytest.raises(ValueError, match="SearchTool"):
        SearchQAEnv(search.retriever)


def test_the_scripted_expert_solves_every_demo_question_by_searching_its_supporting_titles(search):
    from trace_train.data.qa import load_demo_questions
    from trace_train.envs.search_qa import qa_demonstration

    rows = qa_rows(load_demo_questions())
    assert all(row["supporting_titles"] for row in rows)
    for row in rows:
        env = SearchQAEnv(search)
        env.reset(row)
        actions = qa_demonstration(row)
        results = [env.step(action) for action in actions]
        assert [r.done for r in results] == [False] * (len(actions) - 1) + [True]
        assert env.verify() == 1.0 and [q for q, _ in env.state.searches] == row["supporting_titles"]
    bare = {"id": "q", "question": "Who built the tidal clock?", "answers": ["Maren Osk"]}  # no titles named
    assert qa_demonstration(bare) == [tool_call("search", query="Who built the tidal clock?"),
                                      "<answer>Maren Osk</answer>"]


@pytest.mark.parametrize("hedge, gold", [("yes no", "yes"), ("yes no", "no"), ("of", "Duke of York"),
                                         ("Paris London Berlin Rome", "Berlin")])
def test_no_training_reward_pays_a_hedged_answer_as_much_as_the_right_one(search, hedge, gold):
    """Issue 52, item 4: listing candidates (or a lone common word) never earns the right answer's reward;
    f1_match, which paid hedges 1, is refused as a reward (it stays a reported metric)."""
    for reward in REWARDS:
        env = SearchQAEnv(search, reward=reward)
        env.reset({"question": "q?", "answers": [gold]})
        env.step(f"<answer>{hedge}</answer>")
        hedged = env.verify()
        env.reset({"question": "q?", "answers": [gold]})
        env.step(f"<answer>{gold}</answer>")
        assert hedged < env.verify() == 1.0, (reward, hedge, gold, hedged)
    with pytest.raises(ValueError, match="'f1_match' pays hedged answers"):
        SearchQAEnv(search, reward="f1_match")
    assert f1_match(hedge, gold) == 1.0  # the reported metric is the paper's, hedges and all


def test_the_qa_preset_trains_on_exact_match():
    import yaml

    from trace_train.config_loader import PRESET_DIR

    preset = yaml.safe_load(open(PRESET_DIR / "qa_qwen3_14b.yaml"))
    assert preset["task"]["env"]["reward"] == "exact_match"
