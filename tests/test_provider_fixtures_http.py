"""Every recorded upstream stream, for every provider, end to end over HTTP at both ends.

A mock upstream server replays each recording of ``tests/fixtures/recordings`` (every ``.sse`` and
``.chunks.jsonl`` of the provider's vendor) cut at random byte boundaries; a real gateway (uvicorn on
loopback) serves it to a raw HTTP client. The SSE the client receives must pass the stream checker,
accumulate without discrepancies, and end with the same items, status, error and usage as the same
recording driven through the provider in-process — which the provider's own ``test_*_stream.py``
compares item by item with the recording.
"""

from __future__ import annotations

import asyncio
import re
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from conftest import Gateway, check_stream, decode_sse, start_gateway
from fixtures_loader import list_fixtures
from responses_gateway.protocol.accumulator import accumulate
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.base import Provider, ProviderError
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from upstream_mock import UpstreamMock, drive, fixture_reply

JSON = dict[str, Any]
SUFFIXES = (".sse", ".chunks.jsonl")
MINTED_CALL_ID = re.compile(r"call_[0-9a-f]{24}")

MAKERS: dict[str, Callable[[str], Provider]] = {
    "anthropic-messages__": lambda url: AnthropicProvider(
        base_url=url, api_key="sk-ant-fixtures", upstream_model="claude", max_continuations=0
    ),
    "openai-chat__": lambda url: OpenAIChatProvider(
        base_url=url + "/v1", api_key="sk-fixtures-000000", upstream_model="gpt"
    ),
    "openai-responses__": lambda url: OpenAIResponsesProvider(
        base_url=url + "/v1", api_key="sk-fixtures-000000", upstream_model="gpt-5"
    ),
    "gemini__": lambda url: GeminiProvider(
        base_url=url + "/v1beta", api_key="AIzaSyFIXTURES-0123456789ab", upstream_model="gemini-2.5-pro"
    ),
}
NAMES = [name for prefix in MAKERS for name in list_fixtures(prefix, suffixes=SUFFIXES)]


def _prefix(name: str) -> str:
    return next(p for p in MAKERS if name.startswith(p))


def _body(name: str) -> JSON:
    body: JSON = {"model": _prefix(name), "input": "hi"}
    if name.startswith("anthropic-messages__"):
        body["include"] = ["web_search_call.action.sources"]
    return body


def _normalized(value: Any, minted: bool = False) -> Any:
    """Item ids are minted per run, and so are the ids of Gemini calls that came without one."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("id", "created_at", "completed_at", "model"):
                continue
            if key == "encrypted_content" and minted:
                out[key] = bool(item)  # the state names the calls by their minted ids
            elif key == "call_id" and isinstance(item, str) and MINTED_CALL_ID.fullmatch(item):
                out[key] = "minted"  # Gemini calls without an id get one of ours per run
            else:
                out[key] = _normalized(item, minted)
        return out
    if isinstance(value, list):
        return [_normalized(v, minted) for v in value]
    return value


def _summary(response: JSON) -> JSON:
    minted = any(
        isinstance(o.get("call_id"), str) and MINTED_CALL_ID.fullmatch(o["call_id"])
        for o in response.get("output") or []
    )
    fields = ("status", "output", "usage", "error", "incomplete_details")
    return {k: _normalized(response.get(k), minted) for k in fields}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture(scope="module")
def served(upstream: UpstreamMock) -> Iterator[Gateway]:
    providers = []
    for prefix, make in MAKERS.items():
        provider = make(upstream.url)
        provider.name = prefix
        providers.append(provider)
    gw = start_gateway(providers)
    yield gw
    gw.stop()


def test_every_provider_has_recordings() -> None:
    for prefix in MAKERS:
        assert any(n.startswith(prefix) for n in NAMES), prefix


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_recording_through_the_gateway_over_http(upstream: UpstreamMock, served: Gateway, name: str) -> None:
    seed = zlib.crc32(name.encode())
    upstream.reset([fixture_reply(name)])
    try:
        direct: list[JSON] | ProviderError = asyncio.run(
            drive(MAKERS[_prefix(name)](upstream.url), _body(name))
        )
    except ProviderError as exc:
        direct = exc

    upstream.reset([fixture_reply(name, split=True, seed=seed, max_piece=1 + seed % 61, delay=0)])
    with httpx.stream(
        "POST", served.url("/v1/responses"), json={**_body(name), "stream": True}, timeout=30
    ) as r:
        raw = r.read()
        status = r.status_code
    if isinstance(direct, ProviderError):
        # Refused before the first byte: the same refusal, as an HTTP error in OpenAI's shape.
        assert status == direct.status, raw
        assert httpx.Response(status, content=raw).json()["error"]["code"] == direct.code
        return
    assert status == 200, raw
    events = decode_sse(raw)
    check_stream(events, strict=False)  # hosted-tool items are OpenAI's, not Open Responses core
    acc = accumulate(events)
    assert acc.discrepancies == []
    final = events[-1]["response"]
    assert _normalized(acc.response["output"]) == _normalized(final["output"])
    assert _summary(final) == _summary(direct[-1]["response"])
