"""``mcp``: remote MCP servers chosen per request, run by the gateway for any model.

One ``{"type": "mcp", "server_label", "server_url", …}`` tool stands for every tool the server lists:
before the first model turn the engine lists them (an ``mcp_list_tools`` item, unless the conversation
already holds one for that label, which is reused) and the model is offered one function per MCP tool,
named ``mcp__<label>__<tool>`` (a client function with that prefix is refused, so names cannot
collide). A call to one is shown as an ``mcp_call`` whose arguments stream
(``response.mcp_call_arguments.delta``) and which the engine runs through the official ``mcp`` client
(Streamable HTTP, or SSE for a URL ending in ``/sse``); a tool error is the call's ``error``, never a
failed Response. Where ``require_approval`` asks for it, the call is shown as an
``mcp_approval_request`` instead, which ends the Response; the next request's
``mcp_approval_response`` (``approve``, ``approval_request_id``) makes the engine run it before the
first turn, as an ``mcp_call`` carrying ``approval_request_id`` (or tells the model it was declined).

Every connection to a server a request names passes the network guard (``netguard.py``); servers the
operator names in the models file are reached as configured. Each operation has its own timeout and
runs in its own task: a slow, dead or misbehaving server fails its call, not the gateway. Headers and
``authorization`` are sent to the server only: never echoed, stored or logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import logging
import re
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import httpx2

from ...netguard import NetGuard, NetRefused, guarded_client
from ...protocol.builder import HostedCall, HostedSpec, Item, StreamBuilder
from ...protocol.json_field import clean_text
from ...protocol.request import RequestError
from ..hosted import HostedTool, HostedUse, RunContext

if TYPE_CHECKING:  # the mcp SDK takes half a second to import: only when a request uses MCP
    from mcp.client import Client

__all__ = ["MCP_ITEM_TYPES", "McpLimits", "McpServerSpec", "McpTool", "function_name_for"]

JSON = dict[str, Any]
T = TypeVar("T")

log = logging.getLogger("responses_gateway.tools")

MCP_ITEM_TYPES = ("mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response")
LABEL = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
_MAX_NAME = 64
_MAX_URL = 2048
_MAX_HEADERS = 64
_MAX_HEADER_BYTES = 16 * 1024
DECLINED = "The user declined to run this tool call."
# JSON-RPC error codes for what the gateway itself refuses or could not do.
_INVALID_PARAMS = -32602
_INTERNAL = -32603
_NOT_RUN = -32000
_CLOSE_TIMEOUT = 5.0  # a session's orderly end (the Streamable HTTP DELETE) before it is cut
AWAITING = "Not run: this call waits for the user's approval."


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """A server the operator names in the models file: a request may use it by label alone."""

    label: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # read from the environment
    transport: str = "auto"  # auto (SSE when the URL ends in /sse), streamable_http, sse


@dataclass(frozen=True, slots=True)
class McpLimits:
    call_timeout: float = 60.0  # one tools/call, connection included
    list_timeout: float = 60.0  # one listing (every page), connection included
    output_chars: int = 100_000  # what one call's output keeps (the rest is cut, and said so)
    max_tools: int = 128  # tools kept from one server's list
    max_event_bytes: int = 16 * 1024 * 1024  # one message from a server


def function_name_for(label: str, tool: str) -> str:
    """The function an MCP tool is offered as: ``mcp__<label>__<tool>``, at most 64 characters."""
    name = f"mcp__{label}__{_UNSAFE.sub('_', tool)}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9]}_{digest}"


class McpTool(HostedTool):
    type = "mcp"
    kind = "mcp_call"
    function_name = ""
    kinds = MCP_ITEM_TYPES
    several = True

    def __init__(
        self,
        servers: Mapping[str, McpServerSpec] | None = None,
        guard: NetGuard | None = None,
        limits: McpLimits | None = None,
    ) -> None:
        self.servers = dict(servers or {})
        self.guard = guard or NetGuard()
        self.limits = limits or McpLimits()

    def unavailable(self) -> str | None:
        return None

    def function(self, config: JSON) -> JSON:
        return _function(
            str(config.get("name") or "tool"), str(config.get("server_label") or "mcp"), None, None
        )

    def declared(self, items: list[JSON]) -> list[JSON]:
        seen: dict[str, JSON] = {}
        for item in items:
            if item.get("type") in ("mcp_call", "mcp_approval_request"):
                label, name = str(item.get("server_label") or ""), str(item.get("name") or "")
                seen.setdefault(function_name_for(label, name), _function(name, label, None, None))
        return list(seen.values())

    def choice(self, choice: JSON) -> str | JSON:
        name, label = choice.get("name"), choice.get("server_label")
        if isinstance(name, str) and isinstance(label, str):
            return {"type": "function", "name": function_name_for(label, name)}
        return "required"

    async def use(self, config: JSON, *, param: str, history: list[JSON], ctx: RunContext) -> HostedUse:
        await _load_sdk()
        label = config.get("server_label")
        if not isinstance(label, str) or not LABEL.match(label):
            raise RequestError(
                "'server_label' must be 1 to 64 letters, digits, '_' or '-'.", param=f"{param}.server_label"
            )
        if config.get("connector_id") is not None:
            raise RequestError(
                "Connectors are not available on this gateway; give 'server_url'.",
                param=f"{param}.connector_id",
            )
        url = config.get("server_url")
        headers = _headers(config, param)
        guard: NetGuard | None = self.guard
        transport = "auto"
        if url is None:
            known = self.servers.get(label)
            if known is None:
                raise RequestError(
                    f"Missing 'server_url': no MCP server labelled {label!r} is configured on this gateway.",
                    param=f"{param}.server_url",
                )
            url, guard, transport = known.url, None, known.transport
            headers = {**known.headers, **headers}
        elif not isinstance(url, str) or len(url) > _MAX_URL:
            raise RequestError(
                f"'server_url' must be a URL of at most {_MAX_URL} characters.", param=f"{param}.server_url"
            )
        else:
            try:
                await self.guard.check_url(url)
            except NetRefused as exc:
                raise RequestError(
                    f"This MCP server cannot be used: {exc}.", param=f"{param}.server_url"
                ) from None
        allowed = _allowed(config.get("allowed_tools"), f"{param}.allowed_tools")
        approval = _Approval.parse(config.get("require_approval"), f"{param}.require_approval")
        use = _Use(self, label, url, headers, guard, transport, allowed, approval)
        use.adopt(history)
        return use

    def history(self, item: JSON, owner: str | None, items: list[JSON]) -> tuple[JSON, JSON] | None:
        kind = item.get("type")
        if kind in ("mcp_list_tools", "mcp_approval_response"):
            return None  # the tools are offered as functions; the answer shows in the call
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            raise RequestError(f"An {kind} item needs its 'id'.", param=".id")
        for key in ("server_label", "name"):
            if not isinstance(item.get(key), str):
                raise RequestError(f"An {kind} item needs '{key}'.", param=f".{key}")
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            arguments = "{}"
        name = function_name_for(item["server_label"], item["name"])
        call = {"type": "function_call", "call_id": item_id, "name": name, "arguments": arguments}
        if kind == "mcp_approval_request":
            if any(i.get("type") == "mcp_call" and i.get("approval_request_id") == item_id for i in items):
                return None  # the call it asked for stands for it
            answer = _answer(items, item_id)
            if answer is True:
                return None  # run by this request's engine before the first turn
            output = DECLINED if answer is False else AWAITING
            return call, {"type": "function_call_output", "call_id": item_id, "output": output}
        return call, {"type": "function_call_output", "call_id": item_id, "output": _model_text(item)}


async def _load_sdk() -> None:
    """Import the mcp SDK's client (half a second) off the event loop, once, on first use."""
    if "mcp.client.streamable_http" not in sys.modules:
        await asyncio.to_thread(importlib.import_module, "mcp.client.streamable_http")
        await asyncio.to_thread(importlib.import_module, "mcp.client.sse")


def _answer(items: list[JSON], request_id: str) -> bool | None:
    """The client's answer to an approval request: approve, decline, or none yet (the latest wins)."""
    found: bool | None = None
    for item in items:
        if item.get("type") == "mcp_approval_response" and item.get("approval_request_id") == request_id:
            found = bool(item.get("approve"))
    return found


def _model_text(item: JSON) -> str:
    output, error = item.get("output"), item.get("error")
    if isinstance(output, str):
        return output
    if isinstance(error, dict):
        content = error.get("content")
        if isinstance(content, list):
            texts = [
                str(c["text"]) for c in content if isinstance(c, dict) and isinstance(c.get("text"), str)
            ]
            return "Error: " + ("\n".join(texts) or json.dumps(content))
        return f"Error: {error.get('message') or json.dumps(error)}"
    if error:
        return f"Error: {error}"
    return "(no output)"


def protocol_error(code: int, message: str) -> JSON:
    """An ``mcp_call.error``: the MCP server (or the gateway speaking for it) refused the call."""
    return {"type": "mcp_protocol_error", "code": code, "message": message}


def http_error(code: int, message: str) -> JSON:
    """An ``mcp_call.error``: the server could not be reached, or answered with an HTTP error."""
    return {"type": "http_error", "code": code, "message": message}


def _function(name: str, label: str, description: str | None, schema: Any) -> JSON:
    parameters = schema if isinstance(schema, dict) and schema.get("type") == "object" else {"type": "object"}
    about = f"A tool of the MCP server '{label}'."
    return {
        "type": "function",
        "name": function_name_for(label, name),
        "description": f"{description}\n\n({about})" if description else about,
        "parameters": parameters,
        "strict": False,
    }


def _headers(config: JSON, param: str) -> dict[str, str]:
    out: dict[str, str] = {}
    headers = config.get("headers")
    if headers is not None:
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise RequestError("'headers' must map header names to strings.", param=f"{param}.headers")
        if (
            len(headers) > _MAX_HEADERS
            or sum(len(k) + len(v) for k, v in headers.items()) > _MAX_HEADER_BYTES
        ):
            raise RequestError("'headers' is too large.", param=f"{param}.headers")
        for key, value in headers.items():
            if not re.match(r"^[!#$%&'*+.^_`|~0-9a-zA-Z-]+$", key) or any(c in value for c in "\r\n\0"):
                raise RequestError("'headers' holds an invalid header.", param=f"{param}.headers")
            out[key] = value
    token = config.get("authorization")
    if token is not None:
        if not isinstance(token, str) or len(token) > _MAX_HEADER_BYTES or any(c in token for c in "\r\n\0"):
            raise RequestError("'authorization' must be a token string.", param=f"{param}.authorization")
        out["Authorization"] = f"Bearer {token}"
    return out


def _allowed(value: Any, param: str) -> tuple[frozenset[str] | None, bool]:
    """``allowed_tools``: the names kept (None: all) and whether only read-only tools are."""
    if value is None:
        return None, False
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise RequestError("'allowed_tools' must be a list of tool names.", param=param)
        return frozenset(value), False
    if isinstance(value, dict):
        names = value.get("tool_names")
        if names is not None and not (isinstance(names, list) and all(isinstance(v, str) for v in names)):
            raise RequestError("'tool_names' must be a list of tool names.", param=f"{param}.tool_names")
        return (None if names is None else frozenset(names)), bool(value.get("read_only"))
    raise RequestError("'allowed_tools' must be a list of names or a filter object.", param=param)


@dataclass(frozen=True, slots=True)
class _Approval:
    """``require_approval``: "always" (OpenAI's default), "never", or filters naming tools."""

    default: bool
    always: frozenset[str] = frozenset()
    never: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, value: Any, param: str) -> _Approval:
        if value is None or value == "always":
            return cls(True)
        if value == "never":
            return cls(False)
        if not isinstance(value, dict) or set(value) - {"always", "never"}:
            raise RequestError(
                "'require_approval' must be 'always', 'never' or {\"always\": …, \"never\": …}.", param=param
            )
        sets: dict[str, frozenset[str]] = {}
        for key in ("always", "never"):
            spec = value.get(key) or {}
            names = spec.get("tool_names") if isinstance(spec, dict) else None
            if not isinstance(spec, dict) or not (
                names is None or (isinstance(names, list) and all(isinstance(n, str) for n in names))
            ):
                raise RequestError("'tool_names' must be a list of tool names.", param=f"{param}.{key}")
            sets[key] = frozenset(names or ())
        # Tools a filter does not name need approval, unless the only filter lists those that do.
        default = not (value.get("always") is not None and value.get("never") is None)
        return cls(default, sets["always"], sets["never"])

    def required(self, name: str) -> bool:
        if name in self.never:
            return False
        return True if name in self.always else self.default


class McpFailure(Exception):
    """One MCP operation failed; the message is safe to show (no headers, no URL query), ``error``
    the ``mcp_call.error`` object that says it."""

    def __init__(self, error: JSON) -> None:
        super().__init__(str(error["message"]))
        self.error = error


class _Use(HostedUse):
    tool: McpTool

    def __init__(
        self,
        tool: McpTool,
        label: str,
        url: str,
        headers: dict[str, str],
        guard: NetGuard | None,
        transport: str,
        allowed: tuple[frozenset[str] | None, bool],
        approval: _Approval,
    ) -> None:
        self.tool = tool
        self.label = label
        self._url = url
        self._headers = headers
        self._guard = guard
        self._transport = transport
        self._allowed, self._read_only = allowed
        self._approval = approval
        self.listed: list[JSON] | None = None  # the server's tools (None: to be listed)
        self._approved: list[JSON] = []  # approval requests the client approved, not yet run
        # The request's session with the server (see ``_run``) and the operations waiting for it.
        self._session: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[tuple[Any, Any]] = asyncio.Queue()

    # ------------------------------------------------------------------ the request side
    def adopt(self, history: list[JSON]) -> None:
        """Reuse the latest tool list for this label in the conversation; find approved calls."""
        for item in reversed(history):
            if item.get("type") == "mcp_list_tools" and item.get("server_label") == self.label:
                tools = item.get("tools")
                if not item.get("error") and isinstance(tools, list):
                    self.listed = [t for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]
                break
        done = {i.get("approval_request_id") for i in history if i.get("type") == "mcp_call"}
        for item in history:
            if (
                item.get("type") == "mcp_approval_request"
                and item.get("server_label") == self.label
                and item.get("id") not in done
                and _answer(history, str(item.get("id"))) is True
            ):
                self._approved.append(item)

    def _offered(self) -> list[JSON]:
        out = []
        for t in self.listed or []:
            if self._allowed is not None and t["name"] not in self._allowed:
                continue
            if self._read_only and not (t.get("annotations") or {}).get("readOnlyHint"):
                continue
            out.append(t)
        return out

    def spec(self) -> HostedSpec:
        return HostedSpec("mcp_call")

    def specs(self) -> dict[str, HostedSpec]:
        out: dict[str, HostedSpec] = {}
        for t in self._offered():
            name = t["name"]
            if self._approval.required(name):
                fields: JSON = {"arguments": "", "name": name, "server_label": self.label}
                out[function_name_for(self.label, name)] = HostedSpec("mcp_approval_request", fields)
            else:
                fields = {
                    "approval_request_id": None,
                    "arguments": "",
                    "error": None,
                    "name": name,
                    "output": None,
                    "server_label": self.label,
                }
                out[function_name_for(self.label, name)] = HostedSpec("mcp_call", fields)
        return out

    def functions(self) -> list[JSON]:
        return [
            _function(t["name"], self.label, t.get("description"), t.get("input_schema"))
            for t in self._offered()
        ]

    def claims(self, name: str) -> bool:
        return name.startswith(f"mcp__{self.label}__")

    def identity(self) -> str:
        return f"The MCP server_label {self.label!r}"

    # ------------------------------------------------------------------ before the first turn
    async def prepare(
        self, builder: StreamBuilder, ctx: RunContext, extra: list[JSON]
    ) -> AsyncGenerator[None, None]:
        if self.listed is None:
            item = builder.open_tool_call(
                "mcp_list_tools", with_status=False, server_label=self.label, tools=[], error=None
            )
            yield
            try:
                self.listed = await self._run(self._list, self.tool.limits.list_timeout)
            except McpFailure as exc:
                why = self._scrub(str(exc))
                log.warning("MCP server %r: listing its tools failed: %s", self.label, why)
                builder.close_tool_call(item, status="failed", error=why)
                self.listed = []
            else:
                builder.close_tool_call(item, status="completed", tools=self._offered())
            yield
        for request in self._approved:
            name = str(request.get("name"))
            arguments = request.get("arguments") if isinstance(request.get("arguments"), str) else "{}"
            assert isinstance(arguments, str)
            item = builder.open_tool_call(
                "mcp_call",
                approval_request_id=request.get("id"),
                arguments=arguments,
                error=None,
                name=name,
                output=None,
                server_label=self.label,
            )
            yield
            await self._call(item, builder, name, arguments)
            yield
            fn = function_name_for(self.label, name)
            extra.append({"type": "function_call", "call_id": item.id, "name": fn, "arguments": arguments})
            extra.append(
                {"type": "function_call_output", "call_id": item.id, "output": _model_text(item.data)}
            )
        self._approved = []

    def _scrub(self, text: str) -> str:
        """``text`` without the credentials this request sent the server (a server may echo them)."""
        for value in self._headers.values():
            for secret in (value, value.removeprefix("Bearer ")):
                if len(secret) >= 4 and secret in text:
                    text = text.replace(secret, "[redacted]")
        return text

    # ------------------------------------------------------------------ calls
    async def run(
        self, call: HostedCall, item: Item, builder: StreamBuilder, ctx: RunContext
    ) -> AsyncIterator[None]:
        await self._call(item, builder, str(item.data["name"]), call.arguments)
        yield

    def skip(self, call: HostedCall, item: Item, builder: StreamBuilder, why: str) -> None:
        builder.close_tool_call(item, status="incomplete", error=protocol_error(_NOT_RUN, why))

    async def _call(self, item: Item, builder: StreamBuilder, name: str, arguments: str) -> None:
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            error = protocol_error(_INVALID_PARAMS, "The arguments are not a JSON object.")
            builder.close_tool_call(item, status="failed", error=error)
            return
        limits = self.tool.limits

        async def call(client: Client) -> tuple[str, bool]:
            result = await client.call_tool(name, args)
            return _result_text(result), bool(getattr(result, "is_error", False))

        try:
            text, is_error = await self._run(call, limits.call_timeout)
        except McpFailure as exc:
            error = exc.error
            if isinstance(error.get("message"), str):
                error = {**error, "message": self._scrub(error["message"])}
            builder.close_tool_call(item, status="failed", error=error)
            return
        text = _cap(self._scrub(clean_text(text)), limits.output_chars)
        if is_error:
            content = [{"type": "text", "text": text or "The tool failed."}]
            error = {"type": "mcp_tool_execution_error", "content": content}
            builder.close_tool_call(item, status="failed", error=error)
        else:
            builder.close_tool_call(item, status="completed", output=text)

    async def _list(self, client: Client) -> list[JSON]:
        tools: list[JSON] = []
        cursor: str | None = None
        limit = self.tool.limits.max_tools
        for _ in range(64):  # pages
            page = await client.list_tools(cursor=cursor)
            for t in page.tools:
                tools.append(
                    {
                        "name": t.name,
                        "description": t.description,
                        "input_schema": t.input_schema,
                        "annotations": None
                        if t.annotations is None
                        else t.annotations.model_dump(by_alias=True, exclude_none=True),
                    }
                )
            cursor = page.next_cursor
            if cursor is None or len(tools) >= limit:
                break
        if len(tools) > limit:
            log.warning(
                "MCP server %r lists %d tools; the first %d are offered", self.label, len(tools), limit
            )
        return tools[:limit]

    async def _run(self, op: Callable[[Client], Awaitable[Any]], timeout: float) -> Any:
        """``op`` on this request's session with the server, within ``timeout`` seconds.

        The session lives in a task of its own (the ``mcp`` client's task groups and cancel scopes
        stay inside it) and serves the request's operations one at a time, so a listing and the calls
        after it share one connection and handshake. Whatever the server does, the request moves
        on: an operation that times out drops the session (the next one opens a new session), and a
        session that dies fails the operation it was serving."""
        if self._session is None or self._session.done():
            self._session = asyncio.create_task(self._serve())
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((op, future))
        session = self._session
        try:
            await asyncio.wait({future, session}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the request was cancelled (client gone, stop): so is the session
            self._drop()
            raise
        if future.done():
            try:
                return future.result()
            except Exception as exc:
                raise McpFailure(_describe(exc)) from None
        if session.done():
            failure = None if session.cancelled() else session.exception()
            self._drop()
            raise McpFailure(_describe(failure or RuntimeError("the MCP session ended")))
        self._drop()
        raise McpFailure(http_error(504, f"The MCP server did not answer within {timeout:g} seconds."))

    async def _serve(self) -> None:
        from mcp.shared.exceptions import MCPError

        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(self._client(stack))
            while True:
                op, future = await self._queue.get()
                if op is None:
                    return
                try:
                    result = await op(client)
                except Exception as exc:
                    if not future.done():
                        future.set_exception(exc)
                    if not isinstance(exc, MCPError):
                        raise  # a transport failure: this session is done
                else:
                    if not future.done():
                        future.set_result(result)

    def _drop(self) -> None:
        """Abandon the session (cancelled, left to unwind in its task); pending operations fail."""
        session, self._session = self._session, None
        if session is not None and not session.done():
            session.cancel()
        if session is not None:
            session.add_done_callback(_swallow)
        self._queue = asyncio.Queue()

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        session.add_done_callback(_swallow)
        if not session.done():
            self._queue.put_nowait((None, None))
            try:
                await asyncio.wait_for(asyncio.shield(session), _CLOSE_TIMEOUT)
            except (TimeoutError, Exception):
                session.cancel()

    def _client(self, stack: contextlib.AsyncExitStack) -> Client:
        from mcp.client import Client
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client

        guard = self._guard
        limits = self.tool.limits
        timeout = httpx2.Timeout(min(30.0, limits.call_timeout), read=limits.call_timeout)
        sse = self._transport == "sse" or (
            self._transport == "auto" and urlsplit(self._url).path.rstrip("/").endswith("/sse")
        )
        if sse:

            def factory(
                headers: dict[str, str] | None = None,
                timeout: httpx2.Timeout | None = None,
                auth: httpx2.Auth | None = None,
            ) -> httpx2.AsyncClient:
                return guarded_client(guard, headers, timeout, auth)

            transport = sse_client(
                self._url,
                headers=dict(self._headers),
                timeout=min(30.0, limits.call_timeout),
                sse_read_timeout=limits.call_timeout,
                httpx_client_factory=factory,
            )
        else:
            http = guarded_client(guard, dict(self._headers), timeout)
            stack.push_async_callback(http.aclose)
            transport = streamable_http_client(
                self._url, http_client=http, max_sse_event_size=limits.max_event_bytes
            )
        return Client(transport, mode="legacy", cache=None)


def _swallow(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _describe(exc: BaseException) -> JSON:
    """What went wrong as an ``mcp_call.error``, in words safe to show: never headers, never the
    URL's query."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, httpx2.HTTPStatusError):
        status = exc.response.status_code
        return http_error(status, f"The MCP server answered HTTP {status}.")
    if isinstance(exc, httpx2.ConnectError):
        reason = str(exc)
        if "does not connect" in reason or "allow-list" in reason:
            return http_error(502, f"The MCP server cannot be reached: {reason}.")
        return http_error(502, "The MCP server cannot be reached.")
    if isinstance(exc, httpx2.TimeoutException):
        return http_error(504, "The MCP server timed out.")
    if isinstance(exc, httpx2.HTTPError):
        return http_error(502, f"The connection to the MCP server failed ({type(exc).__name__}).")
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        return protocol_error(
            exc.error.code, f"The MCP server refused the request: {exc.error.message[:500]}"
        )
    name = type(exc).__name__
    log.warning("MCP operation failed: %s", name, exc_info=exc)
    return protocol_error(_INTERNAL, f"The MCP operation failed ({name}).")


def _result_text(result: Any) -> str:
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
        else:
            parts.append(block.model_dump_json(by_alias=True, exclude_none=True))
    if not parts:
        structured = getattr(result, "structured_content", None)
        if structured is not None:
            return json.dumps(structured, ensure_ascii=False)
    return "\n".join(parts)


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[… output truncated: {len(text) - limit} more characters not shown]"
