"""Upstream errors as a client of the gateway sees them, for every upstream provider, over real HTTP.

Before the first byte: the upstream's own error body and status become an HTTP error in OpenAI's shape
with a sensible status. After streaming started (for Anthropic an ``error`` event over HTTP 200, for
Chat Completions servers and Gemini an error payload in the stream, for a Responses server an ``error``
event with or without ``response.failed``): the stream ends with ``response.failed`` whose ``error.code``
is one clients act on — ``rate_limit_exceeded``, ``server_is_overloaded``, ``context_length_exceeded``,
``insufficient_quota``, ``server_error`` — and the text streamed so far stays in the failed response.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from conftest import Gateway, check_stream, decode_sse
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.base import Provider
from responses_gateway.providers.fallback import FallbackProvider
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from upstream_mock import UpstreamMock, encode_chunks, error_reply, stream_reply

JSON = dict[str, Any]
KEY = "sk-ant-api03-ERRORMATRIXSECRET-0123456789"

PROVIDERS: dict[str, Callable[[str], Provider]] = {
    "anthropic": lambda url: AnthropicProvider(base_url=url, api_key=KEY, upstream_model="claude-x"),
    "openai-chat": lambda url: OpenAIChatProvider(base_url=url + "/v1", api_key=KEY, upstream_model="gpt"),
    "openai": lambda url: OpenAIResponsesProvider(base_url=url + "/v1", api_key=KEY, upstream_model="gpt"),
    "gemini": lambda url: GeminiProvider(base_url=url, api_key=KEY, upstream_model="gemini-x"),
}


def _anthropic(kind: str, message: str) -> JSON:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _openai(message: str, etype: str, code: str | None) -> JSON:
    return {"error": {"message": message, "type": etype, "param": None, "code": code}}


def _gemini(code: int, status: str, message: str) -> JSON:
    return {"error": {"code": code, "status": status, "message": message}}


PROMPT_TOO_LONG = "prompt is too long: 210417 tokens > 200000 maximum"
GEMINI_TOO_LONG = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
CREDIT = "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing."
QUOTA = "You exceeded your current quota, please check your plan and billing details."

# (provider, upstream status, upstream body) -> (gateway status, code)
BEFORE: list[tuple[str, int, JSON, int, str]] = [
    ("anthropic", 429, _anthropic("rate_limit_error", "Too many requests"), 429, "rate_limit_exceeded"),
    ("anthropic", 529, _anthropic("overloaded_error", "Overloaded"), 503, "server_is_overloaded"),
    ("anthropic", 400, _anthropic("invalid_request_error", PROMPT_TOO_LONG), 400, "context_length_exceeded"),
    ("anthropic", 400, _anthropic("invalid_request_error", CREDIT), 429, "insufficient_quota"),
    ("anthropic", 500, _anthropic("api_error", "Internal server error"), 502, "server_error"),
    ("openai-chat", 429, _openai("Rate limit reached", "requests", "rate_limit_exceeded"), 429,
     "rate_limit_exceeded"),
    ("openai-chat", 503, _openai("The engine is currently overloaded", "server_error", None), 503,
     "server_is_overloaded"),
    ("openai-chat", 400, _openai("This model's maximum context length is 128000 tokens.",
                                 "invalid_request_error", "context_length_exceeded"), 400,
     "context_length_exceeded"),
    ("openai-chat", 429, _openai(QUOTA, "insufficient_quota", "insufficient_quota"), 429,
     "insufficient_quota"),
    ("openai-chat", 500, _openai("The server had an error", "server_error", None), 502, "server_error"),
    ("openai", 429, _openai("Rate limit reached", "requests", "rate_limit_exceeded"), 429,
     "rate_limit_exceeded"),
    ("openai", 503, _openai("Slow down", "server_error", "slow_down"), 503, "server_is_overloaded"),
    ("openai", 400, _openai("Your input exceeds the context window of this model.", "invalid_request_error",
                            "context_length_exceeded"), 400, "context_length_exceeded"),
    ("openai", 429, _openai(QUOTA, "insufficient_quota", "insufficient_quota"), 429, "insufficient_quota"),
    ("openai", 500, _openai("The server had an error", "server_error", None), 502, "server_error"),
    ("gemini", 429, _gemini(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted"), 429,
     "rate_limit_exceeded"),
    ("gemini", 503, _gemini(503, "UNAVAILABLE", "The model is overloaded."), 503, "server_is_overloaded"),
    ("gemini", 400, _gemini(400, "INVALID_ARGUMENT", GEMINI_TOO_LONG), 400, "context_length_exceeded"),
    ("gemini", 500, _gemini(500, "INTERNAL", "An internal error has occurred."), 502, "server_error"),
]  # fmt: skip


def _started(kind: str) -> bytes:
    """The start of a stream that has already sent the text ``Hel``."""
    if kind == "anthropic":
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": [],
                   "stop_reason": None, "usage": {"input_tokens": 5, "output_tokens": 1}}  # fmt: skip
        return encode_chunks(
            [
                {"type": "message_start", "message": message},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
            ],
            "anthropic",
        )
    if kind == "openai-chat":
        delta = {"role": "assistant", "content": "Hel"}
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
        return b"data: " + orjson.dumps(chunk) + b"\n\n"
    if kind == "gemini":
        chunk = {"candidates": [{"content": {"parts": [{"text": "Hel"}], "role": "model"}, "index": 0}]}
        return encode_chunks([chunk], "gemini")
    response = {"id": "resp_u", "object": "response", "created_at": 1, "status": "in_progress",
                "model": "gpt", "output": [], "error": None, "incomplete_details": None}  # fmt: skip
    return encode_chunks(
        [
            {"type": "response.created", "sequence_number": 0, "response": response},
            {"type": "response.in_progress", "sequence_number": 1, "response": response},
            {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
             "item": {"id": "msg_u", "type": "message", "role": "assistant", "status": "in_progress",
                      "content": []}},
            {"type": "response.content_part.added", "sequence_number": 3, "item_id": "msg_u",
             "output_index": 0, "content_index": 0,
             "part": {"type": "output_text", "text": "", "annotations": []}},
            {"type": "response.output_text.delta", "sequence_number": 4, "item_id": "msg_u",
             "output_index": 0, "content_index": 0, "delta": "Hel"},
        ],
        "openai-responses",
    )  # fmt: skip


_ANTHROPIC_END: list[JSON] = [
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
]


def _mid(kind: str, payload: JSON) -> bytes:
    """``payload`` as ``kind``'s upstream sends an error inside a 200 stream."""
    if kind == "anthropic":
        return encode_chunks([payload], "anthropic")
    if kind == "openai-chat":
        return b"data: " + orjson.dumps(payload) + b"\n\n"
    if kind == "gemini":
        return encode_chunks([payload], "gemini")
    error = payload["error"]
    event = {"type": "error", "sequence_number": 5, "error": error}
    failed = {"type": "response.failed", "sequence_number": 6,
              "response": {"id": "resp_u", "object": "response", "created_at": 1, "status": "failed",
                           "model": "gpt", "output": [], "incomplete_details": None,
                           "error": {"code": error["code"], "message": error["message"]}}}  # fmt: skip
    return encode_chunks([event, failed], "openai-responses")


# (provider, mid-stream error payload) -> response.failed code
AFTER: list[tuple[str, JSON, str]] = [
    ("anthropic", _anthropic("rate_limit_error", "Number of requests exceeded"), "rate_limit_exceeded"),
    ("anthropic", _anthropic("overloaded_error", "Overloaded"), "server_is_overloaded"),
    ("anthropic", _anthropic("invalid_request_error", PROMPT_TOO_LONG), "context_length_exceeded"),
    ("anthropic", _anthropic("billing_error", CREDIT), "insufficient_quota"),
    ("anthropic", _anthropic("api_error", "Internal server error"), "server_error"),
    ("openai-chat", _openai("Rate limit reached", "requests", "rate_limit_exceeded"), "rate_limit_exceeded"),
    ("openai-chat", _openai("Overloaded", "server_error", "server_is_overloaded"), "server_is_overloaded"),
    ("openai-chat", _openai("maximum context length exceeded", "invalid_request_error",
                            "context_length_exceeded"), "context_length_exceeded"),
    ("openai-chat", _openai(QUOTA, "insufficient_quota", "insufficient_quota"), "insufficient_quota"),
    ("openai-chat", _openai("The server had an error", "server_error", None), "server_error"),
    # OpenRouter puts the HTTP status it would have sent in ``code``.
    ("openai-chat", {"error": {"code": 429, "message": "Rate limit exceeded"}}, "rate_limit_exceeded"),
    ("openai-chat", {"error": {"code": 503, "message": "No provider available"}}, "server_is_overloaded"),
    ("openai-chat", {"error": {"code": 402, "message": "Insufficient credits"}}, "insufficient_quota"),
    ("openai-chat", {"error": {"code": 502, "message": "Provider returned error"}}, "server_error"),
    ("openai-chat", {"error": {"code": "server_error", "message": "Provider disconnected"}}, "server_error"),
    ("openai", _openai("Rate limit reached", "requests", "rate_limit_exceeded"), "rate_limit_exceeded"),
    ("openai", _openai("Overloaded", "server_error", "server_is_overloaded"), "server_is_overloaded"),
    ("openai", _openai("Your input exceeds the context window of this model.", "invalid_request_error",
                       "context_length_exceeded"), "context_length_exceeded"),
    ("openai", _openai(QUOTA, "insufficient_quota", "insufficient_quota"), "insufficient_quota"),
    ("openai", _openai("The server had an error", "server_error", "server_error"), "server_error"),
    ("gemini", _gemini(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted"), "rate_limit_exceeded"),
    ("gemini", _gemini(503, "UNAVAILABLE", "The model is overloaded."), "server_is_overloaded"),
    ("gemini", _gemini(400, "INVALID_ARGUMENT", GEMINI_TOO_LONG), "context_length_exceeded"),
    ("gemini", _gemini(500, "INTERNAL", "An internal error has occurred."), "server_error"),
]  # fmt: skip


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture
def serve(upstream: UpstreamMock, gateway: Callable[..., Gateway]) -> Callable[[str], Gateway]:
    def factory(kind: str) -> Gateway:
        provider = PROVIDERS[kind](upstream.url)
        provider.name = "m"
        return gateway([provider])

    return factory


def _post(gw: Gateway) -> httpx.Response:
    return httpx.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi", "stream": True}, timeout=30)


@pytest.mark.parametrize(
    ("kind", "upstream_status", "body", "status", "code"),
    BEFORE,
    ids=[f"{b[0]}-{b[1]}-{b[4]}" for b in BEFORE],
)
def test_error_before_streaming_is_an_openai_shaped_http_error(
    upstream: UpstreamMock,
    serve: Callable[[str], Gateway],
    kind: str,
    upstream_status: int,
    body: JSON,
    status: int,
    code: str,
) -> None:
    upstream.reset([error_reply(upstream_status, body)])
    response = _post(serve(kind))
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]
    assert KEY not in response.text


@pytest.mark.parametrize(("kind", "payload", "code"), AFTER, ids=[f"{a[0]}-{a[2]}" for a in AFTER])
def test_error_after_streaming_started_is_response_failed_with_the_code(
    upstream: UpstreamMock, serve: Callable[[str], Gateway], kind: str, payload: JSON, code: str
) -> None:
    upstream.reset([stream_reply(_started(kind) + _mid(kind, payload))])
    response = _post(serve(kind))
    assert response.status_code == 200, response.text
    events = decode_sse(response.content)
    check_stream(events)
    assert "Hel" in [e.get("delta") for e in events if e["type"] == "response.output_text.delta"]
    last = events[-1]
    assert last["type"] == "response.failed"
    assert last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] == code
    assert last["response"]["error"]["message"]
    assert KEY not in response.text


@pytest.mark.parametrize(("payload", "code"), [(a[1], a[2]) for a in AFTER if a[0] == "openai"])
def test_responses_error_event_without_response_failed(
    upstream: UpstreamMock, serve: Callable[[str], Gateway], payload: JSON, code: str
) -> None:
    """A Responses server that sends ``error`` and closes: the gateway still ends with response.failed."""
    error = {"type": "error", "sequence_number": 5, "error": payload["error"]}
    upstream.reset([stream_reply(_started("openai") + encode_chunks([error], "openai-responses"))])
    response = _post(serve("openai"))
    events = decode_sse(response.content)
    check_stream(events)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == code


# The first thing in a 200 stream is an error: nothing was sent yet, so it is still an HTTP error
# (and a fallback model can still serve the request). The Responses passthrough is left out: it relays
# OpenAI's own created → error → failed stream as OpenAI sent it (test_pitfall_18_error_event_then_failed).
FIRST: list[tuple[str, JSON, int, str]] = [
    ("anthropic", _anthropic("overloaded_error", "Overloaded"), 503, "server_is_overloaded"),
    (
        "openai-chat",
        _openai("Rate limit reached", "requests", "rate_limit_exceeded"),
        429,
        "rate_limit_exceeded",
    ),
    (
        "openai-chat",
        {"error": {"code": 503, "message": "No provider available"}},
        503,
        "server_is_overloaded",
    ),
    ("gemini", _gemini(503, "UNAVAILABLE", "The model is overloaded."), 503, "server_is_overloaded"),
    ("gemini", _gemini(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted"), 429, "rate_limit_exceeded"),
]


@pytest.mark.parametrize(("kind", "payload", "status", "code"), FIRST, ids=[f"{f[0]}-{f[3]}" for f in FIRST])
def test_error_as_the_first_event_of_a_200_stream_is_an_http_error(
    upstream: UpstreamMock, serve: Callable[[str], Gateway], kind: str, payload: JSON, status: int, code: str
) -> None:
    upstream.reset([stream_reply(_mid(kind, payload))])
    response = _post(serve(kind))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert KEY not in response.text


@pytest.mark.parametrize("kind", ["openai-chat", "gemini"])
def test_error_first_200_stream_falls_back_to_the_next_model(
    upstream: UpstreamMock, gateway: Callable[..., Gateway], kind: str
) -> None:
    """An in-stream error before anything was sent lets the fallback chain move on: one clean stream."""
    overloaded = {
        "openai-chat": {"error": {"code": 503, "message": "No provider available"}},
        "gemini": _gemini(503, "UNAVAILABLE", "The model is overloaded."),
    }[kind]
    upstream.reset([stream_reply(_mid(kind, overloaded))])
    with UpstreamMock() as backup:
        backup.reset([stream_reply(_started("anthropic") + encode_chunks(_ANTHROPIC_END, "anthropic"))])
        chain = FallbackProvider(
            [(kind, PROVIDERS[kind](upstream.url)), ("claude", PROVIDERS["anthropic"](backup.url))],
            retries=0,
        )
        chain.name = "m"
        response = _post(gateway([chain]))
        assert response.status_code == 200, response.text
        events = decode_sse(response.content)
        check_stream(events)
        assert [e["type"] for e in events].count("response.created") == 1
        assert events[-1]["type"] == "response.completed"
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hel"
        assert len(upstream.requests) == 1 and len(backup.requests) == 1


def test_an_upstream_traceback_is_not_relayed() -> None:
    """llama-cpp-python's server puts the traceback in its 500's message; the client gets the message."""
    from responses_gateway.providers.upstream_errors import from_http

    body = orjson.dumps(
        {
            "error": {
                "message": "1 validation error:\n  {'loc': ('body', 'response_format', 'type'), 'msg': "
                "\"Input should be 'text' or 'json_object'\"}\n\n  File \"/srv/llama_cpp/server/app.py\", "
                "line 376, in create_chat_completion\n    POST /v1/chat/completions",
                "type": "internal_server_error",
            }
        }
    )
    err = from_http(500, {}, body, upstream="The upstream")
    assert err.status == 502
    assert str(err) == (
        "The upstream failed (HTTP 500): 1 validation error: {'loc': ('body', 'response_format', 'type'), "
        "'msg': \"Input should be 'text' or 'json_object'\"}"
    )
    bare = b'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: bad schema\n'
    assert str(from_http(500, {}, bare, upstream="U")) == "U failed (HTTP 500): ValueError: bad schema"
    fastapi = orjson.dumps({"detail": [{"loc": ["body", "messages"], "msg": "Field required"}]})
    assert str(from_http(422, {}, fastapi)) == "messages: Field required"
