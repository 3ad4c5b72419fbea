"""Prometheus metrics, one registry per app, served at ``GET /metrics``.

Everything is counted once per HTTP request, per response, per model turn or per tool run — never per
streamed event — so the relay's hot path carries no metrics work: a response's figures are taken from
its :class:`~responses_gateway.server.request_log.RequestLog` when its work ends.

The registry is the app's own (not ``prometheus_client``'s global one), so several gateways in one
process (the tests) each count their own requests. Label values that a client chooses (the model)
only appear once the gateway served that model; an unknown model is counted as ``model=""``.

The counters, gauges and histograms are this module's own (:class:`Family`), exposed through
``prometheus_client``'s registry and text format with exactly the samples its ``Counter``, ``Gauge``
and ``Histogram`` give (``_total``, ``_created``, cumulative ``_bucket`` with ``le``, ``_count``,
``_sum``): a labelled child's ``inc``/``observe`` is then one attribute update (a bisect for a
histogram) with no lock, instead of ``prometheus_client``'s checks and a mutex per call. They are
updated from the event loop's thread only.

With ``serve --workers N`` each worker counts its own requests, and a scrape reaches one worker:
:meth:`Metrics.share` makes every worker publish its figures to a directory the workers share (a
file per process, rewritten at most once a second when they changed), and the worker scraped adds the
others' to its own (:func:`merge`), so ``/metrics`` reads the same whichever worker answers.
"""

from __future__ import annotations

import os
import secrets
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["CONTENT_TYPE", "SHARE_INTERVAL", "Family", "Metrics", "merge"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
T = TypeVar("T")

# Model latencies: from a cached reply (tens of ms) to a long reasoning answer (minutes).
_LATENCY = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Store writes and reads: sub-millisecond (SQLite) to a slow remote database.
_STORE = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


# ``serve --workers N``: how often (seconds) a worker publishes its figures for the others, at most.
SHARE_INTERVAL = 1.0
# A published file: ``metrics-<pid>-<random>.json`` in the shared directory.
_SHARED_PREFIX = "metrics-"
# One metric as published: name, documentation, type, samples (name, labels, value).
Published = list[Any]

# As prometheus_client: PROMETHEUS_DISABLE_CREATED_SERIES=true leaves out the ``_created`` samples.
_CREATED = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False").lower() not in ("true", "1", "t")


class _Value:
    """A counter's or gauge's child: its value and when it was made."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount


class _Observed:
    """A histogram's child: one count per bucket (not cumulative), the sum, when it was made."""

    __slots__ = ("bounds", "counts", "created", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.total = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.total += amount
        # (The first bucket whose bound is >= amount; the last bound is +Inf.)
        self.counts[bisect_left(self.bounds, amount)] += 1


class Family(Collector):
    """One metric with labels (``counter``, ``gauge`` or ``histogram``), its children made by
    :meth:`labels`, exposed as ``prometheus_client``'s own metric of that type is."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        kind: str,
        namespace: str,
        registry: CollectorRegistry,
        buckets: Sequence[float] = (),
    ) -> None:
        self.name = f"{namespace}_{name}"
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.kind = kind
        self.bounds = (*(float(b) for b in buckets), float("inf")) if kind == "histogram" else ()
        self._le = [floatToGoString(b) for b in self.bounds]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], Any] = {}
        registry.register(self)

    def labels(self, *values: str) -> Any:
        """The child of these label values (made on first use)."""
        found = self._children.get(values)
        if found is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes the labels {self.labelnames}, got {values}")
            found = self._children[values] = _Observed(self.bounds) if self.kind == "histogram" else _Value()
        return found

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        name, kind = self.name, self.kind
        for values, child in list(self._children.items()):
            labels = dict(zip(self.labelnames, values, strict=True))
            if kind == "histogram":
                acc = 0.0
                for le, count in zip(self._le, child.counts, strict=True):
                    acc += count
                    metric.add_sample(f"{name}_bucket", {**labels, "le": le}, acc)
                metric.add_sample(f"{name}_count", labels, acc)
                metric.add_sample(f"{name}_sum", labels, child.total)
            elif kind == "counter":
                metric.add_sample(f"{name}_total", labels, child.value)
            else:
                metric.add_sample(name, labels, child.value)
            if _CREATED and kind != "gauge":
                metric.add_sample(f"{name}_created", labels, child.created)
        return [metric]


class Metrics:
    """The gateway's counters, histograms and gauges, registered in :attr:`registry`."""

    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry(auto_describe=True)
        # ``serve --workers N``: the directory the workers publish their figures to (see share()).
        self._shared: Path | None = None
        self._file: Path | None = None
        self._published = b""
        ns = "responses_gateway"
        model = ["model", "backend"]
        self.http_requests = Family(
            "http_requests",
            "HTTP requests answered, by route pattern, method and status (every endpoint).",
            ["route", "method", "status"],
            kind="counter",
            namespace=ns,
            registry=registry,
        )
        self.responses = Family(
            "responses",
            "POST /v1/responses requests, by model, back end, mode, HTTP status and Response status.",
            [*model, "mode", "http_status", "status"],
            kind="counter",
            namespace=ns,
            registry=registry,
        )
        self.response_errors = Family(
            "response_errors",
            "Responses that ended in an error (HTTP error or failed Response), by error code.",
            [*model, "code"],
            kind="counter",
            namespace=ns,
            registry=registry,
        )
        self.time_to_first_token = Family(
            "time_to_first_token_seconds",
            "From the request's arrival to its first output item.",
            model,
            buckets=_LATENCY,
            kind="histogram",
            namespace=ns,
            registry=registry,
        )
        self.response_duration = Family(
            "response_duration_seconds",
            "From the request's arrival to the end of its work (the end of a background run).",
            model,
            buckets=_LATENCY,
            kind="histogram",
            namespace=ns,
            registry=registry,
        )
        self.tokens = Family(
            "tokens",
            "Tokens the back ends reported, by direction (input, output).",
            [*model, "direction"],
            kind="counter",
            namespace=ns,
            registry=registry,
        )
        self.active_responses = Family(
            "active_responses",
            "Responses being generated now, by mode (stream, json, background).",
            ["mode"],
            kind="gauge",
            namespace=ns,
            registry=registry,
        )
        self.upstream_errors = Family(
            "upstream_errors",
            "Errors a back end returned (including attempts a fallback chain retried), by status and code.",
            ["backend", "status", "code"],
            kind="counter",
            namespace=ns,
            registry=registry,
        )
        self.fallbacks = Family(
            "fallbacks",
            "Responses a later fallback chain member answered, by model asked and model that answered.",
            ["model", "served_by"],
            kind="counter",
            namespace=ns,
            registry=registry,
        )
        self.model_turns = Family(
            "model_turns",
            "Model turns (one per response, more when the gateway runs hosted tools between turns).",
            model,
            kind="counter",
            namespace=ns,
            registry=registry,
        )
        self.tool_runs = Family(
            "tool_runs",
            "Hosted tool calls the gateway ran, by tool type and the call's status.",
            ["tool", "status"],
            kind="counter",
            namespace=ns,
            registry=registry,
        )
        self.tool_duration = Family(
            "tool_run_seconds",
            "How long one hosted tool call ran.",
            ["tool"],
            buckets=_LATENCY,
            kind="histogram",
            namespace=ns,
            registry=registry,
        )
        self.store_latency = Family(
            "store_operation_seconds",
            "Store operations on the request path (create a response, commit its events, read one).",
            ["operation"],
            buckets=_STORE,
            kind="histogram",
            namespace=ns,
            registry=registry,
        )

    def bm25_reads(self, reads: Callable[[], Mapping[str, int]]) -> None:
        """Serve ``reads()`` — the chunks the in-memory BM25 index took in so far, by source
        (``KeywordIndex.reads``) — as a counter, read at each scrape."""
        self.registry.register(_Reads(reads))

    def index_loads(self, vectors: Callable[[], int], warm_up: Callable[[], Mapping[str, int]]) -> None:
        """Serve ``vectors()`` (the vectors the in-memory vector index read) and ``warm_up()`` (the
        start-up warm-up of the file search indexes: ``stores``, ``chunks``, ``running``), read at
        each scrape."""
        self.registry.register(_IndexLoads(vectors, warm_up))

    def share(self, directory: str | Path) -> None:
        """Count together with the other processes sharing ``directory`` (the workers of ``serve
        --workers N``): :meth:`publish` writes this process's figures there, :meth:`exposition` adds
        the others' to its own."""
        self._shared = Path(directory)
        # Named by pid and a random part: a later worker given a stopped one's pid keeps its file.
        self._file = self._shared / f"{_SHARED_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.json"

    def published(self) -> list[Published]:
        """This process's metrics as :meth:`publish` writes them."""
        return [
            [m.name, m.documentation, m.type, [[s.name, s.labels, s.value] for s in m.samples]]
            for m in self.registry.collect()
        ]

    def publish(self, *, final: bool = False) -> None:
        """Write this process's figures for the other workers, if they changed since the last time
        (atomically: a reader sees the previous file or this one). ``final``: the process is stopping;
        its counts stay in the others' totals, its gauges leave them."""
        if self._file is None:
            return
        body = orjson.dumps({"pid": os.getpid(), "final": final, "metrics": self.published()})
        if body == self._published:
            return
        part = self._file.with_suffix(".part")
        part.write_bytes(body)
        os.replace(part, self._file)
        self._published = body

    def _others(self) -> list[tuple[bool, list[Published]]]:
        """The other processes' published figures, each with whether it is still running."""
        assert self._shared is not None
        found: list[tuple[bool, list[Published]]] = []
        for path in sorted(self._shared.glob(f"{_SHARED_PREFIX}*.json")):
            if path == self._file:
                continue  # this process's figures are taken live
            try:
                data = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue  # removed meanwhile
            pid = data.get("pid")
            if not isinstance(pid, int):
                continue
            found.append((not data.get("final") and _running(pid), data.get("metrics") or []))
        return found

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (with :meth:`share`: every worker's figures)."""
        if self._shared is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        merged.register(_Fixed(merge(self.published(), self._others())))
        return generate_latest(merged)

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


def merge(own: list[Published], others: Sequence[tuple[bool, list[Published]]]) -> list[Metric]:
    """``own`` metrics with the other processes' added: counters and histograms summed over every
    process that published (a stopped worker's counts stay in the totals, so they never go down while
    the gateway runs), gauges over the running ones only (``others``: running or not, and its
    metrics), each ``_created`` the earliest. Families and samples keep their first-seen order."""
    kinds: dict[str, tuple[str, str]] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for running, metrics in ((True, own), *others):
        for name, documentation, kind, samples in metrics:
            if name not in kinds:
                kinds[name] = (documentation, kind)
                values[name] = {}
            if kind == "gauge" and not running:
                continue
            into = values[name]
            for sample, labels, value in samples:
                key = (sample, tuple(labels.items()))
                before = into.get(key)
                if before is None:
                    into[key] = value
                elif sample.endswith("_created"):
                    into[key] = min(before, value)
                else:
                    into[key] = before + value
    out: list[Metric] = []
    for name, (documentation, kind) in kinds.items():
        metric = Metric(name, documentation, kind)
        for (sample, labels), value in values[name].items():
            metric.add_sample(sample, dict(labels), value)
        out.append(metric)
    return out


def _running(pid: int) -> bool:
    """Whether ``pid`` is still alive (a worker's pid taken by another user's process is not ours)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


class _Fixed(Collector):
    """Metrics already made (a merged scrape)."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


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


class _IndexLoads(Collector):
    def __init__(self, vectors: Callable[[], int], warm_up: Callable[[], Mapping[str, int]]) -> None:
        self._vectors = vectors
        self._warm_up = warm_up

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(
            "responses_gateway_vector_chunks_read",
            "Vectors the in-memory vector index (file_search, --vector-index memory) read from the "
            "database: whole stores on their first load, then each write's new chunks.",
            value=self._vectors(),
        )
        warm = self._warm_up()
        yield CounterMetricFamily(
            "responses_gateway_index_warmup_stores",
            "Vector stores whose file search indexes the start-up warm-up loaded (serve "
            "--no-warm-indexes: none).",
            value=warm.get("stores", 0),
        )
        yield CounterMetricFamily(
            "responses_gateway_index_warmup_chunks",
            "Chunks in the vector stores the start-up warm-up loaded.",
            value=warm.get("chunks", 0),
        )
        yield GaugeMetricFamily(
            "responses_gateway_index_warmup_running",
            "1 while the start-up warm-up of the file search indexes runs, else 0.",
            value=warm.get("running", 0),
        )
