"""``responses-gateway serve``: command-line options and running the app on uvicorn (uvloop + httptools)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import errno
import gc
import logging
import os
import shutil
import socket
import sys
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from ..engine.tools.mcp import McpServerSpec
from ..engine.tools.web_search import BraveBackend, SearchBackend, SearxngBackend
from ..paths import DATA_DIR_ENV
from ..paths import data_dir as resolve_data_dir
from ..protocol.native import COMPILED_MODULES, compiled_modules
from ..providers.scripted import ScriptedProvider, ScriptError
from ..providers.transport import raise_open_files_limit
from ..store.vector_search import CHOICES as VECTOR_INDEXES
from .app import GatewayApp
from .config import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_FILE_BYTES,
    DROPPABLE_TOOL_TYPES,
    ServerConfig,
)
from .http_protocol import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEAD_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    GatewayHttpProtocol,
)
from .model_process import SharedModel, model_process_config
from .registry import LOCAL_MODEL, ModelRegistry, default_registry, registry_from_config
from .request_log import JSONFormatter
from .streaming import stop_all_runs
from .websocket import UVICORN_WS

if TYPE_CHECKING:
    from ..config import GatewayConfig
from .workers import Supervisor, default_workers

__all__ = ["WORKER_HEADER", "add_serve_arguments", "build_app", "serve"]

log = logging.getLogger("responses_gateway.server")

API_KEYS_ENV = "RG_API_KEYS"
CONFIG_ENV = "RG_CONFIG"
STORE_ENV = "RG_STORE_URL"
REDIS_ENV = "RG_REDIS_URL"
NO_STORE = ("none", "off")
# With --workers N > 1, every response names the worker process (its pid) that answered it.
WORKER_HEADER = "x-gateway-worker"
# The workers' socket directory (store/live.py's SiblingLiveLog): <tmp>/rg-workers-<parent pid>-<random>.
SIBLINGS_PREFIX = "rg-workers-"
# The young generation's collection threshold once started (CPython's default is 700); see startup.
GC_YOUNG = 3_000


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``serve`` options to ``parser``."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="gateway processes sharing the port (default: one per core, or 1 when the embedded model is "
        "served); with N > 1 the embedded model runs once, in a model process the workers share; SIGHUP "
        "restarts the workers one by one",
    )
    parser.add_argument(
        "--worker-port-base",
        type=int,
        default=None,
        metavar="PORT",
        help="with --workers N, worker i also listens on PORT+i (to reach one worker, for tests and "
        "debugging)",
    )
    parser.add_argument(
        "--config",
        default=os.environ.get(CONFIG_ENV) or None,
        metavar="FILE",
        help=f"models file routing model names to providers (also {CONFIG_ENV}); see docs/configuration.md",
    )
    parser.add_argument(
        "--model-path",
        default=None,
        help=f"a GGUF file for the embedded model {LOCAL_MODEL} (default: bundled)",
    )
    parser.add_argument(
        "--no-local", action="store_true", help=f"do not serve the embedded model {LOCAL_MODEL}"
    )
    parser.add_argument(
        "--no-ui", dest="ui", action="store_false", help="do not serve the web playground and inspector at /"
    )
    parser.add_argument(
        "--preload", action="store_true", help="load models at start-up instead of on first request"
    )
    parser.add_argument(
        "--script",
        action="append",
        default=[],
        metavar="FILE",
        help="serve a scripted model from a YAML/JSON script (repeatable; model name from the file's "
        "'model' key, else the file name)",
    )
    parser.add_argument(
        "--keepalive",
        choices=("in_progress", "ping", "comment", "off"),
        default="in_progress",
        help="what to send while the model is silent (default in_progress: resets every client's idle timer)",
    )
    parser.add_argument(
        "--keepalive-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds of silence before a keepalive (default 10)",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"require this Bearer key (repeatable; also {API_KEYS_ENV}, comma-separated)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest accepted request body (default {DEFAULT_MAX_BODY_BYTES})",
    )
    parser.add_argument(
        "--ws-max-lifetime",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="WebSocket mode: how long one connection may stay open (default 3600, as OpenAI's); "
        "the client is told websocket_connection_limit_reached and reconnects",
    )
    parser.add_argument(
        "--ws-max-message-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="WebSocket mode: the largest response.create message (default: --max-body-bytes)",
    )
    parser.add_argument(
        "--max-file-bytes",
        type=int,
        default=DEFAULT_MAX_FILE_BYTES,
        help=f"largest file POST /v1/files accepts (default {DEFAULT_MAX_FILE_BYTES}); streamed to disk",
    )
    parser.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="where responses, events and conversations are kept: sqlite:///path/gateway.db or "
        f"postgresql://user@host/db, or 'none' (also {STORE_ENV}; default sqlite:///<data-dir>/gateway.db)",
    )
    parser.add_argument(
        "--store-retention",
        type=float,
        default=None,
        metavar="DAYS",
        help="delete finished stored responses (their items and events) this many days after they were "
        "created, checked every minute (default: keep them; OpenAI keeps 30 days)",
    )
    parser.add_argument(
        "--store-max-response-bytes",
        type=int,
        default=256 * 1024 * 1024,
        metavar="N",
        help="the most one response may take in the store; past it the client still gets it whole, but "
        "the rest is not stored and the stored response reads failed, saying why (default 268435456)",
    )
    parser.add_argument(
        "--redis",
        default=None,
        metavar="URL",
        help="redis://host:6379/0 to share live events and cancels between gateway instances "
        f"(also {REDIS_ENV})",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help=f"the default SQLite store, the seal key and the embedded model live here (also {DATA_DIR_ENV}; "
        "default $XDG_DATA_HOME/responses-gateway or ~/.local/share/responses-gateway)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="uvicorn's access line for every HTTP request (off by default)",
    )
    parser.add_argument(
        "--no-request-log",
        dest="request_log",
        action="store_false",
        help="no per-response log line (model, status, tokens, time to first token, duration; on by default)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text (default) or json: every log line one JSON object; the per-response line carries "
        "ids, model, back end, status, timings and token counts (docs/observability.md)",
    )
    parser.add_argument(
        "--log-content",
        action="store_true",
        help="add the request's input and instructions and the Response's output to the per-response "
        "line (off by default: logs never carry content)",
    )
    parser.add_argument(
        "--no-metrics",
        dest="metrics",
        action="store_false",
        help="do not serve GET /metrics (Prometheus; served by default, behind the API keys)",
    )
    parser.add_argument(
        "--metrics-public",
        action="store_true",
        help="serve GET /metrics without an API key (for a scraper on a trusted network)",
    )
    parser.add_argument(
        "--traces",
        choices=("off", "console", "otlp"),
        default="off",
        help="OpenTelemetry traces (GenAI semantic conventions): console prints the spans, otlp sends "
        "them over OTLP/HTTP (OTEL_EXPORTER_OTLP_* variables); needs the [otel] extra (default off)",
    )
    parser.add_argument(
        "--raw-reasoning-events",
        choices=("reasoning_text", "reasoning"),
        default="reasoning_text",
        help="event names for raw reasoning text: reasoning_text (response.reasoning_text.delta, as OpenAI "
        "and Codex; default) or reasoning (response.reasoning.delta, the Open Responses spec's spelling)",
    )
    parser.add_argument(
        "--drop-unsupported-tool",
        action="append",
        default=[],
        choices=DROPPABLE_TOOL_TYPES,
        metavar="TYPE",
        help="leave an offered hosted tool of this type (e.g. web_search, which Codex offers on every "
        "request) out for back ends that cannot run it, instead of answering 400; a tool_choice that "
        "asks for it is still refused (repeatable)",
    )
    parser.add_argument(
        "--tool-allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="a host a request-supplied tool URL (an MCP server_url, a page web_search opens) may name: "
        "exact, or *.example.com for its subdomains (repeatable; none given: any public host)",
    )
    parser.add_argument(
        "--tool-allow-network",
        action="append",
        default=[],
        metavar="CIDR",
        help="a non-public network hosted tools may still connect to for a request (e.g. 127.0.0.1/32; "
        "loopback, private, link-local addresses are refused otherwise; repeatable)",
    )
    parser.add_argument(
        "--mcp-call-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="the longest one MCP tool call (or listing) may take before it fails (default 60)",
    )
    parser.add_argument(
        "--vector-index",
        choices=VECTOR_INDEXES,
        default="auto",
        help="where file search finds the nearest vectors: auto (sqlite: memory, postgresql: pgvector), "
        "memory (one matrix per store in each process), sqlite-vec, sqlite-vec-bit (binary quantized, "
        "rescored exactly), pgvector (HNSW for large stores), pgvector-exact; one the store cannot run "
        "falls back to memory, logged (default auto)",
    )
    parser.add_argument(
        "--no-warm-indexes",
        dest="warm_indexes",
        action="store_false",
        help="do not load the existing vector stores' search indexes (BM25, in-memory vectors) in the "
        "background after start-up; each store's first search in a process loads them instead "
        "(warm-up on by default)",
    )
    parser.add_argument(
        "--head-timeout",
        type=float,
        default=DEFAULT_HEAD_TIMEOUT,
        metavar="SECONDS",
        help=f"a request's headers must arrive within this time of its first byte, else 408 and the "
        f"connection closes; a new connection that sends nothing is closed after it (default "
        f"{DEFAULT_HEAD_TIMEOUT:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        metavar="SECONDS",
        help=f"longest pause while a request body arrives, else 408 and the connection closes "
        f"(default {DEFAULT_BODY_TIMEOUT:g})",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"open client connections past which requests are answered 503 (open streams are never "
        f"cut; default {DEFAULT_MAX_CONNECTIONS})",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long open streams may run before they are ended (default 10); "
        "stored responses still running then are recorded as failed",
    )


def _api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    keys = list(args.api_key)
    keys += [k.strip() for k in os.environ.get(API_KEYS_ENV, "").split(",")]
    return tuple(dict.fromkeys(k for k in keys if k))


def store_settings(args: argparse.Namespace) -> tuple[str | None, str | None, str]:
    """``(store_url, redis_url, data_dir)`` from the options, then the environment, then the defaults."""
    from ..store import default_store_url

    data_dir = str(resolve_data_dir(args.data_dir))
    store: str | None = args.store or os.environ.get(STORE_ENV) or default_store_url(data_dir)
    if store is not None and store.strip().lower() in NO_STORE:
        store = None
    redis = args.redis or os.environ.get(REDIS_ENV) or None
    if redis is not None and store is None:
        raise ValueError("--redis needs a store (--store sqlite:///… or postgresql://…)")
    if redis is not None and not redis.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"--redis: expected a redis:// URL, got {redis.split('://')[0]}://…")
    if store is not None:
        from ..store import database_for_url

        database_for_url(store)  # a bad URL fails here, before the server starts
    return store, redis, data_dir


def build_registry(
    args: argparse.Namespace, models: GatewayConfig | None = None, *, model_process: bool = False
) -> ModelRegistry:
    """The models ``serve`` offers: the models file's (--config), the embedded one (unless --no-local or
    the file's ``local: false``), plus each --script. ``model_process``: only the embedded models (what
    the model process of ``serve --workers N`` serves)."""
    if args.config:
        from ..config import load_config

        models = models or load_config(args.config)
        if model_process:
            models = model_process_config(models)
        registry = registry_from_config(
            models,
            local=not args.no_local,
            model_path=args.model_path,
            data_dir=resolve_data_dir(args.data_dir),
        )
    else:
        registry = default_registry(
            local=not args.no_local, model_path=args.model_path, data_dir=resolve_data_dir(args.data_dir)
        )
    for path in [] if model_process else args.script:
        scripted = ScriptedProvider.from_file(path)
        if scripted.name in registry:
            raise ValueError(f"--script {path}: the model name {scripted.name!r} is already served")
        registry.add(scripted)
    return registry


def _remove_stale_sibling_dirs() -> None:
    """Remove the workers' socket directories a killed gateway left behind (its pid is gone)."""
    for path in Path(tempfile.gettempdir()).glob(f"{SIBLINGS_PREFIX}*-*"):
        pid = path.name[len(SIBLINGS_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            if path.stat().st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def _serves_embedded_model(args: argparse.Namespace) -> bool:
    """Whether ``serve`` would load an embedded (llama.cpp) model: the default one, or a models file's
    ``provider: local`` entry."""
    if not args.no_local and LOCAL_MODEL in build_registry(args).names():
        return True
    if args.config:
        from ..config import load_config

        return any(model.provider == "local" for model in load_config(args.config).models)
    return False


def build_app(
    args: argparse.Namespace,
    *,
    siblings_dir: str | None = None,
    shared: SharedModel | None = None,
    model_process: bool = False,
) -> GatewayApp:
    """The ASGI app for parsed ``serve`` options (``siblings_dir``: see ``ServerConfig``). With
    ``shared``, a worker's app that sends the embedded models' requests to the model process, or with
    ``model_process`` too, the model process's own app (server/model_process.py)."""
    store_url, redis_url, data_dir = store_settings(args)
    models: GatewayConfig | None = None
    if args.config:
        from ..config import load_config

        models = load_config(args.config)
    mcp_servers = tuple(
        McpServerSpec(s.label, s.url, s.headers(), s.transport)
        for s in (models.mcp_servers if models else ())
    )
    search: SearchBackend | None = None
    if models is not None and models.web_search is not None:
        ws = models.web_search
        if ws.backend == "searxng":
            assert ws.url is not None
            search = SearxngBackend(ws.url)
        else:
            search = BraveBackend(ws.api_key(), ws.url)
    config = ServerConfig(
        keepalive=args.keepalive,
        keepalive_interval=args.keepalive_interval,
        api_keys=_api_keys(args),
        max_body_bytes=args.max_body_bytes,
        max_file_bytes=args.max_file_bytes,
        store_url=store_url,
        redis_url=redis_url,
        store_retention=None if args.store_retention is None else args.store_retention * 86400,
        store_max_response_bytes=args.store_max_response_bytes,
        data_dir=data_dir,
        raw_reasoning=args.raw_reasoning_events,
        drop_unsupported_tools=tuple(dict.fromkeys(args.drop_unsupported_tool)),
        request_log=args.request_log,
        ui=args.ui,
        ws_max_lifetime=args.ws_max_lifetime,
        ws_max_message_bytes=args.ws_max_message_bytes,
        log_format=args.log_format,
        log_content=args.log_content,
        metrics=args.metrics,
        metrics_public=args.metrics_public,
        traces=args.traces,
        tool_allow_hosts=tuple(args.tool_allow_host),
        tool_allow_networks=tuple(args.tool_allow_network),
        mcp_servers=mcp_servers,
        mcp_call_timeout=args.mcp_call_timeout,
        vector_index=args.vector_index,
        warm_indexes=args.warm_indexes and (models is None or models.warm_indexes),
        search_backend=search,
        siblings_dir=siblings_dir,
    )
    if shared is not None and model_process:
        # Only the workers talk to it: their key, no store (the workers store), nothing but the models.
        # The workers' bodies carry stored context expanded into ``input``: a larger limit than theirs.
        config = dataclasses.replace(
            config,
            api_keys=(shared.key,),
            store_url=None,
            redis_url=None,
            store_retention=None,
            ui=False,
            metrics=False,
            request_log=False,
            max_body_bytes=max(4 * args.max_body_bytes, 64 * 1024 * 1024),
            mcp_servers=(),
            search_backend=None,
            siblings_dir=None,
        )
        return GatewayApp(build_registry(args, models, model_process=True), config, preload=args.preload)
    registry = build_registry(args, models)
    if shared is not None:
        shared.share(registry)
    return GatewayApp(registry, config, preload=args.preload)


def _describe_store(url: str | None) -> str:
    """The store URL without credentials (for the start-up log line)."""
    if url is None:
        return "none (nothing is kept)"
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.rpartition('@')[2]}"


def serve(args: argparse.Namespace) -> int:
    """Run the gateway until interrupted; the exit status."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JSONFormatter())
    try:
        listener = bind(args.host, args.port)
    except OSError as exc:
        # Before anything is loaded or announced: a second gateway on the same port says so and stops.
        reason = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be used ({exc.strerror})"
        sys.stderr.write(
            f"responses-gateway serve: {args.host}:{args.port} {reason}; choose another with --port\n"
        )
        return 2
    siblings_dir: str | None = None
    shared: SharedModel | None = None
    model_app: GatewayApp | None = None
    try:
        if args.workers is not None and args.workers < 1:
            raise ValueError(f"--workers must be at least 1, not {args.workers}")
        local = _serves_embedded_model(args)
        # The embedded model's default is one process: one model answers one request at a time however
        # many workers send it requests (docs/workers.md, "Default").
        workers = args.workers or (1 if local else default_workers())
        if workers > 1:
            _remove_stale_sibling_dirs()
            siblings_dir = tempfile.mkdtemp(prefix=f"{SIBLINGS_PREFIX}{os.getpid()}-")
        protocol = GatewayHttpProtocol.configured(
            head_timeout=args.head_timeout,
            body_timeout=args.body_timeout,
            max_connections=args.max_connections,
        )
        if workers > 1 and local:
            shared = SharedModel.bind()
            model_app = build_app(args, shared=shared, model_process=True)
        app = build_app(args, siblings_dir=siblings_dir, shared=shared)
        # The seal key is read (or created) once, before the workers fork: they share it.
        _ = app.sealer
    except (ScriptError, OSError, ValueError) as exc:
        listener.close()
        if shared is not None:
            shared.listener.close()
        if siblings_dir is not None:
            shutil.rmtree(siblings_dir, ignore_errors=True)
        sys.stderr.write(f"responses-gateway serve: {exc}\n")
        return 2
    try:
        model = None if shared is None or model_app is None else (shared, model_app)
        return _serve_app(args, app, protocol, listener, workers, model)
    finally:
        if shared is not None:
            shared.listener.close()
        if siblings_dir is not None:
            shutil.rmtree(siblings_dir, ignore_errors=True)


def _serve_app(
    args: argparse.Namespace,
    app: GatewayApp,
    protocol: type[GatewayHttpProtocol],
    listener: socket.socket,
    workers: int,
    model: tuple[SharedModel, GatewayApp] | None = None,
) -> int:
    names = app.registry.names()
    if not names:
        listener.close()
        sys.stderr.write("responses-gateway serve: no models to serve (no --config, --script, local model)\n")
        return 2
    log.info(
        "serving %s on http://%s:%d/v1 (keepalive %s every %gs, api keys %s%s)",
        ", ".join(names),
        args.host,
        args.port,
        args.keepalive,
        args.keepalive_interval,
        "required" if app.config.api_keys else "off",
        f", {workers} workers" if workers > 1 else "",
    )
    log.info("store: %s%s", _describe_store(app.config.store_url), " + redis" if app.config.redis_url else "")
    compiled = compiled_modules()
    log.info(
        "hot path: %s",
        f"compiled with mypyc ({len(compiled)} of {len(COMPILED_MODULES)} modules)"
        if compiled
        else "interpreted (make run serves the mypyc build; docs/architecture.md)",
    )
    if model is not None:
        log.info("the embedded model runs in one model process the workers share (%s)", model[0].base_url)
    if not args.preload and LOCAL_MODEL in names:
        log.info(
            "the embedded model %s loads on its first request (use --preload to load it now)", LOCAL_MODEL
        )
    warnings.filterwarnings("ignore", message="The `websockets` implementation is deprecated")
    raise_open_files_limit()  # one socket per stream each side; the upstream pool is unlimited

    def uvicorn_config(app: GatewayApp, headers: list[tuple[str, str]]) -> uvicorn.Config:
        return uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            loop="uvloop",
            http=protocol,
            # WebSocket mode on /v1/responses (server/websocket.py; UVICORN_WS says why this protocol).
            # uvicorn closes a connection (1009) on a message past ws_max_size: twice the gateway's own
            # limit, which answers with an error event and keeps the connection, so only an absurd
            # message ends it.
            ws=UVICORN_WS,
            ws_max_size=2 * app.ws_max_message_bytes,
            lifespan="on",
            access_log=args.access_log,
            log_level=args.log_level,
            # uvicorn's own lines go through the root logger set up above: one format for every line.
            log_config=None,
            timeout_graceful_shutdown=args.shutdown_timeout,
            headers=headers,
        )

    def run_worker(index: int, ready_fd: int | None) -> int:
        if model is not None:
            model[0].listener.close()  # the model process's socket: only it accepts there
        sockets = [listener]
        headers: list[tuple[str, str]] = []
        if workers > 1:
            headers.append((WORKER_HEADER, str(os.getpid())))
            if args.worker_port_base is not None:
                sockets.append(bind(args.host, args.worker_port_base + index, reuse_port=True))
        server = GatewayServer(uvicorn_config(app, headers), args.shutdown_timeout, ready_fd=ready_fd)
        server.run(sockets=sockets)
        return 0 if server.started else 1

    def run_model(index: int, ready_fd: int) -> int:
        assert model is not None
        shared, model_app = model
        listener.close()  # the public port is the workers'
        server = GatewayServer(uvicorn_config(model_app, []), args.shutdown_timeout, ready_fd=ready_fd)
        server.run(sockets=[shared.listener])
        return 0 if server.started else 1

    if workers == 1:
        return run_worker(0, None)
    start_model = run_model if model is not None else None
    return Supervisor(workers, run_worker, grace=args.shutdown_timeout, model=start_model).run()


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """The listening socket ``serve`` hands to uvicorn, bound before anything is announced."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048, reuse_port=reuse_port)
    sock.set_inheritable(True)
    return sock


class GatewayServer(uvicorn.Server):
    """uvicorn's server, ending open streams properly when the graceful-shutdown time runs out.

    uvicorn waits ``timeout_graceful_shutdown`` for requests to finish and then cancels them, which
    would cut a stream mid-frame. Shortly before that, every run still going is stopped instead: its
    stream ends with ``error`` + ``response.failed`` (``server_error``) and a stored response says so.
    """

    def __init__(self, config: uvicorn.Config, grace: float, *, ready_fd: int | None = None) -> None:
        super().__init__(config)
        self._grace = grace
        # ``serve --workers N``: one byte written here tells the parent this worker accepts connections.
        self._ready_fd = ready_fd

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # Everything alive now (modules, the app, the registry) lives as long as the process. Frozen,
        # it is no longer traversed by every full collection: those took 20-30 ms with the ~70,000
        # startup objects, a pause every open stream felt (docs/performance.md).
        gc.collect()
        gc.freeze()
        # A young generation of 700 objects (CPython's default) is collected every few hundred events
        # under load, and what survives (each open stream's state) is traversed again by the older
        # generations: at 300 streams ~7 % of the CPU went to collections, with 50-100 ms full ones.
        # Collected every GC_YOUNG objects, those objects have mostly been freed by then.
        gc.set_threshold(GC_YOUNG, 10, 10)
        if self._ready_fd is not None and self.started:
            os.write(self._ready_fd, b"r")
            os.close(self._ready_fd)
            self._ready_fd = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(max(0.0, self._grace * 0.8), _stop_runs)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def _stop_runs() -> None:
    stopped = stop_all_runs("shutdown")
    if stopped:
        log.info("shutting down: ended %d response(s) still running", stopped)
