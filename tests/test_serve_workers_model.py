"""``serve --workers 2`` with the embedded model: one model process that both workers use.

One gateway as a user starts it (``serve --workers 2 --worker-port-base P``, the embedded
gemma-3-270m); each request is sent to the worker chosen and ``x-gateway-worker`` proves which one
answered:

- the model is loaded once: exactly one process of the gateway maps the GGUF file, and it is neither
  worker; both workers list the model (with its context length) in ``/v1/models``;
- a request to each worker is answered by that model (streams pass the checker, items validate
  against the openai SDK), two concurrent ones, one per worker, are both answered (queued in the
  model process), and a response stored by worker 0 is continued (``previous_response_id``) and
  retrieved on worker 1, over HTTP and in WebSocket mode: the workers store, the model process does not;
- what the embedded model cannot do is refused by the worker with the single-process gateway's 400,
  the model process's own 400 (past its context) reaches the client unchanged, a hosted tool is the
  worker's to run; ``/responses/input_tokens`` is counted by the model;
- the model process killed mid-stream: that stream fails saying so, the supervisor replaces the
  process and the next request is answered;
- a models file's ``provider: local`` model (another name, a queue of one): six requests at once over
  both workers share the model process's queue (the rest get its 429); SIGHUP replaces the workers
  and keeps the model process; SIGTERM stops every process.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.sync.client import connect

from conftest import check_stream
from responses_gateway.protocol.sse import EventStreamDecoder
from serve_process import Served, serve, shared_model_path, stop

pytestmark = pytest.mark.model

JSON = dict[str, Any]
WORKER = "x-gateway-worker"
MODEL = "gemma-3-270m"
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def _port_pair() -> int:
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = int(sock.getsockname()[1])
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", base + 1))
        except OSError:
            continue
        return base
    raise AssertionError("no two consecutive free ports")


def _children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True, text=True, check=False
    )
    return [int(line) for line in out.stdout.split()]


def _maps(pid: int, path: Path | str) -> bool:
    try:
        return str(path) in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


class Gateway:
    def __init__(self, served: Served, base: int) -> None:
        self.served = served
        self.base = base

    def url(self, worker: int) -> str:
        return f"http://127.0.0.1:{self.base + worker}/v1"

    def pid(self, worker: int) -> int:
        return int(httpx.get(f"http://127.0.0.1:{self.base + worker}/health", timeout=10).headers[WORKER])

    def model_process(self) -> int:
        workers = {self.pid(0), self.pid(1)}
        others = [p for p in _children(self.served.proc.pid) if p not in workers]
        assert len(others) == 1, others
        return others[0]

    def count(self, worker: int, text: str, model: str = MODEL) -> int:
        """``POST /v1/responses/input_tokens`` on one worker."""
        body = {"model": model, "input": text}
        reply = httpx.post(f"{self.url(worker)}/responses/input_tokens", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        return int(reply.json()["input_tokens"])

    def stream(self, worker: int, body: JSON) -> tuple[httpx.Response, list[JSON]]:
        decoder = EventStreamDecoder()
        events: list[JSON] = []
        with (
            httpx.Client(timeout=120) as http,
            http.stream("POST", f"{self.url(worker)}/responses", json={**body, "stream": True}) as resp,
        ):
            for chunk in resp.iter_bytes():
                events += decoder.feed(chunk)
        return resp, events + decoder.flush()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("workers-model")
    base = _port_pair()
    served = serve(tmp, "--workers", "2", "--worker-port-base", str(base))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{base + 1}/health", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield Gateway(served, base)
    finally:
        stop(served)


def _completed(events: list[JSON]) -> JSON:
    check_stream(events)
    # A few tokens: the answer may stop at max_output_tokens (incomplete), but it is the model's.
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
    response: JSON = events[-1]["response"]
    openai.types.responses.Response.model_validate(response)
    text = "".join(
        part["text"] for item in response["output"] for part in item.get("content", []) if "text" in part
    )
    assert text.strip()
    return response


def test_one_model_process_serves_both_workers(gateway: Gateway) -> None:
    first, second = gateway.pid(0), gateway.pid(1)
    assert first != second
    for worker in (0, 1):
        listed = httpx.get(f"{gateway.url(worker)}/models", timeout=10).json()["data"]
        assert next(m for m in listed if m["id"] == MODEL)["context_length"] > 0

    body = {"model": MODEL, "input": "Say hello.", "max_output_tokens": 8}
    results: dict[int, tuple[httpx.Response, list[JSON]]] = {}

    def run(worker: int) -> None:
        results[worker] = gateway.stream(worker, body)

    # One request per worker at the same time: the model process queues them; both are answered.
    threads = [threading.Thread(target=run, args=(w,)) for w in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    for worker, pid in ((0, first), (1, second)):
        resp, events = results[worker]
        assert resp.status_code == 200 and int(resp.headers[WORKER]) == pid
        _completed(events)

    # Loaded once: one process of the gateway maps the GGUF, and it is the model process.
    gguf = shared_model_path().resolve()
    mapping = [p for p in _children(gateway.served.proc.pid) if _maps(p, gguf)]
    assert mapping == [gateway.model_process()]
    assert not _maps(gateway.served.proc.pid, gguf)
    for pid in (first, second):  # the workers did not even load llama.cpp
        assert not _maps(pid, "libllama")

    # Stored by worker 0 (its store), continued and retrieved on worker 1.
    zero = openai.OpenAI(base_url=gateway.url(0), api_key="unused", max_retries=0, timeout=120)
    one = openai.OpenAI(base_url=gateway.url(1), api_key="unused", max_retries=0, timeout=120)
    stored = zero.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=8)
    assert stored.status in ("completed", "incomplete")
    assert one.responses.retrieve(stored.id).output == stored.output
    follow = one.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=stored.id, max_output_tokens=8
    )
    assert follow.previous_response_id == stored.id
    # The model saw worker 0's stored turn: more input tokens than the new message alone.
    alone = gateway.count(1, "What is my name?")
    assert follow.usage is not None and follow.usage.input_tokens > alone
    # WebSocket mode on a worker, over the model process: continued from worker 0's stored response.
    with connect(f"ws://127.0.0.1:{gateway.base + 1}/v1/responses") as ws:
        assert ws.response is not None and int(ws.response.headers[WORKER]) == second
        create = {"type": "response.create", **body, "store": False, "previous_response_id": stored.id}
        ws.send(json.dumps(create))
        turn: list[JSON] = []
        while not turn or turn[-1]["type"] not in TERMINAL:
            turn.append(json.loads(ws.recv(timeout=120)))
            assert turn[-1]["type"] != "error", turn[-1]
    assert _completed(turn)["usage"]["input_tokens"] > gateway.count(1, "Say hello.")

    # What the embedded model cannot read is refused as by one process: 400, same code and param.
    with pytest.raises(openai.BadRequestError) as refused:
        one.responses.create(
            model=MODEL,
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}],
                }
            ],
        )
    assert refused.value.status_code == 400 and refused.value.param
    # Refused by the model itself (past its context), in the model process: the client gets its 400.
    with pytest.raises(openai.BadRequestError) as too_long:
        one.responses.create(model=MODEL, input="word " * 40000, max_output_tokens=4)
    error = too_long.value.body
    assert isinstance(error, dict) and error["code"] == "context_length_exceeded"
    assert error["param"] == "input"
    assert str(error["message"]).startswith("This model's maximum context length is")
    # A hosted tool is the worker's to run: offered to the model as a function, not refused as a tool
    # type the model process does not know.
    hosted = one.responses.create(
        model=MODEL,
        input="Say hi.",
        tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],
        max_output_tokens=8,
    )
    assert hosted.status in ("completed", "incomplete")
    # Counted by the model's tokenizer in the model process, through either worker.
    counts = [gateway.count(w, "Say hello.") for w in (0, 1)]
    assert counts[0] == counts[1] > 0

    # The model process killed mid-answer: that response fails saying so (a valid stream), the
    # supervisor replaces the process and the next request is answered.
    old = gateway.model_process()
    long = {"model": MODEL, "input": "Write a long story.", "max_output_tokens": 400, "stream": True}
    decoder = EventStreamDecoder()
    events: list[JSON] = []
    with (
        httpx.Client(timeout=120) as http,
        http.stream("POST", f"{gateway.url(0)}/responses", json=long) as resp,
    ):
        for chunk in resp.iter_bytes():
            events += decoder.feed(chunk)
            if old and any(e["type"] == "response.output_text.delta" for e in events):
                os.kill(old, signal.SIGKILL)
                killed, old = old, 0
    events += decoder.flush()
    old = killed
    check_stream(events)
    assert events[-1]["type"] == "response.failed"
    assert "embedded model's process stopped" in events[-1]["response"]["error"]["message"]
    deadline = time.monotonic() + 60
    while True:
        try:
            new = gateway.model_process()
            if new != old:
                break
        except AssertionError:
            pass
        assert time.monotonic() < deadline, "the model process was not replaced"
        time.sleep(0.1)
    resp, events = gateway.stream(1, {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4})
    assert resp.status_code == 200
    check_stream(events)
    assert events[-1]["type"] == "response.completed" or events[-1]["type"] == "response.incomplete"


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A models file's ``provider: local`` model under another name, with a queue of one."""
    tmp = tmp_path_factory.mktemp("workers-config")
    config = tmp / "models.yaml"
    config.write_text(
        "local: false\nmodels:\n"
        f"  - name: tiny\n    provider: local\n    model_path: {shared_model_path()}\n"
        "    retries: 0\n    options: {max_queue: 1}\n"
    )
    base = _port_pair()
    served = serve(
        tmp, "--no-local", "--config", str(config), "--workers", "2", "--worker-port-base", str(base)
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{base + 1}/health", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield Gateway(served, base)
    finally:
        stop(served)


def test_a_models_file_model_shared_queued_reloaded_and_stopped(configured: Gateway) -> None:
    for worker in (0, 1):
        listed = [m["id"] for m in httpx.get(f"{configured.url(worker)}/models", timeout=10).json()["data"]]
        assert listed == ["tiny"]
    body = {"model": "tiny", "input": "Write a long story about a cat.", "max_output_tokens": 48}
    replies: list[httpx.Response] = []

    def run(worker: int) -> None:
        replies.append(httpx.post(f"{configured.url(worker)}/responses", json=body, timeout=120))

    # Six at once, three per worker, against one generation and one waiting place: the model
    # process's queue counts them all, whichever worker sent them; the rest get its 429.
    threads = [threading.Thread(target=run, args=(i % 2,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    statuses = sorted(r.status_code for r in replies)
    assert len(statuses) == 6 and 200 in statuses and 429 in statuses, statuses
    assert set(statuses) == {200, 429}
    for reply in replies:
        if reply.status_code == 429:
            error = reply.json()["error"]
            assert error["code"] == "rate_limit_exceeded"
            assert error["message"].startswith("The local model is busy: 1 requests are already waiting")
        else:
            assert reply.json()["status"] in ("completed", "incomplete")

    # SIGHUP replaces the workers and keeps the model process; SIGTERM stops every process.
    model = configured.model_process()
    before = {configured.pid(0), configured.pid(1)}
    configured.served.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 60
    while True:
        try:
            now = {configured.pid(0), configured.pid(1)}
        except httpx.HTTPError:
            now = before
        if not now & before:
            break
        assert time.monotonic() < deadline, "SIGHUP did not replace the workers"
        time.sleep(0.1)
    # The old workers leave; the model process stays the same one.
    while set(_children(configured.served.proc.pid)) != {*now, model}:
        assert time.monotonic() < deadline, _children(configured.served.proc.pid)
        time.sleep(0.1)
    assert configured.count(0, "Hi.", "tiny") == configured.count(1, "Hi.", "tiny") > 0
    everyone = [*now, model]
    stop(configured.served)
    assert configured.served.proc.returncode == 0
    time.sleep(0.5)
    for pid in everyone:
        assert not Path(f"/proc/{pid}").exists()
