"""A rate-limited upstream's delay reaches the client in the words Codex reads.

Codex takes the delay of a ``rate_limit_exceeded`` failure from the error message only ("Please try
again in 1.898s" / "... in 20ms", codex-rs/codex-api/src/sse/responses.rs); mid-stream there is no
Retry-After header to carry it. So when the upstream said how long to wait (``retry-after``,
``retry-after-ms``, Gemini's ``RetryInfo``), the error message says it in that form: over HTTP for a
429 before the stream, and in ``response.failed`` (and the stored response) for a failure mid-stream.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.protocol.checker import check
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.base import Provider
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.upstream_errors import from_error_payload, retry_hint, with_retry_hint
from upstream_mock import Reply, UpstreamMock, encode_chunks, error_reply, stream_reply

JSON = dict[str, Any]

# Codex's own pattern (rate_limit_regex), used here to read the delay back as Codex would.
CODEX_RETRY = re.compile(r"Please try again in (\d+(?:\.\d+)?)(s|ms)")
KEY = "sk-retry-hint-secret-0000"


def _codex_delay(message: str) -> float | None:
    match = CODEX_RETRY.search(message)
    if match is None:
        return None
    value = float(match.group(1))
    return value if match.group(2) == "s" else value / 1000


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (1.898, "Please try again in 1.898s."),
        (0.02, "Please try again in 20ms."),
        (0.035, "Please try again in 35ms."),
        (0.0001, "Please try again in 1ms."),
        (3, "Please try again in 3s."),
        (34.4, "Please try again in 34.4s."),
        (1.0004, "Please try again in 1.001s."),  # rounded up: never too early
        (0, "Please try again in 0s."),
    ],
)
def test_retry_hint_is_what_codex_parses(seconds: float, text: str) -> None:
    assert retry_hint(seconds) == text
    delay = _codex_delay(text)
    assert delay is not None and delay >= seconds


def test_hint_only_for_rate_limits_with_a_delay_and_never_twice() -> None:
    assert with_retry_hint("slow down", "rate_limit_exceeded", 2) == "slow down. Please try again in 2s."
    assert with_retry_hint("Slow down.", "rate_limit_exceeded", 2) == "Slow down. Please try again in 2s."
    assert with_retry_hint("slow down", "rate_limit_exceeded", None) == "slow down"
    assert with_retry_hint("overloaded", "server_is_overloaded", 2) == "overloaded"
    openai_message = "Rate limit reached for gpt-4o. Please try again in 1.898s. Visit https://x"
    assert with_retry_hint(openai_message, "rate_limit_exceeded", 5) == openai_message


def test_gemini_retry_info_inside_a_stream_sets_the_delay() -> None:
    err = from_error_payload([_gemini_rate_limit("12s")])
    assert (err.code, err.retry_after) == ("rate_limit_exceeded", 12.0)
    assert err.message.endswith("Please try again in 12s.")


# ---------------------------------------------------------------------------------------- upstreams
def _gemini_rate_limit(delay: str) -> JSON:
    return {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "message": "Resource has been exhausted (e.g. check quota).",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}],
        }
    }


def _openai_rate_limit(message: str) -> JSON:
    return {"error": {"message": message, "type": "requests", "param": None, "code": "rate_limit_exceeded"}}


def _anthropic_rate_limit() -> JSON:
    return {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests exceeded"}}


PROVIDERS: dict[str, Callable[[str], Provider]] = {
    "openai-chat": lambda url: OpenAIChatProvider(base_url=url + "/v1", api_key=KEY, upstream_model="gpt-x"),
    "anthropic": lambda url: AnthropicProvider(base_url=url, api_key=KEY, upstream_model="claude-x"),
    "gemini": lambda url: GeminiProvider(base_url=url, api_key=KEY, upstream_model="g"),
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture
def gateway_for(tmp_path: Path) -> Iterator[Callable[[str, str], Gateway]]:
    started: list[Gateway] = []

    def factory(kind: str, url: str) -> Gateway:
        provider = PROVIDERS[kind](url)
        provider.name = "m"
        gw = start_gateway(
            [provider], store_url=f"sqlite://{tmp_path}/data/gateway.db", data_dir=str(tmp_path / "data")
        )
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.stop()


def _post(gw: Gateway) -> httpx.Response:
    with httpx.Client(timeout=30) as client:
        return client.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi", "stream": True})


# ---------------------------------------------------------------------------------------- before the stream
PRE_STREAM: list[tuple[str, Reply, str, float]] = [
    (
        "openai-chat",
        error_reply(429, _openai_rate_limit("Rate limit reached for requests"), headers={"retry-after": "2"}),
        "Rate limit reached for requests. Please try again in 2s.",
        2.0,
    ),
    (
        "openai-chat",
        error_reply(429, _openai_rate_limit("Rate limit reached"), headers={"retry-after-ms": "20"}),
        "Rate limit reached. Please try again in 20ms.",
        0.02,
    ),
    (
        # The upstream (OpenAI itself) already said it in Codex's words: left as it is.
        "openai-chat",
        error_reply(
            429,
            _openai_rate_limit(
                "Rate limit reached for gpt-4o on tokens per min. Please try again in 1.898s."
            ),
            headers={"retry-after": "2"},
        ),
        "Rate limit reached for gpt-4o on tokens per min. Please try again in 1.898s.",
        1.898,
    ),
    (
        "anthropic",
        error_reply(429, _anthropic_rate_limit(), headers={"retry-after": "7"}),
        "Number of requests exceeded. Please try again in 7s.",
        7.0,
    ),
    (
        "gemini",
        error_reply(429, _gemini_rate_limit("34.4s")),
        "Resource has been exhausted (e.g. check quota). Please try again in 34.4s.",
        34.4,
    ),
]


@pytest.mark.parametrize(
    ("kind", "reply", "message", "delay"), PRE_STREAM, ids=[f"{p[0]}-{i}" for i, p in enumerate(PRE_STREAM)]
)
def test_a_429_before_the_stream_says_when_to_retry(
    upstream: UpstreamMock,
    gateway_for: Callable[[str, str], Gateway],
    kind: str,
    reply: Reply,
    message: str,
    delay: float,
) -> None:
    upstream.reset([reply])
    response = _post(gateway_for(kind, upstream.url))
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert (error["code"], error["message"]) == ("rate_limit_exceeded", message)
    assert _codex_delay(error["message"]) == pytest.approx(delay)
    assert int(response.headers["retry-after"]) >= delay
    assert KEY not in response.text


# ---------------------------------------------------------------------------------------- mid-stream
def _gemini_text_then_rate_limit() -> Reply:
    text = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Working on it"}]}}]}
    return stream_reply(encode_chunks([text, _gemini_rate_limit("1.898s")], "gemini"))


def _anthropic_paused_turn() -> Reply:
    """A turn Anthropic paused (pause_turn): the gateway continues it with a second request."""
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-x",
        "stop_reason": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Searching"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "pause_turn"}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]
    return stream_reply(encode_chunks(events, "anthropic"))


MID_STREAM: list[tuple[str, list[Reply], str]] = [
    # Gemini's error chunk after text: the RetryInfo in its body is the only word on the delay.
    (
        "gemini",
        [_gemini_text_then_rate_limit()],
        "Resource has been exhausted (e.g. check quota). Please try again in 1.898s.",
    ),
    # The continuation of a paused Anthropic turn is refused with 429 + retry-after, after text was sent.
    (
        "anthropic",
        [_anthropic_paused_turn(), error_reply(429, _anthropic_rate_limit(), headers={"retry-after": "3"})],
        "Number of requests exceeded. Please try again in 3s.",
    ),
]


@pytest.mark.parametrize(("kind", "replies", "message"), MID_STREAM, ids=[m[0] for m in MID_STREAM])
def test_a_rate_limit_mid_stream_says_when_to_retry_in_response_failed(
    upstream: UpstreamMock,
    gateway_for: Callable[[str, str], Gateway],
    kind: str,
    replies: list[Reply],
    message: str,
) -> None:
    upstream.reset(replies)
    gw = gateway_for(kind, upstream.url)
    response = _post(gw)
    assert response.status_code == 200, response.text
    events = decode_sse(response.content)
    check_stream(events)
    assert not check(events, profile="codex")
    assert any(e["type"] == "response.output_text.delta" for e in events)
    failed = events[-1]
    assert failed["type"] == "response.failed"
    error = failed["response"]["error"]
    assert (error["code"], error["message"]) == ("rate_limit_exceeded", message)
    assert _codex_delay(error["message"]) is not None
    assert len(upstream.requests) == len(replies)
    # The stored response says the same.
    with httpx.Client(timeout=30) as client:
        stored = client.get(gw.url(f"/v1/responses/{failed['response']['id']}")).json()
    assert stored["status"] == "failed"
    assert stored["error"] == error
