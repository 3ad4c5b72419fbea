"""Real MCP servers on loopback for the tests, written with the ``mcp`` SDK's server side.

One ``MCPServer`` with a few tools, served over Streamable HTTP (``/mcp``) and over SSE (``/sse``) by
uvicorn in a thread each. A recorder in front of each app keeps the headers and JSON-RPC methods it
received, so tests can prove what reached the server (and what did not).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

HUGE_CHARS = 300_000
LEAKED = "k-very-secret-123"  # the credential tests send, which ``leak`` echoes


def make_server() -> MCPServer:
    server = MCPServer("gateway-test")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Repeat the text."""
        return text

    @server.tool()
    def boom() -> str:
        """Always fails."""
        raise ValueError("the tool broke")

    @server.tool()
    async def slow() -> str:
        """Takes far too long."""
        await anyio.sleep(20)
        return "late"

    @server.tool()
    def leak() -> str:
        """Fails, echoing the credential the test sends (a server that echoes credentials)."""
        raise ToolError(f"bad token {LEAKED}")

    @server.tool()
    def huge() -> str:
        """Returns far too much."""
        return "x" * HUGE_CHARS

    return server


@dataclass
class Recorder:
    """An ASGI app in front of another: the headers and JSON-RPC methods of every request."""

    app: Any
    headers: list[dict[str, str]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.headers.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})

        async def recv() -> Any:
            message = await receive()
            if message.get("type") == "http.request" and message.get("body"):
                try:
                    body = orjson.loads(message["body"])
                except orjson.JSONDecodeError:
                    body = None
                if isinstance(body, dict) and isinstance(body.get("method"), str):
                    self.methods.append(body["method"])
            return message

        await self.app(scope, recv, send)

    def count(self, method: str) -> int:
        return self.methods.count(method)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    url: str
    recorder: Recorder
    server: uvicorn.Server

    def stop(self) -> None:
        self.server.should_exit = True


def serve(app: Any, path: str) -> Served:
    recorder = Recorder(app)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(recorder, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    threading.Thread(target=server.run, name=f"mcp-{port}", daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the MCP server did not start")
        time.sleep(0.01)
    return Served(f"http://127.0.0.1:{port}{path}", recorder, server)


def serve_streamable_http() -> Served:
    return serve(make_server().streamable_http_app(), "/mcp")


def serve_sse() -> Served:
    return serve(make_server().sse_app(), "/sse")
