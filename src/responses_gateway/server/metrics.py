"""Prometheus metrics, one registry per app, served at ``GET /metrics``.

Everything is counted once per HTTP request, per response, per model turn or per tool run — never per
streamed event — so the relay's hot path carries no metrics work: a response's figures are taken from
its :class:`~responses_gateway.server.request_log.RequestLog` when its work ends.

The registry is the app's own (not ``prometheus_client``'s global one), so several gateways in one
process (the tests) each count their own requests. Label values that a client chooses (the model)
only appear once the gateway served that model; an unknown model is counted as ``model=""``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
T = TypeVar("T")

# Model latencies: from a cached reply (tens of ms) to a long reasoning answer (minutes).
_LATENCY = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Store writes and reads: sub-millisecond (SQLite) to a slow remote database.
_STORE = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Metrics:
    """The gateway's counters, histograms and gauges, registered in :attr:`registry`."""

    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        ns = "responses_gateway"
        model = ["model", "backend"]
        self.http_requests = Counter(
            "http_requests",
            "HTTP requests answered, by route pattern, method and status (every endpoint).",
            ["route", "method", "status"],
            namespace=ns,
            registry=registry,
        )
        self.responses = Counter(
            "responses",
            "POST /v1/responses requests, by model, back end, mode, HTTP status and Response status.",
            [*model, "mode", "http_status", "status"],
            namespace=ns,
            registry=registry,
        )
        self.response_errors = Counter(
            "response_errors",
            "Responses that ended in an error (HTTP error or failed Response), by error code.",
            [*model, "code"],
            namespace=ns,
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "time_to_first_token_seconds",
            "From the request's arrival to its first output item.",
            model,
            namespace=ns,
            registry=registry,
            buckets=_LATENCY,
        )
        self.response_duration = Histogram(
            "response_duration_seconds",
            "From the request's arrival to the end of its work (the end of a background run).",
            model,
            namespace=ns,
            registry=registry,
            buckets=_LATENCY,
        )
        self.tokens = Counter(
            "tokens",
            "Tokens the back ends reported, by direction (input, output).",
            [*model, "direction"],
            namespace=ns,
            registry=registry,
        )
        self.active_responses = Gauge(
            "active_responses",
            "Responses being generated now, by mode (stream, json, background).",
            ["mode"],
            namespace=ns,
            registry=registry,
        )
        self.upstream_errors = Counter(
            "upstream_errors",
            "Errors a back end returned (including attempts a fallback chain retried), by status and code.",
            ["backend", "status", "code"],
            namespace=ns,
            registry=registry,
        )
        self.fallbacks = Counter(
            "fallbacks",
            "Responses a later fallback chain member answered, by model asked and model that answered.",
            ["model", "served_by"],
            namespace=ns,
            registry=registry,
        )
        self.model_turns = Counter(
            "model_turns",
            "Model turns (one per response, more when the gateway runs hosted tools between turns).",
            model,
            namespace=ns,
            registry=registry,
        )
        self.tool_runs = Counter(
            "tool_runs",
            "Hosted tool calls the gateway ran, by tool type and the call's status.",
            ["tool", "status"],
            namespace=ns,
            registry=registry,
        )
        self.tool_duration = Histogram(
            "tool_run_seconds",
            "How long one hosted tool call ran.",
            ["tool"],
            namespace=ns,
            registry=registry,
            buckets=_LATENCY,
        )
        self.store_latency = Histogram(
            "store_operation_seconds",
            "Store operations on the request path (create a response, commit its events, read one).",
            ["operation"],
            namespace=ns,
            registry=registry,
            buckets=_STORE,
        )

    def bm25_reads(self, reads: Callable[[], Mapping[str, int]]) -> None:
        """Serve ``reads()`` — the chunks the in-memory BM25 index took in so far, by source
        (``KeywordIndex.reads``) — as a counter, read at each scrape."""
        self.registry.register(_Reads(reads))

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached: a response's counting is then a few dict lookups (the
        label sets are bounded: models served × back ends × statuses)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)

    async def timed(self, operation: str, work: Awaitable[T]) -> T:
        """``await work``, its time observed as store operation ``operation``."""
        started = time.monotonic()
        try:
            return await work
        finally:
            self.store_latency.labels(operation).observe(time.monotonic() - started)

    def timer(self, operation: str, call: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """``call`` (an awaitable factory such as a commit), timed as store operation ``operation``."""

        async def timed() -> None:
            await self.timed(operation, call())

        return timed


class _Reads(Collector):
    def __init__(self, reads: Callable[[], Mapping[str, int]]) -> None:
        self._reads = reads

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "responses_gateway_bm25_chunks_read",
            "Chunks the in-memory BM25 index (file_search) took in, by source: postings (stored at "
            "ingestion, loaded) or texts (tokenized at search: attachments without stored postings).",
            labels=["source"],
        )
        for source, count in sorted(self._reads().items()):
            family.add_metric([source], count)
        yield family
