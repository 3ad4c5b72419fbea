"""A loopback model upstream that streams like a real one, for the gateway overhead benchmark.

``POST /v1/chat/completions`` answers in Chat Completions SSE, ``POST /v1/responses`` in Responses SSE
(the full event sequence OpenAI sends for a text answer). Both stream ``--deltas`` text deltas
``--interval-ms`` apart after ``--first-delay-ms``. The upstream model name ``*-idle`` waits
``--idle-delay-s`` before its first delta instead, so an idle open stream can be held cheaply.

Every delta's text is ``#<index>@<monotonic_ns>;``: the index makes drops and reordering detectable
through any translation, and the send time (CLOCK_MONOTONIC, shared by every process on the host) lets
the load generator measure per-event transit latency without trusting any intermediary.

Plain asyncio protocol on uvloop rather than a framework: the mock must cost far less per event than
any contender, or it would be the thing measured. ``GET /stats`` reports open streams and requests
per path (the harness uses it to know when idle streams have all reached the upstream).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any, cast

import orjson

_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_LAST_CHUNK = b"0\r\n\r\n"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _plain(status: str, body: bytes, keep_alive: bool = True) -> bytes:
    conn = b"keep-alive" if keep_alive else b"close"
    return (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: %s\r\n\r\n%s"
        % (status.encode(), len(body), conn, body)
    )


class Settings:
    def __init__(self, deltas: int, interval_s: float, first_delay_s: float, idle_delay_s: float) -> None:
        self.deltas = deltas
        self.interval_s = interval_s
        self.first_delay_s = first_delay_s
        self.idle_delay_s = idle_delay_s


class Stats:
    def __init__(self) -> None:
        self.open_streams = 0
        self.requests: dict[str, int] = {}
        self.finished = 0
        self.aborted = 0


def _response_obj(rid: str, model: str, created: int, status: str, text: str | None, n: int) -> bytes:
    """A Response object with every field OpenAI sends, so strict passthrough validation accepts it."""
    output: list[Any] = []
    usage: Any = None
    if text is not None:
        output = [
            {
                "id": "msg_bench",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
            }
        ]
        usage = {
            "input_tokens": 8,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 8 + n,
        }
    return orjson.dumps(
        {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": status,
            "background": False,
            "completed_at": created if status == "completed" else None,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": None,
            "max_tool_calls": None,
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "prompt_cache_key": None,
            "reasoning": {"effort": None, "summary": None},
            "safety_identifier": None,
            "service_tier": "default",
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto",
            "tools": [],
            "top_logprobs": 0,
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }
    )


class _Stream:
    """One streamed answer; every delta is scheduled at an absolute time so lateness never accumulates."""

    def __init__(self, conn: MockProtocol, kind: str, model: str, n: int, first_delay: float) -> None:
        self.conn = conn
        self.kind = kind
        self.model = model
        self.n = n
        self.index = 0
        self.seq = 0
        self.texts: list[str] = []
        self.handle: asyncio.TimerHandle | None = None
        self.created = int(time.time())
        self.rid = f"resp_bench{id(self):x}{time.monotonic_ns():x}"
        loop = asyncio.get_running_loop()
        self.t0 = loop.time() + first_delay
        self.model_b = orjson.dumps(model)

    def start(self) -> None:
        out = [_HEAD]
        if self.kind == "responses":
            out.append(self._event("response.created", b'"response":' + self._resp("in_progress", None)))
            out.append(self._event("response.in_progress", b'"response":' + self._resp("in_progress", None)))
        self.conn.transport_write(b"".join(out))
        loop = asyncio.get_running_loop()
        self.handle = loop.call_at(self.t0, self.tick)

    def _resp(self, status: str, text: str | None) -> bytes:
        return _response_obj(self.rid, self.model, self.created, status, text, self.n)

    def _event(self, etype: str, body: bytes) -> bytes:
        payload = b'event: %s\ndata: {"type":"%s",%s,"sequence_number":%d}\n\n' % (
            etype.encode(),
            etype.encode(),
            body,
            self.seq,
        )
        self.seq += 1
        return _chunk(payload)

    def _chat(self, delta: bytes, finish: bytes = b"null") -> bytes:
        return _chunk(
            b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":%d,"model":%s,'
            b'"system_fingerprint":null,"choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}'
            b"\n\n" % (self.created, self.model_b, delta, finish)
        )

    def tick(self) -> None:
        i = self.index
        text = f"#{i}@{time.monotonic_ns()};"
        self.texts.append(text)
        out: list[bytes] = []
        if self.kind == "chat":
            if i == 0:
                out.append(self._chat(b'{"role":"assistant","content":"","refusal":null}'))
            out.append(self._chat(b'{"content":"%s"}' % text.encode()))
        else:
            if i == 0:
                out.append(
                    self._event(
                        "response.output_item.added",
                        b'"output_index":0,"item":{"id":"msg_bench","type":"message","status":"in_progress",'
                        b'"role":"assistant","content":[]}',
                    )
                )
                out.append(
                    self._event(
                        "response.content_part.added",
                        b'"item_id":"msg_bench","output_index":0,"content_index":0,'
                        b'"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}',
                    )
                )
            out.append(
                self._event(
                    "response.output_text.delta",
                    b'"item_id":"msg_bench","output_index":0,"content_index":0,"delta":"%s","logprobs":[]'
                    % text.encode(),
                )
            )
        self.index = i + 1
        if self.index >= self.n:
            out.append(self._finish())
            self.conn.transport_write(b"".join(out))
            self.handle = None
            self.conn.stream_done(self)
            return
        self.conn.transport_write(b"".join(out))
        loop = self.conn.loop
        self.handle = loop.call_at(self.t0 + self.index * self.conn.settings.interval_s, self.tick)

    def _finish(self) -> bytes:
        full = "".join(self.texts)
        if self.kind == "chat":
            usage = b'{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}' % (self.n, self.n + 8)
            return (
                self._chat(b"{}", b'"stop"')
                + _chunk(
                    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":%d,"model":%s,'
                    b'"system_fingerprint":null,"choices":[],"usage":%s}\n\n'
                    % (self.created, self.model_b, usage)
                )
                + _chunk(b"data: [DONE]\n\n")
                + _LAST_CHUNK
            )
        full_b = orjson.dumps(full)
        part = b'{"type":"output_text","text":%s,"annotations":[],"logprobs":[]}' % full_b
        return b"".join(
            [
                self._event(
                    "response.output_text.done",
                    b'"item_id":"msg_bench","output_index":0,"content_index":0,"text":%s,"logprobs":[]'
                    % full_b,
                ),
                self._event(
                    "response.content_part.done",
                    b'"item_id":"msg_bench","output_index":0,"content_index":0,"part":%s' % part,
                ),
                self._event(
                    "response.output_item.done",
                    b'"output_index":0,"item":{"id":"msg_bench","type":"message","status":"completed",'
                    b'"role":"assistant","content":[%s]}' % part,
                ),
                self._event("response.completed", b'"response":' + self._resp("completed", full)),
                _LAST_CHUNK,
            ]
        )

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class MockProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive (pooling clients reuse connections), Content-Length request bodies."""

    def __init__(self, settings: Settings, stats: Stats) -> None:
        self.settings = settings
        self.stats = stats
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.stream: _Stream | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop transports are not asyncio.Transport subclasses, only duck-typed ones.
        self.transport = cast(asyncio.Transport, transport)

    def transport_write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.cancel()
            self.stream = None
            self.stats.open_streams -= 1
            self.stats.aborted += 1
        self.transport = None

    def stream_done(self, stream: _Stream) -> None:
        if self.stream is stream:
            self.stream = None
            self.stats.open_streams -= 1
            self.stats.finished += 1
            if self.buf:
                self._process()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.stream is None:
            self._process()

    def _process(self) -> None:
        while self.stream is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, target, _version = lines[0].split(" ", 2)
            except ValueError:
                self._reply("400 Bad Request", b'{"error":"bad request line"}', close=True)
                return
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._reply("411 Length Required", b'{"error":"send content-length"}', close=True)
                return
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            path = target.split("?", 1)[0]
            self.stats.requests[f"{method} {path}"] = self.stats.requests.get(f"{method} {path}", 0) + 1
            self._route(method, path, body)

    def _reply(self, status: str, body: bytes, close: bool = False) -> None:
        self.transport_write(_plain(status, body, keep_alive=not close))
        if close and self.transport is not None:
            self.transport.close()

    def _route(self, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path == "/stats":
            s = self.stats
            self._reply(
                "200 OK",
                orjson.dumps(
                    {
                        "open_streams": s.open_streams,
                        "finished": s.finished,
                        "aborted": s.aborted,
                        "requests": s.requests,
                    }
                ),
            )
            return
        if method == "GET" and path in ("/health", "/v1/models"):
            self._reply("200 OK", b'{"object":"list","data":[{"id":"bench","object":"model"}]}')
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/responses"):
            self._reply("404 Not Found", b'{"error":{"message":"not found","type":"invalid_request_error"}}')
            return
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            self._reply("400 Bad Request", b'{"error":{"message":"body is not JSON"}}')
            return
        if not isinstance(req, dict) or req.get("stream") is not True:
            self._reply("400 Bad Request", b'{"error":{"message":"the mock only streams (stream: true)"}}')
            return
        model = str(req.get("model", "bench"))
        kind = "chat" if path == "/v1/chat/completions" else "responses"
        s = self.settings
        delay = s.idle_delay_s if model.endswith("-idle") else s.first_delay_s
        stream = _Stream(self, kind, model, s.deltas, delay)
        self.stream = stream
        self.stats.open_streams += 1
        stream.start()


async def serve(host: str, port: int, settings: Settings, ready: str | None) -> None:
    loop = asyncio.get_running_loop()
    stats = Stats()
    server = await loop.create_server(
        lambda: MockProtocol(settings, stats), host, port, backlog=8192, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    if ready:
        with open(ready, "w") as f:
            f.write(str(bound))
    print(f"mock upstream on http://{host}:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--deltas", type=int, default=64)
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--first-delay-ms", type=float, default=0.0)
    p.add_argument("--idle-delay-s", type=float, default=120.0)
    p.add_argument("--ready-file", help="write the bound port here once listening")
    a = p.parse_args()
    raise_nofile()
    settings = Settings(a.deltas, a.interval_ms / 1000, a.first_delay_ms / 1000, a.idle_delay_s)
    try:
        import uvloop

        uvloop.run(serve(a.host, a.port, settings, a.ready_file))
    except ImportError:
        asyncio.run(serve(a.host, a.port, settings, a.ready_file))


if __name__ == "__main__":
    main()
