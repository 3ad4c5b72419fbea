"""The create-response request as the gateway understands it, after validation at the edge.

``parse_request`` (in this module) turns the JSON body into a :class:`ResponseRequest` once; nothing
downstream re-validates. Input is normalized: a plain string becomes one user message, every message's
``content`` becomes a list of typed parts, and role-only messages get ``type: "message"``.

Errors are :class:`RequestError` with OpenAI's wording and codes (``invalid_type``, ``invalid_value``,
``unknown_parameter``, ``missing_required_parameter``…) and ``param`` naming the offending field the
way OpenAI does (``input[2].role``, ``tools[0].name``). Top-level and a few fixed-shape objects
(``text``, ``reasoning``, ``stream_options``) reject unknown keys like OpenAI; input items and tools
keep extra keys so that passthrough providers see them untouched.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

__all__ = [
    "JSON",
    "MAX_NESTING",
    "RequestError",
    "ResponseRequest",
    "check_nesting",
    "echo_tool",
    "parse_request",
    "public_tools",
]

# Tool fields that carry credentials for a server the tool reaches: sent there, never echoed or stored.
SECRET_TOOL_FIELDS = ("headers", "authorization")


def public_tools(tools: list[JSON]) -> list[JSON]:
    """``tools`` without credentials (an MCP tool's ``headers`` and ``authorization``), as OpenAI
    echoes them on the Response."""
    return [
        {k: v for k, v in tool.items() if k not in SECRET_TOOL_FIELDS}
        if isinstance(tool, dict) and tool.get("type") == "mcp"
        else tool
        for tool in tools
    ]


@dataclass(slots=True)
class ResponseRequest:
    model: str
    input: list[JSON] = field(default_factory=list)
    instructions: str | None = None
    tools: list[JSON] = field(default_factory=list)
    tool_choice: str | JSON = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    text: JSON = field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: JSON | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    conversation: str | JSON | None = None
    include: list[str] = field(default_factory=list)
    metadata: JSON | None = None
    truncation: str | None = None
    user: str | None = None
    top_logprobs: int | None = None
    # ``context_management``: the token count past which the context is compacted before the turn
    # (its ``compaction`` entry's ``compact_threshold``, or the default), None without one.
    compact_threshold: int | None = None
    # The body exactly as received, for passthrough providers.
    raw: JSON = field(default_factory=dict)
    # Hints: validated and echoed on the Response, never acted upon by a back end.
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    client_metadata: JSON | None = None
    stream_options: JSON | None = None
    prompt: JSON | None = None
    # Engine options the Responses API has no field for, set by the other front ends (Chat
    # Completions' ``stop``/``seed``, Messages' ``stop_sequences``), never parsed from a Responses
    # body: the output is cut before the first stop sequence (natively by back ends that take them,
    # by the engine for the others: engine/stop.py); ``seed`` goes to back ends that take one.
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def echo(self) -> JSON:
        """The request fields a Response reports back (keyword arguments for ``new_response``)."""
        reasoning = self.reasoning or {}
        return {
            "background": self.background,
            "conversation": _conversation_echo(self.conversation),
            "frequency_penalty": self.frequency_penalty,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": self.max_tool_calls,
            "metadata": self.metadata,
            "parallel_tool_calls": self.parallel_tool_calls,
            "presence_penalty": self.presence_penalty,
            "previous_response_id": self.previous_response_id,
            "prompt": self.prompt,
            "prompt_cache_key": self.prompt_cache_key,
            "prompt_cache_retention": self.prompt_cache_retention,
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "safety_identifier": self.safety_identifier,
            "service_tier": self.service_tier,
            "store": self.store,
            "temperature": self.temperature,
            "text": {
                "format": self.text.get("format", {"type": "text"}),
                "verbosity": self.text.get("verbosity") or "medium",
            },
            "tool_choice": self.tool_choice,
            "tools": [echo_tool(tool) for tool in self.tools],
            "top_logprobs": self.top_logprobs,
            "top_p": self.top_p,
            "truncation": self.truncation,
            "user": self.user,
        }


def echo_tool(tool: JSON) -> JSON:
    """A tool as the Response reports it: a function tool (also inside a namespace) always carries
    ``description``, ``parameters`` and ``strict`` (null when the client left them out), as OpenAI's
    Response and the Open Responses schema have them."""
    kind = tool.get("type")
    if kind == "function":
        missing = [key for key in ("description", "parameters", "strict") if key not in tool]
        return {**tool, **dict.fromkeys(missing)} if missing else tool
    if kind == "namespace" and isinstance(tool.get("tools"), list):
        return {**tool, "tools": [echo_tool(sub) for sub in tool["tools"]]}
    return tool


def _conversation_echo(conversation: str | JSON | None) -> JSON | None:
    if conversation is None:
        return None
    if isinstance(conversation, str):
        return {"id": conversation}
    return conversation


class RequestError(Exception):
    """A request the gateway refuses, with the HTTP status and OpenAI error fields to report."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status
        self.type = type


# ---------------------------------------------------------------------------------------- primitives
_TYPE_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a decimal",
    str: "a string",
    dict: "an object",
    list: "an array",
    type(None): "null",
}


def _got(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), "an unknown type")


def _invalid_type(param: str, expected: str, value: Any) -> RequestError:
    return RequestError(
        f"Invalid type for '{param}': expected {expected}, but got {_got(value)} instead.",
        param=param,
        code="invalid_type",
    )


def _invalid_value(param: str, value: Any, allowed: tuple[str, ...]) -> RequestError:
    quoted = [f"'{a}'" for a in allowed]
    supported = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}"
    return RequestError(
        f"Invalid value: '{value}'. Supported values are: {supported}.", param=param, code="invalid_value"
    )


def _missing(param: str) -> RequestError:
    return RequestError(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _unknown(param: str) -> RequestError:
    return RequestError(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")


def _unsupported(param: str, why: str) -> RequestError:
    return RequestError(f"Unsupported parameter: '{param}' {why}", param=param, code=None)


def _str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _invalid_type(param, "a string", value)
    return value


def _opt_str(value: Any, param: str) -> str | None:
    return None if value is None else _str(value, param)


def _bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid_type(param, "a boolean", value)
    return value


def _obj(value: Any, param: str) -> JSON:
    if not isinstance(value, dict):
        raise _invalid_type(param, "an object", value)
    return value


def check_list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise _invalid_type(param, "an array", value)
    return value


def _out_of_range(param: str, kind: str, below: bool, bound: float, value: Any) -> RequestError:
    side, op = ("below minimum", ">=") if below else ("above maximum", "<=")
    return RequestError(
        f"Invalid '{param}': {kind} {side} value. Expected a value {op} {bound:g}, but got {value} instead.",
        param=param,
        code=f"{kind}_{'below_min' if below else 'above_max'}_value",
    )


def _number(value: Any, param: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid_type(param, "a decimal", value)
    if value < lo or value > hi:
        raise _out_of_range(param, "decimal", value < lo, lo if value < lo else hi, value)
    return float(value)


def _int(value: Any, param: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid_type(param, "an integer", value)
    if value < lo or (hi is not None and value > hi):
        raise _out_of_range(param, "integer", value < lo, lo if value < lo else (hi or lo), value)
    return value


def _enum(value: Any, param: str, allowed: tuple[str, ...]) -> str:
    _str(value, param)
    if value not in allowed:
        raise _invalid_value(param, value, allowed)
    return str(value)


def _opt_enum(value: Any, param: str, allowed: tuple[str, ...]) -> str | None:
    return None if value is None else _enum(value, param, allowed)


def _only_keys(obj: JSON, param: str, allowed: frozenset[str]) -> None:
    for key in obj:
        if key not in allowed:
            raise _unknown(f"{param}.{key}")


def _type_of(obj: JSON, param: str) -> str:
    if "type" not in obj:
        raise _missing(f"{param}.type")
    return _str(obj["type"], f"{param}.type")


# ---------------------------------------------------------------------------------------- input
ROLES = ("user", "assistant", "system", "developer")
ITEM_STATUSES = ("in_progress", "completed", "incomplete")
INPUT_PARTS = ("input_text", "input_image", "input_file")
ASSISTANT_PARTS = ("output_text", "refusal", *INPUT_PARTS)
IMAGE_DETAILS = ("low", "high", "auto")

# Item types that carry only data the gateway passes through: checked for being objects with a type.
PASSTHROUGH_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "computer_call",
        "computer_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "tool_search_call",
        "tool_search_output",
        "compaction",
    }
)
CHECKED_ITEMS = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "item_reference",
)


def _part(value: Any, param: str, allowed: tuple[str, ...]) -> JSON:
    part = _obj(value, param)
    kind = _type_of(part, param)
    if kind not in allowed:
        raise _invalid_value(f"{param}.type", kind, allowed)
    if kind in ("input_text", "output_text"):
        if "text" not in part:
            raise _missing(f"{param}.text")
        _str(part["text"], f"{param}.text")
        if kind == "output_text" and "annotations" in part:
            check_list(part["annotations"], f"{param}.annotations")
    elif kind == "refusal":
        if "refusal" not in part:
            raise _missing(f"{param}.refusal")
        _str(part["refusal"], f"{param}.refusal")
    elif kind == "input_image":
        _opt_str(part.get("image_url"), f"{param}.image_url")
        _opt_str(part.get("file_id"), f"{param}.file_id")
        if part.get("image_url") is None and part.get("file_id") is None:
            raise _missing(f"{param}.image_url")
        if part.get("detail") is not None:
            _enum(part["detail"], f"{param}.detail", IMAGE_DETAILS)
    else:
        for key in ("file_id", "file_data", "file_url", "filename"):
            _opt_str(part.get(key), f"{param}.{key}")
        if all(part.get(k) is None for k in ("file_id", "file_data", "file_url")):
            raise _missing(f"{param}.file_data")
    return part


def _message(item: JSON, param: str) -> JSON:
    if "role" not in item:
        raise _missing(f"{param}.role")
    role = _enum(item["role"], f"{param}.role", ROLES)
    if "content" not in item:
        raise _missing(f"{param}.content")
    content = item["content"]
    if isinstance(content, str):
        parts: list[JSON] = [
            {"type": "output_text" if role == "assistant" else "input_text", "text": content}
        ]
        if role == "assistant":
            parts[0]["annotations"] = []
    elif isinstance(content, list):
        allowed = ASSISTANT_PARTS if role == "assistant" else INPUT_PARTS
        parts = [_part(p, f"{param}.content[{j}]", allowed) for j, p in enumerate(content)]
    else:
        raise _invalid_type(f"{param}.content", "a string or an array", content)
    if item.get("status") is not None:
        _enum(item["status"], f"{param}.status", ITEM_STATUSES)
    _opt_str(item.get("id"), f"{param}.id")
    _opt_str(item.get("phase"), f"{param}.phase")
    out = {"type": "message", **{k: v for k, v in item.items() if k != "type"}}
    out["content"] = parts
    return out


def _output_value(value: Any, param: str) -> None:
    if isinstance(value, str):
        return
    if isinstance(value, list):
        for j, p in enumerate(value):
            _part(p, f"{param}[{j}]", INPUT_PARTS)
        return
    raise _invalid_type(param, "a string or an array", value)


def _required_str(item: JSON, key: str, param: str) -> None:
    if key not in item:
        raise _missing(f"{param}.{key}")
    _str(item[key], f"{param}.{key}")


def check_input_item(value: Any, param: str) -> JSON:
    item = _obj(value, param)
    kind = item.get("type")
    if kind is None and "role" in item:
        return _message(item, param)
    if kind is None and set(item) == {"id"}:
        # OpenAI's ItemReference: ``type`` is optional.
        _required_str(item, "id", param)
        return {"type": "item_reference", "id": item["id"]}
    kind = _type_of(item, param)
    if kind == "message":
        return _message(item, param)
    if kind == "item_reference":
        # Resolved from the store by the server (the Vercel AI SDK sends these by default).
        _required_str(item, "id", param)
        return {"type": "item_reference", "id": item["id"]}
    if kind in ("function_call", "custom_tool_call"):
        _required_str(item, "call_id", param)
        _required_str(item, "name", param)
        _required_str(item, "arguments" if kind == "function_call" else "input", param)
        _opt_str(item.get("id"), f"{param}.id")
        if item.get("status") is not None:
            _enum(item["status"], f"{param}.status", ITEM_STATUSES)
        return item
    if kind in ("function_call_output", "custom_tool_call_output"):
        _required_str(item, "call_id", param)
        if "output" not in item:
            raise _missing(f"{param}.output")
        _output_value(item["output"], f"{param}.output")
        return item
    if kind == "reasoning":
        summary = check_list(item.get("summary", []), f"{param}.summary")
        for j, s in enumerate(summary):
            s = _obj(s, f"{param}.summary[{j}]")
            if _type_of(s, f"{param}.summary[{j}]") != "summary_text":
                raise _invalid_value(f"{param}.summary[{j}].type", s["type"], ("summary_text",))
            _required_str(s, "text", f"{param}.summary[{j}]")
        _opt_str(item.get("encrypted_content"), f"{param}.encrypted_content")
        if item.get("content") is not None:
            check_list(item["content"], f"{param}.content")
        out = dict(item)
        out["summary"] = summary
        return out
    if kind in PASSTHROUGH_ITEMS:
        return item
    raise _invalid_value(f"{param}.type", kind, (*CHECKED_ITEMS, *sorted(PASSTHROUGH_ITEMS)))


def _input(value: Any) -> list[JSON]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    items = check_list(value, "input")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "compaction_trigger":
            out.append(_compaction_trigger(item, f"input[{i}]", last=i == len(items) - 1))
        else:
            out.append(check_input_item(item, f"input[{i}]"))
    return out


def _compaction_trigger(item: JSON, param: str, *, last: bool) -> JSON:
    """``{"type": "compaction_trigger"}``: compact the context now (the server answers with a compaction
    item and nothing else). It must be the final input item."""
    if not last:
        raise RequestError(
            f"Invalid '{param}': a 'compaction_trigger' item must be the final input item.",
            param=param,
            code="invalid_value",
        )
    for key in item:
        if key not in ("type", "id"):
            raise _unknown(f"{param}.{key}")
    _opt_str(item.get("id"), f"{param}.id")
    return {"type": "compaction_trigger"}


# ---------------------------------------------------------------------------------------- tools
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
TOOL_TYPES = (
    "function",
    "custom",
    "namespace",
    "tool_search",
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
    "file_search",
    "mcp",
    "image_generation",
    "code_interpreter",
    "computer_use_preview",
    "computer",
    "local_shell",
    "shell",
    "apply_patch",
)


def _tool_name(tool: JSON, param: str) -> str:
    if "name" not in tool:
        raise _missing(f"{param}.name")
    name = _str(tool["name"], f"{param}.name")
    if not TOOL_NAME.match(name):
        raise RequestError(
            f"Invalid '{param}.name': string does not match pattern. Expected a string that matches the "
            "pattern '^[a-zA-Z0-9_.-]+$' (at most 128 characters).",
            param=f"{param}.name",
            code="invalid_value",
        )
    return name


def _function_tool(tool: JSON, param: str) -> None:
    _tool_name(tool, param)
    _opt_str(tool.get("description"), f"{param}.description")
    if tool.get("parameters") is not None:
        _obj(tool["parameters"], f"{param}.parameters")
    if tool.get("strict") is not None:
        _bool(tool["strict"], f"{param}.strict")


def _tool(value: Any, param: str) -> JSON:
    tool = _obj(value, param)
    kind = _type_of(tool, param)
    if kind not in TOOL_TYPES:
        raise _invalid_value(f"{param}.type", kind, TOOL_TYPES)
    if kind == "function":
        _function_tool(tool, param)
    elif kind == "custom":
        _tool_name(tool, param)
        _opt_str(tool.get("description"), f"{param}.description")
        if tool.get("format") is not None:
            fmt = _obj(tool["format"], f"{param}.format")
            fkind = _enum(_type_of(fmt, f"{param}.format"), f"{param}.format.type", ("text", "grammar"))
            if fkind == "grammar":
                _enum(fmt.get("syntax"), f"{param}.format.syntax", ("lark", "regex"))
                _required_str(fmt, "definition", f"{param}.format")
    elif kind == "namespace":
        _tool_name(tool, param)
        for j, sub in enumerate(check_list(tool.get("tools", []), f"{param}.tools")):
            sub = _obj(sub, f"{param}.tools[{j}]")
            _enum(_type_of(sub, f"{param}.tools[{j}]"), f"{param}.tools[{j}].type", ("function", "custom"))
            _function_tool(sub, f"{param}.tools[{j}]")
    elif kind == "file_search":
        if "vector_store_ids" not in tool:
            raise _missing(f"{param}.vector_store_ids")
        check_list(tool["vector_store_ids"], f"{param}.vector_store_ids")
    elif kind == "mcp":
        _required_str(tool, "server_label", param)
    return tool


def _callable_names(tools: list[JSON]) -> set[tuple[str, str]]:
    names: set[tuple[str, str]] = set()
    for tool in tools:
        if tool["type"] in ("function", "custom"):
            names.add((tool["type"], tool["name"]))
        elif tool["type"] == "namespace":
            names.update((sub["type"], sub["name"]) for sub in tool.get("tools", []))
    return names


HOSTED_CHOICES = (
    "file_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "web_search",
    "computer_use_preview",
    "computer",
    "code_interpreter",
    "image_generation",
    "mcp",
    "apply_patch",
    "shell",
    "tool_search",
)


def _tool_choice(value: Any, tools: list[JSON]) -> str | JSON:
    if isinstance(value, str):
        return _enum(value, "tool_choice", ("none", "auto", "required"))
    choice = _obj(value, "tool_choice")
    kind = _type_of(choice, "tool_choice")
    if kind in ("function", "custom"):
        name = _str(choice.get("name"), "tool_choice.name") if "name" in choice else None
        if name is None:
            raise _missing("tool_choice.name")
        if (kind, name) not in _callable_names(tools):
            raise RequestError(
                f"Tool choice '{kind}' not found in 'tools' parameter.", param="tool_choice", code=None
            )
    elif kind == "allowed_tools":
        _enum(choice.get("mode"), "tool_choice.mode", ("auto", "required"))
        for j, t in enumerate(check_list(choice.get("tools"), "tool_choice.tools")):
            _type_of(_obj(t, f"tool_choice.tools[{j}]"), f"tool_choice.tools[{j}]")
    elif kind not in HOSTED_CHOICES:
        raise _invalid_value(
            "tool_choice.type", kind, ("function", "custom", "allowed_tools", *HOSTED_CHOICES)
        )
    return choice


# ---------------------------------------------------------------------------------------- objects
TEXT_KEYS = frozenset({"format", "verbosity"})
REASONING_KEYS = frozenset({"effort", "summary", "generate_summary"})
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
SUMMARIES = ("auto", "concise", "detailed")
INCLUDABLE = (
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "web_search_call.action.sources",
    "web_search_call.results",
)
SCHEMA_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _text(value: Any) -> JSON:
    text = _obj(value, "text")
    _only_keys(text, "text", TEXT_KEYS)
    out: JSON = {"format": {"type": "text"}}
    if text.get("format") is not None:
        fmt = _obj(text["format"], "text.format")
        kind = _enum(_type_of(fmt, "text.format"), "text.format.type", ("text", "json_schema", "json_object"))
        if kind == "json_schema":
            if "name" not in fmt:
                raise _missing("text.format.name")
            if not SCHEMA_NAME.match(_str(fmt["name"], "text.format.name")):
                raise RequestError(
                    "Invalid 'text.format.name': string does not match pattern. Expected a string that "
                    "matches the pattern '^[a-zA-Z0-9_-]+$'.",
                    param="text.format.name",
                    code="invalid_value",
                )
            if "schema" not in fmt:
                raise _missing("text.format.schema")
            _obj(fmt["schema"], "text.format.schema")
            if fmt.get("strict") is not None:
                _bool(fmt["strict"], "text.format.strict")
            _opt_str(fmt.get("description"), "text.format.description")
        out["format"] = fmt
    if text.get("verbosity") is not None:
        out["verbosity"] = _enum(text["verbosity"], "text.verbosity", ("low", "medium", "high"))
    return out


def _reasoning(value: Any) -> JSON:
    reasoning = _obj(value, "reasoning")
    _only_keys(reasoning, "reasoning", REASONING_KEYS)
    summary = _opt_enum(reasoning.get("summary"), "reasoning.summary", SUMMARIES)
    legacy = _opt_enum(reasoning.get("generate_summary"), "reasoning.generate_summary", SUMMARIES)
    return {
        "effort": _opt_enum(reasoning.get("effort"), "reasoning.effort", EFFORTS),
        "summary": summary if summary is not None else legacy,
    }


def check_metadata(value: Any) -> JSON:
    metadata = _obj(value, "metadata")
    if len(metadata) > 16:
        raise RequestError(
            "Invalid 'metadata': too many properties. Expected an object with at most 16 properties, "
            f"but got an object with {len(metadata)} properties instead.",
            param="metadata",
            code="object_above_max_properties",
        )
    for key, val in metadata.items():
        if len(key) > 64:
            raise RequestError(
                f"Invalid 'metadata': key '{key[:20]}…' is longer than 64 characters.",
                param="metadata",
                code="invalid_value",
            )
        if not isinstance(val, str) or len(val) > 512:
            raise RequestError(
                f"Invalid 'metadata.{key}': expected a string of at most 512 characters.",
                param=f"metadata.{key}",
                code="invalid_value",
            )
    return metadata


def _include(value: Any) -> list[str]:
    return [_enum(v, f"include[{i}]", INCLUDABLE) for i, v in enumerate(check_list(value, "include"))]


def _conversation(value: Any) -> str | JSON:
    if isinstance(value, str):
        return value
    conversation = _obj(value, "conversation")
    _required_str(conversation, "id", "conversation")
    return conversation


def _stream_options(value: Any) -> JSON:
    options = _obj(value, "stream_options")
    _only_keys(options, "stream_options", frozenset({"include_obfuscation"}))
    if options.get("include_obfuscation") is not None:
        _bool(options["include_obfuscation"], "stream_options.include_obfuscation")
    return options


def _prompt(value: Any) -> JSON:
    prompt = _obj(value, "prompt")
    _required_str(prompt, "id", "prompt")
    return prompt


# ---------------------------------------------------------------------------------------- top level
_Setter = Callable[[ResponseRequest, Any], None]


def _set(attr: str, check: Callable[[Any, str], Any]) -> _Setter:
    def setter(req: ResponseRequest, value: Any) -> None:
        if value is not None:
            setattr(req, attr, check(value, attr))

    return setter


def _set_value(attr: str, check: Callable[[Any], Any]) -> _Setter:
    def setter(req: ResponseRequest, value: Any) -> None:
        if value is not None:
            setattr(req, attr, check(value))

    return setter


def _set_tool_choice(req: ResponseRequest, value: Any) -> None:
    # Resolved after ``tools`` (see parse_request), since a named choice must match a declared tool.
    if value is not None:
        req.tool_choice = value


# ``context_management: [{"type": "compaction"}]`` without a ``compact_threshold``: OpenAI picks one per
# model; the gateway, which does not know every back end's window, uses this one (estimated tokens).
DEFAULT_COMPACT_THRESHOLD = 100_000
# OpenAI's minimum ``compact_threshold``.
MIN_COMPACT_THRESHOLD = 1000


def _set_context_management(req: ResponseRequest, value: Any) -> None:
    if value is None:
        return
    for i, entry in enumerate(check_list(value, "context_management")):
        param = f"context_management[{i}]"
        entry = _obj(entry, param)
        _enum(_type_of(entry, param), f"{param}.type", ("compaction",))
        for key in entry:
            if key not in ("type", "compact_threshold"):
                raise _unknown(f"{param}.{key}")
        threshold = entry.get("compact_threshold")
        if threshold is None:
            req.compact_threshold = DEFAULT_COMPACT_THRESHOLD
        else:
            req.compact_threshold = _int(threshold, f"{param}.compact_threshold", MIN_COMPACT_THRESHOLD)


def _set_tools(req: ResponseRequest, value: Any) -> None:
    if value is not None:
        req.tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(check_list(value, "tools"))]


def _set_input(req: ResponseRequest, value: Any) -> None:
    if value is not None:
        req.input = _input(value)


# Every top-level field of the create-response body and how it is checked. Anything else is an
# ``unknown_parameter``, as OpenAI answers.
FIELDS: dict[str, _Setter] = {
    "model": lambda req, value: None,
    "input": _set_input,
    "instructions": _set("instructions", _opt_str),
    "tools": _set_tools,
    "tool_choice": _set_tool_choice,
    "parallel_tool_calls": _set("parallel_tool_calls", _bool),
    "temperature": _set("temperature", lambda v, p: _number(v, p, 0, 2)),
    "top_p": _set("top_p", lambda v, p: _number(v, p, 0, 1)),
    # In the Open Responses spec's create body (OpenAI's range); the Vercel AI SDK's Open Responses
    # provider sends them for presencePenalty / frequencyPenalty.
    "presence_penalty": _set("presence_penalty", lambda v, p: _number(v, p, -2, 2)),
    "frequency_penalty": _set("frequency_penalty", lambda v, p: _number(v, p, -2, 2)),
    # OpenAI's own API refuses budgets under 16; the back ends behind a gateway (llama.cpp, vLLM, Chat
    # Completions servers) accept any positive budget, so the gateway does too. The openai passthrough
    # relays OpenAI's 400 for a budget it refuses.
    "max_output_tokens": _set("max_output_tokens", lambda v, p: _int(v, p, 1)),
    "max_tool_calls": _set("max_tool_calls", lambda v, p: _int(v, p, 1)),
    "text": _set_value("text", _text),
    "reasoning": _set_value("reasoning", _reasoning),
    "stream": _set("stream", _bool),
    "stream_options": _set_value("stream_options", _stream_options),
    "store": _set("store", _bool),
    "background": _set("background", _bool),
    "previous_response_id": _set("previous_response_id", _str),
    "conversation": _set_value("conversation", _conversation),
    "include": _set_value("include", _include),
    "metadata": _set_value("metadata", check_metadata),
    "truncation": _set("truncation", lambda v, p: _enum(v, p, ("auto", "disabled"))),
    "user": _set("user", _str),
    "safety_identifier": _set("safety_identifier", _str),
    "prompt_cache_key": _set("prompt_cache_key", _str),
    "prompt_cache_retention": _set("prompt_cache_retention", lambda v, p: _enum(v, p, ("in-memory", "24h"))),
    "service_tier": _set(
        "service_tier", lambda v, p: _enum(v, p, ("auto", "default", "flex", "scale", "priority"))
    ),
    "client_metadata": _set_value("client_metadata", lambda v: _obj(v, "client_metadata")),
    "top_logprobs": _set("top_logprobs", lambda v, p: _int(v, p, 0, 20)),
    "prompt": _set_value("prompt", _prompt),
    "context_management": _set_context_management,
}

# Stored prompt templates do not exist here: refused with a clear message rather than silently ignored.
# (previous_response_id, conversation, background and item_reference are checked against the store by
# the server, which refuses them only when it runs without one.)
_STATEFUL = {
    "prompt": "is not supported by this gateway: it has no stored prompt templates. Send 'instructions' "
    "and 'input' instead.",
}


# How deep a request body may nest (objects and arrays). Free-form objects (tool parameters, schemas,
# metadata, item content) are stored and re-sent upstream inside envelopes of a few more levels, and
# orjson refuses to serialize past 255: 64 leaves room and is far beyond any real schema.
MAX_NESTING = 64


def check_nesting(body: Any, *, limit: int = MAX_NESTING) -> None:
    """Raise RequestError (400, param: where) if ``body`` nests deeper than ``limit`` levels.

    One iterative pass over the containers (no recursion, nothing built); the path of the offending
    value is worked out only when there is one.
    """
    stack: list[tuple[Any, int]] = [(body, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        value, depth = pop()
        if depth > limit:
            raise RequestError(
                f"The request nests objects and arrays deeper than {limit} levels.",
                param=_deep_path(body, limit),
                code="invalid_value",
            )
        for child in value.values() if type(value) is dict else value:
            if type(child) is dict or type(child) is list:
                push((child, depth + 1))


def _deep_path(body: Any, limit: int) -> str | None:
    """The param naming where ``body`` is too deep: its first two keys on the way (``tools[0].parameters``,
    ``metadata.x``), as OpenAI names a param."""
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(body, 1, ())]
    while stack:
        value, depth, path = stack.pop()
        if depth > limit:
            keys = 0
            name = ""
            for part in path:
                if keys == 2:
                    break
                if part.startswith("["):
                    name += part
                else:
                    keys += 1
                    name += "." + part if name else part
            return name or None
        items = value.items() if type(value) is dict else ((f"[{i}]", v) for i, v in enumerate(value))
        for key, child in items:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1, (*path, str(key))))
    return None


def parse_request(body: Any) -> ResponseRequest:
    """Validate a decoded create-response body and return it normalized; raise RequestError if invalid."""
    if not isinstance(body, dict):
        raise RequestError(
            f"Invalid type for request body: expected an object, but got {_got(body)} instead.",
            code="invalid_type",
        )
    check_nesting(body)
    for key in body:
        if key not in FIELDS:
            raise _unknown(key)
    if body.get("model") is None:
        raise _missing("model")
    req = ResponseRequest(model=_str(body["model"], "model"), raw=body)
    for key, value in body.items():
        FIELDS[key](req, value)
    if "tool_choice" in body and body["tool_choice"] is not None:
        req.tool_choice = _tool_choice(body["tool_choice"], req.tools)
    for key, why in _STATEFUL.items():
        if getattr(req, key) is not None:
            raise _unsupported(key, why)
    return req
