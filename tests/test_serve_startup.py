"""``responses-gateway`` as a newcomer first meets it: --version, a port already taken, a model that is
not there, a request with nothing to answer."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

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
