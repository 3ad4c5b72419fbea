"""POST /v1/responses/input_tokens: each back end counts with its own tokenizer or counting endpoint.

Anthropic, Gemini and the OpenAI passthrough are mocks on loopback (the test checks what they were
asked); the embedded model counts with its tokenizer, exactly what ``usage.input_tokens`` then says;
back ends with no way to count (Chat Completions servers, scripted) refuse with a 400 saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from conftest import Gateway
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.base import Provider
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from responses_gateway.providers.scripted import ScriptedProvider
from upstream_mock import UpstreamMock, json_reply

Factory = Callable[..., Gateway]
JSON = dict[str, Any]
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
BODY: JSON = {"model": "m", "instructions": "Be brief.", "input": "Weather in Paris?", "tools": [TOOL]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


def _count(gw: Gateway, body: JSON) -> httpx.Response:
    return httpx.post(f"{gw.base_url}/responses/input_tokens", json=body, timeout=30)


def _serve(gateway: Factory, provider: Provider) -> Gateway:
    provider.name = "m"
    return gateway([provider])


def test_anthropic_counts_with_its_count_tokens_endpoint(gateway: Factory, upstream: UpstreamMock) -> None:
    upstream.reset([json_reply({"input_tokens": 42})])
    gw = _serve(
        gateway, AnthropicProvider(base_url=upstream.url, api_key="sk-ant-x", upstream_model="claude-x")
    )
    got = _count(gw, BODY)
    assert got.status_code == 200, got.text
    assert got.json() == {"object": "response.input_tokens", "input_tokens": 42}
    sent = upstream.requests[-1]
    assert sent.path == "/v1/messages/count_tokens"
    body = sent.json
    assert body["model"] == "claude-x" and body["system"] and body["tools"][0]["name"] == "get_weather"
    assert "stream" not in body and "max_tokens" not in body


def test_gemini_counts_with_count_tokens(gateway: Factory, upstream: UpstreamMock) -> None:
    upstream.reset([json_reply({"totalTokens": 17})])
    gw = _serve(
        gateway,
        GeminiProvider(base_url=upstream.url, api_key="AIzaSyX-0123456789abcdef", upstream_model="g3"),
    )
    got = _count(gw, BODY)
    assert got.json() == {"object": "response.input_tokens", "input_tokens": 17}, got.text
    sent = upstream.requests[-1]
    assert sent.path.endswith("/models/g3:countTokens")
    request = sent.json["generateContentRequest"]
    assert (
        request["model"] == "models/g3" and request["contents"][0]["parts"][0]["text"] == "Weather in Paris?"
    )


def test_the_openai_passthrough_asks_openai(gateway: Factory, upstream: UpstreamMock) -> None:
    upstream.reset([json_reply({"object": "response.input_tokens", "input_tokens": 9})])
    gw = _serve(
        gateway,
        OpenAIResponsesProvider(base_url=upstream.url + "/v1", api_key="sk-x", upstream_model="gpt-5"),
    )
    got = _count(gw, {**BODY, "stream": True, "max_output_tokens": 50})
    assert got.json()["input_tokens"] == 9, got.text
    sent = upstream.requests[-1]
    assert sent.path == "/v1/responses/input_tokens"
    assert (
        sent.json["model"] == "gpt-5" and "stream" not in sent.json and "max_output_tokens" not in sent.json
    )


def test_an_upstream_error_is_the_clients_error(gateway: Factory, upstream: UpstreamMock) -> None:
    upstream.reset(
        [json_reply({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}, 400)]
    )
    gw = _serve(
        gateway, AnthropicProvider(base_url=upstream.url, api_key="sk-ant-x", upstream_model="claude-x")
    )
    got = _count(gw, BODY)
    assert got.status_code == 400 and "bad" in got.json()["error"]["message"]


def test_hosted_tools_are_counted_as_the_model_sees_them(gateway: Factory, upstream: UpstreamMock) -> None:
    upstream.reset([json_reply({"input_tokens": 99})])
    gw = _serve(
        gateway, AnthropicProvider(base_url=upstream.url, api_key="sk-ant-x", upstream_model="claude-x")
    )
    tool = {"type": "code_interpreter", "container": {"type": "auto"}}
    got = _count(gw, {**BODY, "tools": [tool]})
    if got.status_code == 400:  # no sandbox on this machine: the tool is refused, as on create
        assert "code_interpreter" in got.json()["error"]["message"]
        return
    assert got.json()["input_tokens"] == 99
    assert [t["name"] for t in upstream.requests[-1].json["tools"]] == ["code_interpreter"]


@pytest.mark.parametrize(
    "make",
    [
        lambda url: OpenAIChatProvider(base_url=url + "/v1", api_key="sk-x", upstream_model="gpt-4o"),
        lambda url: ScriptedProvider([{"message": ["hi"]}]),
    ],
    ids=["openai-chat", "scripted"],
)
def test_back_ends_that_cannot_count_say_so(
    gateway: Factory, upstream: UpstreamMock, make: Callable[[str], Provider]
) -> None:
    gw = _serve(gateway, make(upstream.url))
    got = _count(gw, BODY)
    assert got.status_code == 400
    error = got.json()["error"]
    assert error["param"] == "model" and "no way to count" in error["message"]


def test_mistakes_are_the_same_400s_as_on_create(gateway: Factory) -> None:
    gw = _serve(gateway, ScriptedProvider([{"message": ["hi"]}]))
    assert _count(gw, {"model": "m"}).json()["error"]["param"] == "input"
    assert _count(gw, {"model": "nope", "input": "x"}).status_code == 404
    assert (
        _count(gw, {"model": "m", "input": "x", "temperature": "hot"}).json()["error"]["param"]
        == "temperature"
    )
