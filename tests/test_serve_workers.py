"""``serve --workers 2`` on the default SQLite store: stateful requests spanning two worker processes.

One gateway (``responses-gateway serve --workers 2 --worker-port-base P``) as a user starts it; worker
0 also listens on P and worker 1 on P+1, so each request here is sent to the worker chosen, and the
``x-gateway-worker`` header (the worker's pid) proves it:

- a background response produced by worker 0 is resumed on worker 1 (``starting_after``) while it
  runs; the joined stream passes the checker and equals worker 0's own replay;
- a cancel sent to worker 1 stops worker 0's run at once (not at the next heartbeat);
- a conversation whose turns alternate between the workers: each sees the other's items;
- a WebSocket session made again on the other worker continues from the first one's response;
- ``/metrics`` counts every worker's requests, and open streams, whichever worker is scraped;
- the shared port spreads connections over both workers, a killed worker is replaced, SIGHUP
  replaces both without refusing a request, SIGTERM stops everything
(``--workers 2`` with the embedded model: tests/test_serve_workers_model.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import ClientConnection, connect

from conftest import check_stream
from responses_gateway.protocol.sse import EventStreamDecoder
from serve_process import Served, serve, stop

JSON = dict[str, Any]
WORKER = "x-gateway-worker"
TERMINAL = ("response.completed", "response.incomplete", "response.failed", "response.cancelled")


def _port_pair() -> int:
    """A port P with P and P+1 both free."""
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


class Workers:
    def __init__(self, served: Served, base: int) -> None:
        self.served = served
        self.base = base

    def url(self, worker: int) -> str:
        return f"http://127.0.0.1:{self.base + worker}/v1"

    def client(self, worker: int) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url(worker), api_key="unused", max_retries=0, timeout=30)

    def pid(self, worker: int) -> str:
        return httpx.get(f"http://127.0.0.1:{self.base + worker}/health", timeout=10).headers[WORKER]


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    tmp = tmp_path_factory.mktemp("workers")
    script = tmp / "slow.yaml"
    words = ", ".join(f'"w{i} "' for i in range(30))
    script.write_text(
        "model: slow\nturns:\n"
        "  - when: {text_contains: zebra42}\n    steps: [{message: ['I saw zebra42 in the context']}]\n"
        "  - when: {text_contains: quick}\n    steps: [{message: ['remember zebra42']}]\n"
        f"  - steps:\n      - message: [{words}]\n        delay: 0.1\n"
    )
    base = _port_pair()
    served = serve(
        tmp, "--no-local", "--script", str(script), "--workers", "2", "--worker-port-base", str(base)
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # the parent answers /health once the first worker is up: wait for the second
            try:
                httpx.get(f"http://127.0.0.1:{base + 1}/health", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield Workers(served, base)
    finally:
        stop(served)


def _events(response: httpx.Response) -> list[JSON]:
    decoder = EventStreamDecoder()
    events: list[JSON] = []
    for chunk in response.iter_bytes():
        events += decoder.feed(chunk)
    return events + decoder.flush()


def test_each_worker_is_its_own_process(workers: Workers) -> None:
    first, second = workers.pid(0), workers.pid(1)
    assert first != second
    assert {first, second} <= {str(pid) for pid in _children(workers.served.proc.pid)}
    # The shared port reaches both (a fresh connection each time; the kernel picks the worker).
    seen = {httpx.get(f"{workers.served.base_url}/models", timeout=10).headers[WORKER] for _ in range(40)}
    assert seen <= {first, second} and seen


def _policies(pid: int) -> dict[int, int]:
    """Each thread of ``pid``: its scheduling policy (field 41 of ``/proc/PID/task/TID/stat``)."""
    policies: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        # Fields after the command name (which may hold spaces) start at field 3.
        policies[int(tid)] = int(stat.rsplit(")", 1)[1].split()[38])
    return policies


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH") or not Path("/proc/self/task").is_dir(), reason="Linux")
def test_each_workers_sqlite_thread_runs_as_a_batch_thread(workers: Workers) -> None:
    # The thread writing the SQLite store shares a core with the worker's event loop: woken for each
    # write, it must not take that core from the loop at once (it delayed the first events of the
    # streams starting then: docs/performance.md, "the store's added first-event latency,
    # re-measured"). A batch thread runs when the loop waits, with the same share of the core.
    for worker in (0, 1):
        pid = int(workers.pid(worker))
        # A stored response, so the worker has used its store (its SQLite thread is running).
        done = workers.client(worker).responses.create(model="slow", input="quick")
        assert done.status == "completed"
        policies = _policies(pid)
        assert policies[pid] == os.SCHED_OTHER  # the event loop's thread
        assert list(policies.values()).count(os.SCHED_BATCH) == 1, policies


def test_resume_on_another_worker_follows_the_run_live(workers: Workers) -> None:
    created = workers.client(0).responses.create(model="slow", input="tell me", background=True)
    assert created.status == "queued" or created.status == "in_progress"
    with httpx.Client(timeout=30) as http:
        # Worker 1 resumes after the first three events while worker 0 is still producing the rest.
        with http.stream(
            "GET",
            f"{workers.url(1)}/responses/{created.id}",
            params={"stream": "true", "starting_after": "2"},
        ) as resp:
            assert resp.status_code == 200 and resp.headers[WORKER] == workers.pid(1)
            started = time.monotonic()
            resumed = _events(resp)
            took = time.monotonic() - started
        whole = http.get(f"{workers.url(0)}/responses/{created.id}", params={"stream": "true"})
    assert whole.headers[WORKER] == workers.pid(0)
    replay = EventStreamDecoder().feed(whole.content)
    # It was live: the 30 deltas are 0.1 s apart, so following them took most of 3 s.
    assert took > 1.5
    assert [e["sequence_number"] for e in resumed] == list(range(3, len(replay)))
    assert replay[3:] == resumed
    assert resumed[-1]["type"] == "response.completed"
    check_stream(replay)
    text = "".join(e["delta"] for e in resumed if e["type"] == "response.output_text.delta")
    assert text == "".join(f"w{i} " for i in range(30))
    # The stored response reads the same on both workers.
    one, two = (workers.client(w).responses.retrieve(created.id) for w in (0, 1))
    assert one.status == two.status == "completed" and one.output_text == two.output_text == text


def test_cancel_on_another_worker_stops_the_run(workers: Workers) -> None:
    created = workers.client(0).responses.create(model="slow", input="tell me", background=True)
    time.sleep(0.5)  # running on worker 0
    started = time.monotonic()
    with httpx.Client(timeout=30) as http:
        cancelled = http.post(f"{workers.url(1)}/responses/{created.id}/cancel")
    took = time.monotonic() - started
    assert cancelled.status_code == 200 and cancelled.headers[WORKER] == workers.pid(1)
    assert cancelled.json()["status"] == "cancelled"
    # At once, through the sibling channel, not at worker 0's next heartbeat (5 s).
    assert took < 2, took
    with httpx.Client(timeout=30) as http:
        replay = EventStreamDecoder().feed(
            http.get(f"{workers.url(0)}/responses/{created.id}", params={"stream": "true"}).content
        )
    # The stream ends as any stopped run's does (the gateway's convention: see streaming.STOPS).
    assert replay[-1]["type"] in TERMINAL
    deltas = [e for e in replay if e["type"] == "response.output_text.delta"]
    assert 0 < len(deltas) < 30
    check_stream(replay)
    assert workers.client(0).responses.retrieve(created.id).status == "cancelled"


def test_conversation_across_workers(workers: Workers) -> None:
    conversation = workers.client(1).conversations.create(items=[{"role": "user", "content": "quick one"}])
    first = workers.client(0).responses.create(model="slow", input="hello", conversation=conversation.id)
    assert first.output_text == "remember zebra42"
    # Worker 1 gives the model the conversation, worker 0's turn included.
    second = workers.client(1).responses.create(model="slow", input="and now?", conversation=conversation.id)
    assert second.output_text == "I saw zebra42 in the context"
    items = workers.client(0).conversations.items.list(conversation.id, order="asc").data
    texts = [item.content[0].text for item in items if item.type == "message"]  # type: ignore[union-attr]
    assert texts == [
        "quick one",
        "hello",
        "remember zebra42",
        "and now?",
        "I saw zebra42 in the context",
    ]


def _ws_turn(ws: ClientConnection, **body: Any) -> JSON:
    """One ``response.create`` on a WebSocket connection: its final Response (the stream checked)."""
    ws.send(json.dumps({"type": "response.create", **body}))
    events: list[JSON] = []
    while not events or events[-1]["type"] not in TERMINAL:
        events.append(json.loads(ws.recv(timeout=15)))
        assert events[-1]["type"] != "error", events[-1]
    check_stream(events)
    return dict(events[-1]["response"])


def test_websocket_continuation_across_workers(workers: Workers) -> None:
    """Codex's transport: a session whose connection is made again lands on another worker and
    continues from the response the first worker stored; within one connection ``store: false``
    continues from the connection's own responses, as with one process."""
    url = "ws://127.0.0.1:{}/v1/responses"
    with connect(url.format(workers.base)) as ws:
        assert ws.response is not None and ws.response.headers[WORKER] == workers.pid(0)
        first = _ws_turn(ws, model="slow", input="a quick one")
    assert first["output"][0]["content"][0]["text"] == "remember zebra42"
    with connect(url.format(workers.base + 1)) as ws:
        assert ws.response is not None and ws.response.headers[WORKER] == workers.pid(1)
        second = _ws_turn(ws, model="slow", input="and now?", previous_response_id=first["id"])
        assert second["output"][0]["content"][0]["text"] == "I saw zebra42 in the context"
        # Not stored: only this connection can continue from it.
        third = _ws_turn(ws, model="slow", store=False, input="once more", previous_response_id=second["id"])
        assert third["output"][0]["content"][0]["text"] == "I saw zebra42 in the context"
    # Worker 0 reads what worker 1 stored; the unstored response is nowhere.
    assert workers.client(0).responses.retrieve(second["id"]).previous_response_id == first["id"]
    with pytest.raises(openai.NotFoundError):
        workers.client(0).responses.retrieve(third["id"])


def _scrape(workers: Workers, worker: int) -> dict[str, float]:
    """``/metrics`` of one worker: each sample's value by name and labels (``name{a="b",...}``)."""
    resp = httpx.get(f"http://127.0.0.1:{workers.base + worker}/metrics", timeout=10)
    assert resp.status_code == 200 and resp.headers[WORKER] == workers.pid(worker)
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = sample.value
    return values


def _total(values: dict[str, float], prefix: str, label: str = "") -> float:
    """The sum of the samples named ``prefix...`` (with the label ``label``, e.g. ``mode="json"``)."""
    return sum(v for k, v in values.items() if k.startswith(prefix) and label in k)


def _until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_metrics_count_every_workers_requests(workers: Workers) -> None:
    # The JSON-mode responses (earlier tests' background runs may still be ending meanwhile).
    done, json_mode = "responses_gateway_responses_total{", 'mode="json"'
    before: list[float] = []

    def same() -> bool:  # whichever worker is scraped, once both published what earlier tests did
        before[:] = [_total(_scrape(workers, w), done, json_mode) for w in (0, 1)]
        return before[0] == before[1]

    # (Two figures can agree while each still lacks the other's latest response: wait for both to
    # have published, at most SHARE_INTERVAL after the earlier tests' last response.)
    time.sleep(2.5)
    _until(same, "both workers give the same count")
    for worker, n in ((0, 3), (1, 2)):
        for _ in range(n):
            assert workers.client(worker).responses.create(model="slow", input="quick").output_text
    # Each worker adds the other's published figures (written within SHARE_INTERVAL).
    for w in (0, 1):
        _until(
            lambda w=w: _total(_scrape(workers, w), done, json_mode) == before[w] + 5,
            f"worker {w} counts the 5 responses of both workers",
        )
    one, two = _scrape(workers, 0), _scrape(workers, 1)
    histogram = "responses_gateway_response_duration_seconds_count{"
    assert _total(one, histogram) == _total(two, histogram) >= 5
    # A stream open on worker 1 is an active response on worker 0's /metrics too, until it ends.
    active = 'responses_gateway_active_responses{mode="stream"}'
    stream = workers.client(1).responses.create(model="slow", input="tell me", stream=True)
    first = next(iter(stream))
    assert first.type == "response.created"
    _until(lambda: _scrape(workers, 0).get(active) == 1, "worker 0 sees worker 1's open stream")
    assert [e.type for e in stream][-1] == "response.completed"
    _until(lambda: _scrape(workers, 0).get(active) == 0, "the stream's end reaches worker 0's gauge")


def _children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True, text=True, check=False
    )
    return [int(line) for line in out.stdout.split()]


def test_supervision_restart_reload_and_stop(tmp_path: Path) -> None:
    script = tmp_path / "quick.yaml"
    script.write_text("model: quick\nsteps: [{message: [ok]}]\n")
    # The socket directory a SIGKILLed gateway left behind (its pid no longer runs) is cleaned up.
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = Path(tempfile.gettempdir()) / f"rg-workers-{gone.pid}-test"
    stale.mkdir()
    (stale / "123.sock").touch()
    served = serve(tmp_path, "--no-local", "--script", str(script), "--workers", "2")
    try:
        assert not stale.exists()
        url = f"{served.base_url}/responses"
        deadline = time.monotonic() + 20
        while len(before := _children(served.proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(before) == 2, (before, served.proc.poll(), served.log.read_text(errors="replace"))
        # A worker that dies is replaced.
        os.kill(before[0], signal.SIGKILL)
        while (
            len(after := _children(served.proc.pid)) < 2 or before[0] in after
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(after) == 2 and before[0] not in after and before[1] in after, (
            before,
            after,
            served.proc.poll(),
            served.log.read_text(errors="replace"),
        )
        # SIGHUP: both replaced one by one; requests keep being answered meanwhile.
        served.proc.send_signal(signal.SIGHUP)
        answered = 0
        deadline = time.monotonic() + 20
        while set(_children(served.proc.pid)) & set(after) and time.monotonic() < deadline:
            got = httpx.post(url, json={"model": "quick", "input": "hi"}, timeout=10)
            assert got.status_code == 200, got.text
            answered += 1
        assert not set(_children(served.proc.pid)) & set(after) and answered
        client = openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=30)
        assert client.responses.create(model="quick", input="hi").output_text == "ok"
        final = _children(served.proc.pid)
    finally:
        stop(served)
    assert served.proc.returncode == 0
    time.sleep(0.5)
    for pid in final:  # no worker outlives the parent
        assert not Path(f"/proc/{pid}").exists()


def test_workers_that_cannot_start_stop_the_gateway(tmp_path: Path) -> None:
    """Every worker fails its start-up (the store cannot be created): the parent gives up after three
    in a row, exits non-zero and leaves no worker behind, instead of restarting them for ever."""
    gateway = Path(sys.executable).parent / "responses-gateway"
    script = tmp_path / "quick.yaml"
    script.write_text("model: quick\nsteps: [{message: [ok]}]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RG_")}
    args = ["serve", "--no-local", "--script", str(script), "--workers", "2", "--port", str(_port_pair())]
    args += ["--data-dir", str(tmp_path), "--store", "sqlite:///proc/no-such-place/gateway.db"]
    done = subprocess.run([str(gateway), *args], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "workers keep failing at start-up" in done.stderr
