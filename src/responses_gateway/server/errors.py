"""HTTP errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import math

import orjson

from ..protocol.request import RequestError
from ..providers.base import ProviderError
from ..providers.upstream_errors import with_retry_hint
from ..redaction import REDACTOR
from .types import Send

__all__ = ["HTTPError", "provider_message", "send_error", "send_json", "status_for_code"]


def provider_message(err: ProviderError) -> str:
    """What the client reads for ``err``: a rate limit with a known delay says so as OpenAI does
    ("... Please try again in 1.5s."), the phrase Codex takes its retry delay from, whichever provider
    raised it (the HTTP providers already add it; scripted and third-party providers need not)."""
    return with_retry_hint(err.message, err.code, err.retry_after)


class HTTPError(Exception):
    """An error response: status, OpenAI error fields and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or []

    @classmethod
    def from_request_error(cls, err: RequestError) -> HTTPError:
        return cls(err.status, err.message, type=err.type, param=err.param, code=err.code)

    @classmethod
    def from_provider_error(cls, err: ProviderError) -> HTTPError:
        headers = []
        if err.retry_after is not None:
            # Retry-After takes whole seconds; round up so a client never retries too early.
            headers.append((b"retry-after", str(max(0, math.ceil(err.retry_after))).encode()))
        message = provider_message(err)
        return cls(err.status, message, type=err.type, param=err.param, code=err.code, headers=headers)

    def body(self) -> bytes:
        # Every plain HTTP error passes here: no configured secret leaves in one.
        message = REDACTOR.scrub(self.message)
        return orjson.dumps(
            {"error": {"message": message, "type": self.type, "param": self.param, "code": self.code}}
        )


# A failed response's error code -> the HTTP status a non-streaming client gets for it.
_CODE_STATUS = {
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "server_is_overloaded": 503,
    "context_length_exceeded": 400,
    "invalid_prompt": 400,
    "invalid_request_error": 400,
    "invalid_image": 400,
    "invalid_api_key": 401,
}


def status_for_code(code: str | None) -> int:
    """The HTTP status matching a ``response.failed`` error code."""
    return _CODE_STATUS.get(code or "", 500)


JSON_HEADERS = [(b"content-type", b"application/json")]


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send a complete JSON response."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(send: Send, err: HTTPError) -> None:
    await send_json(send, err.status, err.body(), err.headers)
