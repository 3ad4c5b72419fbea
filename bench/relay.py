"""A bare TCP byte relay: the physical floor for any proxy in Python.

It accepts a connection, opens one to the upstream, and copies bytes both ways, parsing nothing, with
back-pressure (a side whose peer cannot keep up stops being read). Same runtime as the gateway (CPython,
uvloop), so the gap between the gateway and this relay is the cost of HTTP + translation, not of Python.

``--translate``: the same relay, but each Chat Completions text chunk the upstream sends is parsed
(``orjson.loads``) and written to the client as a Responses ``output_text.delta`` event
(``orjson.dumps``), every other frame as it came. It is not a gateway (no response head of its own, no
created/completed events, no checks; it assumes the mock's replies): it is the floor for any proxy that
translates each event in Python on this runtime, in one callback per read, and so says how much of a
gateway's CPU per event the translation itself needs (docs/performance.md, "The floor for a translating
proxy").
"""

from __future__ import annotations

import argparse
import asyncio
import resource
from typing import cast

import orjson


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


class _Translating(_Side):
    """The upstream end of ``--translate``: Chat Completions chunks in, Responses deltas out."""

    def __init__(self) -> None:
        super().__init__()
        self.in_body = False
        self.chunked = False
        self.buf = b""
        self.seq = 0

    def data_received(self, data: bytes) -> None:
        if not self.in_body:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self._write(data)  # (the mock's head comes in one read)
                return
            self.in_body = True
            self.chunked = b"transfer-encoding: chunked" in data[:end].lower()
            self._write(data[: end + 4])
            data = data[end + 4 :]
        if not self.chunked:
            self._write(data)  # a plain answer (/health): as it came
            return
        if self.buf:
            data = self.buf + data
        out: list[bytes] = []
        pos = 0
        n = len(data)
        while pos < n:
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(data[pos:eol], 16)
            if eol + 2 + size + 2 > n:
                break
            payload = data[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
            if size == 0:
                out.append(b"0\r\n\r\n")
                self.in_body = False  # the next answer on this connection starts with its head
                continue
            if payload.startswith(b"data: {") and payload.endswith(b"\n\n"):
                chunk = orjson.loads(payload[6:-2])
                choices = chunk.get("choices")
                content = choices[0]["delta"].get("content") if choices else None
                if content:
                    event = {
                        "type": "response.output_text.delta",
                        "sequence_number": self.seq,
                        "item_id": "msg_relay",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": content,
                        "logprobs": [],
                    }
                    self.seq += 1
                    payload = b"".join((_DELTA_PREFIX, orjson.dumps(event), b"\n\n"))
            out.append(b"%x\r\n%b\r\n" % (len(payload), payload))
        self.buf = data[pos:]
        if out:
            self._write(out[0] if len(out) == 1 else b"".join(out))

    def _write(self, data: bytes) -> None:
        super().data_received(data)  # what the plain relay does with what it read


_DELTA_PREFIX = b"event: response.output_text.delta\ndata: "


class _Downstream(_Side):
    def __init__(self, upstream_host: str, upstream_port: int, translate: bool = False) -> None:
        super().__init__()
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.translate = translate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # Hold the client's bytes until the upstream connection exists.
        transport.pause_reading()  # type: ignore[attr-defined]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            side = _Translating if self.translate else _Side
            _, up = await loop.create_connection(side, self.upstream_host, self.upstream_port)
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


async def serve(
    host: str, port: int, upstream_host: str, upstream_port: int, ready: str | None, translate: bool = False
) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Downstream(upstream_host, upstream_port, translate),
        host,
        port,
        backlog=8192,
        reuse_address=True,
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
    p.add_argument(
        "--translate", action="store_true", help="Chat Completions text chunks -> Responses deltas"
    )
    a = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uhost, _, uport = a.upstream.rpartition(":")
    coro = serve(a.host, a.port, uhost, int(uport), a.ready_file, a.translate)
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)


if __name__ == "__main__":
    main()
