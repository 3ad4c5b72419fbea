"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the Anthropic Messages front end.

The body is translated (``protocol.messages.messages_request``) into a Responses create body and
answered through ``ResponsesAPI.prepare``/``run``, so every back end, capability check and the engine
serve it unchanged; the events become Anthropic's stream (``MessagesStream``: ``message_start`` …
``message_stop``, ``ping`` while the model is silent) or one ``message`` body. Thinking blocks carry
the reasoning item they stand for, sealed for the caller (:class:`~responses_gateway.sealing.Sealer`,
bound to the caller's owner) as their ``signature``, and are opened again when they come back.
Every error, the ones raised before the route is reached included (auth, unknown model), is in
Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ..protocol.messages import (
    MessagesStream,
    error_payload,
    error_type_for_status,
    message_from_response,
    messages_param,
    messages_request,
    stop_sequences,
)
from ..protocol.request import RequestError
from ..providers.base import ProviderError
from ..redaction import REDACTOR
from ..sealing import SealError
from .bodies import parse_json_body
from .errors import HTTPError, send_json
from .frontends import JSON, DialectClient, DialectSink, DialectStream, Seal, renamed, sse_event
from .http_protocol import body_writer, client_gone
from .request_log import RequestLog
from .responses import ResponsesAPI
from .router import Router
from .streaming import Sink
from .types import Receive, Scope, Send

__all__ = ["PREFIX", "MessagesAPI", "send_anthropic_error"]

PREFIX = "/v1/messages"
PING = sse_event("ping", {"type": "ping"})
_SIGNED = "rgthink1"  # what a sealed signature holds: {"v": _SIGNED, "item": reasoning item}


def anthropic_error(err: HTTPError) -> bytes:
    """``err`` as Anthropic's error body (its message scrubbed of secrets, as every HTTP error is)."""
    return orjson.dumps(error_payload(error_type_for_status(err.status), REDACTOR.scrub(err.message)))


async def send_anthropic_error(send: Send, err: HTTPError) -> None:
    await send_json(send, err.status, anthropic_error(err), err.headers)


class MessagesAPI:
    """``/v1/messages`` over :class:`ResponsesAPI`."""

    def __init__(self, responses: ResponsesAPI) -> None:
        self.responses = responses
        self.app = responses.app

    def register(self, router: Router) -> None:
        router.add(PREFIX, POST=self.create)
        router.add(PREFIX + "/count_tokens", POST=self.count_tokens)

    def _signing(self, owner: str) -> tuple[Callable[[JSON], str], Callable[[str, str], JSON]]:
        sealer = self.app.sealer

        def sign(item: JSON) -> str:
            kept = {k: item[k] for k in ("summary", "content", "encrypted_content") if item.get(k)}
            return sealer.seal(
                {"v": _SIGNED, "item": {"type": "reasoning", "summary": [], **kept}}, context=owner
            )

        def open_(signature: str, param: str) -> JSON:
            try:
                value: Any = sealer.unseal(signature, context=owner)
            except SealError:
                value = None
            if (
                not isinstance(value, dict)
                or value.get("v") != _SIGNED
                or not isinstance(value.get("item"), dict)
            ):
                raise RequestError(
                    f"{param}: Invalid signature: this thinking block was not produced by this gateway "
                    "for this API key, or was altered.",
                    param=param,
                    code="invalid_signature",
                )
            item: JSON = value["item"]
            return item

        return sign, open_

    async def _translate(
        self, scope: Scope, receive: Receive, *, counting: bool
    ) -> tuple[str, JSON, Any, tuple[str, ...]]:
        app = self.app
        body = parse_json_body(await app.read_body(scope, receive))
        owner = app.owner_for(scope)
        sign, open_ = self._signing(owner)
        try:
            request_body = messages_request(body, open_, counting=counting)
            stop = stop_sequences(body)
        except RequestError as exc:
            raise HTTPError.from_request_error(exc) from None
        return owner, request_body, sign, stop

    async def create(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.app
        line = RequestLog(app.observer, route="/v1/messages")
        with line.answering():
            owner, request_body, sign, stop = await self._translate(scope, receive, counting=False)
            model = str(request_body["model"])
            try:
                ready = await self.responses.prepare(owner, request_body, line, stop=stop)
            except HTTPError as exc:
                raise renamed(exc, messages_param) from None
            config = app.config
            streamed = bool(request_body.get("stream"))

            def make(seal: Seal) -> Sink:
                sink: DialectStream | DialectSink

                def stopped_by() -> str | None:
                    return sink.stopped_by

                if streamed:
                    sink = DialectStream(
                        send,
                        receive,
                        frames=_frames(MessagesStream(model, sign), stopped_by),
                        seal=seal,
                        keepalive=PING if config.keepalive != "off" else None,
                        interval=config.keepalive_interval,
                        direct=body_writer(scope),
                        gone=client_gone(scope),
                    )
                else:
                    sink = DialectSink(
                        send,
                        receive,
                        body=lambda response: orjson.dumps(
                            message_from_response(response, model, sign, sink.stopped_by)
                        ),
                        seal=seal,
                        gone=client_gone(scope),
                    )
                return sink

            await self.responses.run(ready, DialectClient(make), line)

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The tokens the model would read, counted by the back end (as ``/v1/responses/input_tokens``)."""
        owner, request_body, _, _ = await self._translate(scope, receive, counting=True)
        try:
            ready = await self.responses.prepare(owner, request_body)
        except HTTPError as exc:
            raise renamed(exc, messages_param) from None
        try:
            count = await ready.provider.count_input_tokens(ready.request)
        except ProviderError as exc:
            raise HTTPError.from_provider_error(exc) from None
        await send_json(send, 200, orjson.dumps({"input_tokens": count}))


def _frames(stream: MessagesStream, stopped_by: Callable[[], str | None]) -> Callable[[list[JSON]], bytes]:
    def frames(events: list[JSON]) -> bytes:
        stream.stop_sequence = stopped_by()
        return b"".join(sse_event(name, payload) for event in events for name, payload in stream.feed(event))

    return frames
