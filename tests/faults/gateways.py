"""Fixtures the fault cases share (import them into a module to use them): one mock upstream per module,
and gateways on a SQLite store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import Gateway, start_gateway
from responses_gateway.providers.base import Provider
from upstream_mock import UpstreamMock


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[Callable[[Provider], Gateway]]:
    """``stored(provider)``: a gateway serving ``provider`` on this test's SQLite store."""
    started: list[Gateway] = []

    def factory(provider: Provider) -> Gateway:
        gw = start_gateway(
            [provider],
            store_url=f"sqlite:///{tmp_path / 'store.db'}",
            data_dir=str(tmp_path / "data"),
            keepalive_interval=0.2,
        )
        started.append(gw)
        return gw

    yield factory
    for gw in started:
        gw.stop()
