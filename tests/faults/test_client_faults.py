"""Hostile and broken clients: slow-loris heads, bodies that stall, floods of half-open connections,
protocol garbage, too many connections and clients that leave mid-stream. The server closes what
abuses it, answers in OpenAI's error shape, keeps serving everyone else and keeps its memory."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from soundness import assert_sound_stream, terminal_status

from conftest import Gateway, decode_sse, start_gateway
from responses_gateway.providers.scripted import ScriptedProvider
from serve_process import serve

HEAD, BODY = 0.6, 0.6
SLOW = [{"message": [f"w{i} " for i in range(25)], "delay": 0.1}]  # a 2.5 s stream


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("clients")
    gateway = start_gateway(
        [ScriptedProvider([{"message": "ok"}], name="m"), ScriptedProvider(SLOW, name="slow")],
        http={"head_timeout": HEAD, "body_timeout": BODY},
        store_url=f"sqlite:///{tmp / 'store.db'}",
        data_dir=str(tmp / "data"),
    )
    yield gateway
    gateway.stop()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def read_all(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything until the server closes (b'' if it closed without a word)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def json_error(data: bytes, status: int) -> dict[str, object]:
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status), data[:300]
    assert b"content-type: application/json" in head.lower()
    error: dict[str, object] = orjson.loads(body)["error"]
    assert error["message"] and "type" in error and "code" in error
    return error


def normal_request(gw: Gateway) -> None:
    got = httpx.post(gw.url("/v1/responses"), json={"model": "m", "input": "hi"}, timeout=10)
    assert got.status_code == 200 and got.json()["status"] == "completed", got.text


def test_slow_loris_heads_are_cut_while_others_are_served(gw: Gateway) -> None:
    request = (
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 200
    )
    socks = [connect(gw.port) for _ in range(30)]
    closed_at: list[float] = []
    started = time.monotonic()

    def dribble(sock: socket.socket) -> None:
        try:
            for byte in request:
                sock.send(bytes([byte]))
                time.sleep(0.1)
        except OSError:
            pass  # the server closed on us: what we want
        data = read_all(sock)
        closed_at.append(time.monotonic() - started)
        if data:
            assert json_error(data, 408)["code"] == "request_timeout"

    threads = [threading.Thread(target=dribble, args=(s,)) for s in socks]
    for t in threads:
        t.start()
    time.sleep(0.2)
    normal_request(gw)  # served while the dribblers hold their connections
    for t in threads:
        t.join(15)
    for s in socks:
        s.close()
    assert len(closed_at) == 30
    assert max(closed_at) < HEAD + 3, closed_at  # not the ~25 s the dribble would take


def test_silent_and_half_open_connections_are_closed(gw: Gateway) -> None:
    silent = [connect(gw.port) for _ in range(100)]
    half = [connect(gw.port) for _ in range(100)]
    for sock in half:
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n")
    normal_request(gw)
    started = time.monotonic()
    assert all(read_all(s) == b"" for s in silent)
    for sock in half:
        assert json_error(read_all(sock), 408)["code"] == "request_timeout"
    assert time.monotonic() - started < HEAD + 3
    for sock in silent + half:
        sock.close()


def test_a_stalled_body_gets_408(gw: Gateway) -> None:
    sock = connect(gw.port)
    sock.sendall(
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model": "m", '
    )
    assert json_error(read_all(sock), 408)["code"] == "request_timeout"
    sock.close()
    normal_request(gw)


def test_streams_longer_than_every_timeout_are_untouched(gw: Gateway) -> None:
    got = httpx.post(
        gw.url("/v1/responses"), json={"model": "slow", "input": "hi", "stream": True}, timeout=30
    )
    events = decode_sse(got.content)
    assert_sound_stream(events)
    assert terminal_status(events) == "completed"
    # A keep-alive connection used twice, with a pause longer than the head timeout between requests
    # (uvicorn's keep-alive idle limit is 5 s).
    with httpx.Client(timeout=10) as client:
        for _ in range(2):
            assert client.post(gw.url("/v1/responses"), json={"model": "m", "input": "x"}).status_code == 200
            time.sleep(HEAD * 1.5)


def test_a_kept_alive_connection_keeps_each_limit_after_a_slow_body() -> None:
    """The head limit of a connection's next request runs from the end of the previous response,
    even when that request's body was slow and the (longer) body limit was the last one guarded."""
    head, body = 0.6, 3.0
    gw = start_gateway(
        [ScriptedProvider([{"message": "ok"}], name="m")], http={"head_timeout": head, "body_timeout": body}
    )
    try:
        sock = connect(gw.port)
        payload = orjson.dumps({"model": "m", "input": "hi"})
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload)
        )
        # The body comes slower than the head limit but within the body limit: served.
        time.sleep(1.0)
        sock.sendall(payload)
        sock.settimeout(10)
        first = b""
        while b'"completed"' not in first:
            chunk = sock.recv(65536)
            assert chunk, first
            first += chunk
        assert first.startswith(b"HTTP/1.1 200")
        # Then a head that never completes: 408 once the head limit has passed, not the body's.
        started = time.monotonic()
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n")
        assert json_error(read_all(sock), 408)["code"] == "request_timeout"
        assert head * 0.9 <= time.monotonic() - started < head + 1.0
        sock.close()
    finally:
        gw.stop()


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length, leaving the connection open."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_request_answered_before_its_body_leaves_nothing_behind() -> None:
    """A wrong key's 401 is sent from the request's head, before its body arrives. The body that
    follows is read and dropped (the connection serves its next request), a body that stalls closes
    the connection with no 408 after the 401, and a graceful shutdown closes the connection at once:
    it used to take the body's bytes for a new request it had to wait for, and never closed."""
    gw = start_gateway(
        [ScriptedProvider([{"message": "ok"}], name="m")],
        api_keys=["sk-right"],
        http={"head_timeout": HEAD, "body_timeout": BODY},
    )
    try:
        payload = orjson.dumps({"model": "m", "input": "hi"})

        def head(key: str) -> bytes:
            return (
                b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (key.encode(), len(payload))
            )

        reused, stalled, idle = (connect(gw.port) for _ in range(3))
        for sock in (reused, stalled, idle):
            sock.sendall(head("sk-wrong"))
            assert json_error(read_response(sock), 401)["type"] == "invalid_request_error"
        reused.sendall(payload + head("sk-right") + payload)
        answer = read_response(reused)
        assert answer.startswith(b"HTTP/1.1 200") and b'"completed"' in answer, answer[:300]
        stalled.sendall(payload[:5])
        idle.sendall(payload)
        assert read_all(stalled) == b""  # closed after the body limit, nothing more said
        started = time.monotonic()
        gw.stop()
        assert not gw.thread.is_alive() and time.monotonic() - started < 3
        assert read_all(idle) == b"" and read_all(reused) == b""
        for sock in (reused, stalled, idle):
            sock.close()
    finally:
        gw.stop()


def test_a_connection_answered_before_its_body_is_idle_once_the_body_is_in() -> None:
    """uvicorn arms its idle limit when a response completes; the body arriving after it disarmed it,
    and the connection then stayed open for ever. It closes after the idle limit like any other."""
    gw = start_gateway([ScriptedProvider([{"message": "ok"}], name="m")], api_keys=["sk-right"], keep_alive=1)
    try:
        payload = orjson.dumps({"model": "m", "input": "hi"})
        sock = connect(gw.port)
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-wrong\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload)
        )
        assert json_error(read_response(sock), 401)["code"] == "invalid_api_key"
        sock.sendall(payload)
        started = time.monotonic()
        assert read_all(sock, timeout=5) == b""
        assert 0.9 <= time.monotonic() - started < 3
        sock.close()
    finally:
        gw.stop()


GARBAGE = {
    "bad content-length": b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n{}",
    "length and chunked": (
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\n"
    ),
    "control character": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Evil: a\x01b\r\n\r\n",
    "bad request line": b"GET /v1/models HTTP/9.Z\r\nHost: x\r\n\r\n",
    "bad chunk": b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


@pytest.mark.parametrize("raw", GARBAGE.values(), ids=GARBAGE.keys())
def test_protocol_garbage_gets_a_json_400(gw: Gateway, raw: bytes) -> None:
    sock = connect(gw.port)
    sock.sendall(raw)
    error = json_error(read_all(sock), 400)
    assert error["type"] == "invalid_request_error"
    sock.close()


def test_past_the_connection_limit_a_json_503_then_recovery(tmp_path: Path) -> None:
    limited = start_gateway(
        [ScriptedProvider([{"message": "ok"}], name="m")], http={"max_connections": 3, "head_timeout": 30}
    )
    try:
        idle = [connect(limited.port) for _ in range(3)]
        time.sleep(0.2)
        got = httpx.post(limited.url("/v1/responses"), json={"model": "m", "input": "hi"}, timeout=10)
        assert got.status_code == 503, got.text
        assert got.headers["retry-after"] == "1"
        assert got.json()["error"]["code"] == "server_is_overloaded"
        for sock in idle:
            sock.close()
        time.sleep(0.2)
        normal_request(limited)
    finally:
        limited.stop()


def test_a_client_leaving_mid_stream_leaves_a_terminal_stored_response(gw: Gateway) -> None:
    sock = connect(gw.port)
    body = json.dumps({"model": "slow", "input": "hi", "stream": True}).encode()
    sock.sendall(
        b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    sock.settimeout(10)
    data = b""
    while b"response.output_text.delta" not in data:
        data += sock.recv(65536)
    response_id = data.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
    sock.close()
    deadline = time.monotonic() + 10
    while True:
        status = httpx.get(gw.url(f"/v1/responses/{response_id}"), timeout=10).json()["status"]
        if status != "in_progress" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status in ("failed", "cancelled", "incomplete"), status


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_serve_under_a_half_open_flood(tmp_path: Path) -> None:
    """The real ``serve``: 500 half-open connections are all closed after --head-timeout, its memory
    stays bounded, a normal request is served meanwhile, and garbage gets the JSON 400."""
    script = tmp_path / "m.json"
    script.write_text(json.dumps({"model": "m", "turns": [{"steps": [{"message": "ok"}]}]}))
    served = serve(tmp_path, "--no-local", "--script", str(script), "--head-timeout", "1")
    try:
        before = rss_kb(served.proc.pid)
        socks = [connect(served.port) for _ in range(500)]
        for sock in socks:
            sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 4000)
        got = httpx.post(f"{served.base_url}/responses", json={"model": "m", "input": "hi"}, timeout=10)
        assert got.status_code == 200, got.text
        during = rss_kb(served.proc.pid)
        assert all(json_error(read_all(s), 408) for s in socks)
        for sock in socks:
            sock.close()
        assert during - before < 64 * 1024, (before, during)  # KB: well under 64 MB for 500 connections
        garbage = connect(served.port)
        garbage.sendall(GARBAGE["length and chunked"])
        json_error(read_all(garbage), 400)
        garbage.close()
    finally:
        served.proc.terminate()
        served.proc.wait(10)
