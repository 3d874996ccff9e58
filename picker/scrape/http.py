"""The scrape loop's HTTP client: GET of ``/metrics`` pages over keep-alive HTTP/1.1 connections.

Why not aiohttp, which picker uses everywhere else: a poll through its client costs about a third more CPU
(docs/performance.md, "Scraping"), paid per endpoint and interval in every worker. A poll needs little of a general
client: one GET on a connection kept per endpoint, a status line, a few headers, a body of known length or chunked.
This module does that and nothing else, on asyncio streams, with the same limits (``max_response_bytes`` for the
body, 64 KiB for the head) and without redirects, cookies or proxies (no metrics server sends a redirect).
``https`` URLs connect with TLS and do not verify certificates (the reference's ``insecureSkipVerify: true``).

Errors: ``ScrapeError("http", ...)`` for a status other than 200, ``("too_large", ...)`` for a page over the cap,
``("connect", ...)`` for an answer that is not HTTP/1.x or ends early; ``OSError`` (``ConnectionRefusedError``
among them) from connecting is left to the caller, which maps it to ``refused`` or ``connect``. A connection the
server closed while idle (its keep-alive timeout) is noticed when the next answer is empty, and that GET is
retried once on a new connection, as aiohttp does. The caller bounds each GET in time (``asyncio.timeout``); a
connection interrupted mid-answer is closed, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from picker.scrape.errors import ScrapeError

__all__ = ["MAX_HEAD_BYTES", "MetricsClient"]

MAX_HEAD_BYTES = 64 * 1024
_READ_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    tls: bool
    request: bytes  # the whole GET, ready to write


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter


class MetricsClient:
    """GETs ``/metrics`` pages, keeping one idle connection per URL between polls."""

    def __init__(self, *, max_response_bytes: int, headers: dict[str, str]) -> None:
        self._cap = max_response_bytes
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._targets: dict[str, _Target] = {}
        self._idle: dict[str, _Connection] = {}
        self._tls: ssl.SSLContext | None = None

    async def get(self, url: str) -> bytes:
        """The body of a 200 answer to GET ``url``. Raises ``ScrapeError`` or ``OSError`` (see the module)."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = self._parse(url)
        conn = self._idle.pop(url, None)
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect(target)
            try:
                body, keep = await self._exchange(conn, target)
                break
            except (_Stale, ConnectionResetError, BrokenPipeError) as exc:
                conn.writer.close()
                if not reused:  # a new connection gave no answer: not an idle one the server closed
                    if isinstance(exc, _Stale):
                        raise ScrapeError("connect", "the server closed the connection without an answer") from exc
                    raise
                conn, reused = None, False  # closed by the server while idle: once more, on a new one
            except BaseException:
                conn.writer.close()
                raise
        if keep:
            self._idle[url] = conn
        else:
            conn.writer.close()
        return body

    def forget(self, url: str) -> None:
        """Close the idle connection of ``url`` (an endpoint that left the pool)."""
        self._targets.pop(url, None)
        conn = self._idle.pop(url, None)
        if conn is not None:
            conn.writer.close()

    async def close(self) -> None:
        conns = list(self._idle.values())
        self._idle.clear()
        for conn in conns:
            conn.writer.close()
        for conn in conns:
            with contextlib.suppress(OSError):  # ssl.SSLError is one
                await conn.writer.wait_closed()

    def _parse(self, url: str) -> _Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ScrapeError("connect", f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        try:
            port = parts.port or (443 if tls else 80)
        except ValueError as exc:
            raise ScrapeError("connect", f"bad port in {url!r}") from exc
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        head = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc.rpartition('@')[2]}\r\n{self._headers}\r\n"
        return _Target(parts.hostname, port, tls, head.encode("latin-1"))

    async def _connect(self, target: _Target) -> _Connection:
        tls: ssl.SSLContext | None = None
        if target.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
                self._tls.check_hostname = False
                self._tls.verify_mode = ssl.CERT_NONE
            tls = self._tls
        reader, writer = await asyncio.open_connection(
            target.host, target.port, ssl=tls, server_hostname=target.host if tls else None, limit=MAX_HEAD_BYTES
        )
        return _Connection(reader, writer)

    async def _exchange(self, conn: _Connection, target: _Target) -> tuple[bytes, bool]:
        """One GET on ``conn``: (body, whether the connection may be used again)."""
        conn.writer.write(target.request)
        reader = conn.reader
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _Stale from exc
            raise ScrapeError("connect", "the answer ended inside its headers") from exc
        except asyncio.LimitOverrunError as exc:
            raise ScrapeError("connect", f"answer headers over {MAX_HEAD_BYTES} bytes") from exc
        status, keep, length, chunked = _read_head(head)
        if status != 200:
            raise ScrapeError("http", _status_text(head))
        try:
            if chunked:
                return await self._read_chunked(reader), keep
            if length is not None:
                if length > self._cap:
                    raise ScrapeError("too_large", f"page of {length} bytes exceeds {self._cap}")
                return await reader.readexactly(length), keep
            return await self._read_to_end(reader), False
        except asyncio.IncompleteReadError as exc:
            raise ScrapeError("connect", "the answer ended before its body did") from exc

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        body = bytearray()
        while True:
            try:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0].strip(), 16)
            except (asyncio.LimitOverrunError, ValueError) as exc:
                raise ScrapeError("connect", "bad chunk size in the answer") from exc
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                    pass
                return bytes(body)
            if len(body) + size > self._cap:
                raise ScrapeError("too_large", f"page exceeds {self._cap} bytes")
            body += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise ScrapeError("connect", "bad chunk end in the answer")

    async def _read_to_end(self, reader: asyncio.StreamReader) -> bytes:
        body = bytearray()
        while chunk := await reader.read(_READ_CHUNK):
            body += chunk
            if len(body) > self._cap:
                raise ScrapeError("too_large", f"page exceeds {self._cap} bytes")
        return bytes(body)


class _Stale(Exception):
    """A kept connection gave no answer at all: the server closed it while it was idle."""


def _status_text(head: bytes) -> str:
    """``HTTP <code> <reason>`` of an answer's head, for the error message."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    _, _, rest = line.partition(" ")
    return f"HTTP {rest}".rstrip()


def _read_head(head: bytes) -> tuple[int, bool, int | None, bool]:
    """(status, keep-alive, content-length, chunked) of an answer's head. Raises ``ScrapeError``."""
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise ScrapeError("connect", f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    status = int(parts[1])
    keep = parts[0] != b"HTTP/1.0"
    length: int | None = None
    chunked = False
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ScrapeError("connect", "a header line without a colon in the answer")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError as exc:
                raise ScrapeError("connect", "a bad content-length in the answer") from exc
            if length < 0:
                raise ScrapeError("connect", "a negative content-length in the answer")
        elif name == b"transfer-encoding":
            chunked = value.strip().lower().endswith(b"chunked")
        elif name == b"connection":
            tokens = value.strip().lower()
            if b"close" in tokens:
                keep = False
            elif b"keep-alive" in tokens:
                keep = True
    return status, keep, length, chunked
