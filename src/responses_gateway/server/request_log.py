"""One record per ``POST /v1/responses``: what was asked, how it ended, how long it took.

When the request's work ends (for a background response, when the run ends, not when the queued
snapshot is sent) its :class:`RequestLog` is written once, to three places:

- the log line at INFO on ``responses_gateway.requests``: the model asked for and the back end that
  answered, the HTTP status, the Response's status, token counts, the time to the first output item
  and the whole duration. With ``serve --log-format json`` the same fields are one JSON object per line
  (:class:`JSONFormatter`). It never carries content, instructions, tool arguments or keys, unless
  ``serve --log-content`` adds the request's input and the Response's output (scrubbed of the
  gateway's secrets). ``serve --no-request-log`` turns the line off.
- the Prometheus metrics (``server/metrics.py``), whatever the log settings;
- the OpenTelemetry spans (``server/tracing.py``) when traces are on.

Nothing here runs per streamed event: the relay's hot path only sets the builder's first-output time.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import orjson

from ..engine import Phase
from ..protocol.builder import StreamBuilder
from ..redaction import REDACTOR
from .errors import HTTPError
from .metrics import Metrics

if TYPE_CHECKING:
    from .tracing import Tracing

__all__ = ["JSONFormatter", "Observer", "RequestLog", "log"]

log = logging.getLogger("responses_gateway.requests")

_UNSAFE = re.compile(r"[^\x21-\x7e]")
# The most content one JSON line carries per field with --log-content (the rest is cut, and says so).
CONTENT_LIMIT = 64 * 1024


def _word(value: str) -> str:
    """A client-chosen name as one printable word (no spaces or line breaks to forge log lines)."""
    return _UNSAFE.sub("?", value[:200])


@dataclass(slots=True)
class Observer:
    """Where a request's record goes: the app's metrics, the log line's settings, the tracer."""

    metrics: Metrics | None = None
    log_line: bool = True
    log_content: bool = False
    tracing: Tracing | None = None


class RequestLog:
    """Collects one request's facts and writes its record once."""

    __slots__ = (
        "active",
        "backend",
        "backends",
        "background",
        "builder",
        "error_code",
        "http_status",
        "method",
        "model",
        "observer",
        "prepared",
        "primary",
        "request",
        "route",
        "started",
        "started_ns",
        "stream",
        "timeline",
        "written",
    )

    def __init__(
        self,
        observer: Observer | None = None,
        *,
        enabled: bool = True,
        route: str = "/v1/responses",
        method: str = "POST",
    ) -> None:
        self.observer = observer if observer is not None else Observer(log_line=enabled)
        # The route and method the HTTP request counter labels this request with (a front end's
        # own, or WEBSOCKET for one response.create message).
        self.route, self.method = route, method
        self.started = time.monotonic()
        self.started_ns = time.time_ns()
        self.model: str | None = None
        self.stream = False
        self.background = False
        self.builder: StreamBuilder | None = None
        self.http_status = 200
        self.error_code: str | None = None
        # The back end's name once the model was found (metrics label the model only then), and the
        # first member of its fallback chain (an answer from another one is a fallback).
        self.backend: str | None = None
        self.primary: str | None = None
        # For a fallback chain: each member's model name -> its back end's name.
        self.backends: dict[str, str] = {}
        # Whether the request was accepted (parsed, model found, capabilities checked): an HTTP error
        # after that came from the back end.
        self.prepared = False
        self.request: dict[str, Any] | None = None
        self.timeline: list[Phase] = []
        self.active: str | None = None
        self.written = False

    def answering(self) -> RequestLog:
        """Around one request's answer (``with line.answering():``): how it failed (an HTTP error's
        status and code, 499 for a client gone before the answer started, 500 for a bug) is noted,
        and the record written when it ends — unless its work goes on in the background (the record
        is written when that ends). The exception goes on. (A plain context manager, not a generator
        one: it wraps every request.)"""
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            if isinstance(exc, HTTPError):
                self.http_status, self.error_code = exc.status, exc.code
            elif isinstance(exc, asyncio.CancelledError):
                self.http_status = 499
            elif isinstance(exc, Exception):
                self.http_status = 500
        if not self.background:
            self.write()

    @property
    def mode(self) -> str:
        return "background" if self.background else "stream" if self.stream else "json"

    def activate(self, mode: str) -> None:
        """The response's work starts (``mode``: stream, json or background): counted in the
        active-responses gauge until :meth:`write`."""
        metrics = self.observer.metrics
        if metrics is not None and self.active is None:
            self.active = mode
            metrics.active_responses.labels(mode).inc()

    def fields(self, now: float) -> dict[str, Any]:
        """The record, as the JSON line shows it (no content)."""
        builder = self.builder
        response: dict[str, Any] = builder.response if builder is not None else {}
        usage = response.get("usage") or {}
        error = response.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        first = builder.first_output_at if builder is not None else None
        out: dict[str, Any] = {
            "id": response.get("id"),
            "model": _word(self.model) if self.model else None,
            "backend": _word(self.answered_by) if self.answered_by else None,
            "http_status": self.http_status,
            "status": response.get("status"),
            "error": _word(str(code or self.error_code)) if (code or self.error_code) else None,
            "stream": self.stream,
            "background": self.background,
            "input_tokens": usage.get("input_tokens"),
            "output_tokens": usage.get("output_tokens"),
            "ttft_ms": round((first - self.started) * 1000) if first else None,
            "duration_ms": round((now - self.started) * 1000),
        }
        if builder is not None and builder.served_by:
            out["served_by"] = _word(builder.served_by)
        return out

    @property
    def answered_by(self) -> str | None:
        """The back end that answered: for a fallback chain, the answering member's back end."""
        builder = self.builder
        if builder is not None and builder.served_by:
            return self.backends.get(builder.served_by, self.backend)
        return self.backend

    def write(self) -> None:
        if self.written:
            return
        self.written = True
        now = time.monotonic()
        fields = self.fields(now)
        observer = self.observer
        if observer.metrics is not None:
            self._count(observer.metrics, fields, now)
        if observer.tracing is not None:
            observer.tracing.record(self, fields, now)
        if not observer.log_line or not log.isEnabledFor(logging.INFO):
            return
        extra = dict(fields)
        if observer.log_content:
            extra.update(self._content())
        log.info("response %s", _text_line(fields), extra={"rg_fields": extra})

    def _count(self, metrics: Metrics, fields: dict[str, Any], now: float) -> None:
        metrics.http_requests.labels(self.route, self.method, str(self.http_status)).inc()
        if self.active is not None:
            metrics.active_responses.labels(self.active).dec()
        known = self.backend is not None
        model = (fields["model"] or "") if known else ""
        backend = fields["backend"] or ""
        status = fields["status"] or ""
        metrics.responses.labels(model, backend, self.mode, str(self.http_status), status).inc()
        if fields["error"] is not None:
            metrics.response_errors.labels(model, backend, fields["error"]).inc()
        builder = self.builder
        if builder is not None:
            for name, http, code in builder.failed_attempts:
                failed = self.backends.get(name, name)
                metrics.upstream_errors.labels(_word(failed), str(http), _word(code or "")).inc()
            if self.primary is not None and builder.served_by and builder.served_by != self.primary:
                metrics.fallbacks.labels(model, _word(builder.served_by)).inc()
        if self.prepared and (self.http_status >= 400 or status == "failed"):
            where = str(self.http_status) if self.http_status >= 400 else "stream"
            metrics.upstream_errors.labels(backend, where, fields["error"] or "").inc()
        if not known:
            return
        if builder is not None and builder.first_output_at is not None:
            metrics.time_to_first_token.labels(model, backend).observe(builder.first_output_at - self.started)
        metrics.response_duration.labels(model, backend).observe(now - self.started)
        if fields["input_tokens"] is not None:
            metrics.tokens.labels(model, backend, "input").inc(int(fields["input_tokens"]))
        if fields["output_tokens"] is not None:
            metrics.tokens.labels(model, backend, "output").inc(int(fields["output_tokens"]))
        turns = sum(1 for phase in self.timeline if phase[0] == "turn")
        metrics.model_turns.labels(model, backend).inc(turns or (1 if builder is not None else 0))
        for kind, name, started, ended, outcome in self.timeline:
            if kind == "tool":
                metrics.tool_runs.labels(name, outcome).inc()
                metrics.tool_duration.labels(name).observe(ended - started)

    def _content(self) -> dict[str, Any]:
        """The request's input and instructions and the Response's output (--log-content only)."""
        out: dict[str, Any] = {}
        raw = self.request or {}
        for key in ("instructions", "input"):
            if key in raw:
                out[key] = _bounded(raw[key])
        if self.builder is not None:
            out["output"] = _bounded(self.builder.response.get("output"))
        return out


def _bounded(value: Any) -> Any:
    """``value`` scrubbed of secrets, as JSON text past :data:`CONTENT_LIMIT` characters (cut)."""
    if isinstance(value, str):
        text = REDACTOR.scrub(value)
        return text if len(text) <= CONTENT_LIMIT else text[:CONTENT_LIMIT] + "…[truncated]"
    text = REDACTOR.scrub(orjson.dumps(value).decode())
    if len(text) <= CONTENT_LIMIT:
        return orjson.loads(text)
    return text[:CONTENT_LIMIT] + "…[truncated]"


def _text_line(fields: dict[str, Any]) -> str:
    """Today's ``key=value`` line (the text log format)."""
    parts: list[str] = []
    if fields["id"]:
        parts.append(f"id={fields['id']}")
    parts.append(f"model={fields['model'] or '-'}")
    if fields.get("served_by"):
        parts.append(f"served_by={fields['served_by']}")
    parts.append(f"http={fields['http_status']}")
    parts.append(f"status={fields['status'] or '-'}")
    if fields["error"]:
        parts.append(f"error={fields['error']}")
    parts.append(f"stream={'true' if fields['stream'] else 'false'}")
    if fields["background"]:
        parts.append("background=true")
    for key in ("input_tokens", "output_tokens", "ttft_ms"):
        parts.append(f"{key}={'-' if fields[key] is None else fields[key]}")
    parts.append(f"duration_ms={fields['duration_ms']}")
    return " ".join(parts)


class JSONFormatter(logging.Formatter):
    """One JSON object per log record: time, level, logger, message, and a request record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "rg_fields", None)
        if isinstance(fields, dict):
            out["event"] = "response"
            out.update(fields)
        else:
            out["message"] = record.getMessage()
            if record.exc_info:
                out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()
