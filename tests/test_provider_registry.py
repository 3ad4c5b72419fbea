"""Provider factories: the entry-point group third parties use, the built-in table, and the registry a
models file builds (names, aliases, fallback chains, the embedded model kept lazy)."""

from __future__ import annotations

import asyncio
import sys
import tomllib
from collections.abc import AsyncIterator
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.config import ConfigError, ModelConfig, parse_config
from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.request import ResponseRequest
from responses_gateway.protocol.response import new_response
from responses_gateway.providers import registry as providers_registry
from responses_gateway.providers.base import Provider, ProviderError
from responses_gateway.providers.fallback import FallbackProvider
from responses_gateway.providers.registry import (
    BUILTIN_FACTORIES,
    ENTRY_POINT_GROUP,
    ProviderContext,
    RequestDefaults,
    provider_names,
)
from responses_gateway.server.registry import LOCAL_MODEL, registry_from_config

ROOT = Path(__file__).resolve().parent.parent
THIS_MODULE = Path(__file__).stem


class EchoProvider(Provider):
    """A third-party provider: answers with its configured greeting and the upstream model name."""

    def __init__(self, greeting: str, upstream: str | None) -> None:
        self.name = "echo"
        self.greeting = greeting
        self.upstream = upstream
        self.closed = False

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        yield
        builder.message(f"{self.greeting} from {self.upstream}")
        builder.complete()
        yield

    async def aclose(self) -> None:
        self.closed = True


def echo_factory(model: ModelConfig, context: ProviderContext) -> Provider:
    """The factory a third-party package would declare as an entry point."""
    options = dict(model.options)
    greeting = options.pop("greeting", "hello")
    if options:
        raise model.error(f"unknown option {next(iter(options))!r}", f"options.{next(iter(options))}")
    return EchoProvider(str(greeting), model.upstream_model)


def not_a_provider_factory(model: ModelConfig, context: ProviderContext) -> Any:
    return object()


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    """Make importlib.metadata report these entry points (name=module:attr) in the providers group."""
    eps = [metadata.EntryPoint(name=n, value=v, group=ENTRY_POINT_GROUP) for n, v in targets.items()]
    real = metadata.entry_points

    def entry_points(**params: Any) -> Any:
        if params.get("group") == ENTRY_POINT_GROUP:
            return metadata.EntryPoints(eps)
        return real(**params)

    monkeypatch.setattr(metadata, "entry_points", entry_points)


ECHO_CONFIG = """\
local: false
models:
  - name: parrot
    provider: echo
    upstream_model: polly-1
    aliases: [polly]
    options: {greeting: squawk}
"""


def test_a_third_party_entry_point_is_a_provider_a_config_can_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sys.modules.get(THIS_MODULE) is not None  # importable by name, as an entry point needs
    _fake_entry_points(monkeypatch, echo=f"{THIS_MODULE}:echo_factory")
    assert "echo" in provider_names() and "anthropic" in provider_names()
    config = parse_config(ECHO_CONFIG, "models.yaml")
    registry = registry_from_config(config, context=ProviderContext())
    assert registry.names() == ["parrot", "polly"]
    assert [(m["id"], m["owned_by"]) for m in registry.models()] == [("parrot", "echo"), ("polly", "echo")]
    gw: Gateway = start_gateway(registry)
    try:
        response = httpx.post(gw.url("/v1/responses"), json={"model": "polly", "input": "hi", "stream": True})
        assert response.status_code == 200
        events = decode_sse(response.content)
        check_stream(events)
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "squawk from polly-1"
    finally:
        gw.stop()
    provider = registry.get_loaded("parrot")
    assert isinstance(provider, EchoProvider) and provider.closed  # closed at shutdown


def test_without_the_entry_point_the_name_is_unknown_with_file_and_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_entry_points(monkeypatch)
    with pytest.raises(ConfigError) as info:
        parse_config(ECHO_CONFIG, "models.yaml")
    message = str(info.value)
    assert message.startswith("models.yaml:4: models[0].provider: must be one of the known providers: ")
    assert "anthropic, gemini, local, openai, openai-chat, scripted (not 'echo')" in message
    assert ENTRY_POINT_GROUP in message


def test_broken_entry_points_are_start_up_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, echo="no_such_module_here:factory")
    config = parse_config(ECHO_CONFIG, "models.yaml")
    with pytest.raises(
        ConfigError, match=r"^models.yaml:4: models\[0\].provider: provider 'echo': entry point"
    ):
        registry_from_config(config, context=ProviderContext())
    _fake_entry_points(monkeypatch, echo=f"{THIS_MODULE}:not_a_provider_factory")
    with pytest.raises(ConfigError, match="returned object, not a Provider"):
        registry_from_config(parse_config(ECHO_CONFIG, "models.yaml"), context=ProviderContext())


def test_an_entry_point_with_a_built_in_name_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, anthropic=f"{THIS_MODULE}:echo_factory")
    config = parse_config("models:\n  - name: c\n    provider: anthropic\n    upstream_model: u\n", "m.yaml")
    registry = registry_from_config(config, local=False, context=ProviderContext())
    assert isinstance(registry.get_loaded("c"), EchoProvider)


def test_factory_option_errors_name_the_option_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, echo=f"{THIS_MODULE}:echo_factory")
    text = ECHO_CONFIG.replace("options: {greeting: squawk}", "options:\n      colour: blue")
    with pytest.raises(ConfigError, match=r"^models.yaml:8: models\[0\].options.colour: unknown option"):
        registry_from_config(parse_config(text, "models.yaml"), context=ProviderContext())


def test_pyproject_declares_every_built_in_provider_as_an_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"][ENTRY_POINT_GROUP]
    assert set(declared) == set(BUILTIN_FACTORIES)
    for name, target in declared.items():
        module, _, attr = target.partition(":")
        assert module == "responses_gateway.providers.registry"
        assert getattr(providers_registry, attr) is BUILTIN_FACTORIES[name]
    # Once installed (pip install -e . after this table was added) they resolve to the same factories.
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN_FACTORIES:
            assert ep.load() is BUILTIN_FACTORIES[ep.name]


def test_embedded_model_stays_unless_turned_off(tmp_path: Path) -> None:
    script = tmp_path / "demo.yaml"
    script.write_text('- message: "hi"\n')
    text = f"models:\n  - name: demo\n    provider: scripted\n    script: {script.name}\n"
    config_file = str(tmp_path / "models.yaml")
    on = registry_from_config(parse_config(text, config_file), context=ProviderContext())
    assert on.names() == [LOCAL_MODEL, "demo"]
    assert on.models()[0]["owned_by"] == "local"
    assert on.get_loaded(LOCAL_MODEL) is None  # lazy: llama_cpp is not imported at start-up
    off = registry_from_config(parse_config("local: false\n" + text, config_file), context=ProviderContext())
    assert off.names() == ["demo"]
    flag = registry_from_config(parse_config(text, config_file), local=False, context=ProviderContext())
    assert flag.names() == ["demo"]


def test_fallback_to_the_embedded_model_with_it_turned_off_is_an_error(tmp_path: Path) -> None:
    script = tmp_path / "demo.yaml"
    script.write_text('- message: "hi"\n')
    text = f"models:\n  - name: demo\n    provider: scripted\n    script: {script}\n"
    text += "    fallbacks: [gemma-3-270m]\n"
    with pytest.raises(ConfigError, match=r"models.yaml:5: models\[0\].fallbacks: .*turned off"):
        registry_from_config(parse_config(text, "models.yaml"), local=False, context=ProviderContext())


class _Flaky(Provider):
    def __init__(self, name: str, failures: int) -> None:
        self.name = name
        self.failures = failures
        self.calls = 0

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ProviderError("overloaded", status=503, code="server_is_overloaded")
        yield
        builder.message(f"{self.name} answered")
        builder.complete()
        yield


def test_registry_chains_fallbacks_with_per_model_retries() -> None:
    from responses_gateway.server.registry import ModelRegistry

    registry = ModelRegistry()
    first, second = _Flaky("first", failures=10), _Flaky("second", failures=1)
    registry.add(first, "first", fallbacks=["second-alias"], retries=0)
    registry.add(second, "second", aliases=["second-alias"], retries=1)
    chain = asyncio.run(registry.get("first"))
    assert isinstance(chain, FallbackProvider)
    assert [name for name, _ in chain.chain] == ["first", "second"] and chain.retries == [0, 1]
    chain.backoff = 0.0
    gw = start_gateway(registry)
    try:
        body = httpx.post(gw.url("/v1/responses"), json={"model": "first", "input": "x"}).json()
    finally:
        gw.stop()
    assert body["output"][0]["content"][0]["text"] == "second answered"
    assert (first.calls, second.calls) == (1, 2)


def test_request_defaults_fill_only_what_the_client_left_out() -> None:
    seen: list[ResponseRequest] = []

    class Recorder(Provider):
        async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
            seen.append(request)
            yield

    wrapped = RequestDefaults(Recorder(), max_output_tokens=99, reasoning_effort="low")

    async def run(request: ResponseRequest) -> None:
        async for _ in wrapped.stream(request, StreamBuilder(new_response("m"))):
            pass

    asyncio.run(run(ResponseRequest(model="m", raw={"model": "m"})))
    asyncio.run(
        run(ResponseRequest(model="m", max_output_tokens=5, reasoning={"effort": "high", "summary": "auto"}))
    )
    assert seen[0].max_output_tokens == 99 and seen[0].reasoning == {"effort": "low"}
    assert seen[0].raw == {"model": "m", "max_output_tokens": 99, "reasoning": {"effort": "low"}}
    assert seen[1].max_output_tokens == 5 and seen[1].reasoning == {"effort": "high", "summary": "auto"}
