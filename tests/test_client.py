"""``responses_gateway.client`` against real servers: this gateway over HTTP (sync and async), a
stream cut mid-way and resumed with ``starting_after``, and an older server's dialect (seed 002's
``response.function_call.arguments.delta`` and ``response.text.done``, seed 003's annotation event)
replayed byte for byte by a mock, whose checker violations are reported without failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from openai.types.responses import Response

from conftest import Gateway, check_stream, start_gateway
from fixtures_loader import list_fixtures
from responses_gateway import client as client_module
from responses_gateway.client import (
    AsyncResponsesClient,
    ResponsesAPIError,
    ResponsesClient,
    StreamStep,
    output_text,
)
from responses_gateway.protocol import accumulate, check
from responses_gateway.protocol.sse import EventStreamDecoder, SSEEventTooLarge
from responses_gateway.providers.scripted import ScriptedProvider
from upstream_mock import UpstreamMock, fixture_reply, stream_reply

KEY = "sk-client-test"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("client")
    models = [
        ScriptedProvider(
            [
                {"reasoning": {"summary": [["Think", "ing"]]}},
                {"message": ["Hello", ", ", "world"]},
                {"usage": {"input_tokens": 3, "output_tokens": 4}},
            ],
            name="talk",
        ),
        ScriptedProvider([{"message": [f"w{i} " for i in range(12)], "delay": 0.05}], name="slow"),
    ]
    gateway = start_gateway(models, api_keys=(KEY,), store_url=f"sqlite:///{tmp / 'store.db'}")
    yield gateway
    gateway.stop()


def test_public_api_is_pinned() -> None:
    assert sorted(client_module.__all__) == [
        "AsyncResponseStream",
        "AsyncResponsesClient",
        "ResponseStream",
        "ResponsesAPIError",
        "ResponsesClient",
        "StreamStep",
        "output_text",
    ]
    public = {"cancel", "close", "create", "delete", "models", "resume", "retrieve", "stream"}
    assert {n for n in vars(ResponsesClient) if not n.startswith("_")} == public
    assert {n for n in vars(AsyncResponsesClient) if not n.startswith("_")} == public - {"close"} | {"aclose"}
    for name in public - {"close"}:
        sync, asynchronous = getattr(ResponsesClient, name), getattr(AsyncResponsesClient, name)
        assert inspect.signature(sync).parameters == inspect.signature(asynchronous).parameters, name
    assert str(inspect.signature(ResponsesClient.__init__)) == (
        "(self, base_url: 'str' = 'http://127.0.0.1:8080/v1', api_key: 'str | None' = None, *, "
        "timeout: 'float | httpx.Timeout' = Timeout(connect=10.0, read=600.0, write=600.0, pool=600.0), "
        "headers: 'dict[str, str] | None' = None, profile: 'Profile | str | None' = 'openai', "
        "max_resumes: 'int' = 3, http: 'httpx.Client | None' = None) -> 'None'"
    )
    assert {n for n in dir(StreamStep) if not n.startswith("_")} == {
        "event",
        "response",
        "type",
        "violations",
    }


def test_sync_stream_steps_carry_the_response_so_far(gw: Gateway) -> None:
    with ResponsesClient(gw.base_url, KEY) as client:
        texts: list[str] = []
        with client.stream(model="talk", input="hi") as stream:
            for step in stream:
                assert step.violations == []
                if step.type == "response.output_text.delta":
                    texts.append(output_text(step.response))
        assert texts == ["Hello", "Hello, ", "Hello, world"]
        check_stream(stream.events)
        final = stream.response
        Response.model_validate(final)
        assert final["status"] == "completed" and output_text(final) == "Hello, world"
        assert final["output"][0]["summary"][0]["text"] == "Thinking"
        assert stream.violations == [] and stream.finished and stream.resumes == 0
        # Multi-turn, retrieve and the JSON mode through the same client.
        again = client.create(model="talk", input="more", previous_response_id=final["id"])
        assert again["previous_response_id"] == final["id"] and output_text(again) == "Hello, world"
        assert client.retrieve(final["id"])["output"] == final["output"]
        assert [m["id"] for m in client.models()] == ["talk", "slow"]
        with pytest.raises(ResponsesAPIError) as caught:
            client.create(model="nope", input="x")
        assert (caught.value.status, caught.value.code, caught.value.param) == (
            404,
            "model_not_found",
            "model",
        )
        with (
            pytest.raises(ResponsesAPIError) as caught,
            client.stream(model="talk", input="x", top_p=9) as bad,
        ):
            bad.until_done()
        assert caught.value.status == 400 and caught.value.param == "top_p"


def test_async_client(gw: Gateway) -> None:
    async def run() -> tuple[list[str], dict[str, Any], dict[str, Any]]:
        async with AsyncResponsesClient(gw.base_url, KEY) as client:
            kinds: list[str] = []
            async with client.stream(model="talk", input="hi") as stream:
                async for step in stream:
                    kinds.append(step.type)
            plain = await client.create(model="talk", input="hi", store=False)
            return kinds, stream.response, plain

    kinds, streamed, plain = asyncio.run(run())
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert output_text(streamed) == output_text(plain) == "Hello, world"
    assert plain["store"] is False


class CuttingProxy:
    """A TCP proxy to the gateway that drops its first connection right after forwarding ``marker``."""

    def __init__(self, port: int, marker: bytes) -> None:
        self.target = port
        self.marker = marker
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target))
            first = self.connections == 1
            threading.Thread(target=self._pump, args=(conn, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, conn, first), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, cutting: bool) -> None:
        seen = b""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                seen += data
                if cutting and self.marker in seen:
                    self.cut.set()
                    break
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def test_a_dropped_stream_resumes_with_starting_after(gw: Gateway) -> None:
    proxy = CuttingProxy(gw.port, b"response.output_text.delta")
    try:
        with ResponsesClient(f"http://127.0.0.1:{proxy.port}/v1", KEY) as client:
            # A background response keeps running when its client goes away; the stream resumes.
            stream = client.stream(model="slow", input="hi", background=True)
            response = stream.until_done()
    finally:
        proxy.close()
    assert proxy.cut.is_set() and proxy.connections == 2
    assert stream.resumes == 1 and stream.resume_error is None
    assert response["status"] == "completed"
    assert output_text(response) == "".join(f"w{i} " for i in range(12))
    # One clean stream: no event twice, numbers consecutive, the checker satisfied.
    numbers = [e["sequence_number"] for e in stream.events]
    assert numbers == list(range(len(numbers)))
    check_stream(stream.events)
    assert stream.violations == []


def test_a_dropped_stream_that_cannot_resume_reads_incomplete(gw: Gateway) -> None:
    proxy = CuttingProxy(gw.port, b"response.output_text.delta")
    try:
        with ResponsesClient(f"http://127.0.0.1:{proxy.port}/v1", KEY) as client:
            stream = client.stream(model="slow", input="hi", store=False)
            response = stream.until_done()
    finally:
        proxy.close()
    assert stream.resumes == 0 and proxy.connections == 1
    assert stream.resume_error is not None and "cannot be resumed" in stream.resume_error
    assert response["status"] == "incomplete"
    assert "lifecycle.terminal_missing" in {v.rule for v in stream.violations}


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


def test_an_older_servers_dialect_is_read_and_its_violations_reported() -> None:
    snapshot = {"id": "resp_old", "object": "response", "status": "in_progress", "model": "m", "output": []}
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup", "arguments": ""}
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
    annotation = {
        "type": "url_citation",
        "url": "https://example.com",
        "title": "ex",
        "start_index": 0,
        "end_index": 2,
    }
    interpreter = {
        "type": "code_interpreter_call",
        "id": "ci_1",
        "status": "in_progress",
        "code": "",
        "outputs": None,
    }
    body = _sse(
        {"type": "response.created", "response": snapshot},
        {"type": "response.output_item.added", "output_index": 0, "item": call},
        {
            "type": "response.function_call.arguments.delta",
            "item_id": "fc_1",
            "output_index": 0,
            "delta": '{"q":',
        },
        {
            "type": "response.function_call.arguments.delta",
            "item_id": "fc_1",
            "output_index": 0,
            "delta": '"x"}',
        },
        {
            "type": "response.function_call.arguments.done",
            "item_id": "fc_1",
            "output_index": 0,
            "arguments": '{"q":"x"}',
        },
        {"type": "response.output_item.added", "output_index": 1, "item": message},
        {
            "type": "response.text.done",
            "item_id": "msg_1",
            "output_index": 1,
            "content_index": 0,
            "text": "hi there",
        },
        {
            "type": "response.output_text_annotation.added",
            "item_id": "msg_1",
            "output_index": 1,
            "content_index": 0,
            "annotation_index": 0,
            "annotation": annotation,
        },
        # Seed 002's code interpreter events.
        {"type": "response.output_item.added", "output_index": 2, "item": interpreter},
        {"type": "response.code_interpreter.in_progress", "item_id": "ci_1", "output_index": 2},
        {
            "type": "response.code_interpreter.call.code.delta",
            "item_id": "ci_1",
            "output_index": 2,
            "delta": "print(",
        },
        {
            "type": "response.code_interpreter.call.code.delta",
            "item_id": "ci_1",
            "output_index": 2,
            "delta": "6*7)",
        },
        {
            "type": "response.code_interpreter.call.code.done",
            "item_id": "ci_1",
            "output_index": 2,
            "code": "print(6*7)",
        },
        {"type": "response.code_interpreter.call.interpreting", "item_id": "ci_1", "output_index": 2},
        {"type": "response.code_interpreter.call.completed", "item_id": "ci_1", "output_index": 2},
        {"type": "response.completed", "response": {**snapshot, "status": "completed", "output": []}},
    )
    # A line of garbage in the middle: reported, and the stream goes on.
    cut = body.index(b"event: response.output_item.added")
    body = body[:cut] + b"data: {not json\n\n" + body[cut:]
    with UpstreamMock() as upstream:
        upstream.enqueue(stream_reply(body, split=True, seed=3))
        with ResponsesClient(f"{upstream.url}/v1") as client:
            stream = client.stream(model="m", input="hi")
            steps = list(stream)
    assert [v.rule for v in stream.violations if v.rule == "sse.payload"] == ["sse.payload"]
    assert len(steps) == 16
    response = stream.response
    assert response["status"] == "completed"
    fc, msg, ci = response["output"]
    assert (ci["code"], ci["status"]) == ("print(6*7)", "completed")
    assert (fc["name"], fc["arguments"]) == ("lookup", '{"q":"x"}')
    assert msg["content"][0]["text"] == "hi there"
    assert msg["content"][0]["annotations"] == [annotation]
    # The old spellings and the missing sequence numbers are reported, not raised.
    assert stream.violations
    assert sum(len(s.violations) for s in steps) <= len(stream.violations)
    assert any("function_call.arguments" in str(v) or "unknown" in str(v) for v in stream.violations)


STREAMED = sorted(
    name
    for name in list_fixtures()
    if name.startswith("openai-responses__") and name.endswith((".sse", ".chunks.jsonl"))
)


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.mark.parametrize("name", STREAMED)
def test_every_recorded_openai_stream_reads_as_offline(upstream: UpstreamMock, name: str) -> None:
    """Streams recorded from OpenAI and other Responses servers, served over HTTP in random pieces:
    the client's events, Response and violations are what the protocol core finds offline."""
    reply = fixture_reply(name, split=True, seed=len(name), max_piece=1500, delay=0)
    body = b"".join(reply.pieces())
    upstream.reset([reply])
    decoder = EventStreamDecoder()
    offline = decoder.feed(body) + decoder.flush()
    with ResponsesClient(f"{upstream.url}/v1", "k") as client, client.stream(model="m", input="x") as stream:
        steps = list(stream)
    assert [s.event for s in steps] == stream.events == offline
    assert stream.response == accumulate(offline).response
    assert [str(v) for v in stream.violations] == [str(v) for v in check(offline, profile="openai")]


def test_an_endless_event_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "MAX_EVENT_BYTES", 4096)
    huge = _sse(
        {"type": "response.created", "response": {"id": "r", "object": "response", "pad": "x" * 10_000}}
    )
    with UpstreamMock() as upstream:
        upstream.enqueue(stream_reply(huge, split=True, seed=1, max_piece=512, delay=0))
        with ResponsesClient(f"{upstream.url}/v1") as client, pytest.raises(SSEEventTooLarge):
            client.stream(model="m", input="hi").until_done()
