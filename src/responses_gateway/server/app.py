"""The gateway as a raw ASGI app: routing, body limits, auth, validation, then the provider loop.

A framework would add a task group and per-request objects to every stream; the routes are few and
fixed, so a dict lookup on ``(method, path)`` is all the routing needed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import orjson

from ..protocol.builder import StreamBuilder
from ..protocol.request import RequestError, parse_request
from ..protocol.response import new_response
from ..providers.base import Provider, ProviderError
from .auth import APIKeyAuth
from .capabilities import check_capabilities
from .config import ServerConfig
from .errors import HTTPError, send_error, send_json
from .registry import ModelRegistry
from .streaming import GENERIC_FAILURE, respond_json, respond_stream
from .types import Receive, Scope, Send

__all__ = ["GatewayApp"]

log = logging.getLogger("responses_gateway.server")

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

_MODELS_PREFIX = "/v1/models/"


class GatewayApp:
    """ASGI application serving ``POST /v1/responses``, ``GET /v1/models`` and ``GET /health``."""

    def __init__(self, registry: ModelRegistry, config: ServerConfig | None = None, *, preload: bool = False):
        self.registry = registry
        self.config = config or ServerConfig()
        self._auth = APIKeyAuth(self.config.api_keys)
        self._preload = preload
        self._routes: dict[str, dict[str, Handler]] = {
            "/v1/responses": {"POST": self._create_response},
            "/v1/models": {"GET": self._list_models},
            "/health": {"GET": self._health},
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    # ------------------------------------------------------------------------------------ plumbing
    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self._preload:
                        await self.registry.preload()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.registry.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            if path != "/health":
                self._auth.check(scope["headers"])
            methods = self._routes.get(path)
            if methods is None and path.startswith(_MODELS_PREFIX) and len(path) > len(_MODELS_PREFIX):
                methods = {"GET": self._get_model}
            if methods is None:
                raise HTTPError(404, f"Invalid URL ({method} {path})", code="not_found")
            handler = methods.get(method)
            if handler is None:
                allow = ", ".join(methods).encode()
                raise HTTPError(
                    405,
                    f"Method {method} is not allowed on {path}; use {', '.join(methods)}.",
                    code="method_not_allowed",
                    headers=[(b"allow", allow)],
                )
            await handler(scope, receive, send)
        except HTTPError as exc:
            await send_error(send, exc)
        except Exception:
            # A bug, not a client error: log it, answer in OpenAI's shape, reveal nothing.
            log.exception("unhandled error on %s %s", method, path)
            with contextlib.suppress(Exception):
                await send_error(
                    send, HTTPError(500, GENERIC_FAILURE, type="server_error", code="server_error")
                )

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
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

    async def _list_models(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, orjson.dumps({"object": "list", "data": self.registry.models()}))

    async def _get_model(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = scope["path"][len(_MODELS_PREFIX) :]
        model = self.registry.model(name)
        if model is None:
            raise _model_not_found(name)
        await send_json(send, 200, orjson.dumps(model))

    async def _create_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = await self._read_body(scope, receive)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise HTTPError(
                400,
                "We could not parse the JSON body of your request. The API expects a JSON payload, but "
                "what was sent was not valid JSON.",
            ) from None
        try:
            request = parse_request(body)
        except RequestError as exc:
            raise HTTPError.from_request_error(exc) from None
        provider = await self._provider(request.model)
        try:
            check_capabilities(request, provider.capabilities)
            provider.check_request(request)
        except RequestError as exc:
            raise HTTPError.from_request_error(exc) from None
        except ProviderError as exc:
            raise HTTPError.from_provider_error(exc) from None
        builder = StreamBuilder(new_response(request.model, **request.echo()))
        builder.start()
        if request.stream:
            await respond_stream(
                send,
                receive,
                provider,
                request,
                builder,
                keepalive=self.config.keepalive,
                keepalive_interval=self.config.keepalive_interval,
            )
        else:
            await respond_json(send, receive, provider, request, builder)

    async def _provider(self, model: str) -> Provider:
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
            raise _model_not_found(model)
        return provider


def _too_large(limit: int) -> HTTPError:
    return HTTPError(413, f"Request body too large: the limit is {limit} bytes.", code="request_too_large")


def _model_not_found(model: str) -> HTTPError:
    return HTTPError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
