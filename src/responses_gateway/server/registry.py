"""Model name -> Provider. Providers that are slow to build (the embedded model) are built on first use."""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..providers.base import Provider

__all__ = ["LOCAL_MODEL", "ModelRegistry", "default_registry"]

log = logging.getLogger("responses_gateway.registry")

LOCAL_MODEL = "gemma-3-270m"

ProviderFactory = Callable[[], Provider]


@dataclass(slots=True)
class _Entry:
    name: str
    owned_by: str
    created: int
    provider: Provider | None = None
    factory: ProviderFactory | None = None
    lock: asyncio.Lock | None = None


class ModelRegistry:
    """The models the gateway serves, in registration order."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def add(
        self, provider: Provider, name: str | None = None, *, owned_by: str = "responses-gateway"
    ) -> None:
        """Serve ``provider`` under ``name`` (default: ``provider.name``)."""
        model = name or provider.name
        if not model:
            raise ValueError("a model needs a name")
        self._entries[model] = _Entry(model, owned_by, int(time.time()), provider=provider)

    def add_lazy(self, name: str, factory: ProviderFactory, *, owned_by: str = "responses-gateway") -> None:
        """Serve a provider that ``factory`` builds (in a worker thread) when the model is first asked for."""
        self._entries[name] = _Entry(name, owned_by, int(time.time()), factory=factory)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return list(self._entries)

    def get_loaded(self, name: str) -> Provider | None:
        """The provider if it is already built, without building it."""
        entry = self._entries.get(name)
        return entry.provider if entry is not None else None

    async def get(self, name: str) -> Provider | None:
        """The provider serving ``name``, building it on first use; None for an unknown model."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        if entry.provider is not None:
            return entry.provider
        if entry.lock is None:
            entry.lock = asyncio.Lock()
        async with entry.lock:
            if entry.provider is None:
                assert entry.factory is not None
                log.info("loading model %s", name)
                started = time.perf_counter()
                # Loading weights takes seconds: keep the event loop serving other requests meanwhile.
                provider = await asyncio.to_thread(entry.factory)
                await _load(provider)
                entry.provider = provider
                log.info("model %s ready in %.1f s", name, time.perf_counter() - started)
        return entry.provider

    async def preload(self) -> None:
        """Build and load every model now (at start-up) instead of on its first request."""
        for name in self.names():
            provider = await self.get(name)
            if provider is not None:
                await _load(provider)

    def models(self) -> list[dict[str, object]]:
        """The ``data`` of ``GET /v1/models``, in OpenAI's Model shape."""
        return [
            {"id": e.name, "object": "model", "created": e.created, "owned_by": e.owned_by}
            for e in self._entries.values()
        ]

    def model(self, name: str) -> dict[str, object] | None:
        entry = self._entries.get(name)
        if entry is None:
            return None
        return {"id": entry.name, "object": "model", "created": entry.created, "owned_by": entry.owned_by}

    async def aclose(self) -> None:
        """Close every built provider."""
        for entry in self._entries.values():
            if entry.provider is not None:
                try:
                    await entry.provider.aclose()
                except Exception:
                    log.exception("closing model %s failed", entry.name)


async def _load(provider: Provider) -> None:
    # Providers with weights (the embedded model) expose an idempotent blocking ``load()``.
    load = getattr(provider, "load", None)
    if callable(load):
        await asyncio.to_thread(load)


def default_registry(*, local: bool = True, model_path: str | None = None) -> ModelRegistry:
    """The embedded local model (unless ``local`` is False) and nothing else."""
    registry = ModelRegistry()
    if local:

        def build_local() -> Provider:
            # Imported here: llama_cpp takes a while to import and is an optional dependency.
            module = importlib.import_module("responses_gateway.providers.local")
            provider = module.LocalProvider(model_path)
            if not isinstance(provider, Provider):
                raise TypeError("LocalProvider is not a Provider")
            return provider

        registry.add_lazy(LOCAL_MODEL, build_local, owned_by="local")
    return registry
