"""A small HTTP/1.1 POST client with one deadline per request and a cap on what it reads.

``urllib``'s ``timeout`` bounds each socket operation, not the request: a server that sends one byte
every two seconds holds it forever, and its parser raises ``http.client`` exceptions (a non-HTTP banner,
an over-long header) that are neither ``URLError`` nor ``OSError``. Here every socket operation gets the
time left until the request's deadline, the response head is capped at :data:`MAX_HEAD_BYTES` and the
body at ``max_body_bytes``, and every failure is an :class:`HttpFailure` with a one-line reason.

One connection per request (``Connection: close``); ``Content-Length``, chunked and read-to-close bodies
are understood. ``https`` URLs use the default TLS context. Name resolution (``getaddrinfo``) is the one
step the deadline cannot interrupt; use an IP address where that matters.
"""

from __future__ import annotations

import re
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["MAX_HEAD_BYTES", "Endpoint", "HttpFailure", "post_json"]

MAX_HEAD_BYTES = 64 << 10
_STATUS = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9])(?: [^\r\n]*)?")
_CHUNK = 64 << 10


class HttpFailure(Exception):
    """The request failed; the message says how (for an observation or a log line)."""


@dataclass(frozen=True)
class Endpoint:
    """Where to POST: ``http(s)://host[:port]/path``."""

    tls: bool
    host: str
    port: int
    target: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Split ``url``, or a ValueError naming what is wrong with it."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"`url` must be an http(s) URL, got {url!r}")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"`url` has an invalid port: {url!r}") from None
        if not parts.hostname or any(c in url for c in "\r\n \t"):
            raise ValueError(f"`url` must name a host and contain no whitespace, got {url!r}")
        tls = parts.scheme == "https"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(tls, parts.hostname, port or (443 if tls else 80), target)


def post_json(endpoint: Endpoint, body: bytes, *, timeout: float, max_body_bytes: int) -> tuple[int, bytes]:
    """POST ``body`` as JSON; the final status and the response body, all within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    try:
        with _connect(endpoint, deadline) as sock:
            host = endpoint.host if ":" not in endpoint.host else f"[{endpoint.host}]"
            head = (f"POST {endpoint.target} HTTP/1.1\r\nHost: {host}:{endpoint.port}\r\n"
                    f"Content-Type: application/json\r\nAccept: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            _send(sock, head.encode("latin-1") + body, deadline)
            reader = _Reader(sock, deadline)
            status, headers = reader.head()
            while 100 <= status < 200:  # interim answers (100 Continue) precede the real one
                status, headers = reader.head()
            return status, reader.body(headers, max_body_bytes)
    except TimeoutError:
        raise HttpFailure(f"retrieval server timed out: no complete answer within {timeout:g} s") from None
    except (OSError, UnicodeError) as error:  # refused, reset, unreachable, TLS errors
        raise HttpFailure(f"retrieval server unreachable ({error})") from None


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _connect(endpoint: Endpoint, deadline: float) -> socket.socket:
    sock = socket.create_connection((endpoint.host, endpoint.port), timeout=_left(deadline))
    if not endpoint.tls:
        return sock
    try:
        sock.settimeout(_left(deadline))
        return ssl.create_default_context().wrap_socket(sock, server_hostname=endpoint.host)
    except BaseException:
        sock.close()
        raise


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        sock.settimeout(_left(deadline))
        view = view[sock.send(view):]


class _Reader:
    """Buffered reads from ``sock``, each bounded by the time left to ``deadline``."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.deadline, self.buffer, self.closed = sock, deadline, bytearray(), False

    def _more(self) -> None:
        self.sock.settimeout(_left(self.deadline))
        data = self.sock.recv(_CHUNK)
        self.closed = not data
        self.buffer += data

    def _take(self, n: int) -> bytes:
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    def until(self, marker: bytes, limit: int, what: str) -> bytes:
        """Bytes up to and without ``marker`` (consumed), at most ``limit`` of them."""
        start = 0
        while (found := self.buffer.find(marker, start)) < 0:
            if len(self.buffer) > limit:
                raise HttpFailure(f"retrieval server sent {what} longer than {limit} bytes")
            if self.closed:
                raise HttpFailure(f"retrieval server closed the connection in the middle of {what}")
            start = max(0, len(self.buffer) - len(marker) + 1)
            self._more()
        if found > limit:
            raise HttpFailure(f"retrieval server sent {what} longer than {limit} bytes")
        line = self._take(found)
        self._take(len(marker))
        return line

    def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n and not self.closed:
            self._more()
        if len(self.buffer) < n:
            raise HttpFailure(f"retrieval server sent a truncated body ({len(self.buffer)} of {n} bytes)")
        return self._take(n)

    def head(self) -> tuple[int, dict[str, str]]:
        """Status code and headers (lower-cased names) of the next response head."""
        if not self.buffer and not self.closed:
            self._more()
        if not self.buffer:
            raise HttpFailure("retrieval server closed the connection without answering")
        if not self.buffer.startswith(b"HTTP/"[: len(self.buffer)]):
            start = bytes(self.buffer[:32])
            raise HttpFailure(f"retrieval server did not answer in HTTP (it sent {start!r})")
        lines = self.until(b"\r\n\r\n", MAX_HEAD_BYTES, "response headers").split(b"\r\n")
        status = _STATUS.fullmatch(lines[0])
        if status is None:
            raise HttpFailure(f"retrieval server did not answer in HTTP (status line {lines[0][:64]!r})")
        headers = {}
        for line in lines[1:]:
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon or not name.strip():
                raise HttpFailure(f"retrieval server sent a malformed header line {line[:64]!r}")
            headers[name.strip().lower()] = value.strip()
        return int(status.group(1)), headers

    def body(self, headers: dict[str, str], cap: int) -> bytes:
        """The body the headers announce: chunked, of ``Content-Length`` bytes, or up to the close."""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._chunked(cap)
        if "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise HttpFailure(f"retrieval server sent an invalid Content-Length {length[:32]!r}")
            if int(length) > cap:
                raise HttpFailure(f"retrieval server answer of {length} bytes exceeds the {cap}-byte cap")
            return self.exactly(int(length))
        while not self.closed and len(self.buffer) <= cap:
            self._more()
        if len(self.buffer) > cap:
            raise HttpFailure(f"retrieval server answer exceeds the {cap}-byte cap")
        return self._take(len(self.buffer))

    def _chunked(self, cap: int) -> bytes:
        out = bytearray()
        while True:
            size_line = self.until(b"\r\n", 1024, "a chunk size line").split(b";")[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise HttpFailure(f"retrieval server sent an invalid chunk size {size_line[:32]!r}") from None
            if size == 0:
                return bytes(out)
            if size < 0 or len(out) + size > cap:
                raise HttpFailure(f"retrieval server answer exceeds the {cap}-byte cap")
            out += self.exactly(size)
            if self.exactly(2) != b"\r\n":
                raise HttpFailure("retrieval server sent a malformed chunk")
