"""Where the store tests find PostgreSQL and Redis: the environment, else scripts/test-services.sh.

Nothing is skipped silently: only when the script itself says it cannot install a server (exit 3)
are those tests skipped, with its reason in the skip message. Any other failure fails the tests.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "test-services.sh"
T = TypeVar("T")


@functools.cache
def service_urls() -> dict[str, str]:
    """``RG_TEST_POSTGRES_URL`` and ``RG_TEST_REDIS_URL``, starting the servers if needed."""
    urls = {k: os.environ[k] for k in ("RG_TEST_POSTGRES_URL", "RG_TEST_REDIS_URL") if os.environ.get(k)}
    if len(urls) == 2:
        return urls
    done = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600
    )
    if done.returncode == 3:
        return {"error": done.stderr.strip().splitlines()[-1]}
    if done.returncode != 0:
        raise RuntimeError(f"scripts/test-services.sh failed ({done.returncode}):\n{done.stderr}")
    for line in done.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export ") :].split("=", 1)
            urls.setdefault(key, value)
    return urls


def require(name: str) -> str:
    """The URL for ``postgres`` or ``redis``, or a loud skip naming why the server cannot run here."""
    urls = service_urls()
    key = {"postgres": "RG_TEST_POSTGRES_URL", "redis": "RG_TEST_REDIS_URL"}[name]
    if key not in urls:
        pytest.skip(f"SKIPPED LOUDLY: {name} unavailable: {urls.get('error', 'no URL reported')}")
    return urls[key]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def fresh_pg_database(name: str) -> str:
    """The URL of database ``name`` on the test PostgreSQL server, dropped and created anew."""
    import asyncpg

    base = require("postgres")

    async def create() -> None:
        conn = await asyncpg.connect(base)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()

    run(create())
    return base.rsplit("/", 1)[0] + "/" + name


def test_services_script_is_idempotent() -> None:
    """A second run finds both servers up and reports the same URLs."""
    if os.environ.get("RG_TEST_POSTGRES_URL"):
        pytest.skip("URLs given by the environment; the script is not used")
    first = service_urls()
    if "error" in first:
        pytest.skip(f"SKIPPED LOUDLY: services unavailable: {first['error']}")
    again = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert again.returncode == 0, again.stderr
    assert f"export RG_TEST_POSTGRES_URL={first['RG_TEST_POSTGRES_URL']}" in again.stdout
    assert "starting" not in again.stderr
