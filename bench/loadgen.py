"""Load generator: C concurrent SSE streams, every frame timestamped as it arrives.

Its own process, plain asyncio protocols on uvloop (no HTTP client library between the socket and the
clock). ``streams`` mode keeps C workers busy, each opening R streams back to back (one connection per
stream), workers' first requests spread over a short ramp so 2,000 connects do not arrive in one
backlog burst. ``idle`` mode opens K streams to the mock's ``*-idle`` model (no delta for minutes),
prints ``OPEN`` when every request is written, waits for a line on stdin, then closes them.

Per stream it records: time to first event (request start -> first frame carrying a delta), gaps
between delta frames, per-delta transit (arrival minus the mock's embedded send time), and whether the
delta indices arrived exactly 0..N-1 in order. It also measures its own event-loop lag and CPU time, so a
saturated load generator shows in its own numbers rather than being charged to a contender.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import resource
import sys
import time
from typing import Any, cast

import orjson

TOKEN = re.compile(rb"#(\d+)@(\d+);")
_MONO = time.monotonic_ns


class StreamRecord:
    __slots__ = (
        "deltas",
        "done",
        "dropped",
        "duplicated",
        "error",
        "events",
        "final_text_ok",
        "gaps",
        "last_delta",
        "last_index",
        "out_of_order",
        "seen",
        "t_end",
        "t_start",
        "terminal",
        "transit",
        "ttfe",
    )

    def __init__(self, t_start: int) -> None:
        self.t_start = t_start
        self.t_end = 0
        self.ttfe = -1
        self.last_delta = 0
        self.last_index = -1
        self.gaps: list[int] = []
        self.transit: list[int] = []
        self.seen: set[int] = set()
        self.deltas = 0
        self.events = 0
        self.out_of_order = 0
        self.duplicated = 0
        self.dropped = 0
        self.terminal = False
        self.final_text_ok: bool | None = None
        self.error: str | None = None
        self.done = False


class SSEClient(asyncio.Protocol):
    """One HTTP/1.1 request; decodes the status, headers, chunked/length/close body and SSE frames."""

    def __init__(self, request: bytes, rec: StreamRecord, fut: asyncio.Future[None], expected: int) -> None:
        self.request = request
        self.rec = rec
        self.fut = fut
        self.expected = expected
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.in_body = False
        self.status = 0
        self.chunked = False
        self.length = -1
        self.raw = bytearray()
        self.chunk_left = 0  # bytes of chunk data still to read; -1 means "expecting CRLF after data"
        self.frames = bytearray()
        self.sep = b"\n\n"
        self.body_done = False
        self.error_body = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop transports are not asyncio.Transport subclasses, only duck-typed ones.
        self.transport = cast(asyncio.Transport, transport)
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = _MONO()
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.head[:end].decode("latin-1").split("\r\n")
            data = self.head[end + 4 :]
            self.head = b""
            self.in_body = True
            try:
                self.status = int(head[0].split(" ", 2)[1])
            except (IndexError, ValueError):
                self._finish(f"bad status line {head[0]!r}")
                return
            for line in head[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "transfer-encoding" and "chunked" in value.lower():
                    self.chunked = True
                elif name == "content-length":
                    self.length = int(value.strip())
        if self.status != 200:
            self.error_body += data
            return
        if self.chunked:
            self._dechunk(data, now)
        else:
            if self.length >= 0:
                self.length -= len(data)
                if self.length <= 0:
                    self.body_done = True
            self._frames(data, now)
        if self.body_done:
            self._finish(None)

    def _dechunk(self, data: bytes, now: int) -> None:
        raw = self.raw
        raw += data
        pos = 0
        n = len(raw)
        payload: list[bytes] = []
        while pos < n:
            if self.chunk_left > 0:
                take = min(self.chunk_left, n - pos)
                payload.append(bytes(raw[pos : pos + take]))
                pos += take
                self.chunk_left -= take
                if self.chunk_left == 0:
                    self.chunk_left = -1
                continue
            if self.chunk_left == -1:
                if n - pos < 2:
                    break
                pos += 2  # the CRLF after chunk data
                self.chunk_left = 0
                continue
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(raw[pos:eol].split(b";", 1)[0], 16)
            pos = eol + 2
            if size == 0:
                self.body_done = True
                break
            self.chunk_left = size
        del raw[:pos]
        if payload:
            self._frames(b"".join(payload), now)

    def _frames(self, data: bytes, now: int) -> None:
        buf = self.frames
        buf += data
        if b"\r" in data and self.sep == b"\n\n" and b"\r\n\r\n" in buf:
            self.sep = b"\r\n\r\n"
        sep = self.sep
        start = 0
        rec = self.rec
        while True:
            end = buf.find(sep, start)
            if end < 0:
                break
            frame = bytes(buf[start:end])
            start = end + len(sep)
            if not frame or frame.startswith(b":"):
                continue  # SSE comment (keepalive)
            rec.events += 1
            if b"output_text.delta" in frame or b"chat.completion.chunk" in frame:
                tokens = TOKEN.findall(frame)
                if not tokens:
                    continue
                if rec.ttfe < 0:
                    rec.ttfe = now - rec.t_start
                else:
                    rec.gaps.append(now - rec.last_delta)
                rec.last_delta = now
                for idx_b, ts_b in tokens:
                    idx = int(idx_b)
                    rec.transit.append(now - int(ts_b))
                    rec.deltas += 1
                    if idx in rec.seen:
                        rec.duplicated += 1
                    rec.seen.add(idx)
                    if idx != rec.last_index + 1:
                        rec.out_of_order += 1
                    rec.last_index = idx
            elif b"[DONE]" in frame:
                rec.terminal = True
            elif b'"response.completed"' in frame:
                rec.terminal = True
                indices = [int(i) for i, _ in TOKEN.findall(frame)]
                rec.final_text_ok = indices == list(range(self.expected))
            elif (
                b'"response.failed"' in frame
                or b'"response.incomplete"' in frame
                or b'"type":"error"' in frame
            ):
                rec.error = "error event: " + frame[:300].decode("utf-8", "replace")
        if start:
            del buf[:start]

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.status == 200 and not self.chunked and self.length < 0:
            self.body_done = True
        if not self.fut.done():
            if self.status and self.status != 200:
                self._finish(f"HTTP {self.status}: {bytes(self.error_body[:300]).decode('utf-8', 'replace')}")
            elif self.body_done:
                self._finish(None)
            else:
                self._finish(f"connection lost mid-stream ({exc or 'EOF'})")

    def _finish(self, error: str | None) -> None:
        rec = self.rec
        if rec.done:
            return
        rec.done = True
        rec.t_end = _MONO()
        if error and not rec.error:
            rec.error = error
        rec.dropped = self.expected - len(rec.seen)
        if not rec.terminal and not rec.error:
            rec.error = "stream ended without a terminal event"
        if self.transport is not None:
            self.transport.close()
        if not self.fut.done():
            self.fut.set_result(None)


def build_request(host: str, port: int, path: str, body: dict[str, Any], api_key: str) -> bytes:
    payload = orjson.dumps(body)
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"accept: text/event-stream\r\nauthorization: Bearer {api_key}\r\n"
        f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
    ).encode() + payload


def request_body(api: str, model: str) -> dict[str, Any]:
    if api == "chat":
        return {"model": model, "messages": [{"role": "user", "content": "bench"}], "stream": True}
    return {"model": model, "input": "bench", "stream": True}


async def one_stream(host: str, port: int, request: bytes, expected: int, deadline: float) -> StreamRecord:
    loop = asyncio.get_running_loop()
    rec = StreamRecord(_MONO())
    fut: asyncio.Future[None] = loop.create_future()
    proto: SSEClient | None = None
    try:
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: SSEClient(request, rec, fut, expected), host, port),
            max(0.1, deadline - loop.time()),
        )
        await asyncio.wait_for(fut, max(0.1, deadline - loop.time()))
    except TimeoutError:
        if proto is not None:
            proto._finish("timed out")
        else:
            rec.error = "connect timed out"
    except OSError as exc:
        rec.error = f"connect failed: {exc}"
    if not rec.done:
        rec.done = True
        rec.t_end = _MONO()
        rec.dropped = expected - len(rec.seen)
    return rec


class LagProbe:
    """Event-loop lag: how late a 5 ms timer fires. A busy load generator shows up here."""

    def __init__(self) -> None:
        self.lags: list[int] = []
        self.running = True

    async def run(self) -> None:
        while self.running:
            t = _MONO()
            await asyncio.sleep(0.005)
            self.lags.append(_MONO() - t - 5_000_000)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run_streams(spec: dict[str, Any]) -> dict[str, Any]:
    host, port = spec["host"], spec["port"]
    request = build_request(
        host, port, spec["path"], request_body(spec["api"], spec["model"]), spec.get("api_key", "sk-bench")
    )
    c, per_worker, expected = spec["concurrency"], spec["streams_per_worker"], spec["deltas"]
    ramp = spec["ramp_s"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + spec["timeout_s"]
    records: list[StreamRecord] = []

    async def worker(w: int) -> None:
        await asyncio.sleep(ramp * w / c)
        for _ in range(per_worker):
            if loop.time() >= deadline:
                break
            records.append(await one_stream(host, port, request, expected, deadline))

    probe = LagProbe()
    probe_task = asyncio.create_task(probe.run())
    cpu0, t0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(c)))
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    probe.running = False
    await probe_task
    return {
        "wall_s": wall,
        "loadgen_cpu_s": cpu,
        "loop_lag_ns": probe.lags,
        "streams_planned": c * per_worker,
        "streams": [
            {
                "ok": r.error is None and r.dropped == 0 and r.out_of_order == 0 and r.duplicated == 0,
                "error": r.error,
                "ttfe_ns": r.ttfe,
                "duration_ns": r.t_end - r.t_start,
                "deltas": r.deltas,
                "events": r.events,
                "dropped": r.dropped,
                "out_of_order": r.out_of_order,
                "duplicated": r.duplicated,
                "final_text_ok": r.final_text_ok,
                "gaps_ns": r.gaps,
                "transit_ns": r.transit,
            }
            for r in records
        ],
    }


async def run_idle(spec: dict[str, Any]) -> dict[str, Any]:
    """Open K streams that stay silent, report OPEN, wait for stdin, close them all."""
    host, port, k = spec["host"], spec["port"], spec["streams"]
    request = build_request(
        host, port, spec["path"], request_body(spec["api"], spec["model"]), spec.get("api_key", "sk-bench")
    )
    loop = asyncio.get_running_loop()
    transports: list[asyncio.BaseTransport] = []
    errors = 0
    ramp = spec["ramp_s"]
    for i in range(k):
        rec = StreamRecord(_MONO())
        fut: asyncio.Future[None] = loop.create_future()
        try:
            tr, _ = await loop.create_connection(lambda r=rec, f=fut: SSEClient(request, r, f, 0), host, port)
            transports.append(tr)
        except OSError:
            errors += 1
        if ramp and i % 50 == 49:
            await asyncio.sleep(ramp * 50 / k)
    print(f"OPEN {len(transports)} {errors}", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for tr in transports:
        tr.close()
    await asyncio.sleep(0.2)
    return {"opened": len(transports), "connect_errors": errors}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="JSON run specification")
    p.add_argument("--out", required=True, help="write the JSON result here")
    a = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    spec = orjson.loads(a.spec)
    coro = run_idle(spec) if spec["mode"] == "idle" else run_streams(spec)
    try:
        import uvloop

        result = uvloop.run(coro)
    except ImportError:
        result = asyncio.run(coro)
    with open(a.out, "wb") as f:
        f.write(orjson.dumps(result))


if __name__ == "__main__":
    main()
