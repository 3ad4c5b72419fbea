"""Anthropic Messages as a front end: a ``POST /v1/messages`` body → a Responses create body, and a
Response's events → Anthropic's stream events (or the final Response → one ``message`` object).

Sans-IO: the server (``server/messages.py``) gives the two functions that touch keys: ``opener`` turns
a thinking block's ``signature`` (or a ``redacted_thinking`` block's ``data``) back into the reasoning
item it stands for, ``signer`` makes that signature from a reasoning item (the gateway seals the whole
item, so the thinking text cannot be altered, and the back end's own reasoning state rides along).

What maps to what:

- ``system`` (a string or text blocks) → ``instructions``; ``max_tokens`` → ``max_output_tokens``;
  ``temperature``, ``top_p``; ``metadata.user_id`` → ``safety_identifier``.
- ``user`` blocks: ``text`` → ``input_text``, ``image`` → ``input_image``, ``document`` (PDF, plain
  text, URL) → ``input_file``/``input_text``, ``tool_result`` → ``function_call_output``;
  ``assistant`` blocks: ``text`` → an assistant message, ``tool_use`` → ``function_call``,
  ``thinking``/``redacted_thinking`` → the reasoning item their signature seals.
- ``tools`` (client tools) → function tools; ``tool_choice`` auto/any/tool/none → auto/required/
  function/none, ``disable_parallel_tool_use`` → ``parallel_tool_calls``.
- ``thinking: {type: enabled, budget_tokens}`` → ``reasoning.effort`` by budget (< 4096 low, < 16384
  medium, else high) with a summary; ``adaptive`` → medium.
- ``output_config``: ``effort`` → ``reasoning.effort`` (``max`` → ``xhigh``), ``format`` (a JSON
  schema) → ``text.format`` (structured output).
- Accepted and ignored (no effect on the answer): ``cache_control``, ``speed``, ``inference_geo``,
  ``diagnostics``, ``user_profile_id``, ``workspace_id``, ``service_tier``.
- ``stop_sequences`` (:func:`stop_sequences`: at most :data:`MAX_STOP_SEQUENCES`) are engine options
  beside the Responses body; the reply's ``stop_reason`` is ``stop_sequence`` and ``stop_sequence``
  names the one that ended the output (``stopped_by``, from the engine or an Anthropic upstream).
- ``top_k``, server tools, ``mcp_servers``, ``container`` and ``context_management`` are refused
  (400).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from .request import RequestError
from .stop import check_stop

__all__ = [
    "MAX_STOP_SEQUENCES",
    "MessagesStream",
    "Opener",
    "Signer",
    "anthropic_usage",
    "error_payload",
    "error_type_for",
    "error_type_for_status",
    "message_from_response",
    "messages_param",
    "messages_request",
    "stop_reason",
    "stop_sequences",
]

JSON = dict[str, Any]
Opener = Callable[[str, str], JSON]  # (signature, param) -> reasoning item; RequestError if not ours
Signer = Callable[[JSON], str]

_KNOWN = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "stream",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
        "service_tier",
        "mcp_servers",
        "container",
        "context_management",
        "output_config",
        *{
            # Hints with no effect on the answer, accepted and ignored: prompt caching (a back end
            # caches on its own), speed and region, diagnostics, attribution.
            "cache_control",
            "speed",
            "inference_geo",
            "diagnostics",
            "user_profile_id",
            "workspace_id",
        },
    }
)
_REFUSED = {
    "top_k": "'top_k' is not supported by this gateway.",
    "mcp_servers": "'mcp_servers' is not supported by this gateway.",
    "container": "'container' is not supported by this gateway.",
    "context_management": "'context_management' is not supported by this gateway.",
}
MAX_MESSAGES = 10_000
MAX_STOP_SEQUENCES = 32


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> RequestError:
    return RequestError(message, param=param, code=code)


def _obj(value: Any, param: str) -> JSON:
    if not isinstance(value, dict):
        raise _bad(f"{param}: Input should be an object", param, "invalid_type")
    return value


def _str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _bad(f"{param}: Input should be a valid string", param, "invalid_type")
    return value


def _text_of(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{param}: Input should be a string or a list of text blocks", param, "invalid_type")
    texts = []
    for j, block in enumerate(content):
        block = _obj(block, f"{param}.{j}")
        if block.get("type") != "text":
            raise _bad(f"{param}.{j}.type: only text blocks are allowed here", f"{param}.{j}.type")
        texts.append(_str(block.get("text"), f"{param}.{j}.text"))
    return "\n\n".join(texts) if param == "system" else "".join(texts)


def _image(block: JSON, param: str) -> JSON:
    source = _obj(block.get("source"), f"{param}.source")
    kind = source.get("type")
    if kind == "base64":
        media = _str(source.get("media_type"), f"{param}.source.media_type")
        data = _str(source.get("data"), f"{param}.source.data")
        return {"type": "input_image", "image_url": f"data:{media};base64,{data}", "detail": "auto"}
    if kind == "url":
        return {
            "type": "input_image",
            "image_url": _str(source.get("url"), f"{param}.source.url"),
            "detail": "auto",
        }
    raise _bad(
        f"{param}.source.type: '{kind}' is not supported; send 'base64' or 'url'", f"{param}.source.type"
    )


def _document(block: JSON, param: str) -> JSON:
    source = _obj(block.get("source"), f"{param}.source")
    kind = source.get("type")
    title = block.get("title") if isinstance(block.get("title"), str) else None
    if kind == "base64":
        media = _str(source.get("media_type"), f"{param}.source.media_type")
        data = _str(source.get("data"), f"{param}.source.data")
        return {
            "type": "input_file",
            "file_data": f"data:{media};base64,{data}",
            "filename": title or "document.pdf",
        }
    if kind == "text":
        return {"type": "input_text", "text": _str(source.get("data"), f"{param}.source.data")}
    if kind == "url":
        return {"type": "input_file", "file_url": _str(source.get("url"), f"{param}.source.url")}
    raise _bad(
        f"{param}.source.type: '{kind}' is not supported; send 'base64', 'text' or 'url'",
        f"{param}.source.type",
    )


def _tool_result(block: JSON, param: str) -> JSON:
    call_id = _str(block.get("tool_use_id"), f"{param}.tool_use_id")
    content = block.get("content")
    output: str | list[JSON]
    if content is None:
        output = ""
    elif isinstance(content, str):
        output = content
    elif isinstance(content, list):
        parts: list[JSON] = []
        for j, inner in enumerate(content):
            inner = _obj(inner, f"{param}.content.{j}")
            if inner.get("type") == "text":
                parts.append(
                    {"type": "input_text", "text": _str(inner.get("text"), f"{param}.content.{j}.text")}
                )
            elif inner.get("type") == "image":
                parts.append(_image(inner, f"{param}.content.{j}"))
            elif inner.get("type") == "document":
                parts.append(_document(inner, f"{param}.content.{j}"))
            else:
                raise _bad(
                    f"{param}.content.{j}.type: '{inner.get('type')}' is not supported in a tool_result",
                    f"{param}.content.{j}.type",
                )
        output = parts if any(p["type"] != "input_text" for p in parts) else "".join(p["text"] for p in parts)
    else:
        raise _bad(
            f"{param}.content: Input should be a string or a list of blocks",
            f"{param}.content",
            "invalid_type",
        )
    if block.get("is_error") is True and isinstance(output, str):
        output = f"Error: {output}" if output else "Error"
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _user(content: Any, param: str, out: list[JSON]) -> None:
    if isinstance(content, str):
        out.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": content}]})
        return
    if not isinstance(content, list):
        raise _bad(f"{param}: Input should be a string or a list of blocks", param, "invalid_type")
    parts: list[JSON] = []

    def flush() -> None:
        if parts:
            out.append({"type": "message", "role": "user", "content": list(parts)})
            parts.clear()

    for j, block in enumerate(content):
        where = f"{param}.{j}"
        block = _obj(block, where)
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "input_text", "text": _str(block.get("text"), f"{where}.text")})
        elif kind == "image":
            parts.append(_image(block, where))
        elif kind == "document":
            parts.append(_document(block, where))
        elif kind == "tool_result":
            flush()
            out.append(_tool_result(block, where))
        else:
            raise _bad(f"{where}.type: '{kind}' is not supported in a user message", f"{where}.type")
    flush()


def _assistant(content: Any, param: str, out: list[JSON], opener: Opener) -> None:
    if isinstance(content, str):
        blocks: list[Any] = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        blocks = content
    else:
        raise _bad(f"{param}: Input should be a string or a list of blocks", param, "invalid_type")
    for j, block in enumerate(blocks):
        where = f"{param}.{j}"
        block = _obj(block, where)
        kind = block.get("type")
        if kind == "text":
            text = _str(block.get("text"), f"{where}.text")
            if text:
                last = out[-1] if out else None
                if last is not None and last.get("type") == "message" and last.get("role") == "assistant":
                    last["content"].append({"type": "output_text", "text": text, "annotations": []})
                else:
                    out.append(
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": text, "annotations": []}],
                        }
                    )
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input") if block.get("input") is not None else {}).decode()
            out.append(
                {
                    "type": "function_call",
                    "call_id": _str(block.get("id"), f"{where}.id"),
                    "name": _str(block.get("name"), f"{where}.name"),
                    "arguments": arguments,
                }
            )
        elif kind == "thinking":
            out.append(opener(_str(block.get("signature"), f"{where}.signature"), f"{where}.signature"))
        elif kind == "redacted_thinking":
            out.append(opener(_str(block.get("data"), f"{where}.data"), f"{where}.data"))
        else:
            raise _bad(f"{where}.type: '{kind}' is not supported in an assistant message", f"{where}.type")


def _tools(tools: Any) -> list[JSON]:
    if not isinstance(tools, list):
        raise _bad("tools: Input should be a valid list", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(tools):
        tool = _obj(tool, f"tools.{i}")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _bad(
                f"tools.{i}.type: server tools ('{kind}') are not supported by this gateway; "
                "declare client tools with 'name' and 'input_schema'",
                f"tools.{i}.type",
            )
        schema = _obj(tool.get("input_schema"), f"tools.{i}.input_schema")
        entry: JSON = {
            "type": "function",
            "name": _str(tool.get("name"), f"tools.{i}.name"),
            "parameters": schema,
            "strict": False,
        }
        if isinstance(tool.get("description"), str):
            entry["description"] = tool["description"]
        out.append(entry)
    return out


def _tool_choice(choice: Any, out: JSON) -> None:
    choice = _obj(choice, "tool_choice")
    kind = choice.get("type")
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "name": _str(choice.get("name"), "tool_choice.name")}
    else:
        raise _bad(
            f"tool_choice.type: '{kind}' is not one of 'auto', 'any', 'tool', 'none'", "tool_choice.type"
        )
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False


def _thinking(value: Any) -> JSON | None:
    value = _obj(value, "thinking")
    kind = value.get("type")
    if kind == "disabled":
        return None
    if kind == "adaptive":
        return {"effort": "medium", "summary": "auto"}
    if kind == "enabled":
        budget = value.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise _bad("thinking.budget_tokens: Input should be a positive integer", "thinking.budget_tokens")
        effort = "low" if budget < 4096 else "medium" if budget < 16384 else "high"
        return {"effort": effort, "summary": "auto"}
    raise _bad(f"thinking.type: '{kind}' is not one of 'enabled', 'disabled', 'adaptive'", "thinking.type")


_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}


def _output_config(value: Any, out: JSON) -> None:
    """``output_config``: ``effort`` → ``reasoning.effort`` (``max`` is the highest there is, ``xhigh``),
    ``format`` (a JSON schema) → ``text.format``."""
    value = _obj(value, "output_config")
    for key in value:
        if key not in ("effort", "format"):
            raise _bad(
                f"output_config.{key}: Extra inputs are not permitted",
                f"output_config.{key}",
                "unknown_parameter",
            )
    effort = value.get("effort")
    if effort is not None:
        if effort not in _EFFORTS:
            raise _bad(
                f"output_config.effort: '{effort}' is not one of low, medium, high, xhigh, max",
                "output_config.effort",
            )
        out["reasoning"] = {**out.get("reasoning", {}), "effort": _EFFORTS[effort]}
    fmt = value.get("format")
    if fmt is not None:
        fmt = _obj(fmt, "output_config.format")
        if fmt.get("type") != "json_schema":
            raise _bad(
                "output_config.format.type: Input should be 'json_schema'", "output_config.format.type"
            )
        schema = _obj(fmt.get("schema"), "output_config.format.schema")
        out["text"] = {"format": {"type": "json_schema", "name": "output", "schema": schema, "strict": True}}


def messages_request(body: Any, opener: Opener, *, counting: bool = False) -> JSON:
    """A Messages create body (``counting``: a count_tokens body, without ``max_tokens``) → the
    Responses create body; RequestError (in Anthropic's field names) for anything refused."""
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", None, "invalid_type")
    for key in body:
        if key not in _KNOWN:
            raise _bad(f"{key}: Extra inputs are not permitted", key, "unknown_parameter")
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, [], {}):
            raise _bad(why, key, "unsupported_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model: Field required", "model", "missing_required_parameter")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _bad("messages: Field required", "messages", "missing_required_parameter")
    if not messages:
        raise _bad("messages: at least one message is required", "messages")
    if len(messages) > MAX_MESSAGES:
        raise _bad(f"messages: at most {MAX_MESSAGES} messages", "messages", "array_above_max_length")
    out: JSON = {"model": model, "store": False}
    if not counting:
        limit = body.get("max_tokens")
        if limit is None:
            raise _bad("max_tokens: Field required", "max_tokens", "missing_required_parameter")
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise _bad("max_tokens: Input should be a positive integer", "max_tokens")
        out["max_output_tokens"] = limit
    items: list[JSON] = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        message = _obj(message, where)
        role = message.get("role")
        if role == "user":
            _user(message.get("content"), f"{where}.content", items)
        elif role == "assistant":
            _assistant(message.get("content"), f"{where}.content", items, opener)
        else:
            raise _bad(f"{where}.role: Input should be 'user' or 'assistant'", f"{where}.role")
    out["input"] = items
    if body.get("system") is not None:
        out["instructions"] = _text_of(body["system"], "system")
    temperature = body.get("temperature")
    if temperature is not None:
        if (
            not isinstance(temperature, int | float)
            or isinstance(temperature, bool)
            or not 0 <= temperature <= 1
        ):
            raise _bad("temperature: Input should be a number between 0 and 1", "temperature")
        out["temperature"] = temperature
    if body.get("top_p") is not None:
        out["top_p"] = body["top_p"]
    if body.get("stream") is not None and not counting:
        if not isinstance(body["stream"], bool):
            raise _bad("stream: Input should be a valid boolean", "stream", "invalid_type")
        out["stream"] = body["stream"]
    if body.get("tools") is not None:
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], out)
    if body.get("thinking") is not None:
        reasoning = _thinking(body["thinking"])
        if reasoning is not None:
            out["reasoning"] = reasoning
    if body.get("output_config") is not None:
        _output_config(body["output_config"], out)
    metadata = body.get("metadata")
    if metadata is not None:
        user = _obj(metadata, "metadata").get("user_id")
        if user is not None:
            out["safety_identifier"] = _str(user, "metadata.user_id")[:64]
    return out


# The Responses fields an Anthropic field became, for errors raised past the translation.
_PARAMS = {
    "max_output_tokens": "max_tokens",
    "reasoning": "thinking",
    "instructions": "system",
    "input": "messages",
    "parallel_tool_calls": "tool_choice",
    "safety_identifier": "metadata",
    "text": "output_config",
}


def messages_param(param: str | None) -> str | None:
    """A refused Responses field named as the Messages client sent it."""
    if param is None:
        return None
    head = param.split(".", 1)[0].split("[", 1)[0]
    return _PARAMS.get(head, param)


# ---------------------------------------------------------------------------------------- replies
def stop_sequences(body: Any) -> tuple[str, ...]:
    """A Messages create body's ``stop_sequences``, validated (RequestError naming them)."""
    value = body.get("stop_sequences") if isinstance(body, dict) else None
    return check_stop(value, "stop_sequences", limit=MAX_STOP_SEQUENCES, allow_string=False)


def stop_reason(response: JSON, stop_sequence: str | None = None) -> str:
    """A finished Response's Anthropic ``stop_reason`` (``stop_sequence``: the one that ended it)."""
    output = response.get("output") or []
    if response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "refusal" if reason == "content_filter" else "max_tokens"
    if any(item.get("type") == "function_call" for item in output):
        return "tool_use"
    if stop_sequence is not None:
        return "stop_sequence"
    refused = any(
        part.get("type") == "refusal"
        for item in output
        if item.get("type") == "message"
        for part in item.get("content") or []
    )
    return "refusal" if refused else "end_turn"


def anthropic_usage(usage: Any) -> JSON:
    """A Response's usage in Anthropic's words: ``input_tokens`` does not count the cached ones."""
    usage = usage if isinstance(usage, dict) else {}
    total_in = int(usage.get("input_tokens") or 0)
    cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": max(total_in - cached, 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def message_id(response_id: str) -> str:
    return "msg_" + response_id.removeprefix("resp_")


def _thinking_text(item: JSON) -> str:
    raw = [c.get("text", "") for c in item.get("content") or [] if c.get("type") == "reasoning_text"]
    if raw:
        return "".join(raw)
    return "\n\n".join(s.get("text", "") for s in item.get("summary") or [])


def _has_state(item: JSON) -> bool:
    return bool(item.get("encrypted_content"))


def message_from_response(
    response: JSON, model: str, signer: Signer, stop_sequence: str | None = None
) -> JSON:
    """A finished (completed or incomplete) Response as one Anthropic ``message`` object
    (``stop_sequence``: the stop sequence that ended it, if one did)."""
    content: list[JSON] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    content.append({"type": "text", "text": part.get("text", "")})
                elif part.get("type") == "refusal":
                    content.append({"type": "text", "text": part.get("refusal", "")})
        elif kind == "function_call":
            try:
                arguments = orjson.loads(item.get("arguments") or "{}")
            except orjson.JSONDecodeError:
                arguments = {}
            content.append(
                {
                    "type": "tool_use",
                    "id": item.get("call_id"),
                    "name": item.get("name"),
                    "input": arguments if isinstance(arguments, dict) else {},
                }
            )
        elif kind == "reasoning":
            text = _thinking_text(item)
            if text:
                content.append({"type": "thinking", "thinking": text, "signature": signer(item)})
            elif _has_state(item):
                content.append({"type": "redacted_thinking", "data": signer(item)})
    return {
        "id": message_id(str(response.get("id", ""))),
        "type": "message",
        "role": "assistant",
        "model": response.get("model") or model,
        "content": content,
        "stop_reason": (reason := stop_reason(response, stop_sequence)),
        "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
        "usage": anthropic_usage(response.get("usage")),
    }


_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class MessagesStream:
    """A Response's events → Anthropic stream events (``message_start`` … ``message_stop``), incrementally.

    :meth:`feed` returns ``(event name, payload)`` pairs. Content blocks are numbered as they open:
    a text part, a function call (``tool_use``, its arguments as ``input_json_delta``), a reasoning
    item (``thinking`` once it has text, with its ``signature_delta`` when it ends; with no text but
    state, a ``redacted_thinking`` block). A failure becomes Anthropic's ``error`` event and ends the
    stream (:attr:`failed`).
    """

    __slots__ = (
        "_args",
        "_blocks",
        "_id",
        "_kinds",
        "_model",
        "_next",
        "_seen",
        "_started",
        "done",
        "failed",
        "signer",
        "stop_sequence",
    )

    def __init__(self, model: str, signer: Signer) -> None:
        self.signer = signer
        self._model = model
        self._id = "msg_"
        self._started = False
        self._next = 0  # the next content block index
        self._blocks: dict[str, int] = {}  # item id (and part index for text) -> open block index
        self._args: dict[str, str] = {}  # function call item id -> arguments sent
        self._seen: set[str] = set()  # every block key opened
        self._kinds: dict[str, str] = {}  # reasoning item id -> the kind of text it streams
        self.done = False
        self.failed = False
        # Set by the server before the terminal event: the stop sequence that ended the output.
        self.stop_sequence: str | None = None

    def _open(self, key: str, block: JSON, out: list[tuple[str, JSON]]) -> int:
        self._seen.add(key)
        index = self._blocks[key] = self._next
        self._next += 1
        out.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        )
        return index

    def _delta(self, index: int, delta: JSON) -> tuple[str, JSON]:
        return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})

    def _close(self, key: str, out: list[tuple[str, JSON]]) -> None:
        index = self._blocks.pop(key, None)
        if index is not None:
            out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))

    def feed(self, event: JSON) -> list[tuple[str, JSON]]:
        """The stream events ``event`` makes."""
        if self.done:
            return []
        kind = event.get("type")
        out: list[tuple[str, JSON]] = []
        if kind in ("response.created", "response.queued", "response.in_progress"):
            if not self._started:
                response = event.get("response") or {}
                self._id = message_id(str(response.get("id", "")))
                self._model = response.get("model") or self._model
                self._start(out)
            return out
        self._start(out)
        item_id = str(event.get("item_id"))
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            key = f"{item_id}/{event.get('content_index', 0)}"
            index = self._blocks.get(key)
            if index is None:
                index = self._open(key, {"type": "text", "text": ""}, out)
            out.append(self._delta(index, {"type": "text_delta", "text": event.get("delta", "")}))
        elif kind == "response.content_part.done":
            self._close(f"{item_id}/{event.get('content_index', 0)}", out)
        elif kind == "response.reasoning_text.delta":
            self._think(item_id, "raw", event.get("delta", ""), out)
        elif kind == "response.reasoning_summary_text.delta":
            self._think(item_id, "summary", event.get("delta", ""), out)
        elif kind == "response.reasoning_summary_part.added" and event.get("summary_index", 0) > 0:
            self._think(item_id, "summary", "\n\n", out)
        elif kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") == "function_call":
                iid = str(item.get("id"))
                self._open(
                    iid,
                    {"type": "tool_use", "id": item.get("call_id"), "name": item.get("name"), "input": {}},
                    out,
                )
                self._args[iid] = ""
                if item.get("arguments"):
                    out.append(self._json(iid, item["arguments"]))
        elif kind == "response.function_call_arguments.delta":
            if item_id in self._args:
                out.append(self._json(item_id, event.get("delta", "")))
        elif kind == "response.output_item.done":
            self._item_done(event.get("item") or {}, out)
        elif kind in _TERMINAL:
            self._finish(kind, event.get("response") or {}, out)
        return out

    def _think(self, item_id: str, kind: str, text: str, out: list[tuple[str, JSON]]) -> None:
        """A thinking delta: one kind of text per item (its raw text, or else its summary, whichever
        streams first), as in the one-body reply."""
        if self._kinds.setdefault(item_id, kind) != kind or not text:
            return
        index = self._blocks.get(item_id)
        if index is None:
            index = self._open(item_id, {"type": "thinking", "thinking": "", "signature": ""}, out)
        out.append(self._delta(index, {"type": "thinking_delta", "thinking": text}))

    def _json(self, iid: str, delta: str) -> tuple[str, JSON]:
        self._args[iid] += delta
        return self._delta(self._blocks[iid], {"type": "input_json_delta", "partial_json": delta})

    def _item_done(self, item: JSON, out: list[tuple[str, JSON]]) -> None:
        iid = str(item.get("id"))
        kind = item.get("type")
        if kind == "function_call" and iid in self._blocks:
            sent = self._args.get(iid, "")
            final = item.get("arguments")
            if isinstance(final, str) and final != sent and final.startswith(sent):
                out.append(self._json(iid, final[len(sent) :]))
            self._close(iid, out)
        elif kind == "reasoning":
            index = self._blocks.get(iid)
            if index is not None:
                out.append(self._delta(index, {"type": "signature_delta", "signature": self.signer(item)}))
                self._close(iid, out)
            elif _thinking_text(item):
                index = self._open(iid, {"type": "thinking", "thinking": "", "signature": ""}, out)
                out.append(self._delta(index, {"type": "thinking_delta", "thinking": _thinking_text(item)}))
                out.append(self._delta(index, {"type": "signature_delta", "signature": self.signer(item)}))
                self._close(iid, out)
            elif _has_state(item):
                self._open(iid, {"type": "redacted_thinking", "data": self.signer(item)}, out)
                self._close(iid, out)
        elif kind == "message":
            for key in [k for k in self._blocks if k.startswith(iid + "/")]:
                self._close(key, out)
            for j, part in enumerate(item.get("content") or []):
                # A part that arrived whole, without deltas: one block with all of it.
                text = part.get("text") if part.get("type") == "output_text" else part.get("refusal")
                if f"{iid}/{j}" not in self._seen and isinstance(text, str) and text:
                    index = self._open(f"{iid}/{j}", {"type": "text", "text": ""}, out)
                    out.append(self._delta(index, {"type": "text_delta", "text": text}))
                    self._close(f"{iid}/{j}", out)

    def _start(self, out: list[tuple[str, JSON]]) -> None:
        if self._started:
            return
        self._started = True
        message: JSON = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        out.append(("message_start", {"type": "message_start", "message": message}))
        out.append(("ping", {"type": "ping"}))

    def _finish(self, kind: Any, response: JSON, out: list[tuple[str, JSON]]) -> None:
        self.done = True
        for key in list(self._blocks):
            self._close(key, out)
        if kind == "response.failed":
            self.failed = True
            failure = response.get("error") or {}
            out.append(
                (
                    "error",
                    error_payload(
                        error_type_for(failure.get("code")), failure.get("message") or "The response failed."
                    ),
                )
            )
            return
        out.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": (reason := stop_reason(response, self.stop_sequence)),
                        "stop_sequence": self.stop_sequence if reason == "stop_sequence" else None,
                    },
                    "usage": anthropic_usage(response.get("usage")),
                },
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))


# ---------------------------------------------------------------------------------------- errors
_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_CODE_TYPES = {
    "rate_limit_exceeded": "rate_limit_error",
    "insufficient_quota": "billing_error",
    "server_is_overloaded": "overloaded_error",
    "context_length_exceeded": "invalid_request_error",
    "invalid_prompt": "invalid_request_error",
    "invalid_api_key": "authentication_error",
}


def error_type_for_status(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    if status in _STATUS_TYPES:
        return _STATUS_TYPES[status]
    if status == 503:
        return "overloaded_error"
    return "api_error" if status >= 500 else "invalid_request_error"


def error_type_for(code: Any) -> str:
    """Anthropic's error type for a failed Response's error code."""
    return _CODE_TYPES.get(str(code), "api_error")


def error_payload(etype: str, message: str) -> JSON:
    """Anthropic's error body: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": etype, "message": message}}
