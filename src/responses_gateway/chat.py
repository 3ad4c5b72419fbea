"""``responses-gateway chat``: a terminal chat with any Responses server, on :mod:`.client`.

Answers stream as they arrive; reasoning is shown dimmed, tool calls (the client's functions and
hosted tools such as ``code_interpreter``) on their own marked lines, each answer followed by a status
line (model, tokens, response id) and any protocol violations the checker found. Turns continue with
``previous_response_id`` (or, after a response the server did not store, by sending the
conversation's messages again). Commands: ``/model [NAME]`` (list or switch), ``/reset`` (a new
conversation), ``/save FILE`` (the conversation as JSON), ``/help``, ``/quit``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, TextIO

import httpx
import orjson

from .client import DEFAULT_BASE_URL, ResponsesAPIError, ResponsesClient, output_text

__all__ = ["Chat", "add_chat_arguments", "run_chat"]

JSON = dict[str, Any]
URL_ENV = "RG_CHAT_URL"
KEY_ENVS = ("RG_API_KEY", "OPENAI_API_KEY")

HELP = """commands:
  /model [NAME]   list the server's models, or switch to NAME
  /reset          start a new conversation (forget previous_response_id)
  /save FILE      write the conversation (requests and Responses) to FILE as JSON
  /help           this help
  /quit           leave (also Ctrl-D)"""

_REASONING = frozenset(
    {
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning.delta",
        "response.reasoning_summary.delta",
    }
)
_TEXT = frozenset({"response.output_text.delta", "response.refusal.delta"})


class Style:
    """ANSI styles, or nothing (``--no-color``, or when the output is not a terminal)."""

    def __init__(self, color: bool) -> None:
        self.dim = "\x1b[2m" if color else ""
        self.bold = "\x1b[1m" if color else ""
        self.tool = "\x1b[36m" if color else ""
        self.warn = "\x1b[33m" if color else ""
        self.error = "\x1b[31m" if color else ""
        self.reset = "\x1b[0m" if color else ""


class Chat:
    """One chat session: the client, the model, the conversation so far."""

    def __init__(self, client: ResponsesClient, model: str | None, out: TextIO, style: Style) -> None:
        self.client = client
        self.model = model
        self.out = out
        self.style = style
        self.previous_id: str | None = None
        # The conversation as input items, for a server that did not store the last response
        # (``store: false``): the next turn sends it whole instead of previous_response_id.
        self.history: list[JSON] = []
        self.turns: list[JSON] = []

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def line(self, text: str, style: str = "") -> None:
        self.write(f"{style}{text}{self.style.reset if style else ''}\n")

    # ------------------------------------------------------------------ commands
    def command(self, text: str) -> bool:
        """Run a ``/command``; False to quit."""
        name, _, arg = text.strip().partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            self.line(HELP)
        elif name == "/reset":
            self.previous_id = None
            self.history = []
            self.turns = []
            self.line("(new conversation)", self.style.dim)
        elif name == "/model":
            if not arg:
                self.list_models()
            else:
                self.model = arg
                self.line(f"(model: {arg}; the conversation continues)", self.style.dim)
        elif name == "/save":
            self.save(arg)
        else:
            self.line(f"unknown command {name}; /help lists them", self.style.warn)
        return True

    def list_models(self) -> None:
        try:
            models = self.client.models()
        except (ResponsesAPIError, httpx.HTTPError) as exc:
            self.line(f"cannot list models: {exc}", self.style.error)
            return
        for model in models:
            mark = "*" if model.get("id") == self.model else " "
            self.line(f" {mark} {model.get('id')}")

    def save(self, path: str) -> None:
        if not path:
            self.line("usage: /save FILE", self.style.warn)
            return
        record = {"model": self.model, "previous_response_id": self.previous_id, "turns": self.turns}
        try:
            Path(path).expanduser().write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
        except OSError as exc:
            self.line(f"cannot save: {exc}", self.style.error)
            return
        self.line(f"(saved {len(self.turns)} turns to {path})", self.style.dim)

    # ------------------------------------------------------------------ one turn
    def ask(self, text: str) -> None:
        if self.model is None:
            self.line("no model: choose one with /model NAME", self.style.warn)
            return
        body: JSON = {"model": self.model, "input": text}
        if self.previous_id is not None:
            body["previous_response_id"] = self.previous_id
        elif self.history:
            body["input"] = [*self.history, {"role": "user", "content": text}]
        style = self.style
        mode = ""  # what the last write was: "", "text", "reasoning"
        printed = False  # whether the answer's text streamed (else it is printed whole at the end)
        try:
            with self.client.stream(**body) as stream:
                for step in stream:
                    event = step.event
                    kind = step.type
                    if kind in _REASONING:
                        if mode != "reasoning":
                            self.write(("\n" if mode else "") + f"{style.dim}[thinking] ")
                            mode = "reasoning"
                        self.write(str(event.get("delta", "")))
                    elif kind in _TEXT:
                        if mode != "text":
                            self.write(
                                (f"{style.reset}\n" if mode else "")
                                + f"{style.bold}{self.model}>{style.reset} "
                            )
                            mode = "text"
                        self.write(str(event.get("delta", "")))
                        printed = True
                    elif kind == "response.output_item.done":
                        shown = _tool_line(event.get("item") or {})
                        if shown is not None:
                            self.write(
                                (f"{style.reset}\n" if mode else "") + f"{style.tool}⚙ {shown}{style.reset}\n"
                            )
                            mode = ""
                    elif kind == "error":
                        error = event.get("error")
                        message = event.get("message") or (
                            error.get("message") if isinstance(error, dict) else None
                        )
                        self.write(
                            (f"{style.reset}\n" if mode else "")
                            + f"{style.error}error: {message}{style.reset}\n"
                        )
                        mode = ""
                response = stream.response
                violations = stream.violations
                resume_error = stream.resume_error
        except ResponsesAPIError as exc:
            self.write((f"{style.reset}\n" if mode else "") + f"{style.error}{exc}{style.reset}\n")
            return
        except httpx.HTTPError as exc:
            self.write(
                (f"{style.reset}\n" if mode else "") + f"{style.error}connection failed: {exc}{style.reset}\n"
            )
            return
        if mode:
            self.write(f"{style.reset}\n")
        if not printed and output_text(response):
            self.line(f"{self.model}> {output_text(response)}")
        self.turns.append({"request": body, "response": response})
        if response.get("status") in ("completed", "incomplete"):
            if response.get("id") and response.get("store") is not False:
                self.previous_id, self.history = str(response["id"]), []
            else:
                # Not stored: the next turn carries the conversation itself.
                self.previous_id = None
                self.history = [*self.history, {"role": "user", "content": text}]
                answer = output_text(response)
                if answer:
                    self.history.append({"role": "assistant", "content": answer})
        self.line(_status_line(response), style.dim)
        if resume_error:
            self.line(f"(stream dropped: {resume_error})", style.warn)
        if violations:
            self.line(f"(! {len(violations)} protocol violation(s): {violations[0]})", style.warn)

    def run(self, read: Any = input) -> int:
        self.line(
            f"chat with {self.model or '(no model)'} at {self.client.base_url} — /help for commands",
            self.style.dim,
        )
        while True:
            try:
                text = read("you> ")
            except (EOFError, KeyboardInterrupt):
                self.write("\n")
                return 0
            if not text.strip():
                continue
            if text.startswith("/"):
                if not self.command(text):
                    return 0
                continue
            try:
                self.ask(text)
            except KeyboardInterrupt:
                self.line("\n(interrupted)", self.style.warn)


def _tool_line(item: JSON) -> str | None:
    """How a finished tool item is shown (None: not a tool call)."""
    kind = item.get("type")
    if kind == "function_call":
        return f"call {item.get('name')}({item.get('arguments', '')})"
    if kind == "custom_tool_call":
        return f"call {item.get('name')}: {item.get('input', '')}"
    if kind == "code_interpreter_call":
        outputs = [o.get("logs") for o in item.get("outputs") or [] if isinstance(o, dict) and o.get("logs")]
        code = str(item.get("code") or "").strip().replace("\n", "\n    ")
        shown = f"code_interpreter [{item.get('status')}]\n    {code}"
        for logs in outputs:
            shown += "\n  → " + str(logs).strip().replace("\n", "\n    ")
        return shown
    if isinstance(kind, str) and kind.endswith("_call"):
        return f"{kind.removesuffix('_call')} [{item.get('status')}]"
    return None


def _status_line(response: JSON) -> str:
    usage = response.get("usage") or {}
    parts = [str(response.get("status") or "?")]
    if usage:
        parts.append(f"{usage.get('input_tokens', '?')} in / {usage.get('output_tokens', '?')} out")
    if response.get("id"):
        parts.append(str(response["id"]))
    error = response.get("error")
    if isinstance(error, dict) and error.get("message"):
        parts.append(f"error: {error.get('code') or ''} {error['message']}")
    return "[" + " · ".join(parts) + "]"


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get(URL_ENV) or DEFAULT_BASE_URL,
        help=f"the Responses server's base URL, ending in /v1 (also {URL_ENV}; default {DEFAULT_BASE_URL})",
    )
    parser.add_argument("--model", help="the model to talk to (default: the server's first model)")
    parser.add_argument(
        "--api-key", help=f"sent as a Bearer token (default: {' or '.join(KEY_ENVS)} from the environment)"
    )
    parser.add_argument("--no-color", action="store_true", help="plain text, no ANSI styles")


def run_chat(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    key = args.api_key or next((os.environ[k] for k in KEY_ENVS if os.environ.get(k)), None)
    with ResponsesClient(args.url, key) as client:
        model = args.model
        if model is None:
            try:
                models = client.models()
            except (ResponsesAPIError, httpx.HTTPError) as exc:
                sys.stderr.write(f"responses-gateway chat: cannot list the models at {args.url}: {exc}\n")
                return 2
            model = str(models[0]["id"]) if models else None
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401 - line editing and history for input()
        color = not args.no_color and out.isatty()
        return Chat(client, model, out, Style(color)).run()
