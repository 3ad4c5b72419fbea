"""The lean upstream HTTP/1.1 client (providers/http1.py) against a raw TCP server that writes exact bytes.

What an upstream can send on the wire (lengths, chunks, close-delimited bodies, gzip, interim answers,
garbage) and what a pool must do with its connections (reuse, the stale keep-alive race, expiry,
back-pressure), through ``Transport`` as the providers use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest

from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.transport import Timeouts, Transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


class RawServer:
    """Accepts connections; for each request on a connection calls ``handler(reader, writer, n)`` (n counts
    requests over the server's life) until it returns False. Records every request it read."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[bytes, dict[str, str], bytes]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, *rest = head.decode("latin-1").split("\r\n")
                headers = {}
                for h in rest:
                    if h:
                        name, _, value = h.partition(":")
                        key = name.strip().lower()
                        # A repeated header shows as both values (as a proxy would fold them).
                        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append((line.encode(), headers, body))
                if not await self.handler(reader, writer, len(self.requests)):
                    return
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def pair(handler: Handler, **transport: Any) -> AsyncIterator[tuple[RawServer, Transport]]:
    """A raw server and a Transport pointed at it (closed afterwards)."""
    async with RawServer(handler) as srv:
        client = Transport(**transport)
        try:
            yield srv, client
        finally:
            await client.aclose()


def reply(body: bytes, *, headers: str = "", status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body


def chunked(*pieces: bytes, headers: str = "") -> bytes:
    out = f"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n{headers}\r\n"
    data = out.encode()
    for p in pieces:
        data += b"%x\r\n%s\r\n" % (len(p), p)
    return data + b"0\r\n\r\n"


async def read_all(transport: Transport, url: str, body: Any = None) -> tuple[int, bytes, list[bytes]]:
    resp = await transport.post(
        url, {"authorization": "Bearer sk-test", "accept": "text/event-stream"}, body or {"x": 1}
    )
    pieces = [c async for c in resp.iter_chunks()]
    return resp.status, b"".join(pieces), pieces


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_lengths_chunks_and_keep_alive_reuse() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        if n % 2:
            writer.write(reply(b'{"n": %d}' % n, headers="Content-Type: application/json\r\n"))
        else:
            # Chunk boundaries and TCP writes split anywhere, even inside the chunk-size line.
            data = chunked(b"data: a\n\n", b"data: b", b"\n\n")
            for i in range(0, len(data), 7):
                writer.write(data[i : i + 7])
                await writer.drain()
        return True

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            assert await read_all(transport, srv.url) == (200, b'{"n": 1}', [b'{"n": 1}'])
            status, body, _ = await read_all(transport, srv.url)
            assert (status, body) == (200, b"data: a\n\ndata: b\n\n")
            resp = await transport.post(srv.url, {}, {"y": 2})
            assert resp.headers["content-type"] == "application/json"
            assert resp.headers["Content-Type"] == "application/json"  # any case
            assert await resp.json() == {"n": 3}
            assert srv.connections == 1  # every request on one kept-alive connection
            assert transport.idle_connections() == 1
            line, headers, body = srv.requests[0]
            assert line == b"POST /v1/chat/completions HTTP/1.1"
            assert headers["accept"] == "text/event-stream"  # the provider's, not beside a default
            assert headers["host"] == f"127.0.0.1:{srv.port}"
            assert headers["content-type"] == "application/json"
            assert headers["authorization"] == "Bearer sk-test"
            assert orjson.loads(body) == {"x": 1}

    run(go())


def test_close_delimited_body_and_connection_close_are_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:  # neither length nor chunks: the body ends with the connection
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: x\n\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"data: y\n\n")
            return False
        writer.write(reply(b"ok", headers="Connection: close\r\n"))
        return False

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            assert (await read_all(transport, srv.url))[:2] == (200, b"data: x\n\ndata: y\n\n")
            assert (await read_all(transport, srv.url))[:2] == (200, b"ok")
            assert srv.connections == 2
            await asyncio.sleep(0.05)
            assert transport.idle_connections() == 0

    run(go())


def test_gzip_body_and_interim_answer() -> None:
    payload = b"".join(b'data: {"i": %d}\n\n' % i for i in range(300))
    packed = gzip.compress(payload)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n")
        half = len(packed) // 2
        writer.write(chunked(packed[:half], packed[half:], headers="Content-Encoding: gzip\r\n"))
        return True

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            resp = await transport.post(srv.url, {}, {})
            assert resp.status == 200
            assert "link" not in resp.headers
            assert b"".join([c async for c in resp.iter_chunks()]) == payload
            assert "gzip" in srv.requests[0][1]["accept-encoding"]

    run(go())


def test_malformed_answer_is_502_naming_it() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        return False

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            await transport.post(srv.url, {}, {})

    with pytest.raises(ProviderError) as info:
        run(go())
    assert info.value.status == 502
    assert "malformed HTTP response" in info.value.message


def test_cut_mid_body_is_502_and_the_connection_is_dropped() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ndata: partial")
        return False

    async def go() -> bytes:
        async with RawServer(handler) as srv:
            transport = Transport()
            got = b""
            try:
                resp = await transport.post(srv.url, {}, {})
                try:
                    async for chunk in resp.iter_chunks():
                        got += chunk
                finally:
                    assert got == b"data: partial"
                    assert transport.idle_connections() == 0
            finally:
                await transport.aclose()
            return got

    with pytest.raises(ProviderError) as info:
        run(go())
    assert info.value.status == 502
    assert "closed the connection mid-response" in info.value.message


def test_stale_keep_alive_connection_is_retried_once_on_a_new_one() -> None:
    """The upstream drops a kept-alive connection just as a request goes out on it (nothing answered):
    the request goes once more on a new connection. A connection that answered anything is never
    retried."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:
            return False  # read the request, close without a byte
        writer.write(reply(b"r%d" % n))
        return True

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            assert (await read_all(transport, srv.url))[1] == b"r1"
            assert (await read_all(transport, srv.url))[1] == b"r3"
            assert srv.connections == 2
            assert len(srv.requests) == 3

    run(go())


def test_stale_retry_never_takes_another_pooled_connection() -> None:
    """An upstream that answers once per connection and closes it at the next request, without
    ``Connection: close``: every pooled connection is stale. The retry must open a new connection;
    taking the next pooled one failed 7-11 requests in 40 (issue 11)."""
    answered: set[asyncio.StreamWriter] = set()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        if writer in answered:
            return False  # the second request on a connection: closed without a byte
        answered.add(writer)
        writer.write(reply(b"ok"))
        return True

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            # Four at once leave four pooled connections, all stale from now on.
            got = await asyncio.gather(*(read_all(transport, srv.url) for _ in range(4)))
            assert [g[1] for g in got] == [b"ok"] * 4
            for _ in range(36):
                assert (await read_all(transport, srv.url))[1] == b"ok"

    run(go())


def test_fresh_connection_closed_without_answer_is_not_retried() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        return False

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            with pytest.raises(ProviderError) as info:
                await transport.post(srv.url, {}, {})
            assert info.value.status == 502
            assert len(srv.requests) == 1

    run(go())


def test_idle_connections_expire_after_the_keepalive_time() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(reply(b"ok"))
        return True

    async def go() -> None:
        async with pair(handler, keepalive=0.2) as (srv, transport):
            await read_all(transport, srv.url)
            assert transport.idle_connections() == 1
            await asyncio.sleep(0.5)
            assert transport.idle_connections() == 0  # closed by the sweep, not only skipped
            await read_all(transport, srv.url)
            assert srv.connections == 2

    run(go())


def test_total_timeout_is_504() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(100):  # keeps sending, so only the total limit can stop it
            writer.write(b"9\r\ndata: x\n\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)
        return False

    async def go() -> None:
        async with pair(handler, timeouts=Timeouts(read=1.0, total=0.3)) as (srv, transport):
            resp = await transport.post(srv.url, {}, {})
            async for _ in resp.iter_chunks():
                pass

    with pytest.raises(ProviderError) as info:
        run(go())
    assert info.value.status == 504


def test_a_slow_reader_pauses_the_socket_and_loses_nothing() -> None:
    piece = b"data: " + b"x" * 4090 + b"\n\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(chunked(*([piece] * 500)))  # ~2 MB at once
        await writer.drain()
        return True

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            resp = await transport.post(srv.url, {}, {})
            total = 0
            biggest = 0
            async for chunk in resp.iter_chunks():
                total += len(chunk)
                biggest = max(biggest, len(chunk))
                await asyncio.sleep(0.002)
            assert total == len(piece) * 500
            # What is held for a reader that is behind stays bounded (the socket was paused).
            assert biggest < 1 << 20
            assert transport.idle_connections() == 1

    run(go())


def test_header_with_a_line_break_is_refused_without_showing_its_value() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(reply(b"ok"))
        return True

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            with pytest.raises(ValueError) as info:
                await transport.post(srv.url, {"authorization": "Bearer sk-x\r\nX-Evil: 1"}, {})
            assert "sk-x" not in str(info.value)
            assert srv.requests == []

    run(go())


def _tls_files(tmp: Any) -> tuple[str, str, str]:
    """A CA and a server certificate for localhost / 127.0.0.1 signed by it (PEM paths)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("test CA"))
        .issuer_name(name("test CA"))
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem, cert_pem, key_pem = tmp / "ca.pem", tmp / "cert.pem", tmp / "key.pem"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(ca_pem), str(cert_pem), str(key_pem)


def test_https_verifies_the_certificate(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``https`` upstreams are verified against the system's CAs (here: a test CA named by
    SSL_CERT_FILE, which OpenSSL reads as the default store); an unknown issuer is a 502."""
    import ssl

    ca, cert, key = _tls_files(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(chunked(b"data: secure\n\n"))
        await writer.drain()

    async def go() -> tuple[bytes, ProviderError]:
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        try:
            monkeypatch.setenv("SSL_CERT_FILE", ca)
            trusting = Transport()
            try:
                body = (await read_all(trusting, f"https://localhost:{port}/v1/responses"))[1]
            finally:
                await trusting.aclose()
            monkeypatch.delenv("SSL_CERT_FILE")
            strict = Transport()
            try:
                with pytest.raises(ProviderError) as info:
                    await strict.post(f"https://127.0.0.1:{port}/v1/responses", {}, {})
            finally:
                await strict.aclose()
            return body, info.value
        finally:
            server.close()

    body, error = run(go())
    assert body == b"data: secure\n\n"
    assert error.status == 502
    assert "SSLCertVerificationError" in error.message


def test_pump_over_a_gzip_body_decodes_and_can_stop() -> None:
    """A compressed body is pumped from the task (decoded as it goes); StopPumping ends it cleanly."""
    from responses_gateway.providers.transport import StopPumping

    payload = b"".join(b'data: {"i": %d}\n\n' % i for i in range(2000))
    packed = gzip.compress(payload)
    third = len(packed) // 3

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(
            chunked(
                packed[:third],
                packed[third : 2 * third],
                packed[2 * third :],
                headers="Content-Encoding: gzip\r\n",
            )
        )
        return True

    async def go() -> None:
        async with pair(handler) as (srv, transport):
            got: list[bytes] = []
            await (await transport.post(srv.url, {}, {})).pump(got.append)
            assert b"".join(got) == payload
            assert transport.idle_connections() == 1  # read to its end: kept

            def stop(chunk: bytes) -> None:
                raise StopPumping

            await (await transport.post(srv.url, {}, {})).pump(stop)  # returns: stopping is no error
            assert (await read_all(transport, srv.url))[1] == payload  # and the pool still serves

    run(go())
