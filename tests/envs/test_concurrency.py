"""The tool environments are safe to step concurrently, as they declare: episodes run on many threads at
once score and observe exactly what they do one after another."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from trace_train.envs import is_concurrency_safe, make_env_factory
from trace_train.envs.bfcl import BfclEnv, bfcl_rows
from trace_train.envs.math_python import MathPythonEnv

from .scripted import CORPUS, DEMO, MATH, bfcl_actions, math_actions, play, qa_actions, tool_call

THREADS = 8


def _bfcl_episode(row: dict, truncate: bool) -> tuple[list[str], float]:
    """Play the ground truth (or all but its last call step) and return the observations and reward."""
    env = BfclEnv()
    env.reset(row)
    actions = bfcl_actions(row["id"])
    if truncate:
        last_call = max(i for i, a in enumerate(actions) if a != "Done.")
        actions = actions[:last_call] + actions[last_call + 1:]
    observations = [r.observation for r in play(env, actions)]
    return observations, env.verify()


def test_bfcl_episodes_on_many_threads_match_the_same_episodes_one_by_one():
    rows = [row for subset in ("base", "long_context", "miss_func", "miss_param")
            for row in [r for r in bfcl_rows() if r["id"].startswith(f"multi_turn_{subset}_")][:6]]
    jobs = [(row, truncate) for row in rows for truncate in (False, True)]
    serial = [_bfcl_episode(*job) for job in jobs]
    with ThreadPoolExecutor(THREADS) as pool:
        concurrent = list(pool.map(lambda job: _bfcl_episode(*job), jobs))
    assert concurrent == serial
    assert [reward for _, reward in serial[::2]] == [1.0] * len(rows)  # the ground truth passes


def _sandboxed_episode(i: int) -> tuple[str, float]:
    """A cell that writes a file named after the episode and lists its work directory, then an answer."""
    row, cells, answer = MATH[i % len(MATH)]
    env = MathPythonEnv()
    env.reset(row)
    code = f"open('episode_{i}', 'w').write('x')\nimport os\nprint(sorted(os.listdir('.')))"
    listing = env.step(tool_call("python", code=code)).observation
    play(env, math_actions(cells, answer))
    return listing, env.verify()


def test_sandboxed_episodes_on_many_threads_see_only_their_own_files_and_score_as_alone():
    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(_sandboxed_episode, range(2 * THREADS)))
    for i, (listing, reward) in enumerate(results):
        assert f"['episode_{i}']" in listing, listing
        assert reward == 1.0


@pytest.mark.parametrize("name", ["guess_number", "math_python", "bfcl"])
def test_the_tool_environments_declare_themselves_concurrency_safe(name):
    assert is_concurrency_safe(make_env_factory(name))


def test_search_episodes_on_many_threads_match_the_same_episodes_one_by_one():
    """One BM25 index shared by every episode, as the trainer's factory shares it; and the HTTP client."""
    from trace_train.envs.search_qa import SearchQAEnv
    from trace_train.tools.retrieval_server import make_server, serve_in_background
    from trace_train.tools.search import BM25Retriever, HttpRetriever, SearchTool

    retriever = BM25Retriever.from_jsonl(CORPUS)
    server = make_server(retriever, host="127.0.0.1", port=0)
    serve_in_background(server)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
        for search in (SearchTool(retriever, topk=3), SearchTool(HttpRetriever(url), topk=3)):
            def episode(question, search=search):
                env = SearchQAEnv(search)
                env.reset({"id": question["id"], "question": question["question"],
                           "answers": question["golden_answers"]})
                return [r.observation for r in play(env, qa_actions(question))], env.verify()

            jobs = DEMO * 2
            serial = [episode(q) for q in jobs]
            with ThreadPoolExecutor(THREADS) as pool:
                concurrent = list(pool.map(episode, jobs))
            assert concurrent == serial
            assert all(reward == 1.0 for _, reward in serial)
    finally:
        server.shutdown()
        server.server_close()
