"""Search: BM25 over the demo corpus, and the Search-R1 HTTP protocol against real loopback servers."""

import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trace_train.data.qa import demo_paths, load_demo_questions
from trace_train.tools.retrieval_server import make_server, serve_in_background
from trace_train.tools.search import (
    BM25Retriever,
    HttpRetriever,
    Passage,
    RetrieverError,
    SearchTool,
    format_hits,
    load_corpus,
)
from trace_train.verifiers.qa import exact_match

CORPUS, QUESTIONS = demo_paths()
HOPS = [json.loads(line) for line in QUESTIONS.read_text().splitlines()]


@pytest.fixture(scope="module")
def bm25():
    return BM25Retriever.from_jsonl(CORPUS)


@pytest.fixture(scope="module")
def server_url(bm25):
    server = make_server(bm25, default_topk=2)
    serve_in_background(server)
    host, port = server.server_address[:2]
    yield f"http://{host}:{port}/retrieve"
    server.shutdown()
    server.server_close()


def _post(url, payload):
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("row", HOPS, ids=[row["id"] for row in HOPS])
def test_scripted_queries_retrieve_the_gold_passages_first(bm25, row):
    for hop in row["hops"]:
        [hits] = bm25.search([hop["query"]], topk=3)
        assert hits[0].passage.id == hop["doc_id"], (hop, [h.passage.id for h in hits])


def test_scripted_search_agent_reaches_reward_one(bm25):
    """Two searches, then answer with the gold answer found verbatim in the second hop's top passage."""
    tool = SearchTool(bm25, topk=3)
    for example, row in zip(load_demo_questions(), HOPS, strict=True):
        observations = [tool(hop["query"]) for hop in row["hops"]]
        answer = next(a for a in example.answers if a in observations[1].split("\n")[0])
        assert exact_match(answer, example.answers) == 1.0


def test_results_are_ranked_limited_and_only_matching(bm25):
    [hits] = bm25.search(["clock"], topk=2)
    assert len(hits) == 2 and hits[0].score >= hits[1].score > 0
    assert all("clock" in (h.passage.title + h.passage.text).lower() for h in hits)
    assert bm25.search(["zebra xylophone", "the of and"], topk=3) == [[], []]
    assert len(bm25.search(["river"], topk=100)[0]) <= len(bm25.passages)


def test_corpus_layouts_and_errors(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"id": 1, "title": "A", "text": "alpha"}\n\n{"id": "2", "contents": "\\"B b\\"\\nbeta text"}\n'
    )
    assert load_corpus(path) == [Passage("1", "A", "alpha"), Passage("2", "B b", "beta text")]
    assert Passage("2", "B b", "beta text").contents == '"B b"\nbeta text'
    path.write_text('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n')
    with pytest.raises(ValueError, match="passage ids must be unique"):
        load_corpus(path)
    path.write_text('{"id": 1, "title": "t"}\n')
    with pytest.raises(ValueError, match='c.jsonl:1: passage 1 needs "text"'):
        load_corpus(path)
    with pytest.raises(ValueError, match="`passages` must not be empty"):
        BM25Retriever([])


def test_format_is_search_r1s(bm25):
    [hits] = bm25.search(["Maren Osk born"], topk=1)
    assert format_hits(hits) == (
        'Doc 1(Title: "Maren Osk") Maren Osk (1790-1862) was a clockmaker and engineer. '
        "She was born in the fishing town of Havrelund and later ran a workshop in the "
        "capital."
    )


def test_http_client_matches_local_bm25(bm25, server_url):
    queries = [hop["query"] for row in HOPS for hop in row["hops"]] + ["zebra"]
    remote = HttpRetriever(server_url).search(queries, topk=3)
    local = bm25.search(queries, topk=3)
    assert [[(h.passage, round(h.score, 5)) for h in hits] for hits in remote] == [
        [(h.passage, round(h.score, 5)) for h in hits] for hits in local
    ]


def test_server_speaks_the_search_r1_protocol(server_url):
    with_scores = _post(server_url, {"queries": ["tidal clock"], "topk": 1, "return_scores": True})
    [[entry]] = with_scores["result"]
    assert set(entry) == {"document", "score"} and entry["document"]["id"] == "d01"
    assert entry["document"]["contents"].startswith('"Tidal clock"\n')
    plain = _post(server_url, {"queries": ["tidal clock", "Lake Ormen"], "topk": None})
    assert [[doc["id"] for doc in docs] for docs in plain["result"]][0][0] == "d01"
    assert all(len(docs) == 2 and "score" not in docs[0] for docs in plain["result"])


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"queries": "tidal"}, '"queries" must be a list of strings'),
        ({"queries": ["x"], "topk": -2}, '"topk" must be an integer from 1 to 100, got -2'),
        ({"queries": ["x"], "return_scores": "yes"}, '"return_scores" must be true or false'),
        ([1, 2], "the request must be a JSON object"),
    ],
)
def test_server_rejects_bad_requests(server_url, payload, message):
    with pytest.raises(urllib.error.HTTPError) as info:
        _post(server_url, payload)
    assert info.value.code == 400 and json.loads(info.value.read())["error"] == message


def test_server_unknown_path(server_url):
    with pytest.raises(urllib.error.HTTPError) as info:
        _post(server_url.replace("/retrieve", "/search"), {"queries": []})
    assert info.value.code == 404


def test_failures_become_observations():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused = SearchTool(HttpRetriever(f"http://127.0.0.1:{port}/retrieve", timeout=2))
    assert refused("anything").startswith("Error: search failed: retrieval server unreachable")
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/retrieve"
        observation = SearchTool(HttpRetriever(url, timeout=0.5))("anything")
    assert observation.startswith("Error: search failed:") and "timed out" in observation
    assert (
        SearchTool(HttpRetriever("http://127.0.0.1:1/retrieve"))("  ") == "Error: the search query is empty."
    )


class _Garbage(BaseHTTPRequestHandler):
    body = b""

    def do_POST(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "invalid JSON"),
        (b'{"result": []}', '"result" with 1 lists'),
        (b'{"result": [[{"document": {"contents": "x"}, "score": 1}]]}', "sent a malformed result"),
    ],
)
def test_malformed_server_answers_become_errors(body, message):
    handler = type("Handler", (_Garbage,), {"body": body})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RetrieverError, match=message):
            HttpRetriever(f"http://127.0.0.1:{server.server_address[1]}/retrieve").search(["q"], topk=1)
    finally:
        server.shutdown()
        server.server_close()


def test_server_command_line(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trace_train.tools.retrieval_server",
            "--corpus",
            str(CORPUS),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == f"serving {CORPUS} at http://127.0.0.1:{port}/retrieve"
        [hits] = HttpRetriever(f"http://127.0.0.1:{port}/retrieve").search(["Lake Ormen outflow"], topk=1)
        assert hits[0].passage.id == "d05"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_inputs_are_validated(bm25):
    with pytest.raises(ValueError, match="wrap a single query in a list"):
        bm25.search("tidal clock")
    with pytest.raises(ValueError, match="`topk` must be a positive integer, got 0"):
        bm25.search(["x"], topk=0)
    with pytest.raises(ValueError, match="`url` must be an http"):
        HttpRetriever("localhost:8000")
    with pytest.raises(ValueError, match="`topk` must be a positive integer"):
        SearchTool(bm25, topk=0)
    with pytest.raises(ValueError, match="`default_topk` must be an integer from 1 to 100"):
        make_server(bm25, default_topk=0)
