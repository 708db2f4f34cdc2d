"""A Search-R1-compatible retrieval server over a local BM25 index (standard library HTTP server).

Serves ``POST /retrieve`` exactly as Search-R1's ``retrieval_server.py`` does (see ``search`` for the
protocol), so a model trained against it can later be pointed at a dense Wikipedia retriever unchanged.
Each returned document is ``{"id", "contents", "title", "text"}``. A missing or null ``topk`` means the
server's default. Bad requests get HTTP 400 with ``{"error": message}`` (a missing, non-numeric or
oversized ``Content-Length``, a body shorter than announced or not sent within ``request_timeout``
seconds, invalid UTF-8 or JSON, nesting deeper than ``bounded_json.MAX_DEPTH``, wrong fields, a ``topk``
above :data:`MAX_TOPK`, more than :data:`MAX_HITS` passages asked in all, more than :data:`MAX_QUERIES`
queries or one longer than :data:`MAX_QUERY_CHARS`: the work of one request is bounded); a request
line or headers that ``http.server`` cannot parse get its own 400, 414 or 431; other paths get 404; a
retriever that fails gets 500. Nothing a client sends prints a traceback: an error the handler did not
foresee is logged as one line.

Run it on a corpus (JSONL with id/title/text or id/contents)::

    python -m trace_train.tools.retrieval_server --corpus corpus.jsonl --port 8000
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from trace_train.tools import bounded_json
from trace_train.tools.search import BM25Retriever, Retriever

MAX_REQUEST_BYTES = 1 << 20
MAX_TOPK = 100
"""The most passages one query may ask for (Search-R1 asks for 3)."""
MAX_HITS = 10_000
"""The most passages one request may ask for, ``len(queries) * topk``: bounds the answer's size (a 1 MiB
request of one-letter queries would otherwise ask for gigabytes)."""
MAX_QUERIES = 256
"""The most queries one request may hold: with at most ``search.MAX_QUERY_TERMS`` distinct terms scored
per query, a request costs at most 256 x 64 term lookups (a 1 MiB request of 10 000 short queries took
17 s of the server's time)."""
MAX_QUERY_CHARS = 4096
"""The longest query, in characters (tokenising is linear in it; a model's search query is a line)."""


def make_server(
    retriever: Retriever, *, host: str = "127.0.0.1", port: int = 0, default_topk: int = 3,
    request_timeout: float = 30.0,
) -> ThreadingHTTPServer:
    """A server bound to ``host:port`` (port 0 picks a free one: see ``server.server_address``).

    ``request_timeout`` bounds each socket read of a connection, so a client that stops sending frees
    its thread.
    """
    if not isinstance(default_topk, int) or isinstance(default_topk, bool) or not 1 <= default_topk <= MAX_TOPK:
        raise ValueError(f"`default_topk` must be an integer from 1 to {MAX_TOPK}, got {default_topk!r}")
    timeout = request_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"`request_timeout` must be a positive number of seconds, got {request_timeout!r}")

    class Handler(_RetrieveHandler):
        pass

    Handler.retriever, Handler.default_topk, Handler.timeout = retriever, default_topk, request_timeout
    server = _Server((host, port), Handler)
    server.daemon_threads = True
    return server


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """One line on stderr instead of ``socketserver``'s traceback."""
        error = sys.exc_info()[1]
        print(f"retrieval server: request from {client_address[0]} failed: {type(error).__name__}: {error}",
              file=sys.stderr, flush=True)


def serve_in_background(server: ThreadingHTTPServer) -> threading.Thread:
    """Start ``server.serve_forever`` in a daemon thread; stop it with ``server.shutdown()``."""
    thread = threading.Thread(target=server.serve_forever, name="retrieval-server", daemon=True)
    thread.start()
    return thread


class _RetrieveHandler(BaseHTTPRequestHandler):
    retriever: Retriever
    default_topk: int

    def do_POST(self):
        if self.path.rstrip("/") != "/retrieve":
            return self._send(404, {"error": f"unknown path {self.path!r}; use POST /retrieve"})
        declared = (self.headers.get("Content-Length") or "").strip()
        if not declared.isascii() or not declared.isdigit() or not 0 < int(declared) <= MAX_REQUEST_BYTES:
            return self._send(400, {"error": f"Content-Length must be a number of bytes from 1 to "
                                             f"{MAX_REQUEST_BYTES}, got {declared[:32]!r}"})
        try:
            body = self.rfile.read(int(declared))
        except TimeoutError:
            body = b""
        if len(body) < int(declared):
            return self._send(400, {"error": f"the body is shorter than its Content-Length ({declared})"})
        try:
            queries, topk, scores = _validate(bounded_json.loads(body), self.default_topk)
        except ValueError as error:
            return self._send(400, {"error": str(error)})
        try:
            ranked = self.retriever.search(queries, topk=topk)
        except Exception as error:  # the retriever's failure is the server's, reported, never a traceback
            return self._send(500, {"error": f"retrieval failed: {type(error).__name__}: {error}"})
        result = [[_entry(hit, scores) for hit in hits] for hits in ranked]
        return self._send(200, {"result": result})

    def do_GET(self):
        self._send(404, {"error": "use POST /retrieve"})

    def log_message(self, format, *args):  # silence per-request logging
        pass

    def _send(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if status != 200:  # the request may not have been read to its end
            self.close_connection = True


def _validate(request, default_topk: int) -> tuple[list[str], int, bool]:
    if not isinstance(request, dict):
        raise ValueError("the request must be a JSON object")
    queries = request.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError('"queries" must be a list of strings')
    if len(queries) > MAX_QUERIES:
        raise ValueError(f'{len(queries)} queries in one request; at most {MAX_QUERIES}')
    longest = max((len(q) for q in queries), default=0)
    if longest > MAX_QUERY_CHARS:
        raise ValueError(f'a query of {longest} characters; at most {MAX_QUERY_CHARS}')
    topk = request.get("topk")
    topk = default_topk if topk is None else topk
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f'"topk" must be an integer from 1 to {MAX_TOPK}, got {str(topk)[:32]}')
    if len(queries) * topk > MAX_HITS:
        raise ValueError(f'{len(queries)} queries of "topk" {topk} ask for more than {MAX_HITS} passages')
    scores = request.get("return_scores", False)
    if not isinstance(scores, bool):
        raise ValueError('"return_scores" must be true or false')
    return queries, topk, scores


def _entry(hit, with_score: bool) -> dict:
    passage = hit.passage
    document = {"id": passage.id, "contents": passage.contents, "title": passage.title, "text": passage.text}
    return {"document": document, "score": hit.score} if with_score else document


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="JSONL corpus (id/title/text or id/contents)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--topk", type=int, default=3, help="default number of passages per query")
    args = parser.parse_args(argv)
    server = make_server(
        BM25Retriever.from_jsonl(args.corpus), host=args.host, port=args.port, default_topk=args.topk
    )
    host, port = server.server_address[:2]
    print(f"serving {args.corpus} at http://{host}:{port}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
