"""Server settings, one frozen object built by run.py (or by tests) and handed to the app."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..engine.tools.mcp import McpServerSpec
from ..engine.tools.web_search import SearchBackend
from ..protocol.request import TOOL_TYPES
from ..store.vector_search import CHOICES as VECTOR_INDEXES

KeepaliveMode = Literal["in_progress", "ping", "comment", "off"]
# Raw reasoning text events: OpenAI's ``response.reasoning_text.delta`` (what Codex and the openai SDK
# read) or the Open Responses spec's ``response.reasoning.delta``.
RawReasoningEvents = Literal["reasoning_text", "reasoning"]
LogFormat = Literal["text", "json"]
TracesMode = Literal["off", "console", "otlp"]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_FILE_BYTES = 512 * 1024 * 1024
# Tool types a server may be told to leave out for back ends that cannot run them: every type but the
# client's own functions (function, custom; namespaces are flattened, never dropped).
DROPPABLE_TOOL_TYPES = tuple(t for t in TOOL_TYPES if t not in ("function", "custom", "namespace"))


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How the gateway serves: keepalive policy, API keys, request size limit, persistence.

    ``store_url`` (``sqlite:///…`` or ``postgresql://…``) is opened at start-up; ``None`` runs without a
    store (nothing is kept; ``previous_response_id``, ``background``… are refused). ``redis_url`` fans
    live events and cancels out across instances. ``data_dir`` holds the seal key (and the default
    SQLite file, chosen by ``serve``); without it and without ``RG_SEAL_KEY`` the key lives in memory.
    """

    keepalive: KeepaliveMode = "in_progress"
    keepalive_interval: float = 10.0
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # The largest file POST /v1/files takes (it is streamed to disk, not held in memory).
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    store_url: str | None = field(default=None, repr=False)
    redis_url: str | None = field(default=None, repr=False)
    data_dir: str | None = None
    # The web playground and inspector at `/` (docs/ui.md); `serve --no-ui` turns it off.
    ui: bool = True
    # How long POST /v1/responses/{id}/cancel waits for the running response to stop.
    cancel_wait: float = 5.0
    raw_reasoning: RawReasoningEvents = "reasoning_text"
    # Hosted tool types (e.g. ``web_search``) left out of a request when its back end cannot run them
    # and ``tool_choice`` does not ask for them, instead of refusing the request (the default).
    drop_unsupported_tools: tuple[str, ...] = ()
    # Finished stored responses older than this many seconds are deleted (None: kept for ever).
    store_retention: float | None = None
    # The most one response may take in the store's event log; past it the rest is not stored and
    # the stored response reads failed, saying so (None: no limit).
    store_max_response_bytes: int | None = 256 * 1024 * 1024
    # How often (seconds) each instance deletes the files and vector stores whose expiry has passed.
    expiry_sweep_interval: float = 60.0
    # One INFO line per POST /v1/responses (server/request_log.py): model, status, tokens, timing.
    request_log: bool = True
    # WebSocket mode (server/websocket.py): how long one connection may live (OpenAI: 60 minutes) and
    # the largest ``response.create`` message it may send (None: ``max_body_bytes``).
    ws_max_lifetime: float = 3600.0
    ws_max_message_bytes: int | None = None
    # The request line as one JSON object (``text``: today's key=value line) and, with log_content,
    # the request's input and the Response's output in it (off by default: content is the user's).
    log_format: LogFormat = "text"
    log_content: bool = False
    # GET /metrics (Prometheus); ``metrics_public`` serves it without an API key.
    metrics: bool = True
    metrics_public: bool = False
    # OpenTelemetry traces (server/tracing.py): off, console (spans printed) or otlp (OTLP/HTTP
    # exporter, configured by the standard OTEL_EXPORTER_OTLP_* variables).
    traces: TracesMode = "off"
    # Where hosted tools may connect for a request (netguard.py): host names a request-supplied URL
    # may name (empty: any public host), and non-public networks still allowed ("127.0.0.1/32").
    tool_allow_hosts: tuple[str, ...] = ()
    tool_allow_networks: tuple[str, ...] = ()
    # MCP servers the models file names (a request may use them by label alone), and one call's limit.
    mcp_servers: tuple[McpServerSpec, ...] = ()
    mcp_call_timeout: float = 60.0
    # The search engine web_search asks for back ends without native search (None: the tool is refused).
    search_backend: SearchBackend | None = field(default=None, repr=False)
    # ``serve --workers N``: the directory where the workers' cancel sockets live (store/live.py's
    # SiblingLiveLog); None for a single process.
    siblings_dir: str | None = None
    # The vector side of file search (retrieval/vector_index.py, docs/file-search.md): ``auto`` (the
    # measured default per store dialect), ``memory``, ``sqlite-vec``, ``sqlite-vec-bit``, ``pgvector``,
    # ``pgvector-exact``; a back end the store cannot run falls back to ``memory``, logged once.
    vector_index: str = "auto"
    # Load the existing vector stores' indexes (BM25, and the in-memory vectors) in the background
    # right after start-up, most recently active first, rather than at each store's first search
    # (``serve --no-warm-indexes`` turns it off; docs/file-search.md, "Warm-up").
    warm_indexes: bool = True

    def __post_init__(self) -> None:
        if self.keepalive not in ("in_progress", "ping", "comment", "off"):
            raise ValueError(f"keepalive must be in_progress, ping, comment or off, not {self.keepalive!r}")
        if self.raw_reasoning not in ("reasoning_text", "reasoning"):
            raise ValueError(f"raw_reasoning must be reasoning_text or reasoning, not {self.raw_reasoning!r}")
        for kind in self.drop_unsupported_tools:
            if kind not in DROPPABLE_TOOL_TYPES:
                raise ValueError(
                    f"drop_unsupported_tools: {kind!r} is not a hosted tool type "
                    f"(one of {', '.join(DROPPABLE_TOOL_TYPES)})"
                )
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json, not {self.log_format!r}")
        if self.traces not in ("off", "console", "otlp"):
            raise ValueError(f"traces must be off, console or otlp, not {self.traces!r}")
        if self.vector_index not in VECTOR_INDEXES:
            raise ValueError(
                f"vector_index must be one of {', '.join(VECTOR_INDEXES)}, not {self.vector_index!r}"
            )
        if self.mcp_call_timeout <= 0:
            raise ValueError("mcp_call_timeout must be positive")
        if self.keepalive_interval <= 0:
            raise ValueError("keepalive_interval must be positive")
        if self.max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        if self.ws_max_lifetime <= 0:
            raise ValueError("ws_max_lifetime must be positive")
        if self.ws_max_message_bytes is not None and self.ws_max_message_bytes <= 0:
            raise ValueError("ws_max_message_bytes must be positive")
        if self.max_file_bytes <= 0:
            raise ValueError("max_file_bytes must be positive")
        if self.expiry_sweep_interval <= 0:
            raise ValueError("expiry_sweep_interval must be positive")
        if self.store_retention is not None and self.store_retention <= 0:
            raise ValueError("store_retention must be positive")
        if self.store_max_response_bytes is not None and self.store_max_response_bytes <= 0:
            raise ValueError("store_max_response_bytes must be positive")
