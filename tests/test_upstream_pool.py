"""The shared upstream pool: unlimited by default (every open stream holds a connection), limits and the
pool wait as configured, and the wait for a pooled connection never charged to the connect timeout."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gguf_files import QWEN, write_gguf
from responses_gateway.config import parse_config
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.registry import ProviderContext
from responses_gateway.providers.transport import Timeouts, Transport
from responses_gateway.server.registry import registry_from_config

ROOT = Path(__file__).resolve().parent.parent


class Gate:
    """An upstream that holds every request open until ``expected`` are open at once (or ``hold`` ends)."""

    def __init__(self, expected: int, hold: float) -> None:
        self.expected = expected
        self.hold = hold
        self.open = 0
        self.peak = 0
        self.all_in = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.open += 1
        self.peak = max(self.peak, self.open)
        if self.open >= self.expected:
            self.all_in.set()
        try:
            await asyncio.wait_for(self.all_in.wait(), self.hold)
        except TimeoutError:
            pass
        finally:
            self.open -= 1
        return web.Response(body=b"data: {}\n\n", content_type="text/event-stream")


async def _serve(gate: Gate) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/{tail:.*}", gate.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    server = site._server
    assert server is not None
    port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1/x"
    finally:
        await runner.cleanup()


async def _one(transport: Transport, url: str) -> bytes:
    resp = await transport.post(url, {}, {"stream": True})
    return await resp.read()


def test_default_pool_holds_150_streams_open_at_once() -> None:
    async def main() -> tuple[int, list[bytes]]:
        gate = Gate(expected=150, hold=15)
        async for url in _serve(gate):
            transport = Transport(timeouts=Timeouts(connect=2, read=30))
            try:
                bodies = await asyncio.gather(*(_one(transport, url) for _ in range(150)))
            finally:
                await transport.aclose()
            return gate.peak, bodies
        raise AssertionError("unreachable")

    peak, bodies = asyncio.run(main())
    # All 150 reached the upstream together: none waited for a pooled connection (the old 64 per host).
    assert peak == 150
    assert bodies == [b"data: {}\n\n"] * 150


def test_a_limited_pool_waits_past_the_connect_timeout_then_serves() -> None:
    async def main() -> tuple[int, list[bytes]]:
        gate = Gate(expected=10**6, hold=0.5)  # each request held 0.5 s
        async for url in _serve(gate):
            # connect 0.1 s: the second request waits ~0.5 s for the only connection, which is not a
            # connect timeout.
            transport = Transport(timeouts=Timeouts(connect=0.1, read=5), limit=1)
            try:
                bodies = await asyncio.gather(*(_one(transport, url) for _ in range(2)))
            finally:
                await transport.aclose()
            return gate.peak, bodies
        raise AssertionError("unreachable")

    peak, bodies = asyncio.run(main())
    assert peak == 1 and len(bodies) == 2


def test_pool_timeout_bounds_the_wait_with_a_504() -> None:
    async def main() -> None:
        gate = Gate(expected=10**6, hold=2.0)
        async for url in _serve(gate):
            transport = Transport(timeouts=Timeouts(connect=0.1, read=5), limit=1, pool_timeout=0.2)
            try:
                first = asyncio.ensure_future(_one(transport, url))
                await asyncio.sleep(0.1)
                with pytest.raises(ProviderError) as info:
                    await _one(transport, url)
                assert info.value.status == 504
                first.cancel()
            finally:
                await transport.aclose()

    asyncio.run(main())


def test_models_file_upstream_section_sizes_the_shared_pool() -> None:
    config = parse_config(
        "local: false\nupstream:\n  pool_limit: 500\n  pool_limit_per_host: 200\n  pool_timeout: 30\n"
        "models:\n  - name: q\n    provider: openai-chat\n    upstream_model: m\n"
        "    base_url: http://127.0.0.1:1/v1\n  - name: r\n    provider: openai\n    upstream_model: m\n",
        "models.yaml",
    )
    up = config.upstream
    assert (up.pool_limit, up.pool_limit_per_host, up.pool_timeout) == (500, 200, 30.0)
    registry = registry_from_config(config)
    q, r = registry.get_loaded("q"), registry.get_loaded("r")
    # Both providers share one transport, built from the section.
    transport = q._transport  # type: ignore[union-attr]
    assert transport is r._transport  # type: ignore[union-attr]
    assert (transport._limit, transport._limit_per_host, transport._pool_timeout) == (500, 200, 30.0)
    with pytest.raises(ValueError, match=r"models.yaml:2: upstream.pool_limit: must be 0 \(unlimited\)"):
        parse_config("upstream:\n  pool_limit: -1\nmodels: []\n", "models.yaml")


def _doc_examples() -> list[str]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("## Models file (`--config`)", 1)[1].split("### Third-party providers", 1)[0]
    return [b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "models:" in b]


@pytest.mark.parametrize("example", range(len(_doc_examples())))
def test_every_models_file_example_in_the_docs_starts(
    example: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _doc_examples()[example]
    for var in re.findall(r"api_key_env: (\w+)", text):
        monkeypatch.setenv(var, "sk-doc-example")
    for rel in re.findall(r"(?:model_path|script): (\S+)", text):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".gguf"):  # a local model's file is read (its metadata) at start-up
            write_gguf(tmp_path / rel, "qwen2", template=QWEN)
        else:
            (tmp_path / rel).write_text('- message: "hi"\n')
    path = tmp_path / "models.yaml"
    path.write_text(text)
    config = parse_config(text, str(path))
    registry = registry_from_config(config, context=ProviderContext())
    for model in config.models:
        assert model.name in registry.names()
