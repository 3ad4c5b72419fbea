"""Provider factories: how a ``provider:`` name in the models file becomes a :class:`Provider`.

A factory is any callable ``(ModelConfig, ProviderContext) -> Provider``. Factories are found through
the entry-point group ``responses_gateway.providers`` (name = the ``provider:`` value), which is how the
built-in ones are declared in pyproject.toml and how a third-party package adds its own::

    [project.entry-points."responses_gateway.providers"]
    bedrock = "my_package.bedrock:make_provider"

The built-in factories are also in :data:`BUILTIN_FACTORIES`, so they resolve even when the installed
distribution's metadata predates them; an entry point with a built-in name wins over the table.

A factory validates the model's ``options`` (unknown or ill-typed ones raise ``model.error(...)``,
which names the file and line) and reads credentials from the environment through
:func:`api_key` (never printing the value). A factory whose ``lazy`` attribute is true is called on the
model's first request, in a worker thread (the embedded model imports heavy modules); its ``check``
attribute, if any, is called at start-up with the same arguments to validate the model early.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from ..config import ModelConfig
from ..config import Timeouts as ModelTimeouts
from ..protocol.builder import StreamBuilder
from ..protocol.request import EFFORTS, ResponseRequest
from .base import Provider, Wrapper
from .gguf_file import BUNDLED_TRAINED_CONTEXT, DEFAULT_N_CTX, PROMPT_FORMATS, ModelFileError, read_gguf
from .names import BUILTIN_NAMES, ENTRY_POINT_GROUP, entry_points, provider_names
from .transport import Timeouts, Transport

__all__ = [
    "BUILTIN_FACTORIES",
    "ENTRY_POINT_GROUP",
    "ProviderContext",
    "ProviderFactory",
    "RequestDefaults",
    "api_key",
    "build_provider",
    "check_lazy",
    "factory_for",
    "is_lazy",
    "provider_names",
    "transport_timeouts",
]

log = logging.getLogger("responses_gateway.providers")


@dataclass(slots=True)
class ProviderContext:
    """What a factory gets besides its model's config: shared resources of the running gateway."""

    # The one pooled HTTP client every upstream provider shares (closed by the server at shutdown).
    transport: Transport = field(default_factory=Transport)
    # responses_gateway.sealing.Sealer for reasoning state in encrypted_content (None: unsealed).
    sealer: Any = None
    # The gateway's data directory (the embedded model's weights live under it); None: the default.
    data_dir: Path | None = None
    # --model-path: the GGUF for a ``local`` model that names no ``model_path``.
    model_path: str | None = None


ProviderFactory = Callable[[ModelConfig, ProviderContext], Provider]


# --------------------------------------------------------------------------------------- lookup
def factory_for(model: ModelConfig) -> ProviderFactory:
    """The factory for ``model.provider``: its entry point, else the built-in table.

    An unknown name, or an entry point that cannot be imported, is a ConfigError naming the file and
    line of the model's ``provider`` key.
    """
    ep = entry_points().get(model.provider)
    if ep is not None:
        try:
            loaded = ep.load()
        except Exception as exc:
            raise model.error(
                f"provider {model.provider!r}: entry point {ep.value!r} cannot be loaded "
                f"({type(exc).__name__}: {exc})",
                "provider",
            ) from None
        if not callable(loaded):
            raise model.error(
                f"provider {model.provider!r}: entry point {ep.value!r} is not callable", "provider"
            )
        factory: ProviderFactory = loaded
        return factory
    builtin = BUILTIN_FACTORIES.get(model.provider)
    if builtin is not None:
        return builtin
    raise model.error(
        f"unknown provider {model.provider!r}; known providers: {', '.join(provider_names())}", "provider"
    )


def is_lazy(factory: ProviderFactory) -> bool:
    """Whether the factory is to be called on first use (in a worker thread) instead of at start-up."""
    return bool(getattr(factory, "lazy", False))


def check_lazy(factory: ProviderFactory, model: ModelConfig, context: ProviderContext) -> dict[str, Any]:
    """Run a lazy factory's start-up check (its ``check`` attribute, same signature), if it has one.

    The check may return details about the model (e.g. a local model's context sizes), listed with it
    in ``GET /v1/models``."""
    check = getattr(factory, "check", None)
    if callable(check):
        details = check(model, context)
        if isinstance(details, dict):
            return details
    return {}


def build_provider(model: ModelConfig, context: ProviderContext) -> Provider:
    """Build ``model``'s provider now (ConfigError for a bad model, naming file and line)."""
    factory = factory_for(model)
    provider = factory(model, context)
    if not isinstance(provider, Provider):
        raise model.error(
            f"provider {model.provider!r}: the factory returned {type(provider).__name__}, not a Provider",
            "provider",
        )
    return provider


# --------------------------------------------------------------------------------------- helpers
def api_key(model: ModelConfig, *, required: bool = True) -> str | None:
    """The key from ``api_key_env``; an unset or empty variable is a ConfigError that names the
    variable (never a value). No ``api_key_env``: None."""
    if not model.api_key_env:
        return None
    value = model.api_key()
    if not value:
        if not required:
            return None
        raise model.error(
            f"the environment variable {model.api_key_env} is not set (it should hold the upstream API key)",
            "api_key_env",
        )
    return value


def transport_timeouts(timeouts: ModelTimeouts) -> Timeouts:
    """The transport's limits for a model's ``timeouts``."""
    return Timeouts(connect=timeouts.connect, read=timeouts.read, total=timeouts.total)


class _Options:
    """Typed access to ``model.options``; every key must be consumed, else an error names it."""

    def __init__(self, model: ModelConfig) -> None:
        self.model = model
        self.values: dict[str, Any] = dict(model.options)
        self.known: list[str] = []

    def _fail(self, key: str, message: str) -> Exception:
        return self.model.error(message, f"options.{key}")

    def take(self, key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        self.known.append(key)
        if key not in self.values:
            return default
        value = self.values.pop(key)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self._fail(key, f"must be a {names}, not {value!r}")
        return value

    def positive_int(self, key: str, default: int | None = None) -> int | None:
        value = self.take(key, int)
        if value is None:
            return default
        if value <= 0:
            raise self._fail(key, "must be a positive integer")
        return int(value)

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str | None:
        value = self.take(key, str)
        if value is None:
            return default
        if value not in choices:
            raise self._fail(key, f"must be one of {', '.join(choices)}, not {value!r}")
        return str(value)

    def literal(self, key: str, kind: Any, default: str) -> Any:
        return self.choice(key, tuple(get_args(kind)), default)

    def str_map(self, key: str) -> dict[str, str] | None:
        value = self.take(key, dict)
        if value is None:
            return None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise self._fail(key, "must map strings to strings")
        return dict(value)

    def str_list(self, key: str) -> list[str]:
        value = self.take(key, list, [])
        if not all(isinstance(v, str) for v in value):
            raise self._fail(key, "must be a list of strings")
        return list(value)

    def done(self) -> None:
        if self.values:
            key = next(iter(self.values))
            known = ", ".join(sorted(self.known))
            raise self._fail(key, f"unknown option for provider {self.model.provider!r}; known: {known}")


def _path(model: ModelConfig, value: str) -> str:
    """A path from the models file: relative ones are relative to the file's directory."""
    path = Path(value).expanduser()
    if not path.is_absolute() and model.source and not model.source.startswith("<"):
        path = Path(model.source).resolve().parent / path
    return str(path)


class RequestDefaults(Wrapper):
    """Applies a model's defaults (``max_output_tokens``, ``reasoning.effort``) to requests that set
    none, then hands the request to the wrapped provider. No generator of its own: ``stream`` returns
    the inner provider's, so the hot path is untouched."""

    def __init__(
        self, inner: Provider, *, max_output_tokens: int | None = None, reasoning_effort: str | None = None
    ) -> None:
        super().__init__(inner)
        self.max_output_tokens = max_output_tokens
        self.reasoning_effort = reasoning_effort

    def __repr__(self) -> str:
        return f"<RequestDefaults {self.inner!r}>"

    def check_request(self, request: ResponseRequest) -> None:
        self.inner.check_request(self.apply(request))

    def apply(self, request: ResponseRequest) -> ResponseRequest:
        changes: dict[str, Any] = {}
        raw = request.raw
        if self.max_output_tokens is not None and request.max_output_tokens is None:
            changes["max_output_tokens"] = self.max_output_tokens
            raw = {**raw, "max_output_tokens": self.max_output_tokens}
        if self.reasoning_effort is not None and (request.reasoning or {}).get("effort") is None:
            reasoning = {**(request.reasoning or {}), "effort": self.reasoning_effort}
            changes["reasoning"] = reasoning
            raw = {**raw, "reasoning": {**(raw.get("reasoning") or {}), "effort": self.reasoning_effort}}
        if not changes:
            return request
        return dataclasses.replace(request, raw=raw, **changes)

    def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        return self.inner.stream(self.apply(request), builder)

    async def count_input_tokens(self, request: ResponseRequest) -> int:
        return await self.inner.count_input_tokens(self.apply(request))

    async def compact(self, request: ResponseRequest) -> dict[str, Any] | None:
        return await self.inner.compact(self.apply(request))

    async def aclose(self) -> None:
        await self.inner.aclose()

    def load(self) -> None:
        load = getattr(self.inner, "load", None)
        if callable(load):
            load()


def _with_defaults(provider: Provider, opts: _Options, *, effort: bool = True) -> Provider:
    max_output = opts.positive_int("max_output_tokens")
    reasoning_effort = opts.choice("reasoning_effort", EFFORTS) if effort else None
    opts.done()
    if max_output is None and reasoning_effort is None:
        return provider
    return RequestDefaults(provider, max_output_tokens=max_output, reasoning_effort=reasoning_effort)


def _no_upstream_keys(model: ModelConfig, *keys: str) -> None:
    for key in keys:
        if getattr(model, key):
            raise model.error(f"provider {model.provider!r} does not use {key!r}", key)


# --------------------------------------------------------------------------------------- built-ins
def anthropic_factory(model: ModelConfig, context: ProviderContext) -> Provider:
    from .anthropic import AnthropicProvider, ThinkingOutput

    _no_upstream_keys(model, "model_path", "script")
    opts = _Options(model)
    kwargs: dict[str, Any] = {}
    max_output = opts.positive_int("max_output_tokens")
    if max_output is not None:
        kwargs["default_max_tokens"] = max_output  # Anthropic requires max_tokens: this is its default
    provider = AnthropicProvider(
        base_url=model.base_url or "https://api.anthropic.com",
        api_key=api_key(model),
        upstream_model=model.upstream_model,
        transport=context.transport,
        timeouts=transport_timeouts(model.timeouts),
        default_effort=opts.choice("reasoning_effort", EFFORTS),
        thinking_output=opts.literal("thinking_output", ThinkingOutput, "summary"),
        strict_tools=bool(opts.take("strict_tools", bool, False)),
        betas=opts.str_list("betas"),
        extra_headers=opts.str_map("extra_headers"),
        max_continuations=opts.positive_int("max_continuations", 4) or 4,
        prompt_caching=bool(opts.take("prompt_caching", bool, False)),
        sealer=context.sealer,
        **kwargs,
    )
    opts.done()
    return provider


def openai_chat_factory(model: ModelConfig, context: ProviderContext) -> Provider:
    from .openai_chat import (
        DIALECT_PRESETS,
        ChatDialect,
        EffortStyle,
        MaxTokensField,
        NamedToolChoice,
        OpenAIChatProvider,
        Passback,
        ReasoningOutput,
        StructuredOutput,
    )

    _no_upstream_keys(model, "model_path", "script")
    opts = _Options(model)
    preset = dict(DIALECT_PRESETS[opts.choice("dialect", tuple(DIALECT_PRESETS)) or "openai"])
    base = ChatDialect(**preset)
    dialect = ChatDialect(
        system_role=opts.literal("system_role", Literal["system", "developer"], base.system_role),
        max_tokens_field=opts.literal("max_tokens_field", MaxTokensField, base.max_tokens_field),
        effort_style=opts.literal("effort_style", EffortStyle, base.effort_style),
        reasoning_passback=opts.literal("reasoning_passback", Passback, base.reasoning_passback),
        include_usage=bool(opts.take("include_usage", bool, base.include_usage)),
        extra_body=opts.take("extra_body", dict, None) or {},
        structured_output=opts.literal("structured_output", StructuredOutput, base.structured_output),
        named_tool_choice=opts.literal("named_tool_choice", NamedToolChoice, base.named_tool_choice),
    )
    provider = OpenAIChatProvider(
        base_url=model.base_url or "https://api.openai.com/v1",
        api_key=api_key(model),
        upstream_model=model.upstream_model,
        dialect=dialect,
        transport=context.transport,
        timeouts=transport_timeouts(model.timeouts),
        reasoning_output=opts.literal("reasoning_output", ReasoningOutput, "summary"),
        extra_headers=opts.str_map("extra_headers"),
        upstream_name=opts.take("upstream_name", str, "The upstream"),
    )
    return _with_defaults(provider, opts)


def openai_factory(model: ModelConfig, context: ProviderContext) -> Provider:
    from .openai_responses import OpenAIResponsesProvider

    _no_upstream_keys(model, "model_path", "script")
    opts = _Options(model)
    provider = OpenAIResponsesProvider(
        base_url=model.base_url or "https://api.openai.com/v1",
        api_key=api_key(model),
        upstream_model=model.upstream_model,
        transport=context.transport,
        timeouts=transport_timeouts(model.timeouts),
        extra_headers=opts.str_map("extra_headers"),
        check_upstream=bool(opts.take("check_upstream", bool, True)),
        upstream_name=opts.take("upstream_name", str, "OpenAI"),
    )
    return _with_defaults(provider, opts)


def gemini_factory(model: ModelConfig, context: ProviderContext) -> Provider:
    from .gemini import GeminiProvider, ReasoningOutput, ThinkingStyle

    _no_upstream_keys(model, "model_path", "script")
    opts = _Options(model)
    provider = GeminiProvider(
        base_url=model.base_url or "https://generativelanguage.googleapis.com/v1beta",
        api_key=api_key(model),
        upstream_model=model.upstream_model,
        transport=context.transport,
        timeouts=transport_timeouts(model.timeouts),
        thinking_style=opts.literal("thinking_style", ThinkingStyle, "auto"),
        include_thoughts=opts.take("include_thoughts", bool, None),
        reasoning_output=opts.literal("reasoning_output", ReasoningOutput, "summary"),
        extra_headers=opts.str_map("extra_headers"),
    )
    return _with_defaults(provider, opts)


_LOCAL_INT_OPTIONS = ("n_ctx", "n_threads", "n_batch", "max_queue", "max_parallel_calls", "top_k")


def _local_kwargs(model: ModelConfig, context: ProviderContext) -> tuple[dict[str, Any], _Options]:
    _no_upstream_keys(model, "upstream_model", "base_url", "api_key_env", "script")
    opts = _Options(model)
    kwargs: dict[str, Any] = {}
    for key in _LOCAL_INT_OPTIONS:
        value = opts.positive_int(key)
        if value is not None:
            kwargs[key] = value
    seed = opts.take("seed", int)
    if seed is not None:
        kwargs["seed"] = seed
    kwargs["extra_buffers"] = bool(opts.take("extra_buffers", bool, False))
    kwargs["prompt_format"] = opts.choice("prompt_format", PROMPT_FORMATS, "auto")
    path = _path(model, model.model_path) if model.model_path else context.model_path
    kwargs["model_path"] = path
    kwargs["data_dir"] = context.data_dir
    return kwargs, opts


def local_factory(model: ModelConfig, context: ProviderContext) -> Provider:
    # Checked at start-up by the registry (check_local_options), built on first use in a worker thread.
    kwargs, opts = _local_kwargs(model, context)
    from .local import LocalProvider

    provider = LocalProvider(**kwargs)
    return _with_defaults(provider, opts, effort=False)


def check_local_options(model: ModelConfig, context: ProviderContext) -> dict[str, Any]:
    """Validate a ``local`` model's keys, options and model file at start-up without importing llama_cpp;
    its context sizes."""
    kwargs, opts = _local_kwargs(model, context)
    opts.positive_int("max_output_tokens")
    opts.done()
    try:
        return local_model_details(kwargs["model_path"], kwargs.get("n_ctx"))
    except ModelFileError as exc:
        raise model.error(str(exc), "model_path") from None


def local_model_details(model_path: str | Path | None, n_ctx: int | None = None) -> dict[str, Any]:
    """What ``GET /v1/models`` says of a local model: ``context_length`` (the context it is run with)
    and ``trained_context_length``; reading the file's metadata checks it (ModelFileError)."""
    if model_path is None:
        return {"context_length": n_ctx or DEFAULT_N_CTX, "trained_context_length": BUNDLED_TRAINED_CONTEXT}
    info = read_gguf(model_path)
    details: dict[str, Any] = {"context_length": n_ctx or DEFAULT_N_CTX}
    if info.context_length:
        details["trained_context_length"] = info.context_length
    return details


def scripted_factory(model: ModelConfig, context: ProviderContext) -> Provider:
    from .scripted import ScriptedProvider, ScriptError

    _no_upstream_keys(model, "upstream_model", "base_url", "api_key_env", "model_path")
    assert model.script is not None  # the config parser requires it
    opts = _Options(model)
    opts.done()
    path = _path(model, model.script)
    try:
        return ScriptedProvider.from_file(path, name=model.name)
    except (ScriptError, OSError) as exc:
        message = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise model.error(f"{path}: {message}", "script") from None


BUILTIN_FACTORIES: Mapping[str, ProviderFactory] = {
    "anthropic": anthropic_factory,
    "openai-chat": openai_chat_factory,
    "openai": openai_factory,
    "gemini": gemini_factory,
    "local": local_factory,
    "scripted": scripted_factory,
}


assert set(BUILTIN_FACTORIES) == set(BUILTIN_NAMES), "providers/names.py lists the built-in providers"

local_factory.lazy = True  # type: ignore[attr-defined]
local_factory.check = check_local_options  # type: ignore[attr-defined]
