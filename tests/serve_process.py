"""``responses-gateway serve`` as a separate process, as a user starts it, for the real-client tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

GATEWAY = Path(sys.executable).parent / "responses-gateway"


def shared_model_path() -> Path:
    """The bundled GGUF, assembled once in the default data directory."""
    from responses_gateway.providers.local import ensure_default_model

    return ensure_default_model()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=10)


def serve(tmp: Path, *args: str) -> Served:
    """``responses-gateway serve`` on a free port with its own SQLite store and seal key in ``tmp``."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RG_")}
    if "--no-local" not in args and "--model-path" not in args:
        # The embedded model's file lives in the data directory (here ``tmp``): share the one in the
        # default data directory instead of assembling 240 MB per test.
        args = ("--model-path", str(shared_model_path()), *args)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(GATEWAY),
                "serve",
                "--port",
                str(port),
                "--store",
                f"sqlite:///{tmp / 'gateway.db'}",
                "--data-dir",
                str(tmp),
                "--log-level",
                "warning",
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    served = Served(proc, port, log)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        try:
            if served.get("/health").status_code == 200:
                return served
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"serve did not come up:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)


def stop(served: Served) -> None:
    """Stop the process; fail if it logged an exception that escaped the application (as conftest's
    guard does for the in-process gateways)."""
    served.proc.terminate()
    try:
        served.proc.wait(10)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        served.proc.wait(5)
    log = served.log.read_text(errors="replace")
    if "Exception in ASGI application" in log:
        raise AssertionError(f"serve logged an exception that escaped the application:\n{log[-4000:]}")


@contextmanager
def serving(tmp: Path, *args: str) -> Iterator[Served]:
    """:func:`serve`, stopped when the block ends."""
    served = serve(tmp, *args)
    try:
        yield served
    finally:
        stop(served)
