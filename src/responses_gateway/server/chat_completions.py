"""``POST /v1/chat/completions``: the Chat Completions front end over the Responses engine.

The body is translated (``protocol.chat_completions.chat_request``) into a Responses create body and
answered through ``ResponsesAPI.prepare``/``run``, so every back end, capability check and the engine
serve it unchanged; the events become ``chat.completion.chunk`` frames (``ChatStream``) or one
``chat.completion`` body. Errors keep OpenAI's shape (the app's ``send_error``).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from ..protocol.chat_completions import (
    ChatOptions,
    ChatStream,
    chat_param,
    chat_request,
    completion_from_response,
)
from ..protocol.request import RequestError
from .bodies import parse_json_body
from .errors import HTTPError
from .frontends import JSON, DialectClient, DialectSink, Seal, renamed, sse_data
from .request_log import RequestLog
from .responses import ResponsesAPI
from .router import Router
from .streaming import KEEPALIVE_COMMENT
from .types import Receive, Scope, Send

__all__ = ["ChatCompletionsAPI"]

DONE = b"data: [DONE]\n\n"


def chat_frames(options: ChatOptions) -> Callable[[list[JSON]], bytes]:
    """A run's events → Chat Completions SSE frames, ending with ``[DONE]`` (not after an error)."""
    stream = ChatStream(options)

    def frames(events: list[JSON]) -> bytes:
        out = [sse_data(chunk) for event in events for chunk in stream.feed(event)]
        if stream.done and not stream.failed:
            out.append(DONE)
        return b"".join(out)

    return frames


class ChatCompletionsAPI:
    """``POST /v1/chat/completions`` over :class:`ResponsesAPI`."""

    def __init__(self, responses: ResponsesAPI) -> None:
        self.responses = responses
        self.app = responses.app

    def register(self, router: Router) -> None:
        router.add("/v1/chat/completions", POST=self.create)

    async def create(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.app
        line = RequestLog(app.observer, route="/v1/chat/completions")
        with line.answering():
            body = parse_json_body(await app.read_body(scope, receive))
            try:
                request_body, options = chat_request(body)
            except RequestError as exc:
                raise HTTPError.from_request_error(exc) from None
            try:
                ready = await self.responses.prepare(app.owner_for(scope), request_body, line)
            except HTTPError as exc:
                raise renamed(exc, chat_param) from None
            config = app.config

            def make(seal: Seal) -> DialectSink:
                return DialectSink(
                    send,
                    receive,
                    frames=chat_frames(options) if options.stream else None,
                    body=lambda response: orjson.dumps(completion_from_response(response, options)),
                    seal=seal,
                    keepalive=KEEPALIVE_COMMENT if config.keepalive != "off" else None,
                    interval=config.keepalive_interval,
                )

            await self.responses.run(ready, DialectClient(make), line)
