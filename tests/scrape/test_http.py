"""picker.scrape.http against a raw TCP server on 127.0.0.1 that answers exactly the bytes each test gives it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from picker.extproc import tls
from picker.scrape.errors import ScrapeError
from picker.scrape.http import MAX_HEAD_BYTES, MetricsClient

PAGE = b'vllm:num_requests_waiting{model_name="m"} 3\n'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)

# One answer per request: bytes to send, then whether to close the connection afterwards.
Answer = tuple[bytes, bool]


class RawServer:
    def __init__(self, answers: Callable[[int], Answer]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                data, close = self.answers(len(self.requests))
                writer.write(data)
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serving(
    answers: Callable[[int], Answer], *, tls_context: ssl.SSLContext | None = None
) -> AsyncIterator[RawServer]:
    server = RawServer(answers)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=tls_context)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
        await listener.wait_closed()


def client(cap: int = 4096) -> MetricsClient:
    return MetricsClient(max_response_bytes=cap, headers={"Accept": "text/plain", "Accept-Encoding": "identity"})


async def test_a_page_with_a_length_and_the_connection_kept() -> None:
    async with serving(lambda _: (OK, False)) as server:
        c = client()
        url = f"http://127.0.0.1:{server.port}/metrics?x=1"
        assert [await c.get(url) for _ in range(3)] == [PAGE] * 3
        await c.close()
    assert server.connections == 1
    assert server.requests[0].startswith(b"GET /metrics?x=1 HTTP/1.1\r\n")
    assert f"\r\nHost: 127.0.0.1:{server.port}\r\n".encode() in server.requests[0]
    assert b"\r\nAccept-Encoding: identity\r\n" in server.requests[0]


async def test_chunked_with_extensions_and_trailers() -> None:
    body = b"7;ext=1\r\nvllm:nu\r\n" + b"%x\r\n%s\r\n" % (len(PAGE) - 7, PAGE[7:]) + b"0\r\nX-Trailer: 1\r\n\r\n"
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    async with serving(lambda _: (answer, False)) as server:
        c = client()
        url = f"http://127.0.0.1:{server.port}/metrics"
        assert await c.get(url) == PAGE
        assert await c.get(url) == PAGE  # the trailers were consumed: the next answer parses
        await c.close()
    assert server.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAGE,  # no length: read to its end
        OK.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1),
    ],
    ids=["without-a-length", "connection-close"],
)
async def test_an_answer_that_ends_its_connection_is_not_kept(answer: bytes) -> None:
    async with serving(lambda _: (answer, True)) as server:
        c = client()
        url = f"http://127.0.0.1:{server.port}/metrics"
        assert await c.get(url) == PAGE
        assert await c.get(url) == PAGE
        await c.close()
    assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_retried_once_on_a_new_one() -> None:
    async with serving(lambda _: (OK, True)) as server:  # answers, then closes without saying so
        c = client()
        url = f"http://127.0.0.1:{server.port}/m"
        assert await c.get(url) == PAGE
        await asyncio.sleep(0.05)  # the close reaches the client's idle connection
        assert await c.get(url) == PAGE
        await c.close()
    assert server.connections == 2


@pytest.mark.parametrize(
    ("answer", "reason", "message"),
    [
        (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", "http", "HTTP 503 Service Unavailable"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", "too_large", "page of 5000 bytes exceeds 4096"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + (b"800\r\n" + b"x" * 2048 + b"\r\n") * 3,
            "too_large",
            "page exceeds 4096 bytes",
        ),
        (b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 5000, "too_large", "page exceeds 4096 bytes"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "connect", "not an HTTP/1.x answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "connect", "ended before its body"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "connect", "negative content-length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "connect", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "connect", "without a colon"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "connect", "ended inside its headers"),
    ],
)
async def test_bad_answers_are_scrape_errors(answer: bytes, reason: str, message: str) -> None:
    async with serving(lambda _: (answer, True)) as server:
        c = client()
        with pytest.raises(ScrapeError) as caught:
            await c.get(f"http://127.0.0.1:{server.port}/m")
        await c.close()
    assert caught.value.reason == reason
    assert message in caught.value.message


async def test_headers_over_the_limit_are_an_error() -> None:
    answer = b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n"
    async with serving(lambda _: (answer, True)) as server:
        c = client()
        with pytest.raises(ScrapeError, match="over 65536 bytes") as caught:
            await c.get(f"http://127.0.0.1:{server.port}/m")
        await c.close()
    assert caught.value.reason == "connect"


async def test_refused_is_an_oserror_for_the_poller_to_name() -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    with pytest.raises(ConnectionRefusedError):
        await client().get(f"http://127.0.0.1:{port}/m")


async def test_not_an_http_url() -> None:
    with pytest.raises(ScrapeError, match="not an http"):
        await client().get("ftp://127.0.0.1/metrics")


async def test_https_without_verifying_the_certificate(tmp_path: Path) -> None:
    pair = tls.self_signed(("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    async with serving(lambda _: (OK, False), tls_context=context) as server:
        c = client()
        url = f"https://127.0.0.1:{server.port}/metrics"
        assert await c.get(url) == PAGE
        assert await c.get(url) == PAGE
        await c.close()
    assert server.connections == 1


async def test_forget_closes_the_idle_connection() -> None:
    async with serving(lambda _: (OK, False)) as server:
        c = client()
        url = f"http://127.0.0.1:{server.port}/m"
        await c.get(url)
        c.forget(url)
        await c.get(url)
        await c.close()
    assert server.connections == 2
