"""Shared fixtures: a real gateway on a free 127.0.0.1 port, and the stream assertion every server test uses.

``gateway(registry_or_providers, **server_config)`` starts uvicorn (uvloop + httptools, as ``serve``
runs it) in a background thread and returns a :class:`Gateway` with ``base_url`` (``…/v1``, for SDKs)
and ``url(path)``; every server started is stopped at teardown. ``assert_valid_stream(events)`` runs
``protocol.checker.check`` in both profiles and fails with the violations listed (also importable as
``from conftest import check_stream``).

Tests marked ``model`` (the embedded model generating) run one at a time on the machine, whichever
test run they belong to (``one_embedded_model_at_a_time``).

Every test fails if a gateway it ran logged an exception that escaped the application (uvicorn's
"Exception in ASGI application"): uvicorn's own loggers do not propagate to pytest's capture, so without
this guard such an error is visible only on the terminal.
"""

from __future__ import annotations

import fcntl
import logging
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from responses_gateway.protocol.checker import check
from responses_gateway.protocol.sse import EventStreamDecoder
from responses_gateway.providers.base import Provider
from responses_gateway.server.app import GatewayApp
from responses_gateway.server.config import ServerConfig
from responses_gateway.server.http_protocol import GatewayHttpProtocol
from responses_gateway.server.registry import ModelRegistry
from responses_gateway.server.websocket import UVICORN_WS


@dataclass
class Gateway:
    """A running gateway."""

    app: GatewayApp
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    @property
    def registry(self) -> ModelRegistry:
        return self.app.registry

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def url(self, path: str) -> str:
        return f"{self.origin}{path}"

    def stop(self) -> None:
        """A graceful shutdown, as SIGTERM makes one; failing if the server has not stopped in 10 s
        (a connection it waits on for ever went unseen here once: the join timed out silently)."""
        self.server.should_exit = True
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the gateway did not shut down within 10 s"


class _UvicornErrors(logging.Handler):
    """The ERROR records of ``uvicorn.error`` (exceptions that escaped the application) logged by a
    gateway's thread (``gateway-<port>``, see ``start_gateway``).

    uvicorn's loggers are process-wide, so the fake servers the tests run beside the gateway (the MCP
    servers of ``mcp_servers``) log there too: the ``mcp`` SDK's own server raises ClosedResourceError
    when the gateway abandons a call to its ``slow`` tool, which is that SDK's noise, not ours.
    """

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if (record.threadName or "").startswith("gateway-"):
            self.records.append(record)

    def attach(self) -> None:
        # uvicorn.Config applies uvicorn's logging configuration, which removes this handler again.
        logger = logging.getLogger("uvicorn.error")
        if self not in logger.handlers:
            logger.addHandler(self)


UVICORN_ERRORS = _UvicornErrors()


@pytest.fixture(autouse=True)
def no_escaped_exceptions() -> Iterator[None]:
    """Fail the test if a gateway logged an exception that escaped the application during it."""
    UVICORN_ERRORS.attach()
    UVICORN_ERRORS.records.clear()
    yield
    escaped = list(UVICORN_ERRORS.records)
    UVICORN_ERRORS.records.clear()
    if escaped:
        pytest.fail(
            "a gateway logged an error: "
            + "; ".join(
                f"{r.getMessage()} ({r.exc_info[0].__name__ if r.exc_info and r.exc_info[0] else '-'})"
                for r in escaped
            )
        )


# Machine-wide: any two test runs on this machine share its cores (`make test` runs two at once).
MODEL_LOCK = Path(tempfile.gettempdir()) / "rg-embedded-model-tests.lock"


@pytest.fixture(autouse=True)
def one_embedded_model_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests marked ``model`` take turns with those of any other run on the machine.

    llama.cpp's threads spin at their barriers: two processes generating at once on two cores took
    ten times as long (72 s against 7 for one test when `make test` ran its two builds side by side).
    """
    if request.node.get_closest_marker("model") is None:
        yield
        return
    with MODEL_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_gateway(
    models: ModelRegistry | Iterable[Provider],
    *,
    preload: bool = False,
    http: dict[str, Any] | None = None,
    tracer_provider: Any = None,
    keep_alive: int = 5,
    **config: Any,
) -> Gateway:
    """Start a gateway serving ``models`` (a registry, or providers registered under their names), with
    the HTTP protocol ``serve`` runs (``http``: its head/body timeouts and connection limit;
    ``keep_alive``: uvicorn's idle limit between requests, in seconds)."""
    if isinstance(models, ModelRegistry):
        registry = models
    else:
        registry = ModelRegistry()
        for provider in models:
            registry.add(provider)
    app = GatewayApp(registry, ServerConfig(**config), preload=preload, tracer_provider=tracer_provider)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            loop="uvloop",
            http=GatewayHttpProtocol.configured(**(http or {})),
            ws=UVICORN_WS,
            lifespan="on",
            access_log=False,
            log_level="warning",
            timeout_keep_alive=keep_alive,
        )
    )
    UVICORN_ERRORS.attach()
    thread = threading.Thread(target=server.run, name=f"gateway-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.01)
    return Gateway(app, server, thread, port)


@pytest.fixture
def gateway() -> Iterator[Callable[..., Gateway]]:
    """A factory: ``gateway([ScriptedProvider(...)], keepalive="ping")`` -> a running Gateway."""
    started: list[Gateway] = []

    def factory(models: ModelRegistry | Iterable[Provider], **kwargs: Any) -> Gateway:
        gw = start_gateway(models, **kwargs)
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.stop()


def decode_sse(body: bytes) -> list[dict[str, Any]]:
    """The events of a complete SSE body."""
    decoder = EventStreamDecoder()
    return decoder.feed(body) + decoder.flush()


def stream_events(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """POST ``body`` (stream: true) and return the decoded events, asserting SSE framing headers."""
    with httpx.Client(timeout=30) as client:
        response = client.post(url, json=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        return decode_sse(response.content)


def check_stream(events: list[dict[str, Any]], *, strict: bool = True) -> None:
    """Assert that ``events`` pass protocol.checker (``openai`` profile, and ``strict-spec`` if strict)."""
    # The strict Open Responses profile knows only core items and ``response.reasoning.*`` raw
    # reasoning; streams with extension items (custom tool calls, reasoning_text) pass strict=False.
    for profile in ("openai", "strict-spec") if strict else ("openai",):
        violations = check(events, profile=profile)
        assert not violations, f"{profile}: " + "\n".join(str(v) for v in violations)


# Kept for modules that imported the first name.
_assert_valid_stream = check_stream


@pytest.fixture
def assert_valid_stream() -> Callable[..., None]:
    """``assert_valid_stream(events, strict=True)``: the stream passes protocol.checker."""
    return check_stream
