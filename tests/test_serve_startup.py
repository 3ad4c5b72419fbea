"""``responses-gateway`` as a newcomer first meets it: --version, a port already taken, a model that is
not there, a request with nothing to answer."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import httpx

from responses_gateway import __version__
from serve_process import GATEWAY, serve


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
