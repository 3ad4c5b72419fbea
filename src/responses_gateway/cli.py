"""The ``responses-gateway`` command: ``serve`` the gateway, ``check`` a stream, file or endpoint, or
``chat`` with any Responses server in the terminal (chat.py).

``check`` is deliberately plain blocking code (httpx, no event loop) and imports nothing from the
server, so it works wherever the protocol package does.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

from . import __version__
from .protocol.checker import PROFILES, StreamChecker, Violation, check_response
from .protocol.sse import EventStreamDecoder, SSEPayloadError

__all__ = ["CheckResult", "build_parser", "check_file", "check_url", "main"]

EXIT_OK = 0
EXIT_VIOLATIONS = 1
EXIT_ERROR = 2


class CheckError(Exception):
    """The target could not be read or reached (exit status 2, not a protocol verdict)."""


@dataclass
class CheckResult:
    """The verdict on one stream or body."""

    name: str
    events: int = 0
    violations: list[Violation] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "events": self.events,
            "ok": not self.violations,
            "violations": [
                {"rule": v.rule, "sequence_number": v.sequence_number, "message": v.message}
                for v in self.violations
            ],
        }


# ---------------------------------------------------------------------------------------------- files
def _looks_like_sse(data: bytes) -> bool:
    for line in data.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        return stripped.startswith((b"data:", b"event:", b"id:", b"retry:", b":"))
    return False


def _events_from_jsonl(data: bytes) -> Iterator[Any]:
    for number, line in enumerate(data.splitlines(), 1):
        if line.strip():
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise CheckError(f"line {number}: not JSON: {exc}") from None


def _events_from_sse(data: bytes) -> list[dict[str, Any]]:
    decoder = EventStreamDecoder()
    try:
        return decoder.feed(data) + decoder.flush()
    except SSEPayloadError as exc:
        raise CheckError(str(exc)) from None


def check_file(path: Path, profile: str) -> CheckResult:
    """Check a recorded stream: raw SSE (``.sse``), JSON lines of events, or one Response body."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckError(f"{path}: {exc.strerror or exc}") from None
    result = CheckResult(str(path))
    if _looks_like_sse(data):
        events: list[Any] = _events_from_sse(data)
    else:
        try:
            whole = orjson.loads(data)
        except orjson.JSONDecodeError:
            whole = None
        if isinstance(whole, dict) and "type" not in whole:
            # A non-streamed Response body (``stream: false``).
            result.violations = check_response(whole, profile=profile)
            return result
        events = [whole] if isinstance(whole, dict) else list(_events_from_jsonl(data))
    checker = StreamChecker(profile)
    checker.feed_all(events)
    checker.finish()
    result.events = len(events)
    result.violations = checker.violations
    return result


# ---------------------------------------------------------------------------------------------- URLs
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}

# The standard probes: (name, request body fields beyond `model`, whether it streams).
PROBES: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("text-stream", {"input": "Say hello in one short sentence.", "stream": True}, True),
    (
        "function-call-stream",
        {
            "input": "What is the weather in Paris? Use the tool.",
            "tools": [WEATHER_TOOL],
            "tool_choice": "required",
            "stream": True,
        },
        True,
    ),
    ("non-stream", {"input": "Say hello in one short sentence.", "stream": False}, False),
)


def responses_url(base: str) -> str:
    """``http://host/v1`` or ``http://host/v1/responses`` → the ``/responses`` endpoint."""
    base = base.rstrip("/")
    return base if base.endswith("/responses") else f"{base}/responses"


def _http_violation(name: str, message: str) -> CheckResult:
    return CheckResult(name, 0, [Violation("http.response", 0, message)])


def _run_probe(
    client: Any, url: str, name: str, body: dict[str, Any], streaming: bool, profile: str
) -> CheckResult:
    import httpx

    headers = {"Accept": "text/event-stream" if streaming else "application/json"}
    try:
        with client.stream("POST", url, json=body, headers=headers) as response:
            raw_type = response.headers.get("content-type", "")
            content_type = raw_type.split(";")[0].strip().lower()
            if response.status_code != 200:
                text = response.read()[:300].decode("utf-8", "replace")
                return _http_violation(name, f"HTTP {response.status_code}: {text}")
            if not streaming:
                payload = response.read()
                if content_type != "application/json":
                    return _http_violation(name, f"Content-Type {raw_type!r}, expected application/json")
                try:
                    parsed = orjson.loads(payload)
                except orjson.JSONDecodeError as exc:
                    return _http_violation(name, f"body is not JSON: {exc}")
                return CheckResult(name, 0, check_response(parsed, profile=profile))
            if content_type != "text/event-stream":
                return _http_violation(name, f"Content-Type {raw_type!r}, expected text/event-stream")
            checker = StreamChecker(profile)
            decoder = EventStreamDecoder()
            count = 0
            try:
                for chunk in response.iter_bytes():
                    for event in decoder.feed(chunk):
                        count += 1
                        checker.feed(event)
                for event in decoder.flush():
                    count += 1
                    checker.feed(event)
            except SSEPayloadError as exc:
                checker.violations.append(Violation("event.type", count, str(exc)))
            checker.finish()
    except httpx.HTTPError as exc:
        raise CheckError(f"{url}: {type(exc).__name__}: {exc}") from None
    result = CheckResult(name, count, checker.violations)
    # tool_choice "required" obliges a function call; a finished stream without one ignored the request.
    finished = not any(v.rule.startswith("lifecycle.") for v in result.violations)
    if name == "function-call-stream" and finished and not _saw_function_call(checker):
        result.violations.append(
            Violation("probe.function_call", count, "tool_choice 'required' but no function_call item")
        )
    return result


def _saw_function_call(checker: StreamChecker) -> bool:
    return any(item.get("type") == "function_call" for item in checker.done_items)


def check_url(
    url: str,
    model: str,
    profile: str,
    *,
    api_key: str | None = None,
    timeout: float = 120.0,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Send the standard probes to a Responses endpoint and check every answer; ``on_result`` is
    called with each probe's result as soon as it is known (a slow model takes a while per probe)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    endpoint = responses_url(url)
    results = []
    with httpx.Client(headers=headers, timeout=timeout) as client:
        for name, extra, streaming in PROBES:
            body = {"model": model, **extra}
            result = _run_probe(client, endpoint, name, body, streaming, profile)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


# ---------------------------------------------------------------------------------------------- output
def _print_report(results: Sequence[CheckResult], profile: str, out: TextIO) -> None:
    for result in results:
        _print_result(result, profile, out)


def _print_result(result: CheckResult, profile: str, out: TextIO) -> None:
    count = len(result.violations)
    events = f", {result.events} events" if result.events else ""
    verdict = "OK" if not count else f"{count} violation{'s' if count != 1 else ''}"
    out.write(f"{result.name}: {verdict} (profile {profile}{events})\n")
    for violation in result.violations:
        out.write(f"  {violation}\n")
    out.flush()


def _run_check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    profile: str = "strict-spec" if args.strict_spec else args.profile
    target: str = args.target
    try:
        if target.startswith(("http://", "https://")):
            if not args.model:
                err.write("responses-gateway check: --model is required when checking a URL\n")
                return EXIT_ERROR
            # Each probe's line as soon as it is known (in JSON mode, the report comes at the end).
            progress = None if args.json else (lambda result: _print_result(result, profile, out))
            results = check_url(
                target, args.model, profile, api_key=args.api_key, timeout=args.timeout, on_result=progress
            )
        else:
            results = [check_file(Path(target), profile)]
            if not args.json:
                _print_report(results, profile, out)
    except CheckError as exc:
        err.write(f"responses-gateway check: {exc}\n")
        return EXIT_ERROR
    ok = all(not r.violations for r in results)
    if args.json:
        report = {"target": target, "profile": profile, "ok": ok, "results": [r.to_json() for r in results]}
        out.write(json.dumps(report, indent=2) + "\n")
    return EXIT_OK if ok else EXIT_VIOLATIONS


# ---------------------------------------------------------------------------------------------- parser
ServeHooks = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def _serve_hooks() -> ServeHooks | str:
    """The server's argument hook and entry point, or why they cannot be imported."""
    try:
        run = importlib.import_module(f"{__package__}.server.run")
        hooks: ServeHooks = (run.add_serve_arguments, run.serve)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return hooks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="responses-gateway", description="An OpenAI Responses API server in front of any model."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve_parser = sub.add_parser("serve", help="run the gateway server")
    hooks = _serve_hooks()
    if isinstance(hooks, tuple):
        hooks[0](serve_parser)
    serve_parser.set_defaults(handler=_run_serve, serve_hooks=hooks)

    check_parser = sub.add_parser(
        "check",
        help="check a recorded stream or a live endpoint against the protocol rules",
        description="TARGET is a recorded stream (.sse, or JSON lines of events, or a Response body) "
        "or a Responses endpoint URL (http://host/v1). Exit status: 0 clean, 1 violations, 2 errors.",
    )
    check_parser.add_argument("target", metavar="TARGET", help="file path or base URL")
    check_parser.add_argument("--model", help="model to request (URL targets)")
    check_parser.add_argument("--api-key", help="sent as a Bearer token (URL targets)")
    check_parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds per request (default 120)"
    )
    check_parser.add_argument("--json", action="store_true", help="machine-readable report")
    check_parser.add_argument(
        "--profile", choices=PROFILES, default="openai", help="rule profile (default openai)"
    )
    check_parser.add_argument(
        "--strict-spec", action="store_true", help="shorthand for --profile strict-spec"
    )
    check_parser.set_defaults(handler=lambda args: _run_check(args, sys.stdout, sys.stderr))

    from .chat import add_chat_arguments, run_chat

    chat_parser = sub.add_parser(
        "chat",
        help="chat in the terminal with any Responses server (this gateway, OpenAI, another gateway)",
        description="Streams answers, shows reasoning and tool calls, continues with previous_response_id. "
        "Commands: /model [NAME], /reset, /save FILE, /help, /quit.",
    )
    add_chat_arguments(chat_parser)
    chat_parser.set_defaults(handler=run_chat)
    return parser


def _run_serve(args: argparse.Namespace) -> int:
    hooks = args.serve_hooks
    if isinstance(hooks, str):
        sys.stderr.write(f"responses-gateway serve: the server cannot be loaded: {hooks}\n")
        return EXIT_ERROR
    result: int = hooks[1](args)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
