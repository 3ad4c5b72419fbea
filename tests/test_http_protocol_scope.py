"""The request scope ``GatewayHttpProtocol`` builds: ``client``, ``server`` and ``scheme`` as uvicorn's
own protocol gives them (its ``connection_made`` reads the addresses its own, cheaper way), over IPv4,
IPv6 and a Unix socket, checked against the addresses the client's socket itself sees."""

from __future__ import annotations

import http.client
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from responses_gateway.server.http_protocol import GatewayHttpProtocol
from responses_gateway.server.types import Receive, Scope, Send


async def echo_scope(scope: Scope, receive: Receive, send: Send) -> None:
    """An ASGI app answering with what its scope says about the connection."""
    if scope["type"] != "http":
        return
    body = orjson.dumps(
        {"client": scope.get("client"), "server": scope.get("server"), "scheme": scope.get("scheme")}
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve(http: type[Any], **where: Any) -> Iterator[uvicorn.Server]:
    server = uvicorn.Server(
        uvicorn.Config(echo_scope, loop="uvloop", http=http, lifespan="off", log_level="warning", **where)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    yield server
    server.should_exit = True
    thread.join(timeout=10)


def free_port(family: socket.AddressFamily, host: str) -> int:
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def ask_tcp(family: socket.AddressFamily, host: str, port: int) -> tuple[dict[str, Any], Any, Any]:
    """GET over a socket of our own: the scope the server reported, and our socket's two addresses."""
    with socket.socket(family) as sock:
        sock.connect((host, port))
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.sock = sock
        conn.request("GET", "/")
        answer = orjson.loads(conn.getresponse().read())
        return answer, sock.getsockname(), sock.getpeername()


def has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("http", [GatewayHttpProtocol, HttpToolsProtocol], ids=["gateway", "uvicorn"])
@pytest.mark.parametrize(
    ("family", "host"),
    [
        (socket.AF_INET, "127.0.0.1"),
        pytest.param(
            socket.AF_INET6,
            "::1",
            marks=pytest.mark.skipif(not has_ipv6(), reason="no IPv6 loopback"),
        ),
    ],
    ids=["ipv4", "ipv6"],
)
def test_the_scope_names_both_ends_of_a_tcp_connection(
    http: type[Any], family: socket.AddressFamily, host: str
) -> None:
    port = free_port(family, host)
    for _ in serve(http, host=host, port=port):
        answer, mine, theirs = ask_tcp(family, host, port)
        assert answer["client"] == [mine[0], mine[1]]
        assert answer["server"] == [theirs[0], theirs[1]] == [host, port]
        assert answer["scheme"] == "http"


@pytest.mark.parametrize("http", [GatewayHttpProtocol, HttpToolsProtocol], ids=["gateway", "uvicorn"])
def test_the_scope_of_a_unix_socket_connection(http: type[Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gw.sock")
        for _ in serve(http, uds=path):
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(path)
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
            answer = orjson.loads(data.split(b"\r\n\r\n", 1)[1])
            # uvicorn's own protocol: the socket's path with no port, and no client address.
            assert answer == {"client": None, "server": [path, None], "scheme": "http"}
