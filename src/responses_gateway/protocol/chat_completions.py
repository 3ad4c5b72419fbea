"""Chat Completions as a front end: a ``POST /v1/chat/completions`` body → a Responses create body, and a
Response's events → ``chat.completion.chunk`` objects (or the final Response → one ``chat.completion``).

Sans-IO: no I/O, nothing of the server. The server (``server/chat_completions.py``) parses the body
with :func:`chat_request`, hands the Responses body to the same ``prepare``/``run`` as ``POST
/v1/responses``, and feeds each event it is given to a :class:`ChatStream` (streamed) or builds the
reply with :func:`completion_from_response` (not streamed).

What maps to what:

- ``messages``: ``system``/``developer`` → a message item with that role; ``user`` → ``input_text``,
  ``input_image`` (``image_url``), ``input_file`` (``file``); ``input_audio`` is refused; an
  ``assistant`` message → an assistant message and one ``function_call`` per ``tool_calls`` entry;
  ``tool`` → ``function_call_output``.
- ``tools`` (function tools), ``tool_choice``, ``parallel_tool_calls``, ``response_format`` →
  ``text.format``, ``max_tokens``/``max_completion_tokens`` → ``max_output_tokens``,
  ``reasoning_effort`` → ``reasoning.effort``, ``logprobs``/``top_logprobs`` → the output text's
  logprobs, ``temperature``, ``top_p``, ``presence_penalty``, ``frequency_penalty``, ``user``,
  ``metadata``, ``prompt_cache_key``, ``safety_identifier``, ``service_tier`` as they are,
  ``prompt_cache_retention`` (``in_memory`` is ``in-memory`` there); ``prompt_cache_options`` is a
  caching hint, accepted and ignored.
- ``store: true`` keeps the run as a stored Response (when the gateway has a store): the completion
  ``chatcmpl-X`` is the Response ``resp_X``, read through ``GET /v1/responses/resp_X`` and continued
  from a Responses client with ``previous_response_id``. (OpenAI's own ``store`` keeps completions
  for its dashboards and ``GET /v1/chat/completions/{id}``, which this gateway does not serve.)
  Without it nothing is kept.
- ``stop`` (a string or up to 4) and ``seed`` are engine options beside the Responses body
  (:class:`ChatOptions`); ``n`` (up to :data:`MAX_CHOICES`) is the number of runs the server makes,
  each a choice (:class:`ChatStream` per choice with its ``index``, :func:`completion_from_responses`).
- ``logit_bias``, ``audio``/``modalities``, ``prediction``, ``moderation`` and
  ``web_search_options`` are refused with a 400 naming them (the engine has no way to honour them).
"""

from __future__ import annotations

import time
from typing import Any

from .request import RequestError
from .stop import check_stop

__all__ = [
    "MAX_CHOICES",
    "MAX_STOP",
    "ChatOptions",
    "ChatStream",
    "chat_id",
    "chat_param",
    "chat_request",
    "chat_usage",
    "completion_from_response",
    "completion_from_responses",
    "finish_reason",
    "sum_usage",
]

JSON = dict[str, Any]

# Fields accepted and carried over unchanged into the Responses body.
_SAME = (
    "store",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "metadata",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "parallel_tool_calls",
    "stream",
)
# Refused: the engine cannot honour them, and silently ignoring them would change answers.
_REFUSED = {
    "logit_bias": "'logit_bias' is not supported by this gateway.",
    "audio": "Audio output is not supported by this gateway.",
    "modalities": "Only text output is supported by this gateway.",
    "prediction": "'prediction' (predicted outputs) is not supported by this gateway.",
    "web_search_options": "'web_search_options' is not supported by this gateway; use POST /v1/responses "
    "with a web_search tool.",
    "moderation": "'moderation' is not supported by this gateway.",
    "functions": "'functions' (the legacy form) is not supported: send 'tools'.",
    "function_call": "'function_call' (the legacy form) is not supported: send 'tool_choice'.",
}
_KNOWN = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "response_format",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "stop",
        "seed",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "reasoning_effort",
        "verbosity",
        "prompt_cache_retention",
        "prompt_cache_options",  # a caching hint: accepted and ignored
        *_SAME,
        *_REFUSED,
    }
)
MAX_MESSAGES = 10_000
# Choices one request may ask for (``n``): each is a run of the model.
MAX_CHOICES = 8
# Stop sequences one request may give (OpenAI's limit).
MAX_STOP = 4


class ChatOptions:
    """What the reply needs to know of the request (streamed, usage chunk, logprobs, choices) and the
    engine options the Responses body has no field for (``stop``, ``seed``)."""

    __slots__ = ("include_usage", "logprobs", "model", "n", "seed", "stop", "stream")

    def __init__(
        self,
        model: str,
        stream: bool,
        include_usage: bool,
        logprobs: bool,
        *,
        n: int = 1,
        stop: tuple[str, ...] = (),
        seed: int | None = None,
    ) -> None:
        self.model, self.stream, self.include_usage, self.logprobs = model, stream, include_usage, logprobs
        self.n, self.stop, self.seed = n, stop, seed


def _bad(message: str, param: str | None, code: str = "invalid_value") -> RequestError:
    return RequestError(message, param=param, code=code)


def _type_error(param: str, expected: str, value: Any) -> RequestError:
    got = "null" if value is None else type(value).__name__
    return _bad(
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param, "invalid_type"
    )


def _obj(value: Any, param: str) -> JSON:
    if not isinstance(value, dict):
        raise _type_error(param, "an object", value)
    return value


def _text_parts(content: Any, param: str) -> str:
    """A system/developer/tool message's content: a string or text parts, joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _type_error(param, "a string or an array of content parts", content)
    texts = []
    for j, part in enumerate(content):
        part = _obj(part, f"{param}[{j}]")
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise _bad("Invalid content part: only 'text' parts are allowed here.", f"{param}[{j}].type")
        texts.append(part["text"])
    return "".join(texts)


def _user_part(part: Any, param: str) -> JSON:
    part = _obj(part, param)
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise _type_error(f"{param}.text", "a string", part.get("text"))
        return {"type": "input_text", "text": part["text"]}
    if kind == "image_url":
        image = _obj(part.get("image_url"), f"{param}.image_url")
        if not isinstance(image.get("url"), str):
            raise _type_error(f"{param}.image_url.url", "a string", image.get("url"))
        return {"type": "input_image", "image_url": image["url"], "detail": image.get("detail") or "auto"}
    if kind == "file":
        file = _obj(part.get("file"), f"{param}.file")
        out: JSON = {"type": "input_file"}
        for key in ("file_id", "file_data", "filename"):
            if file.get(key) is not None:
                out[key] = file[key]
        return out
    if kind == "input_audio":
        raise _bad("Audio input is not supported by this gateway.", f"{param}.type", "unsupported_value")
    raise _bad(
        f"Invalid value: '{kind}'. Supported content part types are 'text', 'image_url' and 'file'.",
        f"{param}.type",
    )


def _message(message: Any, param: str, out: list[JSON]) -> None:
    message = _obj(message, param)
    role = message.get("role")
    content = message.get("content")
    if role in ("system", "developer"):
        text = _text_parts(content, f"{param}.content")
        out.append({"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]})
    elif role == "user":
        if isinstance(content, str):
            parts = [{"type": "input_text", "text": content}]
        elif isinstance(content, list):
            parts = [_user_part(p, f"{param}.content[{j}]") for j, p in enumerate(content)]
        else:
            raise _type_error(f"{param}.content", "a string or an array of content parts", content)
        out.append({"type": "message", "role": "user", "content": parts})
    elif role == "assistant":
        text = ""
        if content is not None:
            if isinstance(content, list):
                texts = []
                for j, p in enumerate(content):
                    p = _obj(p, f"{param}.content[{j}]")
                    if p.get("type") not in ("text", "refusal"):
                        raise _bad(
                            "Invalid content part: an assistant message holds 'text' or 'refusal' parts.",
                            f"{param}.content[{j}].type",
                        )
                    texts.append(str(p.get("text") or p.get("refusal") or ""))
                text = "".join(texts)
            elif isinstance(content, str):
                text = content
            else:
                raise _type_error(f"{param}.content", "a string or an array of content parts", content)
        if text:
            out.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            raise _type_error(f"{param}.tool_calls", "an array", calls)
        for j, call in enumerate(calls):
            where = f"{param}.tool_calls[{j}]"
            call = _obj(call, where)
            if call.get("type", "function") != "function":
                raise _bad("Only 'function' tool calls are supported.", f"{where}.type")
            function = _obj(call.get("function"), f"{where}.function")
            if not isinstance(call.get("id"), str):
                raise _type_error(f"{where}.id", "a string", call.get("id"))
            if not isinstance(function.get("name"), str):
                raise _type_error(f"{where}.function.name", "a string", function.get("name"))
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                raise _type_error(f"{where}.function.arguments", "a string", arguments)
            out.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": arguments,
                }
            )
    elif role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise _type_error(f"{param}.tool_call_id", "a string", call_id)
        text = _text_parts(content, f"{param}.content")
        out.append({"type": "function_call_output", "call_id": call_id, "output": text})
    elif role == "function":
        raise _bad(
            "'function' messages (the legacy form) are not supported: send 'tool' messages.", f"{param}.role"
        )
    else:
        raise _bad(
            f"Invalid value: '{role}'. Supported values are: 'system', 'developer', 'user', "
            "'assistant' and 'tool'.",
            f"{param}.role",
        )


def _tool(tool: Any, param: str) -> JSON:
    tool = _obj(tool, param)
    if tool.get("type") != "function":
        raise _bad(
            f"Invalid value: '{tool.get('type')}'. Only 'function' tools are supported.", f"{param}.type"
        )
    function = _obj(tool.get("function"), f"{param}.function")
    if not isinstance(function.get("name"), str):
        raise _type_error(f"{param}.function.name", "a string", function.get("name"))
    out: JSON = {"type": "function", "name": function["name"]}
    if function.get("description") is not None:
        out["description"] = function["description"]
    out["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    out["strict"] = bool(function.get("strict"))
    return out


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice  # auto / none / required: the same words, checked by the Responses parser
    choice = _obj(choice, "tool_choice")
    if choice.get("type") == "function":
        function = _obj(choice.get("function"), "tool_choice.function")
        return {"type": "function", "name": function.get("name")}
    if choice.get("type") == "allowed_tools":
        allowed = _obj(choice.get("allowed_tools"), "tool_choice.allowed_tools")
        tools = [
            {
                "type": "function",
                "name": _obj(t, "tool_choice.allowed_tools.tools").get("function", {}).get("name"),
            }
            for t in allowed.get("tools") or []
        ]
        return {"type": "allowed_tools", "mode": allowed.get("mode", "auto"), "tools": tools}
    raise _bad(
        f"Invalid value: '{choice.get('type')}'. Supported tool_choice types are 'function' and "
        "'allowed_tools'.",
        "tool_choice.type",
    )


def _response_format(value: Any) -> JSON:
    value = _obj(value, "response_format")
    kind = value.get("type")
    if kind == "text":
        return {"type": "text"}
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = _obj(value.get("json_schema"), "response_format.json_schema")
        out: JSON = {"type": "json_schema", "name": schema.get("name"), "schema": schema.get("schema") or {}}
        for key in ("description", "strict"):
            if schema.get(key) is not None:
                out[key] = schema[key]
        return out
    raise _bad(
        f"Invalid value: '{kind}'. Supported values are: 'text', 'json_object' and 'json_schema'.",
        "response_format.type",
    )


def chat_request(body: Any) -> tuple[JSON, ChatOptions]:
    """A Chat Completions create body → (the Responses create body, the reply's options); RequestError
    (OpenAI's message and param, in Chat Completions' names) for anything refused."""
    body = _obj(body, "body") if isinstance(body, dict) else None
    if body is None:
        raise _bad("Invalid type for request body: expected an object.", None, "invalid_type")
    for key in body:
        if key not in _KNOWN:
            raise _bad(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, [], False) and not (key == "modalities" and body[key] == ["text"]):
            raise _bad(why, key, "unsupported_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        if messages is None:
            raise _bad("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
        raise _bad("Invalid 'messages': expected a non-empty array of messages.", "messages")
    if len(messages) > MAX_MESSAGES:
        raise _bad(
            f"Invalid 'messages': at most {MAX_MESSAGES} messages.", "messages", "array_above_max_length"
        )
    n = body.get("n")
    if n is None:
        n = 1
    elif not isinstance(n, int) or isinstance(n, bool):
        raise _type_error("n", "an integer", n)
    elif n < 1:
        raise _bad(
            f"Invalid 'n': integer below minimum value. Expected a value >= 1, but got {n} instead.",
            "n",
            "integer_below_min_value",
        )
    elif n > MAX_CHOICES:
        raise _bad(
            f"Invalid 'n': integer above maximum value. Expected a value <= {MAX_CHOICES}, but got {n} "
            "instead.",
            "n",
            "integer_above_max_value",
        )
    stop = check_stop(body.get("stop"), "stop", limit=MAX_STOP, allow_string=True)
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise _type_error("seed", "an integer", seed)
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise _bad("Invalid 'seed': expected a 64-bit integer.", "seed")
    items: list[JSON] = []
    for i, message in enumerate(messages):
        _message(message, f"messages[{i}]", items)
    out: JSON = {"model": model, "input": items, "store": False}  # unless asked for (_SAME)
    for key in _SAME:
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("tools") is not None:
        tools = body["tools"]
        if not isinstance(tools, list):
            raise _type_error("tools", "an array", tools)
        out["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    text: JSON = {}
    if body.get("response_format") is not None:
        text["format"] = _response_format(body["response_format"])
    if body.get("verbosity") is not None:
        text["verbosity"] = body["verbosity"]
    if text:
        out["text"] = text
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get("max_tokens")
    if limit is not None:
        out["max_output_tokens"] = limit
    retention = body.get("prompt_cache_retention")
    if retention is not None:
        if retention not in ("in_memory", "24h"):
            raise _bad(
                f"Invalid value: '{retention}'. Supported values are: 'in_memory' and '24h'.",
                "prompt_cache_retention",
            )
        out["prompt_cache_retention"] = "in-memory" if retention == "in_memory" else retention
    if body.get("reasoning_effort") is not None:
        out["reasoning"] = {"effort": body["reasoning_effort"]}
    logprobs = bool(body.get("logprobs"))
    if logprobs:
        out["include"] = ["message.output_text.logprobs"]
        if body.get("top_logprobs") is not None:
            out["top_logprobs"] = body["top_logprobs"]
    elif body.get("top_logprobs") is not None:
        raise _bad("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    stream = body.get("stream") is True
    include_usage = False
    if body.get("stream_options") is not None:
        options = _obj(body["stream_options"], "stream_options")
        if not stream:
            raise _bad(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options"
            )
        include_usage = options.get("include_usage") is True
    return out, ChatOptions(model, stream, include_usage, logprobs, n=n, stop=stop, seed=seed)


# The Responses fields a Chat Completions field became, for errors raised past the translation.
_PARAMS = {
    "include": "logprobs",
    "max_output_tokens": "max_completion_tokens",
    "text": "response_format",
    "reasoning": "reasoning_effort",
    "input": "messages",
}


def chat_param(param: str | None) -> str | None:
    """A refused Responses field named as the Chat Completions client sent it (``text.format.schema``
    → ``response_format``; an input item → ``messages``, whose indexes differ)."""
    if param is None:
        return None
    head = param.split(".", 1)[0].split("[", 1)[0]
    return _PARAMS.get(head, param)


# ---------------------------------------------------------------------------------------- replies
def finish_reason(response: JSON) -> str:
    """A finished Response's Chat Completions ``finish_reason``."""
    status = response.get("status")
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "content_filter" if reason == "content_filter" else "length"
    if any(item.get("type") == "function_call" for item in response.get("output") or []):
        return "tool_calls"
    return "stop"


def chat_usage(usage: Any) -> JSON | None:
    """A Response's usage in Chat Completions' words."""
    if not isinstance(usage, dict):
        return None
    prompt = int(usage.get("input_tokens") or 0)
    completion = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
        "prompt_tokens_details": {
            "cached_tokens": int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        },
        "completion_tokens_details": {
            "reasoning_tokens": int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)
        },
    }


def _chat_logprobs(entries: list[JSON]) -> list[JSON]:
    return [
        {
            "token": e.get("token", ""),
            "logprob": e.get("logprob", 0.0),
            "bytes": e.get("bytes"),
            "top_logprobs": [
                {"token": t.get("token", ""), "logprob": t.get("logprob", 0.0), "bytes": t.get("bytes")}
                for t in e.get("top_logprobs") or []
            ],
        }
        for e in entries
    ]


def _reasoning_text(item: JSON) -> str:
    raw = [c.get("text", "") for c in item.get("content") or [] if c.get("type") == "reasoning_text"]
    if raw:
        return "".join(raw)
    return "\n\n".join(s.get("text", "") for s in item.get("summary") or [])


def chat_id(response_id: str) -> str:
    """The completion's id, derived from the Response's (one id per run, in Chat Completions' form)."""
    return "chatcmpl-" + response_id.removeprefix("resp_")


def completion_from_response(response: JSON, options: ChatOptions) -> JSON:
    """A finished (completed or incomplete) Response as one ``chat.completion`` object."""
    return completion_from_responses([response], options)


def completion_from_responses(responses: list[JSON], options: ChatOptions) -> JSON:
    """Finished Responses, one per choice (``n``), as one ``chat.completion``: the first one's id and
    model, a choice per Response in order, their usage summed."""
    first = responses[0]
    usages = [chat_usage(r.get("usage")) for r in responses]
    return {
        "id": chat_id(str(first.get("id", ""))),
        "object": "chat.completion",
        "created": int(first.get("created_at") or time.time()),
        "model": first.get("model") or options.model,
        "system_fingerprint": None,
        "service_tier": first.get("service_tier"),
        "choices": [_choice(r, index, options) for index, r in enumerate(responses)],
        "usage": sum_usage(usages),
    }


def sum_usage(usages: list[JSON | None]) -> JSON | None:
    """Chat Completions usages added up (the choices of one request); None if none has any."""
    known = [u for u in usages if u is not None]
    if not known:
        return None
    total = known[0]
    for usage in known[1:]:
        total = {
            "prompt_tokens": total["prompt_tokens"] + usage["prompt_tokens"],
            "completion_tokens": total["completion_tokens"] + usage["completion_tokens"],
            "total_tokens": total["total_tokens"] + usage["total_tokens"],
            "prompt_tokens_details": {
                "cached_tokens": total["prompt_tokens_details"]["cached_tokens"]
                + usage["prompt_tokens_details"]["cached_tokens"]
            },
            "completion_tokens_details": {
                "reasoning_tokens": total["completion_tokens_details"]["reasoning_tokens"]
                + usage["completion_tokens_details"]["reasoning_tokens"]
            },
        }
    return total


def _choice(response: JSON, index: int, options: ChatOptions) -> JSON:
    texts: list[str] = []
    refusals: list[str] = []
    reasoning: list[str] = []
    calls: list[JSON] = []
    annotations: list[JSON] = []
    logprobs: list[JSON] = []
    for item in response.get("output") or []:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    offset = sum(len(t) for t in texts)
                    texts.append(part.get("text", ""))
                    logprobs.extend(_chat_logprobs(part.get("logprobs") or []))
                    for note in part.get("annotations") or []:
                        if note.get("type") == "url_citation":
                            annotations.append(
                                {
                                    "type": "url_citation",
                                    "url_citation": {
                                        "start_index": offset + int(note.get("start_index") or 0),
                                        "end_index": offset + int(note.get("end_index") or 0),
                                        "title": note.get("title") or "",
                                        "url": note.get("url") or "",
                                    },
                                }
                            )
                elif part.get("type") == "refusal":
                    refusals.append(part.get("refusal", ""))
        elif kind == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
                }
            )
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                reasoning.append(text)
    message: JSON = {
        "role": "assistant",
        "content": "".join(texts) if texts or not (calls or refusals) else None,
        "refusal": "".join(refusals) if refusals else None,
        "annotations": annotations,
    }
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "\n\n".join(reasoning)
    return {
        "index": index,
        "message": message,
        "logprobs": {"content": logprobs, "refusal": None} if options.logprobs else None,
        "finish_reason": finish_reason(response),
    }


_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ChatStream:
    """A Response's events → ``chat.completion.chunk`` objects, incrementally.

    :meth:`feed` takes one event and returns the chunks it makes (often none); after the terminal
    event :attr:`done` is set. A failure becomes the one chunk OpenAI sends for an error mid-stream,
    ``{"error": {...}}``, and the stream ends without ``[DONE]`` (:attr:`failed`).

    With ``n`` > 1 there is one per choice: ``index`` is the choice's, ``head`` the completion's id
    and ``created`` (those of the first choice's Response, for every choice), and ``usage`` False
    leaves the usage chunk to the server, which sums the choices'.
    """

    __slots__ = (
        "_calls",
        "_created",
        "_fixed",
        "_id",
        "_index",
        "_last_reasoning",
        "_model",
        "_reasoning",
        "_seen",
        "_sent",
        "_started",
        "_usage",
        "done",
        "failed",
        "options",
    )

    def __init__(
        self,
        options: ChatOptions,
        *,
        index: int = 0,
        head: tuple[str, int] | None = None,
        usage: bool = True,
    ) -> None:
        self.options = options
        self._index = index
        self._usage = usage
        self._fixed = head is not None
        self._id, self._created = head if head is not None else ("chatcmpl-", int(time.time()))
        self._model = options.model
        self._started = False
        self._calls: dict[str, int] = {}  # function_call item id -> tool_calls index
        self._sent: list[str] = []  # the arguments sent so far, by tool_calls index
        self._seen: set[str] = set()  # "item id/content index" of the parts that had deltas
        self._reasoning: dict[str, str] = {}  # reasoning item id -> the kind of text it streams
        self._last_reasoning: str | None = None  # the reasoning item that streamed last
        self.done = False
        self.failed = False

    def _chunk(self, delta: JSON, finish: str | None = None, logprobs: list[JSON] | None = None) -> JSON:
        chunk: JSON = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": self._index,
                    "delta": delta,
                    "logprobs": {"content": logprobs, "refusal": None} if logprobs is not None else None,
                    "finish_reason": finish,
                }
            ],
        }
        if self.options.include_usage:
            chunk["usage"] = None
        return chunk

    def _start(self, out: list[JSON]) -> None:
        if not self._started:
            self._started = True
            out.append(self._chunk({"role": "assistant", "content": "", "refusal": None}))

    def feed(self, event: JSON) -> list[JSON]:
        """The chunks ``event`` makes."""
        if self.done:
            return []
        kind = event.get("type")
        out: list[JSON] = []
        if kind in ("response.created", "response.queued", "response.in_progress"):
            response = event.get("response") or {}
            if response.get("id") and not self._fixed:
                self._id = chat_id(str(response["id"]))
            if response.get("created_at") and not self._fixed:
                self._created = int(response["created_at"])
            self._model = response.get("model") or self._model
            self._start(out)
            return out
        self._start(out)
        if kind == "response.output_text.delta":
            self._seen.add(f"{event.get('item_id')}/{event.get('content_index', 0)}")
            logprobs = _chat_logprobs(event.get("logprobs") or []) if self.options.logprobs else None
            out.append(self._chunk({"content": event.get("delta", "")}, logprobs=logprobs))
        elif kind == "response.refusal.delta":
            self._seen.add(f"{event.get('item_id')}/{event.get('content_index', 0)}")
            out.append(self._chunk({"refusal": event.get("delta", "")}))
        elif kind == "response.reasoning_text.delta":
            self._reason(str(event.get("item_id")), "raw", event.get("delta", ""), out)
        elif kind == "response.reasoning_summary_text.delta":
            self._reason(str(event.get("item_id")), "summary", event.get("delta", ""), out)
        elif kind == "response.reasoning_summary_part.added" and event.get("summary_index", 0) > 0:
            self._reason(str(event.get("item_id")), "summary", "\n\n", out)
        elif kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") == "function_call":
                index = self._calls[str(item.get("id"))] = len(self._calls)
                self._sent.append("")
                call = {
                    "index": index,
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": ""},
                }
                out.append(self._chunk({"tool_calls": [call]}))
                if item.get("arguments"):
                    out.append(self._args(index, item["arguments"]))
        elif kind == "response.function_call_arguments.delta":
            known = self._calls.get(str(event.get("item_id")))
            if known is not None:
                out.append(self._args(known, event.get("delta", "")))
        elif kind == "response.output_item.done":
            item = event.get("item") or {}
            known = self._calls.get(str(item.get("id")))
            final = item.get("arguments")
            if item.get("type") == "message":
                for j, part in enumerate(item.get("content") or []):
                    # A part that arrived whole, without deltas: one delta with all of it.
                    if f"{item.get('id')}/{j}" in self._seen:
                        continue
                    if part.get("type") == "output_text" and part.get("text"):
                        out.append(self._chunk({"content": part["text"]}))
                    elif part.get("type") == "refusal" and part.get("refusal"):
                        out.append(self._chunk({"refusal": part["refusal"]}))
            if known is not None and isinstance(final, str):
                # A back end may settle the arguments only at the end ("{}" for a call without any).
                sent = self._sent[known]
                if final != sent and final.startswith(sent):
                    out.append(self._args(known, final[len(sent) :]))
        elif kind in _TERMINAL:
            self.done = True
            response = event.get("response") or {}
            if kind == "response.failed":
                self.failed = True
                failure = response.get("error") or {}
                code = failure.get("code")
                out.append(
                    {
                        "error": {
                            "message": failure.get("message") or "The response failed.",
                            "type": "server_error"
                            if code in (None, "server_error")
                            else "invalid_request_error"
                            if code == "invalid_prompt"
                            else str(code),
                            "param": None,
                            "code": code,
                        }
                    }
                )
                return out
            out.append(self._chunk({}, finish_reason(response)))
            if self.options.include_usage and self._usage:
                usage_chunk = self._chunk({})
                usage_chunk["choices"] = []
                usage_chunk["usage"] = chat_usage(response.get("usage"))
                out.append(usage_chunk)
        return out

    def _reason(self, item_id: str, kind: str, text: str, out: list[JSON]) -> None:
        """Reasoning text as ``reasoning_content``: one kind per item (its raw text, or else its
        summary, whichever streams first), items apart by a blank line, as in the one-body reply."""
        if self._reasoning.setdefault(item_id, kind) != kind or not text:
            return
        if item_id != self._last_reasoning:
            if self._last_reasoning is not None:
                text = "\n\n" + text
            self._last_reasoning = item_id
        out.append(self._chunk({"reasoning_content": text}))

    def _args(self, index: int, delta: str) -> JSON:
        self._sent[index] += delta
        return self._chunk({"tool_calls": [{"index": index, "function": {"arguments": delta}}]})
