"""Hostile retrieval servers and hostile clients, over real loopback sockets.

The client side: every way a server can misbehave (invalid UTF-8, a truncated body, a non-HTTP banner,
an over-long header, deeply nested JSON, an oversized answer or passage, a server that trickles bytes)
becomes an ``Error: search failed: ...`` observation, and a trickling server cannot hold a request past
its deadline. The server side: every malformed request gets a 4xx answer and nothing prints a
traceback. Servers here answer a bounded number of connections and stop by themselves.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import pytest

from trace_train.data.qa import demo_paths
from trace_train.tools.retrieval_server import (MAX_HITS, MAX_REQUEST_BYTES, MAX_TOPK, make_server,
                                                serve_in_background)
from trace_train.tools.search import (MAX_QUERY_TERMS, BM25Retriever, HttpRetriever, RetrieverError, SearchTool,
                                      load_corpus)

CORPUS, _ = demo_paths()


def _response(body: bytes, *head: str) -> bytes:
    lines = ["HTTP/1.1 200 OK", *head] if not head or not head[0].startswith("HTTP/") else list(head)
    if not any(line.lower().startswith(("content-length", "transfer-encoding")) for line in lines):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _answer(document: dict) -> bytes:
    return json.dumps({"result": [[{"document": document, "score": 1.0}]]}).encode()


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


@contextmanager
def scripted_server(chunks: list[bytes], *, interval: float = 0.0):
    """A loopback server that answers one connection by sending ``chunks``, ``interval`` seconds apart,
    then closes. Yields the URL and the list of chunk sizes it managed to send."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    sent: list[int] = []

    def serve():
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            try:
                _read_request(conn)
                for chunk in chunks:
                    conn.sendall(chunk)
                    sent.append(len(chunk))
                    time.sleep(interval)
            except OSError:  # the client gave up and closed
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/retrieve", sent
    finally:
        listener.close()
        thread.join(timeout=30)


HOSTILE = {
    "invalid UTF-8": ([_response(b'{"result": [[{"document": "\xff\xfe"}]]}')], "not valid UTF-8"),
    "truncated body": ([_response(b'{"result": [', "HTTP/1.1 200 OK", "Content-Length: 500")],
                       "truncated body"),
    "non-HTTP banner": ([b"SSH-2.0-OpenSSH_9.6\r\n"], "did not answer in HTTP"),
    "over-long header": ([b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 200_000 + b"\r\n\r\n{}"],
                         "response headers longer than"),
    "deeply nested JSON": ([_response(b"[" * 30_000 + b"]" * 30_000)], "nested deeper than 32 levels"),
    "nested passage id": ([_response(_answer({"id": json.loads("[" * 40 + "]" * 40), "contents": "x"}))],
                          "nested deeper than 32 levels"),
    "oversized Content-Length": ([_response(b"{}", "HTTP/1.1 200 OK", "Content-Length: 999999999")],
                                 "exceeds the 65536-byte cap"),
    "oversized body without length": ([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b"x" * 200_000],
                                      "exceeds the 65536-byte cap"),
    "invalid Content-Length": ([_response(b"{}", "HTTP/1.1 200 OK", "Content-Length: -1")],
                               "invalid Content-Length"),
    "bad chunk size": ([_response(b"zz\r\n", "HTTP/1.1 200 OK", "Transfer-Encoding: chunked")],
                       "invalid chunk size"),
    "malformed header": ([b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"], "malformed header line"),
    "HTTP error": ([_response(b"{}", "HTTP/1.1 503 Service Unavailable")], "answered HTTP 503"),
    "closed without answer": ([], "closed the connection without answering"),
    "wrong layout": ([_response(b'{"result": [[{"document": 5, "score": 1}]]}')], "sent a malformed result"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_server_is_an_error_observation(name):
    chunks, message = HOSTILE[name]
    with scripted_server(chunks) as (url, _):
        retriever = HttpRetriever(url, timeout=5, max_response_bytes=65536)
        with pytest.raises(RetrieverError, match=message):
            retriever.search(["q"], topk=1)
    with scripted_server(chunks) as (url, _):
        observation = SearchTool(HttpRetriever(url, timeout=5, max_response_bytes=65536))("q")
    assert observation.startswith("Error: search failed: retrieval server") and message in observation


def test_a_trickling_server_cannot_hold_a_request_past_its_deadline():
    """A valid answer sent one byte every 0.25 s needs about 40 s; with ``timeout=1`` the client gives up
    after about 4 bytes (urllib reset its per-read timeout at every byte and waited for all of them)."""
    answer = _response(_answer({"id": "1", "contents": '"T"\nslow'}))
    with scripted_server([answer[i:i + 1] for i in range(len(answer))], interval=0.25) as (url, sent):
        observation = SearchTool(HttpRetriever(url, timeout=1.0))("q")
    assert observation == "Error: search failed: retrieval server timed out: no complete answer within 1 s."
    assert len(sent) < len(answer) // 4


def test_a_server_sending_more_passages_than_asked_shows_topk():
    many = json.dumps({"result": [[{"document": {"id": str(i), "contents": f'"T{i}"\nx'}, "score": 1.0}
                                   for i in range(500)]]}).encode()
    with scripted_server([_response(many)]) as (url, _):
        observation = SearchTool(HttpRetriever(url, timeout=5), topk=3)("q")
    assert observation.splitlines() == [f'Doc {i + 1}(Title: "T{i}") x' for i in range(3)]


def test_chunked_and_interim_answers_and_the_passage_cap():
    body = _answer({"id": "7", "contents": '"Title"\n' + "é" * 10_000})
    chunks = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:100], body[100:]))
    chunked = b"HTTP/1.1 100 Continue\r\n\r\n" + _response(chunks + b"0\r\n\r\n", "HTTP/1.1 200 OK",
                                                             "Transfer-Encoding: chunked")
    with scripted_server([chunked]) as (url, _):
        observation = SearchTool(HttpRetriever(url, timeout=5), max_passage_bytes=1000)("q")
    assert observation.startswith('Doc 1(Title: "Title") éé') and observation.endswith("é [truncated]")
    assert len(observation.encode()) < 1000 + 40


# ---------------------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server():
    server = make_server(BM25Retriever.from_jsonl(CORPUS), request_timeout=0.5)
    serve_in_background(server)
    yield server.server_address[:2]
    server.shutdown()
    server.server_close()


def _raw(address, data: bytes, *, half_close: bool = True) -> bytes:
    """Send ``data`` on a fresh connection; everything the server answers before closing."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _post(body: bytes, *headers: str) -> bytes:
    head = ["POST /retrieve HTTP/1.1", "Host: x", *headers]
    if not any(h.lower().startswith("content-length") for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


MALFORMED = {
    "non-numeric length": _post(b"{}", "Content-Length: abc"),
    "negative length": _post(b"{}", "Content-Length: -5"),
    "unicode digits length": _post(b"{}", "Content-Length: \u0663".encode().decode("latin-1")),
    "oversized length": _post(b"{}", f"Content-Length: {MAX_REQUEST_BYTES + 1}"),
    "no length": b"POST /retrieve HTTP/1.1\r\nHost: x\r\n\r\n",
    "short body": _post(b'{"queries": ["a"]}', "Content-Length: 100"),
    "invalid UTF-8": _post(b'{"queries": ["\xff"]}'),
    "deeply nested JSON": _post(b"[" * 100_000 + b"]" * 100_000),
    "huge integer": _post(b'{"queries": ["a"], "topk": ' + b"9" * 5000 + b"}"),
    "not an object": _post(b'["a"]'),
    "queries not strings": _post(b'{"queries": [1]}'),
    "float topk": _post(b'{"queries": ["a"], "topk": 1e10}'),
    "uncapped topk": _post(b'{"queries": ["a"], "topk": 1000000}'),
    "zero topk": _post(b'{"queries": ["a"], "topk": 0}'),
    "too many passages in all": _post(json.dumps({"queries": ["a"] * 101, "topk": 100}).encode()),
    "too many queries": _post(json.dumps({"queries": ["a b"] * 257, "topk": 1}).encode()),
    "10 000 short queries": _post(json.dumps({"queries": ["w"] * 10_000, "topk": 1}).encode()),
    "a very long query": _post(json.dumps({"queries": ["word " * 200_000], "topk": 1}).encode()),
    "garbage request line": b"POST /retrieve garbage HTTP/1.1\r\n\r\n",
    "over-long header": b"POST /retrieve HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n",
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_request_gets_a_client_error_and_no_traceback(name, server, capfd):
    answer = _raw(server, MALFORMED[name], half_close=name != "short body")
    status = int(answer.split(b" ", 2)[1])
    expected = 431 if name == "over-long header" else 400  # 431: http.server's own answer
    assert status == expected, answer[:200]
    if name not in ("garbage request line", "over-long header"):  # http.server's own HTML page
        assert "error" in json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert "Traceback" not in capfd.readouterr().err


def test_a_failing_retriever_is_a_500_not_a_traceback(capfd):
    class Broken(BM25Retriever):
        def search(self, queries, *, topk=3):
            raise MemoryError("index evicted")

    server = make_server(Broken.from_jsonl(CORPUS))
    serve_in_background(server)
    try:
        answer = _raw(server.server_address[:2], _post(b'{"queries": ["a"]}'))
    finally:
        server.shutdown()
        server.server_close()
    assert answer.startswith(b"HTTP/1.0 500") and b"retrieval failed: MemoryError: index evicted" in answer
    assert "Traceback" not in capfd.readouterr().err


def test_the_server_caps_topk_and_the_passages_of_one_request():
    assert (MAX_TOPK, MAX_HITS) == (100, 10_000)
    with pytest.raises(ValueError, match="`default_topk` must be an integer from 1 to 100"):
        make_server(BM25Retriever.from_jsonl(CORPUS), default_topk=MAX_TOPK + 1)


def test_a_deeply_nested_corpus_line_is_an_error_naming_the_line(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "title": "t", "text": "x"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"corpus.jsonl:2: JSON nested deeper than 32 levels"):
        load_corpus(corpus)
    corpus.write_text('{"id": "1", "text": ' + "[" * 20 + "1" + "]" * 20 + "}\n" + '{"x": "' + "y" * 10_000 + '"}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl:2: a passage needs an \"id\", got .{200}\.\.\.$"):
        load_corpus(corpus)


def test_repeating_a_query_word_changes_neither_its_score_nor_its_cost():
    bm25 = BM25Retriever.from_jsonl(CORPUS)
    [once] = bm25.search(["tidal clock"], topk=3)
    [repeated] = bm25.search([" ".join(["tidal clock"] * 50_000)], topk=3)
    assert once and [(h.passage.id, h.score) for h in repeated] == [(h.passage.id, h.score) for h in once]
    many = " ".join(sorted(bm25._index.vocab_dict))  # every term of the corpus at once
    assert len(bm25._index.vocab_dict) > MAX_QUERY_TERMS
    [capped] = bm25.search([many], topk=3)
    first = " ".join(list(dict.fromkeys(bm25_tokens(many)))[:MAX_QUERY_TERMS])
    assert [(h.passage.id, h.score) for h in capped] == [(h.passage.id, h.score) for h in
                                                         bm25.search([first], topk=3)[0]]


def bm25_tokens(text):
    import bm25s

    return bm25s.tokenize([text], stopwords="en", return_ids=False, show_progress=False)[0]
