"""Search for the multi-hop QA environment: local BM25 (``bm25s``) or a Search-R1 HTTP retriever.

Both retrievers implement ``search(queries, *, topk) -> list[list[SearchHit]]`` (one ranked list per
query, best first) and hold no per-episode state, so an environment's snapshot needs nothing from them.
:class:`SearchTool` turns one query into the observation string the model reads, in Search-R1's
format (``Doc 1(Title: "...") text``), and turns every failure into an ``Error: ...`` observation.

Corpus files are JSONL, one passage per line, either ``{"id", "title", "text"}`` or Search-R1's
``{"id", "contents"}`` where ``contents`` is ``'"Title"\\ntext'`` (the wiki-18 layout).

Hostile data is bounded: a corpus line nesting deeper than ``bounded_json.MAX_DEPTH`` is an error naming
its line, and a BM25 query is scored on its distinct terms (first :data:`MAX_QUERY_TERMS` of them), so
repeating a word neither multiplies its score nor the time a query takes.

The Search-R1 retrieval protocol: ``POST /retrieve`` with ``{"queries": [str, ...], "topk": int,
"return_scores": bool}``; the answer is ``{"result": [[{"document": {"id", "contents", ...}, "score":
float}, ...], ...]}``, one list per query (with ``return_scores`` false each entry is the document
itself). ``retrieval_server`` serves a local corpus with it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import bm25s

from . import bounded_json
from .http_client import Endpoint, HttpFailure, post_json

MAX_QUERY_TERMS = 64
"""Distinct terms of one query that BM25 scores (Search-R1's queries have about 10)."""


@dataclass(frozen=True)
class Passage:
    """One corpus passage."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Search-R1's ``contents`` field: the quoted title, a newline, the text."""
        return f'"{self.title}"\n{self.text}'

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Passage:
        """Build from ``{"id", "title", "text"}`` or ``{"id", "contents"}``."""
        if not isinstance(record, dict) or "id" not in record:
            raise ValueError(f'a passage needs an "id", got {_short(record)}')
        if "contents" in record and "text" not in record:
            title, _, text = str(record["contents"]).partition("\n")
            return cls(str(record["id"]), title.strip().strip('"'), text)
        if "text" not in record:
            raise ValueError(f'passage {record["id"]!r} needs "text" (and "title") or "contents"')
        return cls(str(record["id"]), str(record.get("title", "")), str(record["text"]))


@dataclass(frozen=True)
class SearchHit:
    passage: Passage
    score: float


class Retriever(Protocol):
    def search(self, queries: Sequence[str], *, topk: int = 3) -> list[list[SearchHit]]: ...


class RetrieverError(RuntimeError):
    """The retriever could not answer (connection, HTTP status, malformed response)."""


def load_corpus(path: str | os.PathLike) -> list[Passage]:
    """Read a JSONL corpus; ids must be unique."""
    passages = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    passages.append(Passage.from_record(bounded_json.loads(line)))
                except ValueError as error:
                    raise ValueError(f"{path}:{number}: {error}") from None
    ids = [passage.id for passage in passages]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: passage ids must be unique")
    return passages


class BM25Retriever:
    """Okapi BM25 (Lucene variant, ``bm25s``) over title + text, lower-cased, English stopwords removed.

    Only passages sharing at least one term with the query are returned (score > 0).
    """

    def __init__(self, passages: Sequence[Passage], *, k1: float = 1.5, b: float = 0.75):
        if not passages:
            raise ValueError("`passages` must not be empty")
        self.passages = list(passages)
        self._index = bm25s.BM25(k1=k1, b=b)
        tokens = bm25s.tokenize(
            [f"{p.title} {p.text}" for p in self.passages], stopwords="en", show_progress=False
        )
        self._index.index(tokens, show_progress=False)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, **kwargs) -> BM25Retriever:
        return cls(load_corpus(path), **kwargs)

    def search(self, queries: Sequence[str], *, topk: int = 3) -> list[list[SearchHit]]:
        queries = _check_queries(queries, topk)
        tokens = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
        known = [_distinct(t for t in query if t in self._index.vocab_dict) for query in tokens]
        results: list[list[SearchHit]] = [[] for _ in queries]
        asked = [i for i, query in enumerate(known) if query]
        if asked:
            k = min(topk, len(self.passages))
            documents, scores = self._index.retrieve([known[i] for i in asked], k=k, show_progress=False)
            for row, i in enumerate(asked):
                results[i] = [
                    SearchHit(self.passages[int(d)], float(s))
                    for d, s in zip(documents[row], scores[row], strict=True)
                    if s > 0
                ]
        return results


class HttpRetriever:
    """Client of a Search-R1 retrieval server (``url`` ends in ``/retrieve``); see :mod:`.http_client`.

    Every request has one overall deadline of ``timeout`` seconds (connecting, sending, and reading the
    whole answer, however slowly the server sends it) and reads at most ``max_response_bytes`` of body.
    Every failure (connection, timeout, a non-HTTP or malformed answer, an HTTP error status, invalid
    UTF-8 or JSON, nesting deeper than ``bounded_json.MAX_DEPTH``, an unexpected layout) raises
    :class:`RetrieverError`, which :class:`SearchTool` shows the model. The client holds no state
    between requests (one connection per request), so threads may share it.
    """

    def __init__(self, url: str, *, timeout: float = 10.0, max_response_bytes: int = 4 << 20):
        self.endpoint = Endpoint.parse(url)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"`timeout` must be a positive number of seconds, got {timeout!r}")
        cap = max_response_bytes
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"`max_response_bytes` must be a positive integer, got {max_response_bytes!r}")
        self.url, self.timeout, self.max_response_bytes = url, float(timeout), max_response_bytes

    def search(self, queries: Sequence[str], *, topk: int = 3) -> list[list[SearchHit]]:
        queries = _check_queries(queries, topk)
        body = json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()
        try:
            status, answer = post_json(self.endpoint, body, timeout=self.timeout,
                                       max_body_bytes=self.max_response_bytes)
        except HttpFailure as error:
            raise RetrieverError(str(error)) from None
        if status != 200:
            raise RetrieverError(f"retrieval server answered HTTP {status}")
        try:
            payload = bounded_json.loads(answer)
        except ValueError as error:
            raise RetrieverError(f"retrieval server sent {error}") from None
        return _parse_response(payload, len(queries))


class SearchTool:
    """The search tool of an episode: one query in, one observation string out, never raises.

    At most ``topk`` passages are shown, each cut to ``max_passage_bytes`` of UTF-8 (Search-R1's wiki-18
    passages are about 700 bytes, so the default cuts only what a misbehaving back end sends).
    """

    def __init__(self, retriever: Retriever, *, topk: int = 3, max_passage_bytes: int = 4096):
        if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
            raise ValueError(f"`topk` must be a positive integer, got {topk!r}")
        cap = max_passage_bytes
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"`max_passage_bytes` must be a positive integer, got {max_passage_bytes!r}")
        self.retriever, self.topk, self.max_passage_bytes = retriever, topk, max_passage_bytes

    def __call__(self, query: str) -> str:
        if not isinstance(query, str) or not query.strip():
            return "Error: the search query is empty."
        try:
            [hits] = self.retriever.search([query.strip()], topk=self.topk)
        except RetrieverError as error:
            return f"Error: search failed: {error}."
        hits = hits[: self.topk]  # a server may send more than asked
        return format_hits(hits, max_passage_bytes=self.max_passage_bytes) if hits else "No results found."


def format_hits(hits: Sequence[SearchHit], *, max_passage_bytes: int | None = None) -> str:
    """Search-R1's rendering: ``Doc i(Title: <first line of contents>) <rest>``, one line per hit.

    With ``max_passage_bytes``, each hit's contents are cut to that many bytes of UTF-8 (at a character
    boundary) and marked ``[truncated]``.
    """
    lines = []
    for number, hit in enumerate(hits, 1):
        title, _, text = _cut(hit.passage.contents, max_passage_bytes).partition("\n")
        lines.append(f"Doc {number}(Title: {title}) {text}")
    return "\n".join(lines)


def _cut(text: str, max_bytes: int | None) -> str:
    encoded = text.encode("utf-8", errors="replace")
    if max_bytes is None or len(encoded) <= max_bytes:
        return text
    return encoded[:max_bytes].decode("utf-8", errors="ignore") + " [truncated]"


def _distinct(terms) -> list[str]:
    """The first :data:`MAX_QUERY_TERMS` distinct ``terms``, in order."""
    return list(dict.fromkeys(terms))[:MAX_QUERY_TERMS]


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_queries(queries: Sequence[str], topk: int) -> list[str]:
    if isinstance(queries, str) or not all(isinstance(q, str) for q in queries):
        raise ValueError("`queries` must be a sequence of str (wrap a single query in a list)")
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"`topk` must be a positive integer, got {topk!r}")
    return list(queries)


def _parse_response(payload: Any, expected: int) -> list[list[SearchHit]]:
    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, list) or len(result) != expected:
        raise RetrieverError(f'retrieval server response needs "result" with {expected} lists')
    try:
        return [
            [SearchHit(Passage.from_record(item["document"]), float(item["score"])) for item in ranked]
            for ranked in result
        ]
    except (KeyError, TypeError, ValueError) as error:
        raise RetrieverError(f"retrieval server sent a malformed result ({error})") from None
