"""``responses-gateway`` as a newcomer first meets it: --version, a port already taken, a model that is
not there, a request with nothing to answer."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from responses_gateway import __version__
from serve_process import GATEWAY, Served, free_port, serve, stop


def test_version() -> None:
    done = subprocess.run([str(GATEWAY), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.strip() == f"responses-gateway {__version__}"


def test_a_port_in_use_fails_first_and_clearly(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(GATEWAY), "serve", "--no-local", "--port", str(port), "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    output = done.stdout + done.stderr
    assert f"127.0.0.1:{port} is already in use" in output
    assert "serving" not in output and "Traceback" not in output
    assert len(output.strip().splitlines()) == 1, output


def test_unknown_model_and_empty_request_through_serve(tmp_path: Path) -> None:
    script = tmp_path / "m.json"
    script.write_text('{"model": "m", "turns": [{"steps": [{"message": "ok"}]}]}')
    served = serve(tmp_path, "--no-local", "--script", str(script))
    try:
        url = f"{served.base_url}/responses"
        got = httpx.post(url, json={"model": "nope", "input": "hi"}, timeout=10)
        assert got.status_code == 404
        assert got.json()["error"]["message"] == "The model 'nope' does not exist. This gateway serves: m."
        empty = httpx.post(url, json={"model": "m", "input": []}, timeout=10)
        assert empty.status_code == 400 and empty.json()["error"]["param"] == "input"
        first = httpx.post(url, json={"model": "m", "input": "hi"}, timeout=10).json()
        follow = httpx.post(url, json={"model": "m", "previous_response_id": first["id"]}, timeout=10)
        assert follow.status_code == 200, follow.text  # continuing needs no new input
    finally:
        served.proc.terminate()
        served.proc.wait(10)


BLOCK_LLAMA = """
import sys


class _NoLlama:
    '''An installation without the local extra: llama_cpp cannot be found.'''

    def find_spec(self, name, path=None, target=None):
        if name == "llama_cpp" or name.startswith("llama_cpp."):
            raise ModuleNotFoundError(name)
        return None


sys.meta_path.insert(0, _NoLlama())
"""


def test_without_the_local_extra_the_embedded_model_is_left_out_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_LLAMA)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    script = tmp_path / "m.json"
    script.write_text('{"model": "m", "turns": [{"steps": [{"message": "ok"}]}]}')
    served = serve(tmp_path, "--script", str(script), "--log-level", "warning")
    try:
        models = [m["id"] for m in served.get("/v1/models").json()["data"]]
        assert models == ["m"]
        body = {"model": "gemma-3-270m", "input": "hi"}
        got = httpx.post(f"{served.base_url}/responses", json=body, timeout=10)
        assert got.status_code == 404
        message = got.json()["error"]["message"]
        assert "not available in this installation" in message and "llama-cpp-python" in message
    finally:
        served.proc.terminate()
        served.proc.wait(10)
    log = served.log.read_text()
    assert "the embedded model gemma-3-270m is unavailable: llama-cpp-python is not installed" in log
    assert "Traceback" not in log


def _serve_with_env(tmp: Path, env: dict[str, str], *args: str) -> Served:
    """``serve`` with exactly ``env`` (no --data-dir or --store from the helper)."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(GATEWAY), "serve", "--port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    served = Served(proc, port, log)
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            raise AssertionError(log.read_text(errors="replace"))
        try:
            if served.get("/health").status_code == 200:
                return served
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.1)


@pytest.mark.model
@pytest.mark.parametrize("how", ["--data-dir", "RG_DATA_DIR"])
def test_the_data_dir_moves_the_store_the_key_and_the_model(tmp_path: Path, how: str) -> None:
    data = tmp_path / "data"
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RG_", "XDG_"))}
    env["HOME"] = str(home)
    args = ["--preload"]
    if how == "--data-dir":
        args += ["--data-dir", str(data)]
    else:
        env["RG_DATA_DIR"] = str(data)
    served = _serve_with_env(tmp_path, env, *args)
    try:
        got = httpx.post(
            f"{served.base_url}/responses",
            json={"model": "gemma-3-270m", "input": "hi", "max_output_tokens": 2},
            timeout=60,
        )
        assert got.status_code == 200, got.text
    finally:
        served.proc.terminate()
        served.proc.wait(10)
    # One log format for every line: the gateway's, uvicorn's and llama.cpp's (no raw stderr lines).
    lines = [line for line in served.log.read_text().splitlines() if line.strip()]
    odd = [
        line for line in lines if not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ", line)
    ]
    assert not odd, odd
    assert any("responses_gateway.requests" in line for line in lines)
    assert (data / "gateway.db").is_file()
    assert (data / "seal.key").is_file()
    assert [p.suffix for p in (data / "models").glob("gemma*.gguf")] == [".gguf"]
    assert not home.exists() or not any(home.rglob("*")), sorted(home.rglob("*"))


def test_one_log_line_per_response_without_content(tmp_path: Path) -> None:
    script = tmp_path / "m.json"
    script.write_text('{"model": "m", "turns": [{"steps": [{"message": "the-answer-text"}]}]}')
    served = serve(tmp_path, "--no-local", "--script", str(script), "--log-level", "info")
    try:
        url = f"{served.base_url}/responses"
        ok = httpx.post(url, json={"model": "m", "input": "the-question-text", "stream": True}, timeout=10)
        assert ok.status_code == 200
        missing = httpx.post(url, json={"model": "nope\nforged", "input": "x"}, timeout=10)
        assert missing.status_code == 404
    finally:
        served.proc.terminate()
        served.proc.wait(10)
    log = served.log.read_text()
    lines = [line for line in log.splitlines() if "responses_gateway.requests" in line]
    assert len(lines) == 2, log
    first, second = lines
    assert " model=m " in first and " http=200 " in first and " status=completed " in first
    assert " stream=true " in first and " input_tokens=" in first and " output_tokens=" in first
    assert " ttft_ms=" in first and " duration_ms=" in first and " id=resp_" in first
    assert " model=nope?forged " in second and " http=404 " in second
    assert "the-question-text" not in log and "the-answer-text" not in log


def _read_to_close(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_request_sent_as_shutdown_begins_is_answered(tmp_path: Path) -> None:
    """A connection accepted just before SIGTERM (or a worker's rolling restart) whose request arrives
    after it is answered, with ``Connection: close``, instead of being closed unanswered ("Server
    disconnected without sending a response"); an idle kept-alive connection is closed at once."""
    import signal

    script = tmp_path / "quick.yaml"
    script.write_text("model: quick\nsteps: [{message: [ok]}]\n")
    served = serve(tmp_path, "--no-local", "--script", str(script), "--workers", "1")
    try:
        idle = socket.create_connection(("127.0.0.1", served.port))
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
        idle.settimeout(10)
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += idle.recv(65536)
        head, _, got = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), reply
        length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(got) < length:
            got += idle.recv(65536)
        fresh = socket.create_connection(("127.0.0.1", served.port))
        # Accepted by the gateway (connections are accepted in order: one made after it is answered),
        # nothing sent on it yet.
        assert served.get("/health").status_code == 200
        served.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the graceful shutdown has begun: the listener is closed
            try:
                socket.create_connection(("127.0.0.1", served.port), timeout=1).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the gateway still listens 10 s after SIGTERM")
        body = b'{"model": "quick", "input": "hi"}'
        head = b"POST /v1/responses HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
        fresh.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        answer = _read_to_close(fresh)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:500]
        assert b"\r\nconnection: close\r\n" in answer.lower()
        assert b'"text":"ok"' in answer.replace(b" ", b"")
        assert _read_to_close(idle) == b""  # closed by the shutdown, no request on it
        served.proc.wait(10)
    finally:
        stop(served)
