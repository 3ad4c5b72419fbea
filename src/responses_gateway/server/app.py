"""The gateway as a raw ASGI app: routing, body limits, auth, validation, then the provider loop.

A framework would add a task group and per-request objects to every stream; the routes are few and
fixed, so a dict lookup on ``(method, path)`` is all the routing needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import orjson

from ..engine import HostedTool
from ..engine.tools import CodeInterpreter, ContainerPool, FileSearch
from ..engine.tools.mcp import McpLimits, McpTool
from ..engine.tools.web_search import WEB_SEARCH_TYPES, WebSearch
from ..netguard import NetGuard, NetPolicy
from ..providers.base import Provider
from ..redaction import REDACTOR, install_log_scrubbing
from ..retrieval.service import VectorStores
from ..sealing import SEAL_KEY_ENV, Sealer, load_sealer
from ..store import NotFound, Store, open_store
from .auth import APIKeyAuth
from .chat_completions import ChatCompletionsAPI
from .config import ServerConfig
from .containers import ContainersAPI
from .conversations import ConversationsAPI
from .embeddings import EmbeddingsAPI, models_file_embedders
from .errors import HTTPError, send_error, send_json
from .files import FilesAPI, FileStorage
from .gateway import GatewayAPI
from .messages import PREFIX as MESSAGES
from .messages import MessagesAPI, send_anthropic_error
from .metrics import CONTENT_TYPE, SHARE_INTERVAL, Metrics
from .registry import ModelRegistry
from .request_log import Observer
from .responses import ResponsesAPI
from .router import Router
from .streaming import GENERIC_FAILURE
from .types import Message, Receive, Scope, Send
from .ui import UI, is_ui_path
from .vector_stores import VectorStoresAPI
from .websocket import WebSocketAPI

__all__ = ["GatewayApp"]

log = logging.getLogger("responses_gateway.server")


class GatewayApp:
    """ASGI application serving the Responses API (HTTP and WebSocket mode), ``GET /v1/models`` and
    ``GET /health``.

    ``store`` is the open :class:`~responses_gateway.store.Store` (None before start-up, or when the
    config has no ``store_url``); :meth:`owner_for` names who owns what a request reads and writes.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        config: ServerConfig | None = None,
        *,
        preload: bool = False,
        tracer_provider: Any = None,
    ):
        """``tracer_provider``: an OpenTelemetry ``TracerProvider`` to send spans to (tests pass one
        with an in-memory exporter); without it ``config.traces`` decides (off by default)."""
        self.registry = registry
        self.config = config or ServerConfig()
        self._auth = APIKeyAuth(self.config.api_keys)
        self.metrics = Metrics() if self.config.metrics else None
        tracing = None
        if tracer_provider is not None or self.config.traces != "off":
            try:
                from .tracing import Tracing
            except ImportError:
                raise ValueError("traces need OpenTelemetry: pip install 'responses-gateway[otel]'") from None
            tracing = Tracing.create(self.config.traces, tracer_provider)
        self.observer = Observer(
            metrics=self.metrics,
            log_line=self.config.request_log,
            log_content=self.config.log_content,
            tracing=tracing,
        )
        REDACTOR.add(*self.config.api_keys)
        install_log_scrubbing()
        self._preload = preload
        self.store: Store | None = None
        self._sealer: Sealer | None = None
        # The tools the engine runs for back ends that cannot (engine/tools/): by tool type.
        data_dir = self.config.data_dir
        self.containers = ContainerPool(lambda: None if data_dir is None else Path(data_dir) / "containers")
        cfg = self.config
        self.net_guard = NetGuard(NetPolicy(cfg.tool_allow_hosts, cfg.tool_allow_networks))
        mcp = McpTool(
            {server.label: server for server in cfg.mcp_servers},
            self.net_guard,
            McpLimits(call_timeout=cfg.mcp_call_timeout, list_timeout=cfg.mcp_call_timeout),
        )
        for server in cfg.mcp_servers:  # the models file's MCP credentials are the gateway's secrets too
            REDACTOR.add(*(v.removeprefix("Bearer ") for v in server.headers.values()))
        search = WebSearch(cfg.search_backend, self.net_guard)
        secrets = getattr(cfg.search_backend, "secrets", None)
        if secrets is not None:
            REDACTOR.add(*secrets())
        self.hosted_tools: dict[str, HostedTool] = {
            "code_interpreter": CodeInterpreter(self.containers),
            "mcp": mcp,
            **dict.fromkeys(WEB_SEARCH_TYPES, search),
        }
        self.responses = ResponsesAPI(self)
        self.websockets = WebSocketAPI(self.responses)
        self.router = Router()
        self.router.add("/v1/responses", POST=self.responses.create)
        if self.metrics is not None:
            self.router.add("/metrics", GET=self._metrics)
        self.router.add("/v1/models", GET=self._list_models)
        self.router.add("/v1/models/{name:path}", GET=self._get_model)
        self.router.add("/health", GET=self._health)
        self.responses.register(self.router)
        self.chat_completions = ChatCompletionsAPI(self.responses)
        self.chat_completions.register(self.router)
        self.messages = MessagesAPI(self.responses)
        self.messages.register(self.router)
        # The endpoints that count their own HTTP request once their work ends, with the response's
        # own facts (request_log.py), so their send (the relay's hot path) is not wrapped.
        self._self_counted = (self.responses.create, self.chat_completions.create, self.messages.create)
        self.conversations = ConversationsAPI(
            lambda: self.store, self.owner_for, self.read_body, lambda: self.sealer
        )
        self.conversations.register(self.router)
        self.files = FilesAPI(
            lambda: self.store,
            FileStorage(lambda: None if data_dir is None else Path(data_dir) / "files"),
            self.owner_for,
            lambda: self.config.max_file_bytes,
        )
        self.files.register(self.router)
        self.containers.files = self._file_for_container
        self.containers_api = ContainersAPI(self.containers, self.owner_for, self.read_body)
        self.containers_api.register(self.router)
        self.gateway_api = GatewayAPI(lambda: self.store, self.owner_for, self.read_body)
        self.gateway_api.register(self.router)
        if self.config.ui:
            UI().register(self.router)
        # Vector stores and embeddings (docs/file-search.md); the file_search tool calls
        # ``self.vector_stores.search_for_tool``.
        self.vector_stores = VectorStores(
            lambda: self.store,
            self.files.read,
            models_file_embedders(registry),
            vector_index=self.config.vector_index,
            warm=self.config.warm_indexes,
        )
        if self.metrics is not None:
            self.metrics.bm25_reads(self.vector_stores.keyword_reads)
            self.metrics.index_loads(self.vector_stores.vector_reads, self.vector_stores.warm_up)
        self._sweeper: asyncio.Future[None] | None = None
        # ``serve --workers N``: this worker's figures published for the others (Metrics.share).
        self._metrics_publisher: asyncio.Future[None] | None = None
        VectorStoresAPI(self.vector_stores, self.owner_for, self.read_body).register(self.router)
        EmbeddingsAPI(self.vector_stores, self.owner_for, self.read_body).register(self.router)
        self.hosted_tools["file_search"] = FileSearch(self.vector_stores)

    def owner_for(self, scope: Scope) -> str:
        """The owner of what this request stores and reads: a hash of its API key, or one shared owner.

        Raises the 401 :class:`HTTPError` for a missing or wrong key (when keys are configured).
        """
        return self._auth.owner(scope["headers"], x_api_key=_anthropic(scope["path"]))

    @property
    def ws_max_message_bytes(self) -> int:
        """The largest ``response.create`` message a WebSocket connection may send."""
        limit = self.config.ws_max_message_bytes
        return limit if limit is not None else self.config.max_body_bytes

    @property
    def sealer(self) -> Sealer:
        """The key sealing reasoning state: ``RG_SEAL_KEY``, else ``<data_dir>/seal.key``, else in memory."""
        if self._sealer is None:
            if os.environ.get(SEAL_KEY_ENV) or self.config.data_dir:
                self._sealer = load_sealer(self.config.data_dir)
            else:
                log.warning(
                    "no %s and no data directory: reasoning state is sealed with a key kept in memory, "
                    "which a restart forgets",
                    SEAL_KEY_ENV,
                )
                self._sealer = Sealer([os.urandom(32)])
        return self._sealer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await self.websockets(scope, receive, send)

    # ------------------------------------------------------------------------------------ plumbing
    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    _ = self.sealer
                    if self.config.store_url is not None:
                        self.store = await open_store(
                            self.config.store_url,
                            redis_url=self.config.redis_url,
                            siblings_dir=self.config.siblings_dir,
                            retention=self.config.store_retention,
                            max_response_bytes=self.config.store_max_response_bytes,
                        )
                        # Containers, and what hosted calls told the model, are shared with the
                        # other instances through the store.
                        self.containers.catalog = self.store.containers
                        for tool in self.hosted_tools.values():
                            if tool.results is not None:
                                tool.results.catalog = self.store.tool_results
                    await self.vector_stores.start()
                    if self.store is not None:
                        self._sweeper = asyncio.ensure_future(self._sweep_expired())
                    if self.metrics is not None and self.config.siblings_dir is not None:
                        self.metrics.share(self.config.siblings_dir)
                        self._metrics_publisher = asyncio.ensure_future(self._publish_metrics())
                    if self._preload:
                        await self.registry.preload()
                    await self._check_hosted_tools()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.responses.shutdown()
                if self._metrics_publisher is not None:
                    self._metrics_publisher.cancel()
                    await asyncio.gather(self._metrics_publisher, return_exceptions=True)
                    self._metrics_publisher = None
                    assert self.metrics is not None
                    with contextlib.suppress(OSError):
                        self.metrics.publish(final=True)
                if self._sweeper is not None:
                    self._sweeper.cancel()
                    await asyncio.gather(self._sweeper, return_exceptions=True)
                    self._sweeper = None
                await self.vector_stores.aclose()
                # The containers' last writes reach the store before it closes; their records stay,
                # for another instance to restore.
                await self.containers.aclose()
                self.containers.catalog = None
                for tool in self.hosted_tools.values():
                    if tool.results is not None:
                        await tool.results.aclose()
                        tool.results.catalog = None
                if self.store is not None:
                    store, self.store = self.store, None
                    await store.close()
                await self.registry.aclose()
                self.files.storage.close()
                if self.observer.tracing is not None:
                    self.observer.tracing.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _sweep_expired(self) -> None:
        """Delete expired files and vector stores now and every ``expiry_sweep_interval`` seconds
        (each instance does; see ``FilesAPI.sweep`` and ``VectorStores.sweep`` for why that is safe)."""
        sweeps = (("file", self.files.sweep), ("vector store", self.vector_stores.sweep))
        while True:
            for what, sweep in sweeps:
                try:
                    if deleted := await sweep():
                        log.info("deleted %d expired %s(s)", deleted, what)
                except Exception:
                    log.exception("deleting expired %ss failed", what)
            await asyncio.sleep(self.config.expiry_sweep_interval)

    async def _publish_metrics(self) -> None:
        """``serve --workers N``: publish this worker's metrics for the others now and every
        ``SHARE_INTERVAL`` seconds (when they changed); a scrape on another worker adds them."""
        assert self.metrics is not None
        while True:
            try:
                self.metrics.publish()
            except OSError:
                log.warning("publishing this worker's metrics failed", exc_info=True)
            await asyncio.sleep(SHARE_INTERVAL)

    async def _file_for_container(self, owner: str | None, file_id: str) -> tuple[str, bytes] | None:
        """An uploaded file's name and bytes, for a container's ``file_ids`` (None: no such file)."""
        if self.store is None or owner is None:
            return None
        try:
            meta, data = await self.files.read(owner, file_id)
        except (NotFound, HTTPError, OSError):
            return None
        return str(meta["filename"]), data

    async def read_file(self, owner: str | None, file_id: str) -> tuple[str, bytes] | None:
        """An uploaded file's name and bytes for ``owner`` (None: no such file, or another key's)."""
        return await self._file_for_container(owner, file_id)

    async def _check_hosted_tools(self) -> None:
        """Say at start-up which hosted tools cannot run here, and why (requests for them get a 400)."""
        for tool in dict.fromkeys(self.hosted_tools.values()):
            if tool.optional:
                continue
            why = await asyncio.to_thread(tool.unavailable)
            if why is not None:
                log.warning("the %s tool is unavailable: %s (requests with it get a 400)", tool.type, why)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        metrics = self.metrics
        route = "unmatched"  # no path a client makes up becomes a label
        status = [500]
        counted = metrics is None
        try:
            if path != "/health" and not (
                (self.config.ui and is_ui_path(path)) or (path == "/metrics" and self.config.metrics_public)
            ):
                self._auth.check(scope["headers"], x_api_key=_anthropic(path))
            found = self.router.match(path)
            if found is None:
                raise HTTPError(404, f"Invalid URL ({method} {path})", code="not_found")
            methods, params, route = found
            handler = methods.get(method)
            if handler is None:
                allow = ", ".join(methods).encode()
                raise HTTPError(
                    405,
                    f"Method {method} is not allowed on {path}; use {', '.join(methods)}.",
                    code="method_not_allowed",
                    headers=[(b"allow", allow)],
                )
            if counted or handler in self._self_counted:
                # POST /v1/responses is counted once its work ends, with the response's own facts,
                # and its send (the relay's hot path) is not wrapped.
                counted = True
                await handler(scope, receive, send, **params)
            else:
                await handler(scope, receive, _status_recorder(send, status), **params)
        except HTTPError as exc:
            status[0] = exc.status
            await (send_anthropic_error if _anthropic(path) else send_error)(send, exc)
        except Exception:
            # A bug, not a client error: log it, answer in the route's shape, reveal nothing.
            log.exception("unhandled error on %s %s", method, path)
            status[0] = 500
            with contextlib.suppress(Exception):
                await (send_anthropic_error if _anthropic(path) else send_error)(
                    send, HTTPError(500, GENERIC_FAILURE, type="server_error", code="server_error")
                )
        finally:
            if not counted:
                assert metrics is not None
                metrics.http_requests.labels(route, method, str(status[0])).inc()

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The request's body, at most ``max_body_bytes`` (413 past it); what every endpoint reads."""
        limit = self.config.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise HTTPError(400, "Invalid Content-Length header.") from None
                if declared > limit:
                    raise _too_large(limit)
                break
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HTTPError(400, "The client disconnected before sending the whole body.")
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    # ------------------------------------------------------------------------------------ routes
    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, orjson.dumps({"status": "ok", "models": self.registry.names()}))

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.metrics is not None
        body = self.metrics.exposition()
        headers = [(b"content-type", CONTENT_TYPE.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _list_models(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, orjson.dumps({"object": "list", "data": self.registry.models()}))

    async def _get_model(self, scope: Scope, receive: Receive, send: Send, *, name: str) -> None:
        model = self.registry.model(name)
        if model is None:
            raise _model_not_found(name, self.registry.names(), self.registry.unavailable.get(name))
        await send_json(send, 200, orjson.dumps(model))

    async def provider_for(self, model: str) -> Provider:
        """The back end serving ``model``: 404 naming the models served, 503 if it cannot load."""
        try:
            provider = await self.registry.get(model)
        except Exception:
            log.exception("loading model %s failed", model)
            raise HTTPError(
                503,
                f"The model '{model}' could not be loaded; see the server log.",
                type="server_error",
                code="model_unavailable",
            ) from None
        if provider is None:
            raise _model_not_found(model, self.registry.names(), self.registry.unavailable.get(model))
        return provider


def _anthropic(path: str) -> bool:
    """The Anthropic Messages routes: ``x-api-key`` accepted, errors in Anthropic's shape."""
    return path == MESSAGES or path.startswith(MESSAGES + "/")


def _status_recorder(send: Send, status: list[int]) -> Send:
    """``send``, noting the response's status in ``status[0]`` (for the HTTP request counter)."""

    async def recording(message: Message) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        await send(message)

    return recording


def _too_large(limit: int) -> HTTPError:
    return HTTPError(413, f"Request body too large: the limit is {limit} bytes.", code="request_too_large")


def _model_not_found(model: str, served: list[str], unavailable: str | None = None) -> HTTPError:
    """404 for an unknown model, naming what is served (the first ones, for a long list), and why a
    model this gateway would serve cannot run here."""
    shown = ", ".join(served[:20]) + (f" and {len(served) - 20} more" if len(served) > 20 else "")
    available = f" This gateway serves: {shown}." if served else " This gateway serves no models."
    if unavailable is not None:
        message = f"The model '{model}' is not available in this installation: {unavailable}.{available}"
    else:
        message = f"The model '{model[:200]}' does not exist.{available}"
    return HTTPError(404, message, param="model", code="model_not_found")
