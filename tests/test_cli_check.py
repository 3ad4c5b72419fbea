"""`responses-gateway check` against files and a tiny local Responses server; `serve` wiring."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from responses_gateway import cli
from responses_gateway.protocol import StreamBuilder, encode_event, new_response


def text_stream(raw_reasoning: str = "reasoning_text") -> list[dict[str, Any]]:
    b = StreamBuilder(new_response("m"), raw_reasoning=raw_reasoning)  # type: ignore[arg-type]
    b.start()
    r = b.open_reasoning()
    b.reasoning_delta(r, "hmm")
    b.close_reasoning(r)
    m = b.open_message()
    b.text_delta(m, "Hello")
    b.text_delta(m, " there.")
    b.set_usage(5, 2)
    b.complete()
    events: list[dict[str, Any]] = orjson.loads(orjson.dumps(b.take()))
    return events


class Upstream(ThreadingHTTPServer):
    """Replays builder-made streams; ``mode`` picks a defect to serve."""

    mode = "good"
    seen_headers: list[dict[str, str]]


class Handler(BaseHTTPRequestHandler):
    server: Upstream

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen_headers.append(dict(self.headers))
        mode = self.server.mode
        if mode == "error":
            self._send(500, "application/json", b'{"error":{"message":"down","type":"server_error"}}')
            return
        b = StreamBuilder(new_response(body["model"]))
        b.start()
        if body.get("tools") and mode != "no-tool":
            call = b.open_function_call("get_weather")
            b.arguments_delta(call, '{"city":')
            b.arguments_delta(call, '"Paris"}')
        else:
            m = b.open_message()
            b.text_delta(m, "Hello")
            b.text_delta(m, "!")
        b.set_usage(5, 2)
        b.complete()
        events = b.take()
        if not body.get("stream"):
            self._send(200, "application/json", orjson.dumps(events[-1]["response"]))
            return
        if mode == "broken":
            events = [e for e in events if e["type"] != "response.content_part.added"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.end_headers()
        for event in events:
            self.wfile.write(encode_event(event))
            self.wfile.flush()

    def _send(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream(("127.0.0.1", 0), Handler)
    server.seen_headers = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def url_of(server: Upstream) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}/v1"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ------------------------------------------------------------------ URLs
def test_good_endpoint_passes_all_probes(upstream: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["check", url_of(upstream), "--model", "m", "--api-key", "k1", "--json"], capsys)
    report = json.loads(out)
    assert status == 0 and report["ok"] is True
    assert [r["name"] for r in report["results"]] == ["text-stream", "function-call-stream", "non-stream"]
    assert all(r["events"] > 0 for r in report["results"][:2])
    assert all(h["Authorization"] == "Bearer k1" for h in upstream.seen_headers)


def test_strict_spec_endpoint(upstream: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["check", url_of(upstream) + "/responses", "--model", "m", "--strict-spec"], capsys)
    assert status == 0, out
    assert "profile strict-spec" in out


def test_broken_endpoint_is_reported(upstream: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    upstream.mode = "broken"
    status, out, _ = run(["check", url_of(upstream), "--model", "m", "--json"], capsys)
    report = json.loads(out)
    assert status == 1 and report["ok"] is False
    text = report["results"][0]
    assert {v["rule"] for v in text["violations"]} == {"content.part_not_open", "sequence.contiguous"}
    assert report["results"][1]["ok"] and report["results"][2]["ok"]


def test_ignored_tool_choice_is_reported(upstream: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    upstream.mode = "no-tool"
    status, out, _ = run(["check", url_of(upstream), "--model", "m"], capsys)
    assert status == 1
    assert "[probe.function_call]" in out


def test_http_error_is_a_violation(upstream: Upstream, capsys: pytest.CaptureFixture[str]) -> None:
    upstream.mode = "error"
    status, out, _ = run(["check", url_of(upstream), "--model", "m"], capsys)
    assert status == 1
    assert out.count("[http.response] HTTP 500") == 3


def test_unreachable_endpoint_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    server.server_close()  # nothing listens there now
    status, _, err = run(["check", f"http://127.0.0.1:{port}/v1", "--model", "m", "--timeout", "5"], capsys)
    assert status == 2 and "ConnectError" in err


def test_url_without_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["check", "http://127.0.0.1:9/v1"], capsys)
    assert status == 2 and "--model" in err


def test_responses_url() -> None:
    assert cli.responses_url("http://h/v1/") == "http://h/v1/responses"
    assert cli.responses_url("http://h/v1/responses") == "http://h/v1/responses"


# ------------------------------------------------------------------ files
def test_clean_sse_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.sse"
    path.write_bytes(b"".join(encode_event(e) for e in text_stream()))
    status, out, _ = run(["check", str(path)], capsys)
    assert status == 0
    assert out == f"{path}: OK (profile openai, {len(text_stream())} events)\n"


def test_jsonl_file_with_violation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = text_stream()
    done = next(e for e in events if e["type"] == "response.output_text.done")
    done["text"] = "Hello world."
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in events))
    status, out, _ = run(["check", str(path)], capsys)
    assert status == 1
    assert f"#{done['sequence_number']} [delta.done_mismatch]" in out
    status, out, _ = run(["check", str(path), "--json"], capsys)
    report = json.loads(out)
    assert status == 1
    assert "delta.done_mismatch" in {v["rule"] for v in report["results"][0]["violations"]}


def test_strict_spec_flag_on_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    openai_style = tmp_path / "openai.sse"
    openai_style.write_bytes(b"".join(encode_event(e) for e in text_stream()))
    spec_style = tmp_path / "spec.sse"
    spec_style.write_bytes(b"".join(encode_event(e) for e in text_stream("reasoning")))
    assert run(["check", str(openai_style)], capsys)[0] == 0
    status, out, _ = run(["check", "--strict-spec", str(openai_style)], capsys)
    assert status == 1 and "[spec.raw_reasoning]" in out
    assert run(["check", "--profile", "strict-spec", str(spec_style)], capsys)[0] == 0


def test_response_body_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = text_stream()[-1]["response"]
    path = tmp_path / "body.json"
    path.write_bytes(orjson.dumps(body))
    assert run(["check", str(path)], capsys)[0] == 0
    body["usage"]["total_tokens"] = "7"
    path.write_bytes(orjson.dumps(body))
    status, out, _ = run(["check", str(path)], capsys)
    assert status == 1 and "[usage.shape]" in out


def test_file_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(["check", str(tmp_path / "missing.sse")], capsys)
    assert status == 2 and "missing.sse" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"type":"response.created"}\nnot json\n')
    status, _, err = run(["check", str(bad)], capsys)
    assert status == 2 and "line 2" in err


def test_argparse_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["check", "x", "--profile", "nope"])
    assert exc.value.code == 2


# ------------------------------------------------------------------ serve wiring
def test_serve_is_wired_to_the_server_module(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[argparse.Namespace] = []
    fake = types.ModuleType("responses_gateway.server.run")

    def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--port", type=int, default=8000)

    def serve(args: argparse.Namespace) -> int:
        calls.append(args)
        return 7

    fake.add_serve_arguments = add_serve_arguments  # type: ignore[attr-defined]
    fake.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "responses_gateway.server.run", fake)
    assert cli.main(["serve", "--port", "1234"]) == 7
    assert calls[0].port == 1234


def test_check_works_when_the_server_cannot_import(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "responses_gateway.server.run", None)
    path = tmp_path / "s.sse"
    path.write_bytes(b"".join(encode_event(e) for e in text_stream()))
    assert run(["check", str(path)], capsys)[0] == 0
    status, _, err = run(["serve"], capsys)
    assert status == 2 and "cannot be loaded" in err


WEATHER_CALL = {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_check_url_prints_each_probe_as_it_finishes(tmp_path: Path) -> None:
    """Against a slow model a probe takes a while: its line comes out when it is done, not all three
    at the end (the real command, reading its output as it comes)."""
    import subprocess
    import time

    from conftest import start_gateway
    from responses_gateway.providers.scripted import ScriptedProvider
    from serve_process import GATEWAY

    script: dict[str, Any] = {
        "turns": [
            {"when": {"text_contains": "weather"}, "steps": [{"function_call": WEATHER_CALL}]},
            {"steps": [{"message": ["slow ", "hello ", "there."], "delay": 0.4}]},
        ]
    }
    gw = start_gateway([ScriptedProvider(script, name="slow")])
    try:
        started = time.monotonic()
        proc = subprocess.Popen(
            [str(GATEWAY), "check", gw.base_url, "--model", "slow"], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        first_at = time.monotonic() - started
        rest = proc.stdout.read()
        proc.wait(60)
        ended_at = time.monotonic() - started
    finally:
        gw.stop()
    assert first.startswith("text-stream: OK"), first + rest
    assert "function-call-stream: OK" in rest and "non-stream: OK" in rest, rest
    assert ended_at - first_at > 1.0, (first_at, ended_at)  # the first line came before the last probe ran
