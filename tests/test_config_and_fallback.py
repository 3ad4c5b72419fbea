import asyncio
import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from responses_gateway.config import ConfigError, parse_config
from responses_gateway.protocol import StreamBuilder, new_response
from responses_gateway.protocol.request import ResponseRequest
from responses_gateway.providers.base import Provider, ProviderError
from responses_gateway.providers.fallback import FallbackProvider

GOOD = """\
models:
  - name: claude            # what clients send as "model"
    provider: anthropic
    upstream_model: claude-sonnet-4-5
    base_url: https://api.anthropic.com
    api_key_env: ANTHROPIC_API_KEY
    fallbacks: [claude-backup]
  - name: claude-backup
    provider: openai-chat
    upstream_model: qwen3
    base_url: http://127.0.0.1:8000/v1
    aliases: [backup]
    timeouts: {connect: 2, read: 30}
    options: {max_output_tokens: 1024}
"""


def test_issue_example_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = parse_config(GOOD, "models.yaml")
    assert [m.name for m in cfg.models] == ["claude", "claude-backup"]
    claude, backup = cfg.models
    assert claude.fallbacks == ("claude-backup",)
    assert backup.timeouts.connect == 2.0 and backup.timeouts.read == 30.0
    assert backup.options == {"max_output_tokens": 1024}
    assert cfg.local is True
    assert set(cfg.names()) == {"claude", "claude-backup", "backup"}
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert claude.api_key() == "sk-test"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "models.yaml:1: config: the file is empty"),
        ("models: [\n", "models.yaml:2: invalid YAML"),
        ("modelz: []\n", "models.yaml:1: config: unknown key 'modelz'"),
        (
            "models:\n  - name: a\n    provider: bedrock\n",
            "models.yaml:3: models[0].provider: must be one of",
        ),
        ("models:\n  - provider: local\n", "models.yaml:2: models[0]: missing required key 'name'"),
        (
            "models:\n  - name: a\n    provider: anthropic\n",
            "models.yaml:2: models[0]: provider 'anthropic' needs 'upstream_model'",
        ),
        (
            "models:\n  - name: a\n    provider: local\n    fallbacks: [nope]\n",
            "models.yaml:2: models[0].fallbacks: no model named 'nope'",
        ),
        (
            "models:\n  - name: a\n    provider: local\n  - name: a\n    provider: local\n",
            "models.yaml:4: models[1]: name 'a' is already used",
        ),
        (
            "models:\n  - name: a\n    provider: local\n    timeouts: {connect: -1}\n",
            "models.yaml:4: models[0].timeouts.connect: must be positive",
        ),
        (
            "models:\n  - name: a\n    provider: local\n    retries: yes\n",
            "models.yaml:4: models[0].retries: must be a int",
        ),
        (
            "models:\n  - name: a\n    provider: openai-chat\n    upstream_model: m\n"
            "    base_url: localhost:8000\n",
            "models.yaml:5: models[0].base_url: must start with http:// or https://",
        ),
    ],
)
def test_bad_configs_name_file_and_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "models.yaml")
    assert str(info.value).startswith(expected), str(info.value)


class _Upstream(Provider):
    """Fails ``failures`` times before answering with a text message."""

    def __init__(self, text: str, failures: list[ProviderError]) -> None:
        self.text = text
        self.failures = list(failures)
        self.attempts = 0

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        yield
        builder.message(self.text)
        builder.complete()
        yield


async def _run(provider: Provider) -> list[dict[str, object]]:
    builder = StreamBuilder(new_response("m"))
    builder.start()
    events = []
    async for _ in provider.stream(ResponseRequest(model="m"), builder):
        events.extend(builder.take())
    return events


def test_fallback_on_503_gives_one_clean_stream() -> None:
    first = _Upstream("from first", [ProviderError("down", status=503, code="server_is_overloaded")] * 3)
    second = _Upstream("from second", [])
    slept: list[float] = []

    async def sleep(d: float) -> None:
        slept.append(d)

    chain = FallbackProvider([("a", first), ("b", second)], retries=2, backoff=0.1, sleep=sleep)
    events = asyncio.run(_run(chain))
    assert first.attempts == 3 and second.attempts == 1
    assert slept == [0.1, 0.2]
    types = [e["type"] for e in events]
    assert types.count("response.created") == 1 and types[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert isinstance(final, dict)
    assert final["output"][0]["content"][0]["text"] == "from second"


def test_retry_after_is_respected_then_same_upstream_answers() -> None:
    first = _Upstream(
        "hello", [ProviderError("slow down", status=429, code="rate_limit_exceeded", retry_after=1.5)]
    )
    slept: list[float] = []

    async def sleep(d: float) -> None:
        slept.append(d)

    events = asyncio.run(_run(FallbackProvider([("a", first)], sleep=sleep)))
    assert slept == [1.5]
    assert events[-1]["type"] == "response.completed"


def test_long_retry_after_skips_to_the_next_model_without_waiting() -> None:
    first = _Upstream("a", [ProviderError("quota", status=429, code="rate_limit_exceeded", retry_after=120)])
    second = _Upstream("b", [])
    slept: list[float] = []

    async def sleep(d: float) -> None:
        slept.append(d)

    events = asyncio.run(_run(FallbackProvider([("a", first), ("b", second)], sleep=sleep)))
    assert slept == [] and first.attempts == 1
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "b"  # type: ignore[index]


def test_non_retryable_error_is_raised_at_once() -> None:
    first = _Upstream("a", [ProviderError("bad", status=400, code="invalid_request_error")])
    second = _Upstream("b", [])
    with pytest.raises(ProviderError) as info:
        asyncio.run(_run(FallbackProvider([("a", first), ("b", second)])))
    assert info.value.status == 400 and second.attempts == 0


def test_all_exhausted_raises_the_last_error() -> None:
    def down() -> list[ProviderError]:
        return [ProviderError("down", status=502, code="server_error")] * 5

    async def sleep(d: float) -> None:
        return None

    chain = FallbackProvider(
        [("a", _Upstream("a", down())), ("b", _Upstream("b", down()))], retries=1, sleep=sleep
    )
    with pytest.raises(ProviderError) as info:
        asyncio.run(_run(chain))
    assert info.value.status == 502


def test_the_model_that_answered_is_named_in_a_header_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through a real server: ``model`` stays the one asked for; ``x-gateway-model`` says which model
    of the chain produced the answer (streamed and not), and the log says so once."""
    from conftest import start_gateway

    async def no_wait(_: float) -> None:
        return None

    def chain() -> FallbackProvider:
        down = _Upstream("from a", [ProviderError("down", status=503, code="server_is_overloaded")] * 10)
        provider = FallbackProvider([("a", down), ("b", _Upstream("from b", []))], retries=0, sleep=no_wait)
        provider.name = "a"
        return provider

    caplog.set_level(logging.INFO, logger="responses_gateway")
    gw = start_gateway([chain()])
    try:
        for stream in (True, False):
            body = {"model": "a", "input": "hi", "stream": stream}
            got = httpx.post(gw.url("/v1/responses"), json=body, timeout=10)
            assert got.status_code == 200, got.text
            assert got.headers["x-gateway-model"] == "b"
            assert b"from b" in got.content
            if not stream:
                assert got.json()["model"] == "a"
    finally:
        gw.stop()
    assert "model b answered for a (fallback)" in caplog.text
    # A direct answer carries no such header.
    direct = start_gateway([_named(_Upstream("plain", []), "p")])
    try:
        got = httpx.post(direct.url("/v1/responses"), json={"model": "p", "input": "hi"}, timeout=10)
        assert got.status_code == 200 and "x-gateway-model" not in got.headers
    finally:
        direct.stop()


def _named(provider: Provider, name: str) -> Provider:
    provider.name = name
    return provider
