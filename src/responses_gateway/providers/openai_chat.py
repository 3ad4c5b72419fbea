"""Chat Completions back end: any ``POST /chat/completions`` server behind the Responses API.

One provider serves OpenAI, Azure, vLLM, Ollama, llama.cpp server, LM Studio, OpenRouter, DeepSeek,
Groq, xAI, Mistral and the like. The request is translated by :func:`build_chat_body` (the
:class:`ChatDialect` holds what differs between those servers); the streamed chunks drive the
:class:`StreamBuilder` through :class:`ChatTranslator`. docs/providers/openai-chat.md describes every
mapping and judgment call; the short version:

- ``delta.content`` (a string, or Mistral's array of ``text``/``thinking`` parts) -> message text;
  ``delta.refusal`` -> a refusal part; ``delta.annotations`` (OpenRouter) -> ``url_citation``.
- ``reasoning_content`` (DeepSeek, llama.cpp, xAI, Z.ai), ``reasoning`` (vLLM, Ollama, Groq,
  OpenRouter) and ``reasoning_details`` (OpenRouter) -> one reasoning item whose summary streams the
  text. The text, the field it came in and OpenRouter's details (with their signatures) travel in
  ``encrypted_content`` and go back in the same field next turn (DeepSeek refuses tool loops without
  its ``reasoning_content``).
- a ``custom`` tool (Codex's ``apply_patch``) goes up as a function taking one string ``input``; its
  calls come back as ``custom_tool_call`` items whose input streams out of the argument deltas.
- tool-call fragments are keyed by ``index``; a new ``id`` at a known index starts a new call (servers
  that repeat index 0); the name is set once; a call whose name comes later waits for it.
- nothing is final before ``[DONE]`` (or the end of the body): usage arrives after ``finish_reason``.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson

from ..protocol.builder import Item, StreamBuilder
from ..protocol.json_holes import StringHoles
from ..protocol.native import mypyc_attr
from ..protocol.request import JSON, ResponseRequest
from ..protocol.sse import SSEMessage
from .base import Capabilities, ProviderError
from .custom_tools import (
    InputStream,
    custom_arguments,
    custom_description,
    custom_parameters,
    custom_tool_names,
)
from .http_base import HTTPProvider
from .transport import Timeouts, Transport
from .upstream_errors import from_error_payload, from_http, malformed_event, redact_url, translate

__all__ = [
    "ChatDialect",
    "ChatTranslator",
    "OpenAIChatProvider",
    "build_chat_body",
    "completion_chunks",
    "decode_reasoning_state",
    "encode_reasoning_state",
]

log = logging.getLogger("responses_gateway.openai_chat")

ReasoningOutput = Literal["summary", "reasoning_text", "none"]
ReasoningField = Literal["reasoning_content", "reasoning", "reasoning_details"]
MaxTokensField = Literal["auto", "max_tokens", "max_completion_tokens"]
EffortStyle = Literal["reasoning_effort", "reasoning", "none"]
Passback = Literal["auto", "reasoning_content", "reasoning", "none"]
StructuredOutput = Literal["json_schema", "json_object_schema"]
NamedToolChoice = Literal["object", "only_tool"]

_STATE_PREFIX = "rgchat1."
# The stop sequences a Chat Completions upstream takes (OpenAI's limit).
MAX_NATIVE_STOP = 4
_REASONING_FIELDS: tuple[ReasoningField, ...] = ("reasoning_content", "reasoning")
# Hosts whose servers understand only max_completion_tokens for reasoning models (and accept it for all).
_COMPLETION_TOKENS_HOSTS = ("api.openai.com", ".openai.azure.com", ".azure.com")


@dataclass(frozen=True, slots=True)
class ChatDialect:
    """What differs between Chat Completions servers; the defaults suit OpenAI and most others."""

    # Role of the leading instructions message ("developer" for OpenAI reasoning models if preferred).
    system_role: Literal["system", "developer"] = "system"
    # "auto": max_completion_tokens for OpenAI/Azure hosts, max_tokens for everything else.
    max_tokens_field: MaxTokensField = "auto"
    # How reasoning.effort is sent: OpenAI/DeepSeek/Groq/xAI take reasoning_effort; OpenRouter and
    # Ollama take reasoning: {effort}.
    effort_style: EffortStyle = "reasoning_effort"
    # Reasoning sent back on assistant turns: "auto" uses the field it arrived in (only for reasoning
    # this gateway produced); a field name always sends the text there; "none" drops it.
    reasoning_passback: Passback = "auto"
    # Some servers reject stream_options.
    include_usage: bool = True
    # Merged into every request body last (e.g. {"options": {...}} for Ollama, provider routing).
    extra_body: JSON = field(default_factory=dict)
    # How a text.format json_schema is sent: OpenAI's {"type": "json_schema", "json_schema": {...}},
    # or {"type": "json_object", "schema": {...}} (llama-cpp-python's server rejects json_schema).
    structured_output: StructuredOutput = "json_schema"
    # How tool_choice {type: function, name} is sent: OpenAI's object, or (servers that take only
    # "auto"/"none"/"required") "required" with only that tool offered.
    named_tool_choice: NamedToolChoice = "object"


# The Chat Completions servers people run locally, as dialects (the models file's ``dialect:``); any
# field a model also sets itself wins over its preset.
DIALECT_PRESETS: dict[str, dict[str, Any]] = {
    "openai": {},
    # llama.cpp's llama-server: tool_choice only as a string; no reasoning effort.
    "llama.cpp": {"named_tool_choice": "only_tool", "effort_style": "none", "max_tokens_field": "max_tokens"},
    # llama-cpp-python's server (python -m llama_cpp.server): JSON schemas as json_object + schema.
    "llama-cpp-python": {
        "structured_output": "json_object_schema",
        "effort_style": "none",
        "max_tokens_field": "max_tokens",
    },
    # Ollama's /v1: reasoning as {effort}; tool_choice is ignored there, so a named choice offers one tool.
    "ollama": {
        "named_tool_choice": "only_tool",
        "effort_style": "reasoning",
        "max_tokens_field": "max_tokens",
    },
    "vllm": {"max_tokens_field": "max_tokens"},
    "lm-studio": {"named_tool_choice": "only_tool", "effort_style": "none", "max_tokens_field": "max_tokens"},
}


# ---------------------------------------------------------------------------------------- reasoning state
def encode_reasoning_state(state: JSON) -> str:
    """``encrypted_content`` for reasoning from a chat upstream: its text, field and details, enveloped."""
    return _STATE_PREFIX + base64.urlsafe_b64encode(orjson.dumps(state)).decode("ascii").rstrip("=")


def decode_reasoning_state(value: Any) -> JSON | None:
    """The state inside an ``encrypted_content`` this module produced, else None (another back end's)."""
    if not isinstance(value, str) or not value.startswith(_STATE_PREFIX):
        return None
    raw = value[len(_STATE_PREFIX) :]
    try:
        state = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error):
        return None
    return state if isinstance(state, dict) else None


def _reasoning_text_of(item: JSON) -> str:
    parts = [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)]
    if not any(parts):
        parts = [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
    return "\n\n".join(p for p in parts if isinstance(p, str) and p)


# ---------------------------------------------------------------------------------------- request
def _unsupported(message: str, param: str) -> ProviderError:
    return ProviderError(
        message, status=400, code="unsupported_parameter", type="invalid_request_error", param=param
    )


def _text_of(parts: list[JSON]) -> str:
    return "".join(str(p.get("text", "")) for p in parts if p.get("type") in ("input_text", "output_text"))


def _user_content(parts: list[JSON], param: str) -> str | list[JSON]:
    """A user turn's content: a plain string when it is one text part (every server takes that)."""
    if len(parts) == 1 and parts[0].get("type") == "input_text":
        return str(parts[0].get("text", ""))
    out: list[JSON] = []
    for j, part in enumerate(parts):
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            out.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise _unsupported(
                    "Images by file_id are not supported by this back end; send image_url.",
                    f"{param}[{j}].file_id",
                )
            image: JSON = {"url": url}
            if part.get("detail") in ("low", "high"):
                image["detail"] = part["detail"]
            out.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            file: JSON = {}
            for key in ("file_data", "file_id", "filename"):
                if isinstance(part.get(key), str):
                    file[key] = part[key]
            if not ({"file_data", "file_id"} & set(file)):
                raise _unsupported(
                    "Files by URL are not supported by Chat Completions; send file_data.",
                    f"{param}[{j}].file_url",
                )
            out.append({"type": "file", "file": file})
    return out


def _tool_output(output: Any, param: str) -> str | list[JSON]:
    if isinstance(output, str):
        return output
    parts = [p for p in output if isinstance(p, dict)] if isinstance(output, list) else []
    if all(p.get("type") == "input_text" for p in parts):
        return _text_of(parts)
    content = _user_content(parts, param)
    return content


class _Conversation:
    """Chat messages under construction: assistant text, reasoning and tool calls of a turn merge."""

    def __init__(self, dialect: ChatDialect) -> None:
        self.messages: list[JSON] = []
        self.dialect = dialect
        # The assistant message the next assistant-side items join (None after any other message).
        self._assistant: JSON | None = None
        self._reasoning: list[JSON] = []

    def other(self, message: JSON) -> None:
        self._flush_reasoning()
        self.messages.append(message)
        self._assistant = None

    def assistant(self) -> JSON:
        if self._assistant is None:
            self._assistant = {"role": "assistant", "content": None}
            self.messages.append(self._assistant)
        if self._reasoning:
            self._attach(self._assistant)
        return self._assistant

    def reasoning(self, item: JSON) -> None:
        self._reasoning.append(item)

    def _flush_reasoning(self) -> None:
        # Reasoning with nothing after it in its turn (the turn ended) cannot be attached to anything.
        self._reasoning = []

    def _attach(self, message: JSON) -> None:
        mode = self.dialect.reasoning_passback
        texts: list[str] = []
        details: list[Any] = []
        target: str | None = None
        for item in self._reasoning:
            state = decode_reasoning_state(item.get("encrypted_content"))
            text = str(state.get("text", "")) if state is not None else _reasoning_text_of(item)
            if mode == "auto":
                if state is None:
                    continue
                target = str(state.get("field") or "reasoning_content")
            if state is not None and isinstance(state.get("details"), list):
                details.extend(state["details"])
            if text:
                texts.append(text)
        self._reasoning = []
        if mode == "none":
            return
        field_name = target if mode == "auto" else mode
        if field_name is None:
            return
        if field_name == "reasoning_details":
            if details:
                message["reasoning_details"] = details
            elif texts:
                message["reasoning"] = "".join(texts)
            return
        if texts:
            message[field_name] = "".join(texts)
        if details and field_name == "reasoning":
            message["reasoning_details"] = details

    def finish(self) -> list[JSON]:
        self._flush_reasoning()
        return self.messages


def _convert_input(items: list[JSON], dialect: ChatDialect) -> list[JSON]:
    conv = _Conversation(dialect)
    for i, item in enumerate(items):
        kind = item.get("type")
        param = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            parts: list[JSON] = item.get("content") or []
            if role in ("system", "developer"):
                # Most servers know no "developer" role; it is kept only where the dialect says so.
                developer = role == "developer" and dialect.system_role == "developer"
                conv.other({"role": "developer" if developer else "system", "content": _text_of(parts)})
            elif role == "assistant":
                message = conv.assistant()
                text = _text_of(parts)
                if text:
                    message["content"] = (message["content"] or "") + text
                refusal = "".join(str(p.get("refusal", "")) for p in parts if p.get("type") == "refusal")
                if refusal:
                    message["refusal"] = refusal
            else:
                conv.other({"role": "user", "content": _user_content(parts, f"{param}.content")})
        elif kind == "reasoning":
            conv.reasoning(item)
        elif kind == "function_call":
            message = conv.assistant()
            message.setdefault("tool_calls", []).append(
                {
                    "id": str(item.get("call_id")),
                    "type": "function",
                    "function": {
                        "name": str(item.get("name", "")),
                        "arguments": item.get("arguments") or "{}",
                    },
                }
            )
        elif kind == "custom_tool_call":
            # A custom tool is a function with one string argument upstream (see _custom_tool).
            message = conv.assistant()
            message.setdefault("tool_calls", []).append(
                {
                    "id": str(item.get("call_id")),
                    "type": "function",
                    "function": {
                        "name": str(item.get("name", "")),
                        "arguments": custom_arguments(item.get("input")),
                    },
                }
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            conv.other(
                {
                    "role": "tool",
                    "tool_call_id": str(item.get("call_id")),
                    "content": _tool_output(item.get("output"), f"{param}.output"),
                }
            )
        # Built-in tool call items from another back end carry nothing a chat server can take back.
    return conv.finish()


def _function_tool(tool: JSON) -> JSON:
    function: JSON = {"name": tool["name"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    if tool.get("strict") is not None:
        function["strict"] = bool(tool["strict"])
    return {"type": "function", "function": function}


def _custom_tool(tool: JSON) -> JSON:
    """A custom tool as a function taking its input as one string (its grammar described, not enforced)."""
    function: JSON = {"name": tool["name"]}
    description = custom_description(tool)
    if description:
        function["description"] = description
    function["parameters"] = custom_parameters()
    return {"type": "function", "function": function}


def _tools_and_choice(request: ResponseRequest, dialect: ChatDialect) -> tuple[list[JSON], str | JSON | None]:
    tools = [t for t in request.tools if t.get("type") in ("function", "custom")]
    choice = request.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        # Portable form of allowed_tools: only the allowed functions are offered at all.
        allowed = {t.get("name") for t in choice.get("tools") or [] if isinstance(t, dict)}
        tools = [t for t in tools if t["name"] in allowed]
        choice = str(choice.get("mode") or "auto")
    elif isinstance(choice, dict) and dialect.named_tool_choice == "only_tool":
        tools = [t for t in tools if t["name"] == choice.get("name")]
        choice = "required"
    wire: str | JSON | None
    if isinstance(choice, dict):
        wire = {"type": "function", "function": {"name": choice.get("name")}}
    else:
        wire = None if choice == "auto" else choice
    return [_custom_tool(t) if t["type"] == "custom" else _function_tool(t) for t in tools], wire


def _max_tokens_field(dialect: ChatDialect, base_url: str) -> str:
    if dialect.max_tokens_field != "auto":
        return dialect.max_tokens_field
    host = redact_url(base_url).split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    if any(host == h or (h.startswith(".") and host.endswith(h)) for h in _COMPLETION_TOKENS_HOSTS):
        return "max_completion_tokens"
    return "max_tokens"


def build_chat_body(
    request: ResponseRequest,
    *,
    upstream_model: str | None = None,
    dialect: ChatDialect | None = None,
    base_url: str = "",
) -> JSON:
    """The Chat Completions request body for ``request``."""
    dialect = dialect or ChatDialect()
    messages: list[JSON] = []
    if request.instructions:
        messages.append({"role": dialect.system_role, "content": request.instructions})
    messages.extend(_convert_input(request.input, dialect))
    body: JSON = {"model": upstream_model or request.model, "messages": messages, "stream": True}
    if dialect.include_usage:
        body["stream_options"] = {"include_usage": True}
    tools, choice = _tools_and_choice(request, dialect)
    if tools:
        body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
        if not request.parallel_tool_calls:
            body["parallel_tool_calls"] = False
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.presence_penalty is not None:
        body["presence_penalty"] = request.presence_penalty
    if request.frequency_penalty is not None:
        body["frequency_penalty"] = request.frequency_penalty
    if request.max_output_tokens is not None:
        body[_max_tokens_field(dialect, base_url)] = request.max_output_tokens
    if request.stop and len(request.stop) <= MAX_NATIVE_STOP:
        # More than Chat Completions takes (a Messages client's): the engine alone enforces them.
        body["stop"] = list(request.stop)
    if request.seed is not None:
        body["seed"] = request.seed
    fmt = request.text.get("format") or {}
    if fmt.get("type") == "json_schema":
        schema: JSON = {"name": fmt.get("name") or "response", "schema": fmt.get("schema") or {}}
        if fmt.get("description"):
            schema["description"] = fmt["description"]
        if fmt.get("strict") is not None:
            schema["strict"] = bool(fmt["strict"])
        if dialect.structured_output == "json_object_schema":
            body["response_format"] = {"type": "json_object", "schema": schema["schema"]}
        else:
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif fmt.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    effort = (request.reasoning or {}).get("effort")
    if effort is not None and dialect.effort_style == "reasoning_effort":
        body["reasoning_effort"] = effort
    elif effort is not None and dialect.effort_style == "reasoning":
        body["reasoning"] = {"effort": effort}
    if request.top_logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = request.top_logprobs
    elif "message.output_text.logprobs" in request.include:
        body["logprobs"] = True
    for name in ("user", "safety_identifier", "prompt_cache_key"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    body.update(dialect.extra_body)
    return body


# ---------------------------------------------------------------------------------------- stream
def _obj(value: Any) -> JSON:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_numbers(usage: JSON) -> tuple[int, int, int, int]:
    """(input, output, cached, reasoning) from a chat ``usage`` object, whatever the server."""
    prompt = _int(usage.get("prompt_tokens"))
    completion = _int(usage.get("completion_tokens"))
    prompt_details = _obj(usage.get("prompt_tokens_details"))
    completion_details = _obj(usage.get("completion_tokens_details"))
    cached = _int(prompt_details.get("cached_tokens")) or _int(usage.get("prompt_cache_hit_tokens"))
    reasoning = _int(completion_details.get("reasoning_tokens"))
    total = _int(usage.get("total_tokens"))
    # xAI counts reasoning outside completion_tokens (total = prompt + completion + reasoning); the
    # Responses output_tokens includes reasoning.
    if reasoning and total == prompt + completion + reasoning and total != prompt + completion:
        completion += reasoning
    return prompt, completion, cached, reasoning


def _search_action(tool: JSON) -> JSON | None:
    """The web_search_call action of a Groq executed tool, or None for tools that are not searches."""
    kind = tool.get("type")
    try:
        arguments = orjson.loads(tool.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        arguments = {}
    arguments = arguments if isinstance(arguments, dict) else {}
    if kind in ("search", "web_search", "browser.search"):
        return {"type": "search", "query": str(arguments.get("query") or "")}
    if kind in ("visit", "browser.open") and isinstance(arguments.get("url"), str):
        return {"type": "open_page", "url": arguments["url"]}
    return None


@dataclass(slots=True)
class _Call:
    """One tool call being assembled from fragments."""

    call_id: str | None
    name: str = ""
    pending: list[str] = field(default_factory=list)
    item: Item | None = None
    # For a custom tool's call: its input, read out of the argument JSON as it streams.
    custom: InputStream | None = None


# The keys of a delta that carries nothing but text (the fast path of ChatTranslator._choice).
_PLAIN_DELTA = frozenset({"content", "role"})
# Where a text chunk's text is, and the strings besides it that change from chunk to chunk (OpenAI's
# ``obfuscation``, random padding): the holes of the chunks' bytes (``ChatTranslator.fast``).
_TEXT_PATH: tuple[str | int, ...] = ("choices", 0, "delta", "content")
_CHANGING: tuple[tuple[str | int, ...], ...] = (("obfuscation",),)
# A stream's chunks are learnt again (their bytes changed elsewhere, e.g. a ``created`` that moves with
# the clock) only after the last learnt shape matched this many; at most this many tries each time.
_RELEARN_AFTER = 16
_LEARN_TRIES = 4


def _logprobs(choice: JSON) -> list[JSON] | None:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not content:
        return None
    out: list[JSON] = []
    for entry in content:
        if not isinstance(entry, dict):
            continue
        out.append(
            {
                "token": entry.get("token", ""),
                "bytes": entry.get("bytes") or [],
                "logprob": entry.get("logprob", 0.0),
                "top_logprobs": [
                    {
                        "token": t.get("token", ""),
                        "bytes": t.get("bytes") or [],
                        "logprob": t.get("logprob", 0.0),
                    }
                    for t in entry.get("top_logprobs") or []
                    if isinstance(t, dict)
                ],
            }
        )
    return out


class ChatTranslator:
    """Chat completion chunks in, StreamBuilder calls out (sans-IO)."""

    def __init__(
        self,
        builder: StreamBuilder,
        reasoning_output: ReasoningOutput = "summary",
        custom_tools: frozenset[str] = frozenset(),
    ) -> None:
        self.b = builder
        self.reasoning_output = reasoning_output
        # Names of the request's custom tools: their calls become custom_tool_call items.
        self.custom_tools = custom_tools
        self.message: Item | None = None
        self.reasoning: Item | None = None
        self._reasoning_text: list[str] = []
        self._reasoning_field: ReasoningField | None = None
        self._rs_active = False
        self._details: dict[Any, JSON] = {}
        self._calls: dict[Any, _Call] = {}
        self._all_calls: list[_Call] = []
        self._executed: dict[Any, Item] = {}
        self.finish_reason: str | None = None
        self.usage: JSON | None = None
        self.error: ProviderError | None = None
        self.done = False
        self.dirty = False
        # The bytes the stream's text chunks repeat (see ``fast``), how many chunks they matched, and
        # how many more plain text chunks may be tried to learn them from.
        self._holes: StringHoles | None = None
        self._matched = 0
        self._learn = _LEARN_TRIES

    # ------------------------------------------------------------------ chunks
    def on_chunk(self, chunk: JSON) -> None:
        """Apply one parsed chunk (``data:`` payload)."""
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        x_groq = chunk.get("x_groq")
        if isinstance(x_groq, dict) and isinstance(x_groq.get("usage"), dict):
            self.usage = x_groq["usage"]
        error = chunk.get("error")
        if error is not None and self.error is None:
            self.error = _stream_error(error)
            return
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            # Only the first choice is ours (n is never sent); others would interleave into our items.
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice)

    def fast(self, event: bytes, data: bytes) -> bool:
        """One whole upstream event (``SSEDecoder.single``) that is a plain text delta into the open
        message: applied here, with what ``_dispatch``, ``on_chunk`` and ``_choice`` would do for it,
        and True. False, with nothing changed, for anything else: the general path takes it then.

        Most chunks of a stream are these; this skips the message object, the text decode and the
        probing of every field the general path looks for. And once one has been parsed, the next ones
        are mostly the same bytes with other text (``protocol.json_holes``): those are matched without
        parsing, and their text's JSON goes into the client's event as it came
        (``StreamBuilder.text_delta_json``).
        """
        message = self.message
        if (
            event
            or message is None
            or not message.open
            or self._rs_active
            or self.reasoning is not None
            or self.done
            or self.error is not None
            or data[:1] != b"{"
        ):
            return False
        holes = self._holes
        if holes is not None:
            text = holes.match(data)
            if text is not None:
                self.b.text_delta_json(message, text[0], text[1])
                self.dirty = True
                self._matched += 1
                return True
            if self._matched >= _RELEARN_AFTER:
                self._holes, self._matched, self._learn = None, 0, _LEARN_TRIES
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if type(chunk) is not dict or chunk.get("usage") is not None or chunk.get("error") is not None:
            return False
        choices = chunk.get("choices")
        if type(choices) is not list or len(choices) != 1 or "x_groq" in chunk:
            return False
        choice = choices[0]
        if (
            type(choice) is not dict
            or choice.get("index", 0) != 0
            or choice.get("finish_reason") is not None
            or choice.get("logprobs") is not None
        ):
            return False
        delta = choice.get("delta")
        if type(delta) is not dict or not _PLAIN_DELTA.issuperset(delta):
            return False
        content = delta.get("content")
        if type(content) is not str or not content:
            return False
        try:
            self.b.text_delta(message, content)
        except ProviderError:
            raise
        except Exception as exc:
            raise malformed_event(exc) from None
        self.dirty = True
        if self._learn:
            # Kept until it stops matching; None (the text had an escape, say): a later chunk is tried.
            self._holes = StringHoles.learn(data, _TEXT_PATH, _CHANGING)
            self._learn = 0 if self._holes is not None else self._learn - 1
        return True

    def _choice(self, choice: JSON) -> None:
        delta: JSON = _obj(choice.get("delta")) or _obj(choice.get("message"))
        content = delta.get("content")
        if _PLAIN_DELTA.issuperset(delta) and not isinstance(content, list):
            # Most chunks of a stream: some text (or just the role), nothing else to look for.
            if isinstance(content, str) and content:
                self._text(content, _logprobs(choice))
        else:
            self._delta(delta, choice)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self.finish_reason = reason

    def _delta(self, delta: JSON, choice: JSON) -> None:
        for name in _REASONING_FIELDS:
            text = delta.get(name)
            if isinstance(text, str) and text:
                self._reasoning_delta(text, name)
                break
        details = delta.get("reasoning_details")
        if isinstance(details, list) and details:
            self._reasoning_details(
                details, has_text=bool(delta.get("reasoning") or delta.get("reasoning_content"))
            )
        content = delta.get("content")
        if isinstance(content, str) and content:
            self._text(content, _logprobs(choice))
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict):
                    self._content_part(part)
        refusal = delta.get("refusal")
        if isinstance(refusal, str) and refusal:
            self.b.refusal_delta(self._message(), refusal)
            self.dirty = True
        annotations = delta.get("annotations")
        if isinstance(annotations, list):
            for annotation in annotations:
                self._annotation(annotation)
        executed = delta.get("executed_tools")
        if isinstance(executed, list):
            for position, tool in enumerate(executed):
                if isinstance(tool, dict):
                    self._executed_tool(position, tool)
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for position, fragment in enumerate(tool_calls):
                if isinstance(fragment, dict):
                    self._tool_fragment(position, fragment)

    def _content_part(self, part: JSON) -> None:
        # Mistral magistral: content is an array of {type:text} and {type:thinking, thinking:[parts]}.
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str) and part["text"]:
            self._text(part["text"], None)
        elif kind == "thinking":
            inner = part.get("thinking")
            pieces = inner if isinstance(inner, list) else [{"type": "text", "text": inner}]
            for piece in pieces:
                text = piece.get("text") if isinstance(piece, dict) else None
                if isinstance(text, str) and text:
                    self._reasoning_delta(text, "reasoning_content")

    # ------------------------------------------------------------------ items
    def _message(self) -> Item:
        self._close_reasoning()
        if self.message is None:
            self.message = self.b.open_message()
        return self.message

    def _text(self, text: str, logprobs: list[JSON] | None) -> None:
        self.b.text_delta(self._message(), text, logprobs)
        self.dirty = True

    def _annotation(self, annotation: Any) -> None:
        if not isinstance(annotation, dict) or annotation.get("type") != "url_citation":
            return
        cite = annotation.get("url_citation")
        cite = cite if isinstance(cite, dict) else annotation
        url = cite.get("url")
        if not isinstance(url, str):
            return
        self.b.annotation(
            self._message(),
            {
                "type": "url_citation",
                "end_index": _int(cite.get("end_index")),
                "start_index": _int(cite.get("start_index")),
                "title": str(cite.get("title") or ""),
                "url": url,
            },
        )
        self.dirty = True

    def _begin_reasoning(self, field_name: ReasoningField) -> None:
        """Start a reasoning segment (and its item, unless reasoning is not shown)."""
        self._rs_active = True
        self._reasoning_text, self._details = [], {}
        self._reasoning_field = field_name
        if self.reasoning_output != "none":
            self._close_message()
            self.reasoning = self.b.open_reasoning()
            self.dirty = True

    def _reasoning_delta(self, text: str, field_name: ReasoningField) -> None:
        if not self._rs_active:
            self._begin_reasoning(field_name)
        self._reasoning_text.append(text)
        item = self.reasoning
        if item is None:
            return
        if self.reasoning_output == "reasoning_text":
            self.b.reasoning_delta(item, text)
        else:
            self.b.summary_delta(item, text)
        self.dirty = True

    def _reasoning_details(self, details: list[Any], *, has_text: bool) -> None:
        """OpenRouter's reasoning_details: kept whole (signatures, encrypted data) to send back."""
        for position, detail in enumerate(details):
            if not isinstance(detail, dict):
                continue
            text = detail.get("text") if detail.get("type") == "reasoning.text" else detail.get("summary")
            if not has_text and isinstance(text, str) and text:
                # Details without a plain ``reasoning`` twin carry the only copy of the text.
                self._reasoning_delta(text, "reasoning_details")
            elif not self._rs_active:
                self._begin_reasoning("reasoning_details")
            key = (detail.get("index", position), detail.get("type"))
            kept = self._details.setdefault(key, {})
            for name, value in detail.items():
                if name == "index" or value is None:
                    continue
                if name in ("text", "summary") and isinstance(value, str):
                    kept[name] = str(kept.get(name) or "") + value
                elif value != "" or name not in kept:
                    kept[name] = value
        if self._details:
            self._reasoning_field = "reasoning_details"

    def _close_reasoning(self) -> None:
        self._rs_active = False
        item, self.reasoning = self.reasoning, None
        if item is None:
            return
        state: JSON = {
            "field": self._reasoning_field or "reasoning_content",
            "text": "".join(self._reasoning_text),
        }
        if self._details:
            state["details"] = list(self._details.values())
        self.b.set_encrypted_content(item, encode_reasoning_state(state))
        self.b.close_reasoning(item)
        self._reasoning_text, self._details, self._reasoning_field = [], {}, None
        self.dirty = True

    def _close_message(self) -> None:
        item, self.message = self.message, None
        if item is not None:
            self.b.close_message(item)
            self.dirty = True

    def _executed_tool(self, position: int, tool: JSON) -> None:
        """Groq compound's server-side searches: a ``web_search_call`` per executed search."""
        index = tool.get("index", position)
        item = self._executed.get(index)
        if item is None:
            action = _search_action(tool)
            if action is None:
                return
            self._close_reasoning()
            self._close_message()
            item = self.b.open_tool_call("web_search_call", action=action)
            self._executed[index] = item
            self.b.tool_progress(item, "searching")
            self.dirty = True
        if tool.get("output") is not None and item.open:
            self.b.close_tool_call(item)
            self.dirty = True

    def _tool_fragment(self, position: int, fragment: JSON) -> None:
        index = fragment.get("index", position)
        call_id = fragment.get("id") if isinstance(fragment.get("id"), str) and fragment.get("id") else None
        call = self._calls.get(index)
        if call is None or (call_id is not None and call.call_id is not None and call_id != call.call_id):
            # A new id at a known index is a new call (servers that number every call 0).
            call = _Call(call_id)
            self._calls[index] = call
            self._all_calls.append(call)
        elif call_id is not None and call.call_id is None:
            call.call_id = call_id
        function = _obj(fragment.get("function"))
        name = function.get("name")
        if isinstance(name, str) and name and not call.name:
            call.name = name
        arguments = function.get("arguments")
        if isinstance(arguments, dict):
            arguments = orjson.dumps(arguments).decode()
        if isinstance(arguments, str) and arguments:
            call.pending.append(arguments)
        if call.item is None and call.name:
            self._close_reasoning()
            self._close_message()
            if call.name in self.custom_tools:
                call.custom = InputStream()
                call.item = self.b.open_custom_tool_call(call.name, call_id=call.call_id)
            else:
                call.item = self.b.open_function_call(call.name, call_id=call.call_id)
            self.dirty = True
        if call.item is not None and call.pending:
            for piece in call.pending:
                if call.custom is not None:
                    self.b.custom_input_delta(call.item, call.custom.feed(piece))
                else:
                    self.b.arguments_delta(call.item, piece)
            call.pending = []
            self.dirty = True

    # ------------------------------------------------------------------ finishing
    def close_items(self, status: str = "completed") -> None:
        self._close_reasoning()
        if self.message is not None:
            item, self.message = self.message, None
            self.b.close_message(item, status=status)
        for call in self._all_calls:
            if call.item is None:
                # The name never came: the call cannot be executed, but its arguments are not dropped.
                call.item = self.b.open_function_call(call.name, call_id=call.call_id)
                for piece in call.pending:
                    self.b.arguments_delta(call.item, piece)
            if not call.item.open:
                continue
            if call.custom is not None:
                self.b.custom_input_delta(call.item, call.custom.finish())
                self.b.close_custom_tool_call(call.item, status=status)
            else:
                self.b.close_function_call(call.item, status=status)
        self.dirty = True

    def apply_usage(self) -> None:
        if self.usage is not None:
            prompt, output, cached, reasoning = usage_numbers(self.usage)
            self.b.set_usage(prompt, output, cached_tokens=cached, reasoning_tokens=reasoning)

    def finish(self) -> None:
        """Close everything and emit the terminal event the finish_reason calls for."""
        self.apply_usage()
        if self.error is not None:
            self.fail(self.error)
            return
        reason = self.finish_reason
        if reason == "length":
            self.close_items("incomplete")
            self.b.incomplete("max_output_tokens")
        elif reason == "content_filter":
            self.close_items("incomplete")
            self.b.incomplete("content_filter")
        elif reason == "error":
            self.fail(ProviderError("The upstream reported an error during generation.", status=502))
        elif reason is None and not self.done:
            self.fail(
                ProviderError("The upstream stream ended before the response was finished.", status=502)
            )
        else:
            self.close_items()
            self.b.complete()
        self.dirty = True

    def fail(self, exc: ProviderError) -> None:
        self.apply_usage()
        self._close_reasoning()
        self.b.fail(exc.code or "server_error", exc.message)
        self.dirty = True


# HTTP statuses OpenRouter puts in a mid-stream error's ``code`` that say more than "server error".
_STATUS_CODES = frozenset({402, 429, 503, 529})


def _stream_error(error: Any) -> ProviderError:
    """The ProviderError for an ``error`` inside a 200 stream.

    OpenRouter sends the HTTP status it would have answered as a number in ``code`` (402 out of credits,
    429 rate limited, 503 no provider available); those are classified as that status would be.
    """
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and code in _STATUS_CODES:
        return from_http(code, {}, {"error": {**error, "code": None}})
    return from_error_payload({"error": error})


def completion_chunks(body: Any) -> list[JSON]:
    """The chunks equivalent to a non-streamed ``chat.completion`` body (so one translator serves both)."""
    if isinstance(body, dict) and body.get("error") is not None:
        raise from_error_payload(body)
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise ProviderError("The upstream answered with an unexpected JSON body.", status=502)
    chunks: list[JSON] = []
    for choice in body["choices"]:
        if not isinstance(choice, dict):
            continue
        message = dict(choice.get("message") or {})
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message["tool_calls"] = [
                {**c, "index": c.get("index", i)} for i, c in enumerate(calls) if isinstance(c, dict)
            ]
        chunks.append(
            {
                "choices": [
                    {
                        "index": choice.get("index", 0),
                        "delta": message,
                        "logprobs": choice.get("logprobs"),
                        "finish_reason": choice.get("finish_reason"),
                    }
                ]
            }
        )
    if isinstance(body.get("usage"), dict):
        chunks.append({"choices": [], "usage": body["usage"]})
    return chunks


# ---------------------------------------------------------------------------------------- provider
@mypyc_attr(native_class=False)
class OpenAIChatProvider(HTTPProvider[ChatTranslator]):
    """A model behind a Chat Completions endpoint."""

    name = "openai-chat"
    capabilities = Capabilities(
        streaming=True,
        tools=True,
        parallel_tool_calls=True,
        reasoning=True,
        structured_output=True,
        images=True,
        tool_types=frozenset({"function", "custom"}),
    )
    push_relay = True

    def __init__(
        self,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        upstream_model: str | None = None,
        dialect: ChatDialect | None = None,
        transport: Transport | None = None,
        timeouts: Timeouts | None = None,
        reasoning_output: ReasoningOutput = "summary",
        extra_headers: dict[str, str] | None = None,
        upstream_name: str = "The upstream",
        **dialect_options: Any,
    ) -> None:
        self.dialect = replace(dialect or ChatDialect(), **dialect_options)
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            upstream_model=upstream_model,
            transport=transport,
            timeouts=timeouts,
            extra_headers=extra_headers,
            upstream_name=upstream_name,
        )
        self._reasoning_output: ReasoningOutput = reasoning_output

    @property
    def url(self) -> str:
        base = self.base_url
        return base if base.endswith("/chat/completions") else base + "/chat/completions"

    def endpoint(self, request: ResponseRequest) -> str:
        return self.url

    def headers(self) -> dict[str, str]:
        """Request headers (the key among them: never log this)."""
        out = {"accept": "text/event-stream"}
        if self._api_key:
            out["authorization"] = f"Bearer {self._api_key}"
        out.update(self._extra_headers)
        return out

    def check_request(self, request: ResponseRequest) -> None:
        for i, tool in enumerate(request.tools):
            if tool.get("type") not in ("function", "custom"):
                raise _unsupported(
                    f"Tool type '{tool.get('type')}' is not supported by the Chat Completions back end.",
                    f"tools[{i}].type",
                )
        choice = request.tool_choice
        if isinstance(choice, dict) and choice.get("type") not in ("function", "custom", "allowed_tools"):
            raise _unsupported(
                f"tool_choice '{choice.get('type')}' is not supported here.", "tool_choice.type"
            )
        _convert_input(request.input, self.dialect)

    def build_body(self, request: ResponseRequest) -> JSON:
        """The upstream request body."""
        return build_chat_body(
            request, upstream_model=self.upstream_model, dialect=self.dialect, base_url=self.base_url
        )

    def translator(self, request: ResponseRequest, builder: StreamBuilder) -> ChatTranslator:
        return ChatTranslator(builder, self._reasoning_output, custom_tool_names(request.tools))

    def replay(self, turn: ChatTranslator, body: Any) -> None:
        # A server that ignored ``stream: true`` answered with a whole chat.completion.
        for chunk in completion_chunks(body):
            turn.on_chunk(chunk)
        turn.done = True

    def dispatcher(self) -> Callable[[ChatTranslator, SSEMessage], None]:
        return _dispatch

    def fast_path(self, turn: ChatTranslator) -> Callable[[bytes, bytes], bool] | None:
        return turn.fast


def _dispatch(turn: ChatTranslator, msg: SSEMessage) -> None:
    if turn.done or turn.error is not None:
        return
    data = msg.data
    if data.strip() == "[DONE]":
        turn.done = True
        return
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        log.debug("ignoring a chunk that is not JSON")
        return
    if not isinstance(payload, dict):
        return
    if msg.event == "error":
        # Groq: ``event: error`` with ``{"error": {...}}`` after HTTP 200.
        turn.error = from_error_payload(payload if "error" in payload else {"error": payload})
        return
    translate(turn.on_chunk, payload)
