"""The models file (``serve --config models.yaml``): public model names routed to back ends.

Validated once at start-up. Every error names the file and line, e.g.
``models.yaml:7: models[1].provider: must be one of the known providers: anthropic, gemini, …``.
The file's structure is checked here; each provider's factory (``providers.registry``) checks the
``options`` it understands and reports errors through :meth:`ModelConfig.error`, with the same
file:line form.

Reference: docs/configuration.md.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .providers.names import provider_names

__all__ = [
    "PROVIDER_KINDS",
    "ConfigError",
    "GatewayConfig",
    "McpServerConfig",
    "ModelConfig",
    "Timeouts",
    "UpstreamConfig",
    "WebSearchConfig",
    "load_config",
    "parse_config",
]

# The built-in providers; third-party ones register through the ``responses_gateway.providers``
# entry-point group (see providers/registry.py) and are accepted as well.
PROVIDER_KINDS = ("anthropic", "openai-chat", "openai", "gemini", "local", "scripted")
# Built-in providers that talk to an upstream over HTTP.
UPSTREAM_KINDS = ("anthropic", "openai-chat", "openai", "gemini")

_MODEL_KEYS = {
    "name",
    "provider",
    "upstream_model",
    "base_url",
    "api_key_env",
    "fallbacks",
    "aliases",
    "options",
    "timeouts",
    "retries",
    "model_path",
    "script",
}
_TIMEOUT_KEYS = {"connect", "read", "total"}
_UPSTREAM_KEYS = {
    "pool_limit",
    "pool_limit_per_host",
    "pool_keepalive",
    "pool_timeout",
    "trust_env",
    "max_event_bytes",
    "max_error_body_bytes",
}
_TOP_KEYS = {"models", "local", "upstream", "mcp_servers", "web_search", "file_search"}
_FILE_SEARCH_KEYS = {"warm_indexes"}
_SEARCH_KEYS = {"backend", "url", "api_key_env"}
SEARCH_BACKENDS = ("searxng", "brave")
_MCP_KEYS = {"label", "url", "transport", "headers_env", "authorization_env"}
MCP_TRANSPORTS = ("auto", "streamable_http", "sse")


class ConfigError(ValueError):
    """A models file that cannot be used; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-model upstream limits in seconds.

    ``connect``: the TCP (and TLS) connect. ``read``: the longest silence, waiting for the response
    headers or between two chunks of the body (a long generation that keeps streaming is never cut).
    ``total``: the whole request, None for no limit.
    """

    connect: float = 10.0
    read: float = 300.0
    total: float | None = None


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """The one connection pool every upstream provider shares (the file's ``upstream:`` section).

    A streaming gateway holds one upstream connection per open stream, so by default the pool is
    unlimited (0); a positive limit makes further requests wait up to ``pool_timeout`` seconds
    (None: as long as it takes) for a free connection.
    """

    pool_limit: int = 0
    pool_limit_per_host: int = 0
    pool_keepalive: float = 60.0
    pool_timeout: float | None = None
    trust_env: bool = False
    # What one upstream can make the gateway hold: one stream event still arriving, and the part of
    # an error body read for its message (docs/security.md).
    max_event_bytes: int = 16 * 1024 * 1024
    max_error_body_bytes: int = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    provider: str
    upstream_model: str | None = None
    base_url: str | None = None
    api_key_env: str | None = None
    fallbacks: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    timeouts: Timeouts = Timeouts()
    retries: int = 2
    model_path: str | None = None
    script: str | None = None
    # Where the model was defined, for error messages: file, line of its entry, ``models[i]``, and the
    # line of each key (``"provider"``, ``"options.reasoning_effort"``…).
    source: str = field(default="<config>", compare=False)
    line: int = field(default=1, compare=False)
    where: str = field(default="model", compare=False)
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    def api_key(self) -> str | None:
        """The upstream key, read from the environment at the moment it is needed."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def error(self, message: str, key: str | None = None) -> ConfigError:
        """A ConfigError for this model (or one of its keys) naming the file and line."""
        line = self.lines.get(key, self.line) if key else self.line
        where = f"{self.where}.{key}" if key else self.where
        return ConfigError(f"{self.source}:{line}: {where}: {message}")


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """An MCP server the operator names (the file's ``mcp_servers:``): a request may use it by its
    label alone (``{"type": "mcp", "server_label": "docs"}``). Header values come from environment
    variables, read when the gateway starts; the URL is trusted (no network guard)."""

    label: str
    url: str
    transport: str = "auto"
    headers_env: Mapping[str, str] = field(default_factory=dict)  # header name -> variable name
    authorization_env: str | None = None  # a variable holding a bearer token
    where: str = field(default="mcp_servers", compare=False)

    def headers(self) -> dict[str, str]:
        """The headers to send, read from the environment now; ValueError naming a missing variable."""
        out: dict[str, str] = {}
        wanted = dict(self.headers_env)
        if self.authorization_env:
            wanted["Authorization"] = self.authorization_env
        for header, variable in wanted.items():
            value = os.environ.get(variable)
            if not value:
                raise ValueError(f"{self.where}: the environment variable {variable} is not set")
            out[header] = (
                f"Bearer {value}"
                if header == "Authorization" and variable == self.authorization_env
                else value
            )
        return out


@dataclass(frozen=True, slots=True)
class WebSearchConfig:
    """The search engine the hosted ``web_search`` tool asks (the file's ``web_search:``): SearXNG's
    JSON API at ``url``, or the Brave Search API with its key in the variable ``api_key_env``."""

    backend: str
    url: str | None = None
    api_key_env: str | None = None
    where: str = field(default="web_search", compare=False)

    def api_key(self) -> str:
        value = os.environ.get(self.api_key_env or "")
        if not value:
            raise ValueError(f"{self.where}: the environment variable {self.api_key_env} is not set")
        return value


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    models: tuple[ModelConfig, ...] = ()
    mcp_servers: tuple[McpServerConfig, ...] = ()
    web_search: WebSearchConfig | None = None
    # The file's ``file_search: {warm_indexes: false}``: no start-up warm-up of the vector stores'
    # indexes (as ``serve --no-warm-indexes``; docs/file-search.md, "Warm-up").
    warm_indexes: bool = True
    # The embedded model stays available as ``gemma-3-270m`` unless the file says ``local: false``.
    local: bool = True
    upstream: UpstreamConfig = UpstreamConfig()

    def names(self) -> dict[str, ModelConfig]:
        """Every name a client may send (names and aliases) to its model."""
        out: dict[str, ModelConfig] = {}
        for model in self.models:
            out[model.name] = model
            for alias in model.aliases:
                out[alias] = model
        return out


def load_config(path: str | Path, *, providers: Collection[str] | None = None) -> GatewayConfig:
    """Read and validate a models file; ``providers``: the accepted provider names (default: all
    registered ones, built-in and entry points)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_config(text, str(path), providers=providers)


def parse_config(
    text: str, filename: str = "<config>", *, providers: Collection[str] | None = None
) -> GatewayConfig:
    if providers is None:
        providers = provider_names()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise ConfigError(f"{filename}:{line}: invalid YAML: {exc.problem}") from None
    return _Parser(filename, providers).top(root)


class _Parser:
    def __init__(self, filename: str, providers: Collection[str]) -> None:
        self.filename = filename
        self.providers = sorted(providers)

    def fail(self, node: yaml.Node | None, where: str, message: str) -> ConfigError:
        line = node.start_mark.line + 1 if node is not None else 1
        return ConfigError(f"{self.filename}:{line}: {where}: {message}")

    def mapping(self, node: yaml.Node, where: str, allowed: set[str]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, where, "must be a mapping")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str) or key not in allowed:
                raise self.fail(
                    key_node, where, f"unknown key {key!r}; known keys: {', '.join(sorted(allowed))}"
                )
            if key in out:
                raise self.fail(key_node, where, f"duplicate key {key!r}")
            out[key] = value_node
        return out

    def scalar(self, node: yaml.Node, where: str, kind: type) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, where, f"must be a {kind.__name__}")
        value = yaml.safe_load(yaml.serialize(node))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(node, where, f"must be a {kind.__name__}, not {value!r}")
        if kind is str and not value:
            raise self.fail(node, where, "must not be empty")
        return value

    def names(self, node: yaml.Node, where: str) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, where, "must be a list of model names")
        return tuple(self.scalar(n, f"{where}[{i}]", str) for i, n in enumerate(node.value))

    def top(self, root: yaml.Node | None) -> GatewayConfig:
        if root is None:
            raise self.fail(None, "config", "the file is empty")
        top = self.mapping(root, "config", _TOP_KEYS)
        local = self.scalar(top["local"], "local", bool) if "local" in top else True
        upstream = self.upstream(top["upstream"]) if "upstream" in top else UpstreamConfig()
        models_node = top.get("models")
        if models_node is None:
            raise self.fail(root, "config", "needs a 'models' list")
        if not isinstance(models_node, yaml.SequenceNode):
            raise self.fail(models_node, "models", "must be a list")
        models = [self.model(n, f"models[{i}]") for i, n in enumerate(models_node.value)]
        self.cross_check(models, models_node, local)
        servers: list[McpServerConfig] = []
        if "mcp_servers" in top:
            node = top["mcp_servers"]
            if not isinstance(node, yaml.SequenceNode):
                raise self.fail(node, "mcp_servers", "must be a list")
            for i, entry in enumerate(node.value):
                server = self.mcp_server(entry, f"mcp_servers[{i}]")
                if any(s.label == server.label for s in servers):
                    raise self.fail(entry, f"mcp_servers[{i}]", f"label {server.label!r} is already used")
                servers.append(server)
        search = self.web_search(top["web_search"]) if "web_search" in top else None
        warm = True
        if "file_search" in top:
            found = self.mapping(top["file_search"], "file_search", _FILE_SEARCH_KEYS)
            if "warm_indexes" in found:
                warm = self.scalar(found["warm_indexes"], "file_search.warm_indexes", bool)
        return GatewayConfig(
            models=tuple(models),
            mcp_servers=tuple(servers),
            web_search=search,
            warm_indexes=warm,
            local=local,
            upstream=upstream,
        )

    def web_search(self, node: yaml.Node) -> WebSearchConfig:
        m = self.mapping(node, "web_search", _SEARCH_KEYS)
        if "backend" not in m:
            raise self.fail(node, "web_search", "missing required key 'backend' (searxng or brave)")
        backend = self.scalar(m["backend"], "web_search.backend", str)
        if backend not in SEARCH_BACKENDS:
            raise self.fail(
                m["backend"], "web_search.backend", f"must be one of {', '.join(SEARCH_BACKENDS)}"
            )
        url = self.scalar(m["url"], "web_search.url", str) if "url" in m else None
        if url is not None and not url.startswith(("http://", "https://")):
            raise self.fail(m["url"], "web_search.url", "must start with http:// or https://")
        if backend == "searxng" and url is None:
            raise self.fail(
                node, "web_search", "backend 'searxng' needs 'url' (the instance, e.g. http://127.0.0.1:8888)"
            )
        key = self.scalar(m["api_key_env"], "web_search.api_key_env", str) if "api_key_env" in m else None
        if backend == "brave" and key is None:
            raise self.fail(
                node, "web_search", "backend 'brave' needs 'api_key_env' (the variable holding its key)"
            )
        return WebSearchConfig(
            backend, url, key, where=f"{self.filename}:{node.start_mark.line + 1}: web_search"
        )

    def mcp_server(self, node: yaml.Node, where: str) -> McpServerConfig:
        m = self.mapping(node, where, _MCP_KEYS)
        for required in ("label", "url"):
            if required not in m:
                raise self.fail(node, where, f"missing required key {required!r}")
        label = self.scalar(m["label"], f"{where}.label", str)
        if not all(c.isascii() and (c.isalnum() or c in "_-") for c in label) or len(label) > 64:
            raise self.fail(m["label"], f"{where}.label", "must be 1 to 64 letters, digits, '_' or '-'")
        url = self.scalar(m["url"], f"{where}.url", str)
        if not url.startswith(("http://", "https://")):
            raise self.fail(m["url"], f"{where}.url", "must start with http:// or https://")
        transport = self.scalar(m["transport"], f"{where}.transport", str) if "transport" in m else "auto"
        if transport not in MCP_TRANSPORTS:
            raise self.fail(
                m["transport"], f"{where}.transport", f"must be one of {', '.join(MCP_TRANSPORTS)}"
            )
        headers: dict[str, str] = {}
        if "headers_env" in m:
            h = m["headers_env"]
            if not isinstance(h, yaml.MappingNode):
                raise self.fail(h, f"{where}.headers_env", "must map header names to environment variables")
            for key_node, value_node in h.value:
                key = self.scalar(key_node, f"{where}.headers_env", str)
                headers[key] = self.scalar(value_node, f"{where}.headers_env.{key}", str)
        auth = (
            self.scalar(m["authorization_env"], f"{where}.authorization_env", str)
            if "authorization_env" in m
            else None
        )
        return McpServerConfig(
            label, url, transport, headers, auth, where=f"{self.filename}:{node.start_mark.line + 1}: {where}"
        )

    def upstream(self, node: yaml.Node) -> UpstreamConfig:
        u = self.mapping(node, "upstream", _UPSTREAM_KEYS)
        kwargs: dict[str, Any] = {}
        for key in ("pool_limit", "pool_limit_per_host"):
            if key in u:
                value = self.scalar(u[key], f"upstream.{key}", int)
                if value < 0:
                    raise self.fail(u[key], f"upstream.{key}", "must be 0 (unlimited) or positive")
                kwargs[key] = value
        for key in ("max_event_bytes", "max_error_body_bytes"):
            if key in u:
                value = self.scalar(u[key], f"upstream.{key}", int)
                if value <= 0:
                    raise self.fail(u[key], f"upstream.{key}", "must be positive")
                kwargs[key] = value
        for key in ("pool_keepalive", "pool_timeout"):
            if key in u:
                if key == "pool_timeout" and _is_null(u[key]):
                    continue
                value = self.scalar(u[key], f"upstream.{key}", float)
                if value <= 0:
                    raise self.fail(u[key], f"upstream.{key}", "must be positive")
                kwargs[key] = value
        if "trust_env" in u:
            kwargs["trust_env"] = self.scalar(u["trust_env"], "upstream.trust_env", bool)
        return UpstreamConfig(**kwargs)

    def model(self, node: yaml.Node, where: str) -> ModelConfig:
        m = self.mapping(node, where, _MODEL_KEYS)
        for required in ("name", "provider"):
            if required not in m:
                raise self.fail(node, where, f"missing required key {required!r}")
        provider = self.scalar(m["provider"], f"{where}.provider", str)
        if provider not in self.providers:
            raise self.fail(
                m["provider"],
                f"{where}.provider",
                f"must be one of the known providers: {', '.join(self.providers)} (not {provider!r}); "
                "third-party providers register through the entry-point group "
                "'responses_gateway.providers'",
            )
        lines = {key: value.start_mark.line + 1 for key, value in m.items()}
        if isinstance(m.get("options"), yaml.MappingNode):
            for key_node, _ in m["options"].value:
                if isinstance(key_node, yaml.ScalarNode):
                    lines[f"options.{key_node.value}"] = key_node.start_mark.line + 1
        kwargs: dict[str, Any] = {
            "name": self.scalar(m["name"], f"{where}.name", str),
            "provider": provider,
            "source": self.filename,
            "line": node.start_mark.line + 1,
            "where": where,
            "lines": lines,
        }
        for key in ("upstream_model", "base_url", "api_key_env", "model_path", "script"):
            if key in m:
                kwargs[key] = self.scalar(m[key], f"{where}.{key}", str)
        if "base_url" in kwargs and not kwargs["base_url"].startswith(("http://", "https://")):
            raise self.fail(m["base_url"], f"{where}.base_url", "must start with http:// or https://")
        for key in ("fallbacks", "aliases"):
            if key in m:
                kwargs[key] = self.names(m[key], f"{where}.{key}")
        if "options" in m:
            if not isinstance(m["options"], yaml.MappingNode):
                raise self.fail(m["options"], f"{where}.options", "must be a mapping")
            kwargs["options"] = yaml.safe_load(yaml.serialize(m["options"]))
        if "timeouts" in m:
            t = self.mapping(m["timeouts"], f"{where}.timeouts", _TIMEOUT_KEYS)
            values = {
                k: self.scalar(v, f"{where}.timeouts.{k}", float) for k, v in t.items() if not _is_null(v)
            }
            for k, v in values.items():
                if v <= 0:
                    raise self.fail(t[k], f"{where}.timeouts.{k}", "must be positive")
            kwargs["timeouts"] = Timeouts(**values)
        if "retries" in m:
            retries = self.scalar(m["retries"], f"{where}.retries", int)
            if not 0 <= retries <= 10:
                raise self.fail(m["retries"], f"{where}.retries", "must be between 0 and 10")
            kwargs["retries"] = retries
        if provider in UPSTREAM_KINDS and "upstream_model" not in kwargs:
            raise self.fail(node, where, f"provider {provider!r} needs 'upstream_model'")
        if provider == "openai-chat" and "base_url" not in kwargs:
            raise self.fail(
                node, where, "provider 'openai-chat' needs 'base_url' (e.g. http://127.0.0.1:8000/v1)"
            )
        if provider == "scripted" and "script" not in kwargs:
            raise self.fail(node, where, "provider 'scripted' needs 'script' (a YAML or JSON file)")
        return ModelConfig(**kwargs)

    def cross_check(self, models: list[ModelConfig], node: yaml.SequenceNode, local: bool) -> None:
        seen: dict[str, int] = {}
        if local:
            seen["gemma-3-270m"] = -1
        for i, model in enumerate(models):
            for name in (model.name, *model.aliases):
                if name in seen:
                    raise self.fail(node.value[i], f"models[{i}]", f"name {name!r} is already used")
                seen[name] = i
        for i, model in enumerate(models):
            for target in model.fallbacks:
                if target not in seen:
                    raise self.fail(node.value[i], f"models[{i}].fallbacks", f"no model named {target!r}")
                if target == model.name or target in model.aliases:
                    raise self.fail(
                        node.value[i], f"models[{i}].fallbacks", "a model cannot fall back to itself"
                    )


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"
