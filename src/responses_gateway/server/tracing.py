"""OpenTelemetry traces following the GenAI semantic conventions; off unless ``serve --traces``.

One trace per Response asked for (``POST /v1/responses``, a front end, a WebSocket message), written
when the request's work ends (from the facts its
:class:`~responses_gateway.server.request_log.RequestLog` collected, with their real start and end
times), so nothing is traced per streamed event:

- ``chat {model}`` (kind SERVER): the request. ``gen_ai.operation.name=chat``,
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``gen_ai.response.id``,
  ``gen_ai.provider.name`` (the back end), ``gen_ai.usage.input_tokens`` / ``output_tokens``,
  ``gen_ai.response.finish_reasons``, ``http.response.status_code``, ``error.type`` on failure.
- ``chat {model}`` (kind CLIENT), one per model turn (the engine runs hosted tools between turns;
  without hosted tools the request is one turn): the model that answered (a fallback chain's
  member) and its back end as ``gen_ai.provider.name``.
- ``execute_tool {tool}`` (kind INTERNAL), one per hosted tool call the gateway ran:
  ``gen_ai.operation.name=execute_tool``, ``gen_ai.tool.name``, ``gen_ai.tool.type``.

No content (input, output, arguments) is put in a span. The SDK is an optional extra
(``pip install 'responses-gateway[otel]'``); the OTLP exporter reads the standard
``OTEL_EXPORTER_OTLP_*`` variables.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

if TYPE_CHECKING:
    from .request_log import RequestLog

__all__ = ["Tracing"]

_FINISH = {"completed": "stop", "incomplete": "length", "failed": "error", "cancelled": "cancelled"}


class Tracing:
    """Writes a finished request's spans to ``provider`` (an OpenTelemetry ``TracerProvider``)."""

    def __init__(self, provider: Any, *, owned: bool = False) -> None:
        self.provider = provider
        self.tracer = trace.get_tracer("responses_gateway", tracer_provider=provider)
        self._owned = owned

    @classmethod
    def create(cls, mode: str, provider: Any = None) -> Tracing:
        """``provider`` if given, else an SDK provider exporting to the console or over OTLP/HTTP."""
        if provider is not None:
            return cls(provider)
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
        except ImportError:
            raise ValueError(
                "traces need the OpenTelemetry SDK: pip install 'responses-gateway[otel]'"
            ) from None
        exporter: SpanExporter
        if mode == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                raise ValueError(
                    "--traces otlp needs opentelemetry-exporter-otlp-proto-http "
                    "(pip install 'responses-gateway[otel]')"
                ) from None
            exporter = OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter()
        sdk = TracerProvider(resource=Resource.create({"service.name": "responses-gateway"}))
        sdk.add_span_processor(BatchSpanProcessor(exporter))
        return cls(sdk, owned=True)

    def close(self) -> None:
        """Flush and stop a provider this object made (one handed in belongs to its owner)."""
        if self._owned:
            self.provider.shutdown()

    def record(self, line: RequestLog, fields: dict[str, Any], now: float) -> None:
        """The request's spans, from ``line``'s facts (``fields``: its log record)."""
        base_ns, base = line.started_ns, line.started

        def wall(mono: float) -> int:
            return base_ns + int((mono - base) * 1e9)

        model = fields["model"] or "unknown"
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "http.request.method": line.method,
            "http.route": line.route,
            "http.response.status_code": fields["http_status"],
            "responses_gateway.mode": line.mode,
        }
        if fields["backend"]:
            attrs["gen_ai.provider.name"] = fields["backend"]
            attrs["gen_ai.response.model"] = fields["backend"]
        if fields["id"]:
            attrs["gen_ai.response.id"] = fields["id"]
        if fields["input_tokens"] is not None:
            attrs["gen_ai.usage.input_tokens"] = int(fields["input_tokens"])
        if fields["output_tokens"] is not None:
            attrs["gen_ai.usage.output_tokens"] = int(fields["output_tokens"])
        if fields["status"]:
            attrs["gen_ai.response.finish_reasons"] = (_FINISH.get(fields["status"], fields["status"]),)
        if fields["ttft_ms"] is not None:
            attrs["responses_gateway.time_to_first_token_ms"] = fields["ttft_ms"]
        failed = fields["http_status"] >= 400 or fields["status"] == "failed"
        if failed:
            attrs["error.type"] = fields["error"] or str(fields["http_status"])
        root = self.tracer.start_span(
            f"chat {model}", kind=SpanKind.SERVER, attributes=attrs, start_time=base_ns
        )
        if failed:
            root.set_status(Status(StatusCode.ERROR, attrs["error.type"]))
        context = trace.set_span_in_context(root)
        phases = list(line.timeline)
        if not any(kind == "turn" for kind, *_ in phases) and line.builder is not None and fields["backend"]:
            # No engine: the back end ran one turn, from the request's start to its end.
            served = line.builder.served_by or model
            phases.insert(0, ("turn", served, base, now, fields["status"] or "unknown"))
        for kind, name, started, ended, outcome in phases:
            if kind == "turn":
                span = self.tracer.start_span(
                    f"chat {name}",
                    context=context,
                    kind=SpanKind.CLIENT,
                    start_time=wall(started),
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.provider.name": line.backends.get(name, line.backend or ""),
                        "gen_ai.request.model": name,
                        "responses_gateway.turn_status": outcome,
                    },
                )
            else:
                span = self.tracer.start_span(
                    f"execute_tool {name}",
                    context=context,
                    kind=SpanKind.INTERNAL,
                    start_time=wall(started),
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": name,
                        "gen_ai.tool.type": "extension",
                        "responses_gateway.tool_status": outcome,
                    },
                )
                if outcome not in ("completed", "in_progress", "interpreting"):
                    span.set_status(Status(StatusCode.ERROR, outcome))
            span.end(end_time=wall(ended))
        root.end(end_time=base_ns + int((now - base) * 1e9) if now >= base else time.time_ns())
