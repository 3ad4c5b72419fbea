"""Anthropic Messages API back end: Responses requests in, Responses events out.

The request is translated to one streamed ``POST /v1/messages`` (see :func:`build_messages_body`);
the upstream SSE stream is decoded incrementally and drives the :class:`StreamBuilder` block by block
(see :class:`_Turn`). docs/providers/anthropic.md is the user-facing description of every mapping and
judgment call; the short version:

- ``thinking`` blocks become reasoning items whose summary streams the thinking text; the block itself
  (thinking text + signature, byte for byte) travels in ``encrypted_content`` as an envelope and is
  sent back unmodified next turn. ``redacted_thinking`` becomes a reasoning item with an empty summary.
- ``tool_use`` becomes ``function_call`` (``call_id`` is the ``toolu_`` id), or ``custom_tool_call``
  for tools declared ``type: "custom"`` (sent to Anthropic as a tool taking one string ``input``).
- server tools become built-in call items: web_search/web_fetch -> ``web_search_call``, code
  execution -> ``code_interpreter_call``, MCP -> ``mcp_call``.
- ``citations_delta`` in a text block becomes ``url_citation`` annotations spanning that block's text.
- ``pause_turn`` is continued on the server: the paused content is sent back as the assistant turn
  and the new stream continues the same Response (at most ``max_continuations`` times).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from ..protocol.builder import Item, StreamBuilder
from ..protocol.request import JSON, ResponseRequest
from ..protocol.sse import SSEMessage
from .base import Capabilities, ProviderError
from .custom_tools import InputStream
from .http_base import HTTPProvider
from .transport import Timeouts, Transport, UpstreamResponse
from .upstream_errors import from_error_payload, translate

__all__ = [
    "ANTHROPIC_VERSION",
    "EFFORT_BUDGETS",
    "AnthropicProvider",
    "Sealer",
    "build_messages_body",
    "decode_reasoning_state",
    "encode_reasoning_state",
    "message_events",
]

log = logging.getLogger("responses_gateway.anthropic")

ANTHROPIC_VERSION = "2023-06-01"

# reasoning.effort -> thinking.budget_tokens. Anthropic's minimum budget is 1024; "none" turns thinking
# off. The steps roughly double, as OpenAI's efforts do in practice.
EFFORT_BUDGETS: dict[str, int] = {
    "minimal": 1024,
    "low": 2048,
    "medium": 8192,
    "high": 16384,
    "xhigh": 32768,
}
MIN_BUDGET = 1024

WEB_SEARCH_TOOLS = frozenset(
    {"web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26"}
)
SUPPORTED_TOOLS = frozenset({"function", "custom", *WEB_SEARCH_TOOLS})

# What /v1/messages/count_tokens takes of a Messages body.
_COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers"})

# The envelope marker for reasoning state that is not sealed (see encode_reasoning_state).
_STATE_PREFIX = "rgant1."
_TOOL_ID_BAD = re.compile(r"[^a-zA-Z0-9_-]")
_DATA_URL = re.compile(r"^data:([^;,]+)?((?:;[^;,]*)*?);base64,(.*)$", re.S)

ThinkingOutput = Literal["summary", "reasoning_text", "none"]


class Sealer(Protocol):
    """What this module needs of :class:`responses_gateway.sealing.Sealer`."""

    def seal(self, payload: Any, *, context: str = "") -> str: ...

    def unseal(self, sealed: str, *, context: str = "") -> Any: ...

    def is_sealed(self, value: object) -> bool: ...


# ---------------------------------------------------------------------------------------- reasoning state
def encode_reasoning_state(block: JSON, sealer: Sealer | None = None) -> str:
    """``encrypted_content`` for a thinking/redacted_thinking block: the block verbatim, enveloped.

    Without a sealer the envelope is base64url JSON: the client can read the thinking text (it is the
    summary anyway) but cannot alter it unnoticed, since Anthropic checks the signature. A sealer hides
    it as well (AES-GCM, see responses_gateway.sealing).
    """
    if sealer is not None:
        return sealer.seal(block)
    return _STATE_PREFIX + base64.urlsafe_b64encode(orjson.dumps(block)).decode("ascii").rstrip("=")


def decode_reasoning_state(value: Any, sealer: Sealer | None = None) -> JSON | None:
    """The thinking block inside ``encrypted_content``, or None if it is not ours (another back end's)."""
    if not isinstance(value, str):
        return None
    block: Any = None
    if sealer is not None and sealer.is_sealed(value):
        try:
            block = sealer.unseal(value)
        except ValueError:
            raise ProviderError(
                "A reasoning item's encrypted_content could not be verified.",
                status=400,
                code="invalid_encrypted_content",
                type="invalid_request_error",
            ) from None
    elif value.startswith(_STATE_PREFIX):
        raw = value[len(_STATE_PREFIX) :]
        try:
            block = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        except (ValueError, binascii.Error):
            return None
    if not isinstance(block, dict):
        return None
    if block.get("type") == "thinking" and isinstance(block.get("signature"), str):
        return {
            "type": "thinking",
            "thinking": str(block.get("thinking", "")),
            "signature": block["signature"],
        }
    if block.get("type") == "redacted_thinking" and isinstance(block.get("data"), str):
        return {"type": "redacted_thinking", "data": block["data"]}
    return None


# ---------------------------------------------------------------------------------------- request
@dataclass(slots=True)
class _Messages:
    """Anthropic messages under construction: same-role turns merge, tool results lead user turns."""

    messages: list[JSON] = field(default_factory=list)

    def add(self, role: str, blocks: list[JSON]) -> None:
        if not blocks:
            return
        last = self.messages[-1] if self.messages else None
        if last is None or last["role"] != role:
            last = {"role": role, "content": []}
            self.messages.append(last)
        content: list[JSON] = last["content"]
        for block in blocks:
            if block["type"] == "tool_result":
                # Anthropic wants every tool_result before any other block of the user turn.
                at = next((i for i, b in enumerate(content) if b["type"] != "tool_result"), len(content))
                content.insert(at, block)
            else:
                content.append(block)


def _tool_id(call_id: Any) -> str:
    """A call id in the form Anthropic accepts (``^[a-zA-Z0-9_-]+$``), mapped the same way both ways."""
    text = str(call_id or "call")
    return _TOOL_ID_BAD.sub("_", text)


def _wire_name(name: Any) -> str:
    """A tool name in the form Anthropic accepts (``^[a-zA-Z0-9_-]{1,128}$``); Responses also allows dots."""
    return _TOOL_ID_BAD.sub("_", str(name))[:128]


def _data_url(url: str) -> tuple[str, str] | None:
    match = _DATA_URL.match(url)
    if match is None:
        return None
    return (match.group(1) or "application/octet-stream"), match.group(3)


def _image_block(part: JSON, param: str) -> JSON:
    url = part.get("image_url")
    if not isinstance(url, str):
        raise ProviderError(
            "Images by file_id are not supported by this back end; send image_url (a URL or data URL).",
            status=400,
            code="unsupported_value",
            type="invalid_request_error",
            param=f"{param}.file_id",
        )
    decoded = _data_url(url)
    if decoded is not None:
        media_type, data = decoded
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _file_block(part: JSON, param: str) -> JSON:
    block: JSON
    data = part.get("file_data")
    if isinstance(data, str):
        decoded = _data_url(data)
        media_type, b64 = decoded if decoded is not None else ("application/pdf", data)
        if media_type.startswith("text/"):
            try:
                text = base64.b64decode(b64).decode("utf-8")
            except (ValueError, binascii.Error):
                raise ProviderError(
                    "input_file.file_data is not valid base64 text.",
                    status=400,
                    code="invalid_value",
                    type="invalid_request_error",
                    param=f"{param}.file_data",
                ) from None
            block = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}}
        else:
            block = {"type": "document", "source": {"type": "base64", "media_type": media_type, "data": b64}}
    elif isinstance(part.get("file_url"), str):
        block = {"type": "document", "source": {"type": "url", "url": part["file_url"]}}
    else:
        raise ProviderError(
            "Files by file_id are not supported by this back end; send file_data or file_url.",
            status=400,
            code="unsupported_value",
            type="invalid_request_error",
            param=f"{param}.file_id",
        )
    if isinstance(part.get("filename"), str) and part["filename"]:
        block["title"] = part["filename"]
    return block


def _user_blocks(parts: list[JSON], param: str) -> list[JSON]:
    blocks: list[JSON] = []
    for j, part in enumerate(parts):
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            if part.get("text"):
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            if part.get("refusal"):
                blocks.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image":
            blocks.append(_image_block(part, f"{param}[{j}]"))
        elif kind == "input_file":
            blocks.append(_file_block(part, f"{param}[{j}]"))
    return blocks


def _tool_result_content(output: Any, param: str) -> str | list[JSON]:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        blocks = _user_blocks([p for p in output if isinstance(p, dict)], param)
        return blocks if blocks else ""
    return orjson.dumps(output).decode()


def _tool_input(arguments: Any) -> JSON:
    """A function call's arguments as the object Anthropic's ``tool_use.input`` must be."""
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        value = None
    # Anthropic only takes an object; a malformed or non-object value (a model's mistake that the
    # client echoes back) is wrapped rather than failing every later turn of the conversation.
    return value if isinstance(value, dict) else {"input": arguments}


def _system_text(parts: list[JSON]) -> str:
    return "\n\n".join(p["text"] for p in parts if p.get("type") == "input_text" and p.get("text"))


def _convert_input(items: list[JSON], sealer: Sealer | None) -> tuple[list[str], list[JSON]]:
    """System texts and Anthropic messages for the Responses input items."""
    system: list[str] = []
    out = _Messages()
    for i, item in enumerate(items):
        kind = item.get("type")
        param = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            content = item.get("content") or []
            if role in ("system", "developer"):
                text = _system_text(content)
                if text:
                    system.append(text)
            elif role == "assistant":
                out.add("assistant", _user_blocks(content, f"{param}.content"))
            else:
                out.add("user", _user_blocks(content, f"{param}.content"))
        elif kind == "reasoning":
            block = decode_reasoning_state(item.get("encrypted_content"), sealer)
            # Reasoning from another back end (or sent back by id only) cannot be replayed to
            # Anthropic, which verifies signatures: it is dropped rather than failing the request.
            if block is not None:
                out.add("assistant", [block])
        elif kind == "function_call":
            call = {
                "type": "tool_use",
                "id": _tool_id(item.get("call_id")),
                "name": _wire_name(item.get("name", "")),
                "input": _tool_input(item.get("arguments")),
            }
            out.add("assistant", [call])
        elif kind == "custom_tool_call":
            call = {
                "type": "tool_use",
                "id": _tool_id(item.get("call_id")),
                "name": _wire_name(item.get("name", "")),
                "input": {"input": item.get("input", "")},
            }
            out.add("assistant", [call])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            result: JSON = {
                "type": "tool_result",
                "tool_use_id": _tool_id(item.get("call_id")),
                "content": _tool_result_content(item.get("output"), f"{param}.output"),
            }
            if result["content"] == "":
                del result["content"]
            out.add("user", [result])
        # Other items (built-in tool calls, item references) carry nothing Anthropic can take back.
    return system, out.messages


def _function_tool(tool: JSON, strict: bool) -> JSON:
    out: JSON = {"name": _wire_name(tool["name"])}
    if tool.get("description"):
        out["description"] = tool["description"]
    params = tool.get("parameters")
    out["input_schema"] = (
        params if isinstance(params, dict) and params else {"type": "object", "properties": {}}
    )
    if strict and tool.get("strict"):
        out["strict"] = True
    return out


def _custom_tool(tool: JSON) -> JSON:
    texts = [tool.get("description") or ""]
    fmt = tool.get("format") or {}
    if fmt.get("type") == "grammar":
        # Anthropic has no grammar-constrained input; the grammar is given to the model as guidance.
        texts.append(f"The input must match this {fmt.get('syntax')} grammar:\n{fmt.get('definition', '')}")
    description = "\n\n".join(t for t in texts if t)
    out: JSON = {"name": _wire_name(tool["name"])}
    if description:
        out["description"] = description
    out["input_schema"] = {
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The raw input for the tool."}},
        "required": ["input"],
    }
    return out


def _web_search_tool(tool: JSON, max_uses: int | None) -> JSON:
    out: JSON = {"type": "web_search_20250305", "name": "web_search"}
    if max_uses is not None:
        out["max_uses"] = max_uses
    filters = tool.get("filters") or {}
    if isinstance(filters, dict) and filters.get("allowed_domains"):
        out["allowed_domains"] = list(filters["allowed_domains"])
    location = tool.get("user_location")
    if isinstance(location, dict):
        loc = {"type": "approximate"}
        loc.update({k: location[k] for k in ("city", "region", "country", "timezone") if location.get(k)})
        if len(loc) > 1:
            out["user_location"] = loc
    return out


def _tool_choice(choice: str | JSON, parallel: bool) -> tuple[JSON | None, set[str] | None]:
    """Anthropic's tool_choice (None: leave the default) and, for allowed_tools, the names to keep."""
    allowed: set[str] | None = None
    out: JSON
    if isinstance(choice, str):
        out = {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    elif choice["type"] in ("function", "custom"):
        out = {"type": "tool", "name": _wire_name(choice["name"])}
    elif choice["type"] in WEB_SEARCH_TOOLS:
        out = {"type": "tool", "name": "web_search"}
    elif choice["type"] == "allowed_tools":
        out = {"type": "any" if choice.get("mode") == "required" else "auto"}
        allowed = set()
        for tool in choice.get("tools") or []:
            allowed.add(tool.get("name") or ("web_search" if tool.get("type") in WEB_SEARCH_TOOLS else ""))
    else:
        out = {"type": "auto"}
    if not parallel and out["type"] != "none":
        out["disable_parallel_tool_use"] = True
    if out == {"type": "auto"}:
        return None, allowed
    return out, allowed


@dataclass(frozen=True, slots=True)
class _Options:
    upstream_model: str | None = None
    default_max_tokens: int = 8192
    strict_tools: bool = False
    default_effort: str | None = None
    prompt_caching: bool = False


def _mark_cache_breakpoints(body: JSON, ttl: str | None) -> None:
    """Cache the stable prefix: the system prompt, the tool list and the conversation so far.

    Anthropic caches up to each block carrying ``cache_control`` (at most four); an agent loop resends
    the same prefix every turn, so marking its end makes every later turn read it from cache.
    """
    control: JSON = {"type": "ephemeral"}
    if ttl is not None:
        control["ttl"] = ttl
    if isinstance(body.get("system"), str):
        body["system"] = [{"type": "text", "text": body["system"], "cache_control": control}]
    if body.get("tools"):
        body["tools"][-1] = {**body["tools"][-1], "cache_control": control}
    for message in reversed(body["messages"]):
        content = message["content"]
        # Thinking blocks cannot carry cache_control; the last other block of the last turn can.
        at = next((i for i in range(len(content) - 1, -1, -1) if "thinking" not in content[i]["type"]), None)
        if at is not None:
            content[at] = {**content[at], "cache_control": control}
            break


def _tool_loop_keeps_thinking(messages: list[JSON]) -> bool:
    """False when the last turn answers tool calls of an assistant turn that has no thinking first."""
    if len(messages) < 2:
        return True
    answer, turn = messages[-1], messages[-2]
    if answer.get("role") != "user" or turn.get("role") != "assistant":
        return True
    results, blocks = answer.get("content"), turn.get("content")
    if not isinstance(results, list) or not isinstance(blocks, list) or not blocks:
        return True
    if not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in results):
        return True
    if not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks):
        return True
    first = blocks[0]
    return isinstance(first, dict) and first.get("type") in ("thinking", "redacted_thinking")


def _thinking_budget(request: ResponseRequest, opts: _Options) -> int | None:
    effort = (request.reasoning or {}).get("effort") or opts.default_effort
    if effort is None or effort == "none":
        return None
    return EFFORT_BUDGETS.get(effort, EFFORT_BUDGETS["medium"])


def build_messages_body(
    request: ResponseRequest, *, sealer: Sealer | None = None, options: Any = None
) -> JSON:
    """The ``/v1/messages`` body (streamed) for a Responses request."""
    opts = options or _Options()
    system, messages = _convert_input(request.input, sealer)
    if request.instructions:
        system.insert(0, request.instructions)
    body: JSON = {"model": opts.upstream_model or request.model}

    budget = _thinking_budget(request, opts)
    forced = False
    tools: list[JSON] = []
    choice, allowed = (
        _tool_choice(request.tool_choice, request.parallel_tool_calls) if request.tools else (None, None)
    )
    if choice is not None and choice["type"] in ("any", "tool"):
        # Anthropic rejects extended thinking with a forced tool; the forced call wins.
        forced = True
    for tool in request.tools:
        name = tool.get("name") or ("web_search" if tool["type"] in WEB_SEARCH_TOOLS else "")
        if allowed is not None and name not in allowed:
            continue
        if tool["type"] == "function":
            tools.append(_function_tool(tool, opts.strict_tools))
        elif tool["type"] == "custom":
            tools.append(_custom_tool(tool))
        elif tool["type"] in WEB_SEARCH_TOOLS:
            tools.append(_web_search_tool(tool, request.max_tool_calls))
    if forced:
        budget = None
    if budget is not None and not _tool_loop_keeps_thinking(messages):
        # A client that dropped or stripped the reasoning item (pitfall 19) sends the tool results of
        # an assistant turn without its thinking block; Anthropic refuses that with thinking on ("a
        # final assistant message must start with a thinking block"), so this turn goes without it.
        budget = None

    if request.max_output_tokens is not None:
        max_tokens = request.max_output_tokens
        if budget is not None:
            # max_tokens counts thinking too and must exceed the budget.
            budget = min(budget, max_tokens - 1)
            if budget < MIN_BUDGET:
                budget = None
    else:
        max_tokens = opts.default_max_tokens + (budget or 0)
    body["max_tokens"] = max_tokens
    if system:
        body["system"] = "\n\n".join(system)
    body["messages"] = messages
    if tools:
        body["tools"] = tools
    if choice is not None and tools:
        body["tool_choice"] = choice
    if budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    else:
        # Anthropic's temperature runs 0-1 and newer models refuse temperature together with top_p;
        # with thinking on, both must be left unset.
        if request.temperature is not None:
            body["temperature"] = min(request.temperature, 1.0)
        elif request.top_p is not None:
            body["top_p"] = request.top_p
    fmt = request.text.get("format") or {}
    if fmt.get("type") == "json_schema":
        body["output_config"] = {"format": {"type": "json_schema", "schema": fmt["schema"]}}
    user = request.safety_identifier or request.user
    if user:
        body["metadata"] = {"user_id": user}
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    if opts.prompt_caching:
        # "24h" is beyond Anthropic's longest cache lifetime; its 1h tier is the closest honest match.
        _mark_cache_breakpoints(body, "1h" if request.prompt_cache_retention == "24h" else None)
    body["stream"] = True
    return body


# ---------------------------------------------------------------------------------------- stream
@dataclass(slots=True)
class _Block:
    """One upstream content block in flight: its item handle and what its deltas carry."""

    kind: str
    raw: JSON
    item: Item | None = None
    buf: list[str] = field(default_factory=list)
    start: int = 0
    citations: list[JSON] = field(default_factory=list)
    custom: InputStream | None = None  # a custom tool's input, decoded as its JSON streams


_CODE_TOOLS = frozenset({"code_execution", "bash_code_execution", "text_editor_code_execution"})
_CODE_RESULTS = frozenset(
    {
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
    }
)


def _usage_totals(usage: JSON) -> tuple[int, int, int, int, int]:
    """(input incl. cache, output, cache read, cache write, thinking) from an Anthropic usage object."""

    def num(value: Any) -> int:
        return int(value) if isinstance(value, int | float) else 0

    cache_read = num(usage.get("cache_read_input_tokens"))
    cache_write = num(usage.get("cache_creation_input_tokens"))
    details = usage.get("output_tokens_details")
    thinking = num(details.get("thinking_tokens")) if isinstance(details, dict) else 0
    return (
        num(usage.get("input_tokens")) + cache_read + cache_write,
        num(usage.get("output_tokens")),
        cache_read,
        cache_write,
        thinking,
    )


class _Turn:
    """Translates one Response's worth of upstream streams (several when pause_turn continues)."""

    def __init__(
        self,
        builder: StreamBuilder,
        request: ResponseRequest,
        sealer: Sealer | None,
        thinking_output: ThinkingOutput,
    ) -> None:
        self.b = builder
        self.sealer = sealer
        self.thinking_output = thinking_output
        self.custom_tools = {t["name"] for t in request.tools if t.get("type") == "custom"}
        # Names changed on the way up (dots…) are restored on the way back.
        self.tool_names = {_wire_name(t["name"]): t["name"] for t in request.tools if t.get("name")}
        self.include_sources = "web_search_call.action.sources" in request.include
        self.emitted = False  # any builder call made (then errors end the stream instead of raising)
        self.dirty = False  # builder calls since the last yield
        self.message: Item | None = None
        self.text_len = 0
        self.blocks: dict[int, _Block] = {}
        self.server_calls: dict[str, tuple[Item, JSON]] = {}
        self.totals = [0, 0, 0, 0, 0]
        self.usage: JSON = {}
        self.stop_reason: str | None = None
        self.stop_details: Any = None
        self.done = False  # message_stop arrived
        # Read by HTTPProvider; an error event raises instead (see fail).
        self.error: ProviderError | None = None
        self.continuations = 0  # pause_turn continuations sent
        self.content: list[JSON] = []  # this request's blocks, verbatim, for a pause_turn continuation

    # ------------------------------------------------------------------ per request
    def begin_request(self) -> None:
        self.blocks.clear()
        self.content = []
        self.usage = {}
        self.stop_reason = None
        self.stop_details = None
        self.done = False

    def end_request(self) -> None:
        for i, value in enumerate(_usage_totals(self.usage)):
            self.totals[i] += value

    def apply_usage(self, *, partial: bool = False) -> None:
        """Report the usage of every upstream call; ``partial`` adds the call that broke off."""
        totals = list(self.totals)
        if partial:
            totals = [a + b for a, b in zip(totals, _usage_totals(self.usage), strict=True)]
        inp, out, cached, written, thinking = totals
        self.b.set_usage(
            inp, out, cached_tokens=cached, reasoning_tokens=thinking, cache_write_tokens=written
        )

    def fail(self, exc: ProviderError) -> None:
        """End the response with ``exc``, or raise it while no builder call was made (then it is still
        an HTTP error, which a fallback can act on)."""
        if not self.emitted:
            raise exc
        # What the upstream billed before it failed is still worth reporting.
        self.apply_usage(partial=True)
        self.b.fail(exc.code or "server_error", exc.message)

    def _touch(self) -> None:
        self.emitted = True
        self.dirty = True

    # ------------------------------------------------------------------ events
    def on_event(self, data: JSON) -> None:
        kind = data.get("type")
        if kind == "content_block_delta":
            self._delta(data.get("index", -1), data.get("delta") or {})
        elif kind == "content_block_start":
            self._start(data.get("index", -1), data.get("content_block") or {})
        elif kind == "content_block_stop":
            self._stop(data.get("index", -1))
        elif kind == "message_start":
            message = data.get("message") or {}
            if isinstance(message.get("usage"), dict):
                self.usage = dict(message["usage"])
        elif kind == "message_delta":
            delta = data.get("delta") or {}
            self.stop_reason = delta.get("stop_reason") or self.stop_reason
            if self.stop_reason == "stop_sequence" and isinstance(delta.get("stop_sequence"), str):
                # Which of the request's stop sequences ended the turn, for the Messages front end.
                self.b.stopped_by = delta["stop_sequence"]
            self.stop_details = delta.get("stop_details") or self.stop_details
            # Usage in message_delta is cumulative: it replaces, never adds (pitfall 10).
            if isinstance(data.get("usage"), dict):
                self.usage.update({k: v for k, v in data["usage"].items() if v is not None})
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            raise from_error_payload(data)
        # ping and unknown event types carry nothing for the client.

    def _close_message(self) -> None:
        if self.message is not None:
            self.b.close_message(self.message)
            self.message = None
            self._touch()

    def _start(self, index: int, block: JSON) -> None:
        kind = str(block.get("type", ""))
        raw = dict(block)
        self.content.append(raw)
        state = _Block(kind, raw)
        self.blocks[index] = state
        if kind == "text":
            # The message opens with the first text, so an empty text block leaves no empty item.
            state.start = self.text_len if self.message is not None else 0
            raw["text"] = ""
            raw.pop("citations", None)
            if block.get("text"):
                self._text(state, block["text"])
            return
        if kind in ("thinking", "redacted_thinking", "tool_use", "server_tool_use", "mcp_tool_use"):
            self._close_message()
        self._touch()
        if kind == "thinking":
            raw["thinking"] = ""
            raw.setdefault("signature", "")
            state.item = self.b.open_reasoning()
            if block.get("thinking"):
                self._thinking(state, block["thinking"])
        elif kind == "redacted_thinking":
            data = {"type": "redacted_thinking", "data": block.get("data", "")}
            state.item = self.b.open_reasoning(encrypted_content=encode_reasoning_state(data, self.sealer))
        elif kind == "tool_use":
            name = str(block.get("name", ""))
            name = self.tool_names.get(name, name)
            call_id = str(block.get("id", "")) or None
            if name in self.custom_tools:
                state.kind = "custom_tool_use"
                state.item = self.b.open_custom_tool_call(name, call_id=call_id)
                state.custom = InputStream()
            else:
                state.item = self.b.open_function_call(name, call_id=call_id)
        elif kind == "server_tool_use":
            self._server_tool_start(state, block)
        elif kind == "mcp_tool_use":
            state.item = self.b.open_tool_call(
                "mcp_call",
                name=block.get("name", ""),
                server_label=block.get("server_name", ""),
                arguments="",
            )
            self.server_calls[str(block.get("id", ""))] = (state.item, {})
        elif kind.endswith("_tool_result"):
            self._server_tool_result(block)
        else:
            log.debug("anthropic: ignoring content block type %r", kind)

    def _server_tool_start(self, state: _Block, block: JSON) -> None:
        name = str(block.get("name", ""))
        if name in ("web_search", "web_fetch"):
            state.item = self.b.open_tool_call("web_search_call")
        elif name in _CODE_TOOLS:
            state.item = self.b.open_tool_call(
                "code_interpreter_call", code="", container_id="", outputs=None
            )
        else:
            state.item = None
            return
        self.server_calls[str(block.get("id", ""))] = (state.item, {"name": name})

    def _delta(self, index: int, delta: JSON) -> None:
        state = self.blocks.get(index)
        if state is None:
            return
        kind = delta.get("type")
        if kind == "text_delta":
            self._text(state, str(delta.get("text", "")))
        elif kind == "citations_delta":
            citation = delta.get("citation")
            if isinstance(citation, dict):
                state.citations.append(citation)
                state.raw.setdefault("citations", []).append(citation)
        elif kind == "thinking_delta":
            self._thinking(state, str(delta.get("thinking", "")))
        elif kind == "signature_delta":
            # The signature is assigned, never appended: it arrives whole.
            state.raw["signature"] = str(delta.get("signature", ""))
        elif kind == "input_json_delta":
            fragment = str(delta.get("partial_json", ""))
            if not fragment:
                return
            state.buf.append(fragment)
            # Function and MCP arguments stream through, a custom tool's input string as it decodes;
            # server tool inputs are parsed whole.
            if state.item is None:
                return
            if state.kind in ("tool_use", "mcp_tool_use"):
                self.b.arguments_delta(state.item, fragment)
                self._touch()
            elif state.custom is not None:
                text = state.custom.feed(fragment)
                if text:
                    self.b.custom_input_delta(state.item, text)
                    self._touch()

    def _text(self, state: _Block, text: str) -> None:
        if not text:
            return
        if self.message is None:
            self.message = self.b.open_message()
            self.text_len = 0
            state.start = 0
        state.raw["text"] += text
        self.b.text_delta(self.message, text)
        self.text_len += len(text)
        self._touch()

    def _thinking(self, state: _Block, text: str) -> None:
        if not text or state.item is None:
            return
        state.raw["thinking"] += text
        if self.thinking_output == "summary":
            self.b.summary_delta(state.item, text)
        elif self.thinking_output == "reasoning_text":
            self.b.reasoning_delta(state.item, text)
        self._touch()

    def _stop(self, index: int) -> None:
        state = self.blocks.get(index)
        if state is None:
            return
        kind = state.kind
        item = state.item
        if kind == "text":
            self._annotate(state)
            return
        if kind in ("tool_use", "custom_tool_use", "server_tool_use", "mcp_tool_use"):
            args = "".join(state.buf)
            parsed = _parse_object(args)
            if parsed is None:
                initial = state.raw.get("input")
                parsed = initial if isinstance(initial, dict) else {}
                if not args and parsed:
                    args = orjson.dumps(parsed).decode()
            state.raw["input"] = parsed
            if item is None:
                return
            if kind == "tool_use":
                if not state.buf and args:
                    self.b.arguments_delta(item, args)
                self.b.close_function_call(item)
            elif kind == "custom_tool_use":
                if state.buf and state.custom is not None:
                    rest = state.custom.finish()
                else:  # the input came whole in content_block_start
                    value = parsed.get("input")
                    rest = value if isinstance(value, str) else (args or "")
                self.b.custom_input_delta(item, rest)
                self.b.close_custom_tool_call(item)
            elif kind == "mcp_tool_use":
                if not state.buf and args:
                    self.b.arguments_delta(item, args)
            else:
                self._server_tool_input(item, state, parsed)
            self._touch()
        elif kind == "thinking" and item is not None:
            block = {
                "type": "thinking",
                "thinking": state.raw["thinking"],
                "signature": state.raw["signature"],
            }
            self.b.set_encrypted_content(item, encode_reasoning_state(block, self.sealer))
            self.b.close_reasoning(item)
            self._touch()
        elif kind == "redacted_thinking" and item is not None:
            self.b.close_reasoning(item)
            self._touch()

    def _server_tool_input(self, item: Item, state: _Block, parsed: JSON) -> None:
        call_id = str(state.raw.get("id", ""))
        _, info = self.server_calls.get(call_id, (item, {}))
        info["input"] = parsed
        if item.kind == "web_search_call":
            self.b.tool_progress(item, "searching")
        elif item.kind == "code_interpreter_call":
            # code_execution runs ``code``, bash_code_execution a ``command``; the text editor's
            # input is structured (command, path, file_text), so it is shown as its JSON.
            if info.get("name") == "text_editor_code_execution":
                code: Any = orjson.dumps(parsed).decode()
            else:
                code = parsed.get("code") or parsed.get("command") or ""
            if isinstance(code, str) and code:
                self.b.code_delta(item, code)
            self.b.tool_progress(item, "interpreting")

    def _server_tool_result(self, block: JSON) -> None:
        key = str(block.get("tool_use_id", ""))
        found = self.server_calls.pop(key, None)
        if found is None:
            return
        item, info = found
        content = block.get("content")
        failed = isinstance(content, dict) and str(content.get("type", "")).endswith("_error")
        status = "failed" if failed else "completed"
        params = info.get("input") or {}
        if item.kind == "web_search_call":
            action: JSON
            if info.get("name") == "web_fetch":
                action = {"type": "open_page", "url": params.get("url")}
            else:
                action = {"type": "search", "query": params.get("query", "")}
                if self.include_sources and isinstance(content, list):
                    action["sources"] = [
                        {"type": "url", "url": r["url"]}
                        for r in content
                        if isinstance(r, dict) and isinstance(r.get("url"), str)
                    ]
            self.b.close_tool_call(item, status=status, action=action)
        elif item.kind == "code_interpreter_call":
            logs = _code_logs(content)
            outputs = [{"type": "logs", "logs": logs}] if logs else []
            self.b.close_tool_call(item, status=status, outputs=outputs)
        elif item.kind == "mcp_call":
            text = _result_text(content)
            if block.get("is_error"):
                self.b.close_tool_call(item, status="failed", error=text, output=None)
            else:
                self.b.close_tool_call(item, status="completed", output=text, error=None)
        self._touch()

    def _annotate(self, state: _Block) -> None:
        if self.message is None or not state.raw["text"]:
            return
        for citation in state.citations:
            url = citation.get("url")
            # Document citations (char/page locations) name no URL; they have no Responses analogue.
            if citation.get("type") != "web_search_result_location" or not isinstance(url, str):
                continue
            annotation = {
                "type": "url_citation",
                "end_index": self.text_len,
                "start_index": state.start,
                "title": citation.get("title") or "",
                "url": url,
            }
            self.b.annotation(self.message, annotation)
            self._touch()

    # ------------------------------------------------------------------ finishing
    def finish(self) -> None:
        """Set usage and end the Response according to the last stop_reason."""
        for item, info in self.server_calls.values():
            # A server tool the turn stopped before answering (max_tokens, pause_turn): it ends
            # incomplete, still saying what it was asked.
            params = info.get("input") or {}
            if item.kind == "web_search_call" and info.get("name") == "web_fetch":
                self.b.close_tool_call(
                    item, status="incomplete", action={"type": "open_page", "url": params.get("url")}
                )
            elif item.kind == "web_search_call":
                self.b.close_tool_call(
                    item, status="incomplete", action={"type": "search", "query": params.get("query", "")}
                )
            else:
                self.b.close_item(item, status="incomplete")
        self.server_calls.clear()
        self.apply_usage()
        reason = self.stop_reason
        if reason == "refusal":
            details = self.stop_details if isinstance(self.stop_details, dict) else {}
            explanation = details.get("explanation") or "The model declined to respond to this request."
            message = self.message or self.b.open_message()
            self.message = None
            self.b.refusal_delta(message, str(explanation))
            self.b.close_message(message, status="incomplete")
            self.b.incomplete("content_filter")
        elif reason in ("max_tokens", "model_context_window_exceeded", "pause_turn"):
            self.b.incomplete("max_output_tokens")
        else:
            self.b.complete()
        self._touch()


def _parse_object(text: str) -> JSON | None:
    if not text:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return orjson.dumps(content).decode() if content is not None else ""


def _code_logs(content: Any) -> str:
    if not isinstance(content, dict):
        return ""
    parts = [content.get(k) for k in ("stdout", "stderr", "content")]
    if content.get("type") == "text_editor_code_execution_create_result":
        return "File created." if not content.get("is_file_update") else "File updated."
    return "".join(p for p in parts if isinstance(p, str))


# ---------------------------------------------------------------------------------------- provider
class AnthropicProvider(HTTPProvider[_Turn]):
    """A Claude model behind the Anthropic Messages API (or a compatible endpoint)."""

    name = "anthropic"
    capabilities = Capabilities(
        streaming=True,
        tools=True,
        parallel_tool_calls=True,
        reasoning=True,
        structured_output=True,
        images=True,
        tool_types=frozenset(SUPPORTED_TOOLS),
        file_inputs="documents",
    )

    def __init__(
        self,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: str | None = None,
        upstream_model: str | None = None,
        transport: Transport | None = None,
        timeouts: Timeouts | None = None,
        default_max_tokens: int = 8192,
        default_effort: str | None = None,
        thinking_output: ThinkingOutput = "summary",
        strict_tools: bool = False,
        betas: Iterable[str] = (),
        extra_headers: dict[str, str] | None = None,
        max_continuations: int = 4,
        sealer: Sealer | None = None,
        prompt_caching: bool = False,
    ) -> None:
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            upstream_model=upstream_model,
            transport=transport,
            timeouts=timeouts,
            extra_headers=extra_headers,
            upstream_name="Anthropic",
        )
        self._options = _Options(
            upstream_model, default_max_tokens, strict_tools, default_effort, prompt_caching
        )
        self._thinking_output: ThinkingOutput = thinking_output
        self._betas = tuple(betas)
        self._max_continuations = max_continuations
        self._sealer = sealer

    @property
    def url(self) -> str:
        base = self.base_url
        return base + ("/messages" if base.endswith("/v1") else "/v1/messages")

    def endpoint(self, request: ResponseRequest) -> str:
        return self.url

    async def count_input_tokens(self, request: ResponseRequest) -> int:
        """Anthropic's ``/v1/messages/count_tokens`` on the body a request would send."""
        body = {k: v for k, v in self.build_body(request).items() if k in _COUNT_FIELDS}
        return await self.count_with(self.url + "/count_tokens", body, "input_tokens")

    def headers(self) -> dict[str, str]:
        """Request headers (the key among them: never log this)."""
        out = {"anthropic-version": ANTHROPIC_VERSION, "accept": "text/event-stream"}
        if self._api_key:
            out["x-api-key"] = self._api_key
        if self._betas:
            out["anthropic-beta"] = ",".join(self._betas)
        out.update(self._extra_headers)
        return out

    def check_request(self, request: ResponseRequest) -> None:
        for i, tool in enumerate(request.tools):
            if tool.get("type") not in SUPPORTED_TOOLS:
                raise _unsupported(
                    f"Tool type '{tool.get('type')}' is not supported by the Anthropic back end.",
                    f"tools[{i}].type",
                )
            if tool["type"] in WEB_SEARCH_TOOLS and tool.get("external_web_access") is False:
                # Codex's cached-only search; this back end only searches the live web.
                raise _unsupported(
                    "Web search without live access ('external_web_access': false) is not available "
                    "from the Anthropic back end; send true or leave it out.",
                    f"tools[{i}].external_web_access",
                )
        choice = request.tool_choice
        if isinstance(choice, dict) and choice.get("type") not in (
            "function",
            "custom",
            "allowed_tools",
            *WEB_SEARCH_TOOLS,
        ):
            raise _unsupported(
                f"tool_choice '{choice.get('type')}' is not supported here.", "tool_choice.type"
            )
        fmt = request.text.get("format") or {}
        if fmt.get("type") == "json_object":
            raise _unsupported(
                "text.format 'json_object' is not supported by the Anthropic back end; use 'json_schema'.",
                "text.format.type",
            )
        if request.top_logprobs:
            raise _unsupported("Log probabilities are not available from Anthropic.", "top_logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(request, name):
                raise _unsupported(f"'{name}' is not available from Anthropic; leave it out or send 0.", name)
        # Input conversion raises ProviderError(400) for what it cannot send (file ids...).
        _convert_input(request.input, self._sealer)

    def build_body(self, request: ResponseRequest) -> JSON:
        """The upstream request body."""
        return build_messages_body(request, sealer=self._sealer, options=self._options)

    def translator(self, request: ResponseRequest, builder: StreamBuilder) -> _Turn:
        return _Turn(builder, request, self._sealer, self._thinking_output)

    def replay(self, turn: _Turn, body: Any) -> None:
        # An endpoint (or proxy) that ignored ``stream: true`` answered with a whole Message.
        for event in message_events(body):
            turn.on_event(event)

    def dispatcher(self) -> Callable[[_Turn, SSEMessage], None]:
        return _dispatch

    async def follow_up(self, turn: _Turn, body: JSON) -> tuple[UpstreamResponse, JSON] | None:
        """A ``pause_turn`` is continued (up to ``max_continuations`` times) with the paused content
        appended as the assistant's turn; the usage of every request adds up."""
        if not turn.done:
            raise ProviderError(
                "The Anthropic stream ended before message_stop.", status=502, code="server_error"
            )
        turn.end_request()
        if turn.stop_reason != "pause_turn" or turn.continuations >= self._max_continuations:
            return None
        turn.continuations += 1
        body = _continue_body(body, turn.content)
        resp = await self.open(self.url, body)
        turn.begin_request()
        return resp, body


def message_events(message: Any) -> list[JSON]:
    """The stream events equivalent to a non-streamed Message body (so one translator serves both)."""
    if not isinstance(message, dict) or message.get("type") != "message":
        raise ProviderError(
            "Anthropic answered with an unexpected JSON body.", status=502, code="server_error"
        )
    events: list[JSON] = [{"type": "message_start", "message": {**message, "content": []}}]
    for index, block in enumerate(message.get("content") or []):
        kind = block.get("type")
        deltas: list[JSON] = []
        start = dict(block)
        if kind == "text":
            start["text"] = ""
            start.pop("citations", None)
            deltas = [{"type": "citations_delta", "citation": c} for c in block.get("citations") or []]
            deltas.append({"type": "text_delta", "text": block.get("text", "")})
        elif kind == "thinking":
            start.update(thinking="", signature="")
            deltas = [
                {"type": "thinking_delta", "thinking": block.get("thinking", "")},
                {"type": "signature_delta", "signature": block.get("signature", "")},
            ]
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            start["input"] = {}
            deltas = [
                {"type": "input_json_delta", "partial_json": orjson.dumps(block.get("input") or {}).decode()}
            ]
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    delta = {k: message.get(k) for k in ("stop_reason", "stop_sequence", "stop_details")}
    events.append({"type": "message_delta", "delta": delta, "usage": message.get("usage") or {}})
    events.append({"type": "message_stop"})
    return events


def _dispatch(turn: _Turn, msg: SSEMessage) -> None:
    try:
        payload = orjson.loads(msg.data)
    except orjson.JSONDecodeError:
        return
    if isinstance(payload, dict):
        translate(turn.on_event, payload)


def _continue_body(body: JSON, content: list[JSON]) -> JSON:
    """The request that resumes a paused turn: the paused content appended as the assistant's turn."""
    blocks = [
        {k: v for k, v in block.items() if v is not None}
        for block in content
        if not (block.get("type") == "text" and not block.get("text"))
    ]
    messages = [dict(m) for m in body["messages"]]
    if messages and messages[-1]["role"] == "assistant":
        messages[-1] = {"role": "assistant", "content": [*messages[-1]["content"], *blocks]}
    else:
        messages.append({"role": "assistant", "content": blocks})
    return {**body, "messages": messages}


def _unsupported(message: str, param: str) -> ProviderError:
    return ProviderError(
        message, status=400, code="unsupported_parameter", type="invalid_request_error", param=param
    )
