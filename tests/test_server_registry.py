"""ModelRegistry: lazy building (once, off the event loop), loading, listing, failures."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import httpx

from conftest import Gateway
from responses_gateway.providers.base import Provider
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.server.registry import ModelRegistry


class Heavy(ScriptedProvider):
    """A provider with weights: ``load()`` is blocking and must run off the event loop."""

    def __init__(self) -> None:
        super().__init__([{"message": "loaded"}], name="heavy")
        self.loads: list[str] = []

    def load(self) -> None:
        self.loads.append(threading.current_thread().name)


def test_lazy_model_is_built_and_loaded_once_in_a_worker_thread() -> None:
    built: list[str] = []
    heavy = Heavy()

    def factory() -> Provider:
        built.append(threading.current_thread().name)
        return heavy

    registry = ModelRegistry()
    registry.add_lazy("heavy", factory)
    assert registry.get_loaded("heavy") is None

    async def main() -> list[Provider | None]:
        return await asyncio.gather(*(registry.get("heavy") for _ in range(5)))

    providers = asyncio.run(main())
    assert providers == [heavy] * 5
    assert len(built) == 1 and built[0] != threading.main_thread().name
    assert len(heavy.loads) == 1 and heavy.loads[0] != threading.main_thread().name
    assert asyncio.run(registry.get("unknown")) is None
    assert [m["id"] for m in registry.models()] == ["heavy"]


def test_preload_loads_registered_providers() -> None:
    registry = ModelRegistry()
    heavy = Heavy()
    registry.add(heavy)
    asyncio.run(registry.preload())
    assert len(heavy.loads) == 1


def test_a_model_that_fails_to_load_is_503_and_retried(gateway: Callable[..., Gateway]) -> None:
    attempts: list[int] = []

    def factory() -> Provider:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("weights missing: /secret/path.gguf")
        return ScriptedProvider([{"message": "second time lucky"}], name="flaky")

    registry = ModelRegistry()
    registry.add_lazy("flaky", factory)
    gw = gateway(registry)
    first = httpx.post(gw.url("/v1/responses"), json={"model": "flaky", "input": "hi"})
    assert first.status_code == 503
    assert first.json()["error"]["code"] == "model_unavailable"
    assert "/secret" not in first.text
    second = httpx.post(gw.url("/v1/responses"), json={"model": "flaky", "input": "hi"})
    assert second.json()["output"][0]["content"][0]["text"] == "second time lucky"
