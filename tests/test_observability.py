"""Metrics, JSON logs and traces, as an operator sees them: ``/metrics`` scraped during a load made
with the openai SDK, the ``serve --log-format json`` lines of a real ``serve`` process, and the
OpenTelemetry spans of a gateway given an in-memory exporter.

The counters must equal the requests made (by route, model, back end and status), the histograms
must have one observation per response, the active-streams gauge must be up while streams are open
and back to zero after, and nothing secret or content-bearing may appear unless asked for.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from conftest import Gateway, check_stream, start_gateway, stream_events
from responses_gateway.providers.fallback import FallbackProvider
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.sandbox import probe
from responses_gateway.server.metrics import Metrics
from responses_gateway.server.registry import ModelRegistry
from serve_process import serving

KEY = "sk-obs-test-key-123456"
AUTH = {"Authorization": f"Bearer {KEY}"}

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

# Counters the gateway reads from its file search indexes at each scrape (no ``_created`` series).
READ_AT_SCRAPE = {
    "responses_gateway_bm25_chunks_read",
    "responses_gateway_vector_chunks_read",
    "responses_gateway_index_warmup_stores",
    "responses_gateway_index_warmup_chunks",
}


def scrape(gw: Gateway, headers: dict[str, str] | None = None) -> Samples:
    """``GET /metrics`` parsed by prometheus_client's own parser: (sample name, labels) -> value."""
    reply = httpx.get(gw.url("/metrics"), headers=AUTH if headers is None else headers, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def slow_then(text: str) -> list[dict[str, Any]]:
    """A stream that stays open a while whether or not its client reads (the server keeps sending)."""
    return [
        {"message": [text[:3]]},
        {"sleep": 2.0},
        {"message": [text[3:]]},
        {"usage": {"input_tokens": 7, "output_tokens": 5}},
    ]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    # A fallback chain as a models file makes it: model names "flaky" then "backup", each on its own
    # back end (the back end's name is the `backend` label).
    down = ScriptedProvider(
        [{"error": {"status": 503, "message": "overloaded", "code": "overloaded"}}], name="down-backend"
    )
    up = ScriptedProvider([{"message": ["from backup"]}], name="up-backend")
    chain = FallbackProvider([("flaky", down), ("backup", up)], retries=0)
    models = ModelRegistry()
    models.add(chain, "flaky")
    for provider in [
        ScriptedProvider(
            [{"message": ["Hello ", "there"]}, {"usage": {"input_tokens": 3, "output_tokens": 2}}],
            name="echo",
        ),
        ScriptedProvider(slow_then("slowly done"), name="slow"),
        ScriptedProvider(
            [{"message": ["x"]}, {"fail": {"code": "server_error", "message": "boom"}}], name="bad"
        ),
    ]:
        models.add(provider)
    store = tmp_path_factory.mktemp("obs") / "store.db"
    gateway = start_gateway(models, api_keys=(KEY,), store_url=f"sqlite:///{store}")
    yield gateway
    gateway.stop()


def test_metrics_need_the_api_key_unless_opened(gw: Gateway) -> None:
    reply = httpx.get(gw.url("/metrics"), timeout=10)
    assert reply.status_code == 401
    assert reply.json()["error"]["type"] == "invalid_request_error"
    opened = start_gateway(
        [ScriptedProvider([{"message": ["hi"]}], name="m")], api_keys=(KEY,), metrics_public=True
    )
    try:
        ok = httpx.post(
            opened.url("/v1/responses"), json={"model": "m", "input": "x"}, headers=AUTH, timeout=10
        )
        assert ok.status_code == 200
        samples = text_string_to_metric_families(httpx.get(opened.url("/metrics"), timeout=10).text)
        counted = {
            s.labels["model"]: s.value
            for f in samples
            for s in f.samples
            if s.name == "responses_gateway_responses_total"
        }
        # Its own registry: the one response made here, none of the module gateway's.
        assert counted == {"m": 1.0}
        # Only /metrics is opened: the API still wants its key.
        assert httpx.get(opened.url("/v1/models"), timeout=10).status_code == 401
    finally:
        opened.stop()
    closed = start_gateway([ScriptedProvider([{"message": ["hi"]}], name="m")], metrics=False)
    try:
        assert httpx.get(closed.url("/metrics"), timeout=10).status_code == 404
    finally:
        closed.stop()


def test_counters_match_a_load_made_with_the_sdk(gw: Gateway) -> None:
    before = scrape(gw)
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    streamed, plain = 4, 3
    for _ in range(streamed):
        events = [
            e.model_dump(mode="json", exclude_unset=True)
            for e in client.responses.create(model="echo", input="hi", stream=True)
        ]
        check_stream(events)
        assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello there"
    for _ in range(plain):
        assert client.responses.create(model="echo", input="hi").output_text == "Hello there"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no-such-model", input="hi")
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="echo", input="hi", temperature=7)
    failed = stream_events(gw.url("/v1/responses"), {"model": "bad", "input": "hi", "stream": True}, AUTH)
    check_stream(failed)
    assert failed[-1]["type"] == "response.failed"
    fell_back = client.responses.create(model="flaky", input="hi")
    assert fell_back.output_text == "from backup"
    client.models.list()
    assert httpx.get(gw.url("/v1/nope"), headers=AUTH, timeout=10).status_code == 404

    after = scrape(gw)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    echo = {"model": "echo", "backend": "echo"}
    assert delta("responses_gateway_responses_total", **echo, mode="stream", status="completed") == streamed
    assert delta("responses_gateway_responses_total", **echo, mode="json", status="completed") == plain
    # Refused before the model was looked up (400) or for an unknown model (404): counted, but never
    # under a label value a client chose.
    assert delta("responses_gateway_responses_total", model="", http_status="400") == 1
    assert delta("responses_gateway_responses_total", model="", http_status="404") == 1
    assert delta("responses_gateway_response_errors_total", model="", code="model_not_found") == 1
    assert not any(("model", "no-such-model") in labels for _, labels in after)
    assert delta("responses_gateway_responses_total", model="bad", status="failed") == 1
    assert delta("responses_gateway_response_errors_total", model="bad", code="server_error") == 1
    assert delta("responses_gateway_http_requests_total", route="/v1/responses", method="POST") == (
        streamed + plain + 4  # and the 404, the 400, "bad" and "flaky"
    )
    assert delta("responses_gateway_http_requests_total", route="/v1/models", method="GET", status="200") == 1
    assert delta("responses_gateway_http_requests_total", route="unmatched", status="404") == 1
    # Tokens: the script reports 3 in / 2 out per answered request.
    answered = streamed + plain
    assert delta("responses_gateway_tokens_total", **echo, direction="input") == 3 * answered
    assert delta("responses_gateway_tokens_total", **echo, direction="output") == 2 * answered
    # One time-to-first-token and one duration observation per answered response.
    assert delta("responses_gateway_time_to_first_token_seconds_count", **echo) == answered
    assert delta("responses_gateway_response_duration_seconds_count", **echo) == answered
    assert delta("responses_gateway_model_turns_total", **echo) == answered
    # The fallback chain: one upstream error from the first member's back end, one fallback answered
    # by "backup", whose back end is the one the response is counted under.
    assert (
        delta(
            "responses_gateway_upstream_errors_total", backend="down-backend", status="503", code="overloaded"
        )
        == 1
    )
    assert delta("responses_gateway_fallbacks_total", model="flaky", served_by="backup") == 1
    assert (
        delta("responses_gateway_responses_total", model="flaky", backend="up-backend", status="completed")
        == 1
    )
    assert delta("responses_gateway_upstream_errors_total", backend="bad", status="stream") == 1
    assert value(after, "responses_gateway_active_responses") == 0
    assert KEY not in httpx.get(gw.url("/metrics"), headers=AUTH, timeout=10).text


def test_active_streams_gauge_while_streams_are_open(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    started = threading.Barrier(4)
    release = threading.Event()
    texts: list[str] = []

    def run() -> None:
        with client.responses.stream(model="slow", input="hi") as stream:
            for event in stream:
                if event.type == "response.created":
                    started.wait(10)
                    release.wait(10)
            texts.append(stream.get_final_response().output_text)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    started.wait(10)
    during = scrape(gw)
    release.set()
    for t in threads:
        t.join(20)
    assert texts == ["slowly done"] * 3
    assert value(during, "responses_gateway_active_responses", mode="stream") == 3
    assert value(scrape(gw), "responses_gateway_active_responses", mode="stream") == 0


def test_histograms_and_series_are_well_formed(gw: Gateway) -> None:
    """A 2-second stream lands in the duration histogram's 2.5 s bucket and not the 1 s one; every
    histogram's buckets are cumulative up to ``+Inf`` = ``_count``, every counter and histogram series
    has its ``_created``, and each family has the type Prometheus expects."""
    before = scrape(gw)
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    assert client.responses.create(model="slow", input="hi").output_text == "slowly done"
    reply = httpx.get(gw.url("/metrics"), headers=AUTH, timeout=10)
    families = {f.name: f for f in text_string_to_metric_families(reply.text)}
    after = scrape(gw)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    slow = {"model": "slow", "backend": "slow"}
    duration = "responses_gateway_response_duration_seconds"
    assert delta(f"{duration}_count", **slow) == 1
    assert delta(f"{duration}_bucket", **slow, le="1.0") == 0
    assert delta(f"{duration}_bucket", **slow, le="2.5") == 1
    assert delta(f"{duration}_bucket", **slow, le="+Inf") == 1
    assert 2.0 <= delta(f"{duration}_sum", **slow) < 2.5
    kinds = {
        "responses_gateway_responses": "counter",
        "responses_gateway_http_requests": "counter",
        "responses_gateway_active_responses": "gauge",
        "responses_gateway_response_duration_seconds": "histogram",
        "responses_gateway_time_to_first_token_seconds": "histogram",
    }
    for name, kind in kinds.items():
        assert families[name].type == kind
    for family in families.values():
        if family.type not in ("counter", "histogram") or family.name in READ_AT_SCRAPE:
            continue  # (counts read from the file search indexes at each scrape: no _created)
        series: dict[frozenset[tuple[str, str]], dict[str, Any]] = {}
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            entry = series.setdefault(frozenset(labels.items()), {"buckets": []})
            suffix = sample.name[len(family.name) :]
            if suffix == "_bucket":
                entry["buckets"].append((float(sample.labels["le"]), sample.value))
            else:
                entry[suffix] = sample.value
        if not series:
            continue
        # (The text format carries ``_created`` as a gauge family of its own, one sample per series.)
        created = {frozenset(s.labels.items()) for s in families[f"{family.name}_created"].samples}
        assert created == set(series), family.name
        for entry in series.values():
            if family.type == "histogram":
                bounds = [b for b, _ in entry["buckets"]]
                counts = [c for _, c in entry["buckets"]]
                assert bounds == sorted(bounds) and bounds[-1] == float("inf")
                assert counts == sorted(counts) and counts[-1] == entry["_count"]


def test_background_runs_and_store_latency(gw: Gateway) -> None:
    before = scrape(gw)
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    queued = client.responses.create(model="slow", input="hi", background=True)
    assert queued.status in ("queued", "in_progress")
    deadline = time.monotonic() + 20
    while (done := client.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert done.status == "completed"
    # The run is counted when it ends, just after its status is stored.
    deadline = time.monotonic() + 5
    counted = {"model": "slow", "mode": "background"}
    after = scrape(gw)
    while value(after, "responses_gateway_responses_total", **counted) == value(
        before, "responses_gateway_responses_total", **counted
    ):
        assert time.monotonic() < deadline, "the background run was never counted"
        time.sleep(0.05)
        after = scrape(gw)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert (
        delta("responses_gateway_responses_total", model="slow", mode="background", status="completed") == 1
    )
    assert delta("responses_gateway_tokens_total", model="slow", direction="output") == 5
    assert delta("responses_gateway_store_operation_seconds_count", operation="create_response") == 1
    assert delta("responses_gateway_store_operation_seconds_count", operation="commit_events") == 1
    retrieved = delta("responses_gateway_store_operation_seconds_count", operation="get_response")
    assert retrieved == delta(
        "responses_gateway_http_requests_total", route="/v1/responses/{rid}", method="GET"
    )
    assert retrieved >= 1
    assert value(after, "responses_gateway_active_responses", mode="background") == 0


def test_traces_follow_the_genai_conventions() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = ScriptedProvider(
        [{"message": ["secret-content ", "here"]}, {"usage": {"input_tokens": 11, "output_tokens": 4}}],
        name="m",
    )
    gw = start_gateway([model], tracer_provider=provider)
    try:
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        response = client.responses.create(model="m", input="private question")
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model="missing", input="hi")
    finally:
        gw.stop()
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.parent is None]
    assert sorted(s.name for s in roots) == ["chat m", "chat missing"]
    ok = next(s for s in roots if s.name == "chat m")
    attrs = dict(ok.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "m"
    assert attrs["gen_ai.response.id"] == response.id
    assert attrs["gen_ai.usage.input_tokens"] == 11
    assert attrs["gen_ai.usage.output_tokens"] == 4
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["http.response.status_code"] == 200
    turns = [s for s in spans if s.parent is not None and s.parent.span_id == ok.context.span_id]
    assert [s.name for s in turns] == ["chat m"]
    assert ok.start_time <= turns[0].start_time <= turns[0].end_time <= ok.end_time
    missing = next(s for s in roots if s.name == "chat missing")
    assert missing.attributes is not None and missing.attributes["error.type"] == "model_not_found"
    assert missing.status.status_code.name == "ERROR"
    dumped = json.dumps([dict(s.attributes or {}) for s in spans], default=str)
    assert "secret-content" not in dumped and "private question" not in dumped


@pytest.mark.skipif(probe() is not None, reason=f"the sandbox cannot start here: {probe()}")
def test_tool_runs_are_counted_and_traced() -> None:
    code = json.dumps({"code": "print(6 * 7)"})
    model = ScriptedProvider(
        {
            "turns": [
                {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["42"]}]},
                {"steps": [{"function_call": {"name": "code_interpreter", "arguments": [code]}}]},
            ]
        },
        name="coder",
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gw = start_gateway([model], tracer_provider=provider)
    try:
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        response = client.responses.create(
            model="coder",
            input="compute",
            tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
        )
        assert [item.type for item in response.output] == ["code_interpreter_call", "message"]
        samples = scrape(gw, headers={})
    finally:
        gw.stop()
    assert (
        value(samples, "responses_gateway_tool_runs_total", tool="code_interpreter", status="completed") == 1
    )
    assert value(samples, "responses_gateway_tool_run_seconds_count", tool="code_interpreter") == 1
    assert value(samples, "responses_gateway_model_turns_total", model="coder") == 2
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == [
        "chat coder",
        "chat coder",
        "chat coder",
        "execute_tool code_interpreter",
    ]
    (root,) = [s for s in spans if s.parent is None]
    children = sorted((s for s in spans if s.parent is not None), key=lambda s: s.start_time or 0)
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in children)
    # Turn, tool run, turn: in time order, inside the request.
    assert [s.name for s in children] == ["chat coder", "execute_tool code_interpreter", "chat coder"]
    first, tool, second = children
    assert (root.start_time or 0) <= (first.start_time or 0)
    assert (first.end_time or 0) <= (tool.start_time or 0) <= (tool.end_time or 0) <= (second.start_time or 0)
    assert (second.end_time or 0) <= (root.end_time or 0)
    assert tool.attributes is not None and tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "code_interpreter"
    assert first.attributes is not None and first.attributes["gen_ai.provider.name"] == "coder"


def test_json_log_lines_of_serve(tmp_path: Path) -> None:
    script = tmp_path / "talk.yaml"
    script.write_text(
        "model: talk\nsteps:\n  - message: ['private ', 'answer']\n"
        "  - usage: {input_tokens: 5, output_tokens: 2}\n"
    )
    lines: dict[str, list[dict[str, Any]]] = {}
    for mode, extra in (("plain", ()), ("content", ("--log-content",))):
        run_dir = tmp_path / mode
        run_dir.mkdir()
        with serving(
            run_dir,
            "--no-local",
            "--script",
            str(script),
            "--log-format",
            "json",
            "--log-level",
            "info",
            "--api-key",
            KEY,
            *extra,
        ) as served:
            client = openai.OpenAI(base_url=served.base_url, api_key=KEY, max_retries=0)
            # A user pasting the gateway's key into a prompt: even --log-content never logs it.
            response = client.responses.create(model="talk", input=f"my secret question {KEY}")
            assert response.output_text == "private answer"
            with pytest.raises(openai.NotFoundError):
                client.responses.create(model="nope", input="x")
        text = served.log.read_text()
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        lines[mode] = [r for r in records if r.get("event") == "response"]
        assert all(isinstance(r["time"], str) and r["level"] for r in records)
        assert KEY not in text
    ok, missing = lines["plain"]
    assert ok["model"] == "talk" and ok["backend"] == "talk" and ok["status"] == "completed"
    assert (ok["http_status"], ok["input_tokens"], ok["output_tokens"]) == (200, 5, 2)
    assert ok["id"].startswith("resp_") and ok["duration_ms"] >= ok["ttft_ms"] >= 0
    assert (missing["http_status"], missing["error"], missing["backend"]) == (404, "model_not_found", None)
    assert "input" not in ok and "output" not in ok
    assert "secret question" not in json.dumps(lines["plain"])
    with_content = lines["content"][0]
    assert with_content["input"].startswith("my secret question ") and KEY not in with_content["input"]
    assert with_content["output"][0]["content"][0]["text"] == "private answer"


def _counting_process(
    directory: Path, responses: int, streams: int, *, final: bool, stay: bool
) -> tuple[int, int]:
    """A forked process counting like a worker of ``serve --workers N`` and publishing to
    ``directory``; it stays alive (until the returned pipe is closed) when ``stay``. (pid, pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: count, publish, then wait or exit
        try:
            os.close(write)
            metrics = Metrics()
            metrics.share(directory)
            for _ in range(responses):
                metrics.responses.labels("m", "b", "stream", "200", "completed").inc()
                metrics.response_duration.labels("m", "b").observe(0.3)
            metrics.active_responses.labels("stream").inc(streams)
            metrics.publish(final=final)
            if stay:
                os.read(read, 1)
        finally:
            os._exit(0)
    os.close(read)
    if not stay:
        os.waitpid(pid, 0)
    return pid, write


def test_workers_metrics_add_up_whichever_is_scraped(tmp_path: Path) -> None:
    """``serve --workers N`` (Metrics.share): the process scraped adds every other worker's published
    counts to its own, a stopped or killed worker's counts stay, and only running workers' gauges
    count. (tests/test_serve_workers.py scrapes a real ``serve --workers 2``.)"""
    running, pipe = _counting_process(tmp_path, 3, 1, final=False, stay=True)
    _counting_process(tmp_path, 2, 0, final=True, stay=False)  # stopped gracefully
    _counting_process(tmp_path, 4, 2, final=False, stay=False)  # killed: never said it stopped
    try:
        here = Metrics()
        here.responses.labels("m", "b", "stream", "200", "completed").inc()
        here.response_duration.labels("m", "b").observe(2.0)
        here.active_responses.labels("stream").inc()
        alone = _parse(here.exposition())
        here.share(tmp_path)
        merged = _parse(here.exposition())
    finally:
        os.close(pipe)
        os.waitpid(running, 0)
    done = {"model": "m", "backend": "b", "mode": "stream", "http_status": "200", "status": "completed"}
    assert value(alone, "responses_gateway_responses_total", **done) == 1
    assert value(merged, "responses_gateway_responses_total", **done) == 1 + 3 + 2 + 4
    duration = "responses_gateway_response_duration_seconds"
    assert value(merged, f"{duration}_count", model="m", backend="b") == 10
    assert value(merged, f"{duration}_bucket", model="m", backend="b", le="0.5") == 9
    assert value(merged, f"{duration}_bucket", model="m", backend="b", le="+Inf") == 10
    assert value(merged, f"{duration}_sum", model="m", backend="b") == pytest.approx(9 * 0.3 + 2.0)
    # This process's open stream and the running worker's; not the killed worker's two.
    assert value(merged, "responses_gateway_active_responses", mode="stream") == 2
    # A series' start is the earliest worker's (the children counted before this process did).
    created = "responses_gateway_responses_created"
    assert value(merged, created, **done) < value(alone, created, **done)


def _parse(text: bytes) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out
