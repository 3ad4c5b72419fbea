"""A bare TCP byte relay: the physical floor for any proxy in Python.

It accepts a connection, opens one to the upstream, and copies bytes both ways, parsing nothing, with
back-pressure (a side whose peer cannot keep up stops being read). Same runtime as the gateway (CPython,
uvloop), so the gap between the gateway and this relay is the cost of HTTP + translation, not of Python.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
from typing import cast


class _Side(asyncio.Protocol):
    """One end of a relayed pair; ``peer`` is the other end once both are connected."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop transports are not asyncio.Transport subclasses, only duck-typed ones.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)

    def eof_received(self) -> bool:
        # No half-open connections: HTTP/1.1 clients and servers do not half-close, and keeping them
        # (write_eof to the peer, then close) crashed uvloop 0.23 ("double free or corruption") after the
        # idle test's 1,000 client closes. Returning False closes this side; connection_lost closes the
        # peer.
        self.eof = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.close()
        self.transport = None

    # Back-pressure: when our outgoing buffer is full, stop reading from the peer.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Downstream(_Side):
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__()
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # Hold the client's bytes until the upstream connection exists.
        transport.pause_reading()  # type: ignore[attr-defined]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(_Side, self.upstream_host, self.upstream_port)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        if self.transport is None:  # the client left while we connected
            up.transport.close()  # type: ignore[union-attr]
            return
        up.peer = self
        self.peer = up
        assert up.transport is not None
        for data in self.pending:
            up.transport.write(data)
        self.pending.clear()
        self.transport.resume_reading()


async def serve(host: str, port: int, upstream_host: str, upstream_port: int, ready: str | None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Downstream(upstream_host, upstream_port), host, port, backlog=8192, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    if ready:
        with open(ready, "w") as f:
            f.write(str(bound))
    print(f"relay on {host}:{bound} -> {upstream_host}:{upstream_port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--upstream", required=True, help="HOST:PORT")
    p.add_argument("--ready-file")
    a = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uhost, _, uport = a.upstream.rpartition(":")
    coro = serve(a.host, a.port, uhost, int(uport), a.ready_file)
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)


if __name__ == "__main__":
    main()
