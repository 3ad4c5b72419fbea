"""Google Gemini back end: ``models/{model}:streamGenerateContent?alt=sse`` behind the Responses API.

The request is translated by :func:`build_gemini_body`; the streamed ``GenerateContentResponse`` chunks
drive the :class:`StreamBuilder` through :class:`GeminiTranslator`. docs/providers/gemini.md describes
every mapping and judgment call; the short version:

- text parts -> message text; ``thought: true`` parts -> a reasoning item's summary.
- ``functionCall`` parts arrive whole (Gemini API) or streamed as ``partialArgs`` (Vertex with
  ``streamFunctionCallArguments``); either becomes one ``function_call`` with JSON arguments.
- a ``custom`` tool (Codex's ``apply_patch``) is declared as a function taking one string ``input``;
  its calls come back as ``custom_tool_call`` items (Vertex's streamed ``$.input`` pieces stream out).
- ``thoughtSignature`` (on a call or on a text part) is kept in the ``encrypted_content`` of a
  reasoning item of the same turn (one is emitted, with an empty summary, when the model streamed no
  thoughts) and put back on the same part next turn: Gemini 3 refuses function calls without it.
- ``groundingMetadata`` supports become ``url_citation`` annotations (Gemini's byte offsets converted to
  character offsets).
- usage counts thoughts as output: ``output_tokens = candidatesTokenCount + thoughtsTokenCount``.

The API key travels in the ``x-goog-api-key`` header, never in the URL.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import logging
import mimetypes
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import orjson

from ..protocol.builder import Item, StreamBuilder
from ..protocol.request import JSON, ResponseRequest
from ..protocol.response import new_id
from ..protocol.sse import SSEMessage
from .base import Capabilities, ProviderError
from .custom_tools import (
    INPUT_KEY,
    custom_description,
    custom_input,
    custom_parameters,
    custom_tool_names,
)
from .http_base import HTTPProvider
from .transport import Timeouts, Transport
from .upstream_errors import from_error_payload, translate

__all__ = [
    "EFFORT_BUDGETS",
    "EFFORT_LEVELS",
    "GeminiProvider",
    "GeminiTranslator",
    "build_gemini_body",
    "decode_reasoning_state",
    "encode_reasoning_state",
]

log = logging.getLogger("responses_gateway.gemini")

ThinkingStyle = Literal["auto", "level", "budget"]
ReasoningOutput = Literal["summary", "none"]

# reasoning.effort -> thinkingConfig. Gemini 2.5 takes a token budget (0 turns thinking off where the
# model allows it); Gemini 3 takes a level.
EFFORT_BUDGETS: dict[str, int] = {
    "none": 0,
    "minimal": 512,
    "low": 1024,
    "medium": 8192,
    "high": 24576,
    "xhigh": 32768,
}
EFFORT_LEVELS: dict[str, str] = {
    "none": "minimal",
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
}
WEB_SEARCH_TOOLS = frozenset(
    {"web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26"}
)
SUPPORTED_TOOLS = frozenset({"function", "custom", *WEB_SEARCH_TOOLS})

_FILTERED = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "LANGUAGE",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
    }
)
_COMPLETED = frozenset({"STOP", "FINISH_REASON_UNSPECIFIED"})
_STATE_PREFIX = "rggem1."
# The stop sequences Gemini takes (generationConfig.stopSequences).
MAX_NATIVE_STOP = 5
# Where Vertex's streamed partialArgs put a custom tool's one string argument.
_INPUT_PATH = f"$.{INPUT_KEY}"
_DATA_URL = re.compile(r"^data:([^;,]+)?((?:;[^;,]*)*?);base64,(.*)$", re.S)


# ---------------------------------------------------------------------------------------- reasoning state
def encode_reasoning_state(state: JSON) -> str:
    """``encrypted_content`` carrying a turn's thought signatures (and where each one sat)."""
    return _STATE_PREFIX + base64.urlsafe_b64encode(orjson.dumps(state)).decode("ascii").rstrip("=")


def decode_reasoning_state(value: Any) -> JSON | None:
    """The state inside an ``encrypted_content`` this module produced, else None."""
    if not isinstance(value, str) or not value.startswith(_STATE_PREFIX):
        return None
    raw = value[len(_STATE_PREFIX) :]
    try:
        state = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, binascii.Error):
        return None
    return state if isinstance(state, dict) else None


# ---------------------------------------------------------------------------------------- request
def _unsupported(message: str, param: str) -> ProviderError:
    return ProviderError(
        message, status=400, code="unsupported_parameter", type="invalid_request_error", param=param
    )


def _media_part(url: str, param: str, default_mime: str) -> JSON:
    match = _DATA_URL.match(url)
    if match is not None:
        return {"inlineData": {"mimeType": match.group(1) or default_mime, "data": match.group(3)}}
    if not url.startswith(("http://", "https://", "gs://")):
        raise _unsupported("Expected a URL or a base64 data URL.", param)
    mime = mimetypes.guess_type(url.split("?", 1)[0])[0] or default_mime
    return {"fileData": {"mimeType": mime, "fileUri": url}}


def _user_parts(parts: list[JSON], param: str) -> list[JSON]:
    out: list[JSON] = []
    for j, part in enumerate(parts):
        kind = part.get("type")
        where = f"{param}[{j}]"
        if kind in ("input_text", "output_text"):
            if part.get("text"):
                out.append({"text": str(part["text"])})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise _unsupported(
                    "Images by file_id are not supported by the Gemini back end.", f"{where}.file_id"
                )
            out.append(_media_part(url, f"{where}.image_url", "image/jpeg"))
        elif kind == "input_file":
            data, url = part.get("file_data"), part.get("file_url")
            if isinstance(data, str):
                if _DATA_URL.match(data):
                    out.append(_media_part(data, f"{where}.file_data", "application/pdf"))
                else:
                    out.append({"inlineData": {"mimeType": "application/pdf", "data": data}})
            elif isinstance(url, str):
                out.append(_media_part(url, f"{where}.file_url", "application/pdf"))
            else:
                raise _unsupported(
                    "Files by file_id are not supported by the Gemini back end.", f"{where}.file_id"
                )
    return out


def _text_of(parts: list[JSON]) -> str:
    return "".join(str(p.get("text", "")) for p in parts if p.get("type") in ("input_text", "output_text"))


def _args(arguments: Any) -> JSON:
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise ProviderError(
            "A function_call item's arguments are not valid JSON.",
            status=400,
            code="invalid_value",
            type="invalid_request_error",
        ) from None
    return value if isinstance(value, dict) else {"value": value}


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return ""


class _Contents:
    """Gemini contents under construction: same-role turns merge, signatures land on their parts."""

    def __init__(self) -> None:
        self.contents: list[JSON] = []
        self.system: list[str] = []
        self._signatures: list[JSON] = []
        self._names: dict[str, str] = {}

    def add(self, role: str, parts: list[JSON]) -> None:
        if not parts:
            return
        if role != "model":
            self._apply_signatures()
        if self.contents and self.contents[-1]["role"] == role:
            self.contents[-1]["parts"].extend(parts)
        else:
            self.contents.append({"role": role, "parts": list(parts)})

    def reasoning(self, item: JSON) -> None:
        state = decode_reasoning_state(item.get("encrypted_content"))
        if state is not None and isinstance(state.get("signatures"), list):
            self._signatures.extend(s for s in state["signatures"] if isinstance(s, dict))

    def call(self, item: JSON) -> None:
        call_id = str(item.get("call_id"))
        name = str(item.get("name", ""))
        self._names[call_id] = name
        if item.get("type") == "custom_tool_call":
            # A custom tool is a function with one string argument upstream (see _declaration).
            raw = item.get("input")
            args: JSON = {INPUT_KEY: raw if isinstance(raw, str) else ""}
        else:
            args = _args(item.get("arguments"))
        self.add("model", [{"functionCall": {"id": call_id, "name": name, "args": args}}])

    def result(self, item: JSON) -> None:
        call_id = str(item.get("call_id"))
        response = {
            "functionResponse": {
                "id": call_id,
                "name": self._names.get(call_id, ""),
                "response": {"output": _output_text(item.get("output"))},
            }
        }
        self.add("user", [response])

    def _apply_signatures(self) -> None:
        """Put the model turn's thought signatures back on the parts they came with."""
        signatures, self._signatures = self._signatures, []
        if not signatures or not self.contents or self.contents[-1]["role"] != "model":
            return
        parts: list[JSON] = self.contents[-1]["parts"]
        for sig in signatures:
            value = sig.get("signature")
            if not isinstance(value, str):
                continue
            call_id = sig.get("call_id")
            if call_id is not None:
                target = next((p for p in parts if p.get("functionCall", {}).get("id") == call_id), None)
            else:
                target = next(
                    (p for p in reversed(parts) if "text" in p and "thoughtSignature" not in p), None
                )
                if target is None:
                    target = {"text": ""}
                    parts.append(target)
            if target is not None:
                target["thoughtSignature"] = value

    def finish(self) -> list[JSON]:
        self._apply_signatures()
        return self.contents


def _convert_input(items: list[JSON]) -> tuple[list[str], list[JSON]]:
    out = _Contents()
    for i, item in enumerate(items):
        kind = item.get("type")
        param = f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            parts: list[JSON] = item.get("content") or []
            if role in ("system", "developer"):
                text = _text_of(parts)
                if text:
                    out.system.append(text)
            elif role == "assistant":
                text = _text_of(parts)
                if text:
                    out.add("model", [{"text": text}])
            else:
                out.add("user", _user_parts(parts, f"{param}.content"))
        elif kind == "reasoning":
            out.reasoning(item)
        elif kind in ("function_call", "custom_tool_call"):
            out.call(item)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out.result(item)
        # Built-in tool call items from another back end carry nothing Gemini can take back.
    contents = out.finish()
    return out.system, contents


def _declaration(tool: JSON) -> JSON:
    """A function declaration; a custom tool takes its input as one string (its grammar described)."""
    decl: JSON = {"name": tool["name"]}
    if tool["type"] == "custom":
        description = custom_description(tool)
        if description:
            decl["description"] = description
        decl["parametersJsonSchema"] = custom_parameters()
        return decl
    if tool.get("description"):
        decl["description"] = tool["description"]
    if tool.get("parameters"):
        decl["parametersJsonSchema"] = tool["parameters"]
    return decl


def _thinking_style(style: ThinkingStyle, model: str) -> Literal["level", "budget"]:
    if style != "auto":
        return style
    return "budget" if re.search(r"gemini-(1|2)\.", model) else "level"


def build_gemini_body(
    request: ResponseRequest,
    *,
    upstream_model: str | None = None,
    thinking_style: ThinkingStyle = "auto",
    include_thoughts: bool | None = None,
) -> JSON:
    """The ``GenerateContentRequest`` body for ``request``."""
    model = upstream_model or request.model
    system, contents = _convert_input(request.input)
    if request.instructions:
        system.insert(0, request.instructions)
    body: JSON = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    choice = request.tool_choice
    functions = [t for t in request.tools if t.get("type") in ("function", "custom")]
    mode = "AUTO"
    allowed: list[str] | None = None
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        names = {t.get("name") for t in choice.get("tools") or [] if isinstance(t, dict)}
        functions = [t for t in functions if t["name"] in names]
        mode = "ANY" if choice.get("mode") == "required" else "AUTO"
    elif isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        mode, allowed = "ANY", [str(choice.get("name"))]
    elif choice == "required":
        mode = "ANY"
    elif choice == "none":
        mode = "NONE"
    tools: list[JSON] = []
    if functions:
        tools.append({"functionDeclarations": [_declaration(t) for t in functions]})
    if any(t.get("type") in WEB_SEARCH_TOOLS for t in request.tools):
        tools.append({"googleSearch": {}})
    if tools:
        body["tools"] = tools
    if functions and (mode != "AUTO" or allowed):
        config: JSON = {"mode": mode}
        if allowed:
            config["allowedFunctionNames"] = allowed
        body["toolConfig"] = {"functionCallingConfig": config}
    generation: JSON = {}
    if request.max_output_tokens is not None:
        generation["maxOutputTokens"] = request.max_output_tokens
    if request.temperature is not None:
        generation["temperature"] = request.temperature
    if request.top_p is not None:
        generation["topP"] = request.top_p
    if request.presence_penalty is not None:
        generation["presencePenalty"] = request.presence_penalty
    if request.frequency_penalty is not None:
        generation["frequencyPenalty"] = request.frequency_penalty
    if request.stop and len(request.stop) <= MAX_NATIVE_STOP:
        # Past Gemini's limit the engine alone enforces them.
        generation["stopSequences"] = list(request.stop)
    if request.seed is not None:
        generation["seed"] = request.seed
    fmt = request.text.get("format") or {}
    if fmt.get("type") == "json_schema":
        generation["responseMimeType"] = "application/json"
        generation["responseJsonSchema"] = fmt.get("schema") or {}
    elif fmt.get("type") == "json_object":
        generation["responseMimeType"] = "application/json"
    reasoning = request.reasoning or {}
    thinking: JSON = {}
    effort = reasoning.get("effort")
    if isinstance(effort, str) and effort in EFFORT_BUDGETS:
        if _thinking_style(thinking_style, model) == "budget":
            thinking["thinkingBudget"] = EFFORT_BUDGETS[effort]
        else:
            thinking["thinkingLevel"] = EFFORT_LEVELS[effort]
    show = include_thoughts if include_thoughts is not None else reasoning.get("summary") is not None
    if show and effort != "none":
        thinking["includeThoughts"] = True
    if thinking:
        generation["thinkingConfig"] = thinking
    if request.top_logprobs:
        generation["responseLogprobs"] = True
        generation["logprobs"] = request.top_logprobs
    if generation:
        body["generationConfig"] = generation
    return body


# ---------------------------------------------------------------------------------------- stream
def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_numbers(meta: JSON) -> tuple[int, int, int, int]:
    """(input, output, cached, reasoning) from ``usageMetadata``; thoughts count as output."""
    prompt = _int(meta.get("promptTokenCount")) + _int(meta.get("toolUsePromptTokenCount"))
    thoughts = _int(meta.get("thoughtsTokenCount"))
    output = _int(meta.get("candidatesTokenCount")) + thoughts
    return prompt, output, _int(meta.get("cachedContentTokenCount")), thoughts


def _set_path(target: JSON, path: str, value: Any, append: bool) -> None:
    """Set ``$.a.b[0].c`` in ``target``; strings streamed in pieces are appended."""
    keys: list[str | int] = []
    for name, index in re.findall(r"\.([^.\[\]]+)|\[(\d+)\]", path.removeprefix("$")):
        keys.append(int(index) if index else name)
    if not keys:
        return
    node: Any = target
    for key, nxt in itertools.pairwise(keys):
        empty: Any = [] if isinstance(nxt, int) else {}
        if isinstance(node, list) and isinstance(key, int):
            while len(node) <= key:
                node.append(None)
            if node[key] is None:
                node[key] = empty
            node = node[key]
        elif isinstance(node, dict):
            node = node.setdefault(str(key), empty)
    last = keys[-1]
    if isinstance(node, list) and isinstance(last, int):
        while len(node) <= last:
            node.append(None)
        node[last] = (node[last] or "") + value if append and isinstance(value, str) else value
    elif isinstance(node, dict):
        key = str(last)
        node[key] = str(node.get(key) or "") + value if append and isinstance(value, str) else value


def _partial_value(arg: JSON) -> tuple[bool, Any]:
    for name in ("stringValue", "numberValue", "boolValue"):
        if name in arg:
            return True, arg[name]
    if "nullValue" in arg:
        return True, None
    return False, None


@dataclass(slots=True)
class _Streaming:
    """A function call whose arguments Vertex streams as ``partialArgs``."""

    item: Item
    args: JSON = field(default_factory=dict)
    # A custom tool's call: the input text sent as deltas so far.
    custom: bool = False
    streamed: list[str] = field(default_factory=list)


class GeminiTranslator:
    """GenerateContentResponse chunks in, StreamBuilder calls out (sans-IO)."""

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
        self._signatures: list[JSON] = []
        self._streaming: _Streaming | None = None
        self._text: list[str] = []
        self.finish_reason: str | None = None
        self.finish_message: str | None = None
        self.block_reason: str | None = None
        self.usage: JSON | None = None
        self.grounding: JSON | None = None
        self.error: ProviderError | None = None
        self.done = False  # the chunk with finishReason (the last one Gemini sends) arrived
        self.dirty = False

    def on_chunk(self, chunk: JSON) -> None:
        """Apply one parsed ``GenerateContentResponse``."""
        if isinstance(chunk.get("usageMetadata"), dict):
            self.usage = chunk["usageMetadata"]
        if chunk.get("error") is not None:
            self.error = from_error_payload(chunk)
            return
        feedback = chunk.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            self.block_reason = str(feedback["blockReason"])
        candidates = chunk.get("candidates")
        if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], dict):
            return
        candidate = candidates[0]
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict):
                self._part(part)
        if isinstance(candidate.get("groundingMetadata"), dict) and candidate["groundingMetadata"]:
            self.grounding = candidate["groundingMetadata"]
        if candidate.get("finishReason"):
            self.finish_reason = str(candidate["finishReason"])
            self.done = True
            if candidate.get("finishMessage"):
                self.finish_message = str(candidate["finishMessage"])

    # ------------------------------------------------------------------ parts
    def _part(self, part: JSON) -> None:
        signature = part.get("thoughtSignature")
        call = part.get("functionCall")
        if isinstance(call, dict):
            self._function_call(call, signature if isinstance(signature, str) else None)
            return
        text = part.get("text")
        if part.get("thought") is True:
            if isinstance(signature, str):
                self._signatures.append({"signature": signature, "thought": True})
            if isinstance(text, str) and text and self.reasoning_output != "none":
                self._close_message()
                if self.reasoning is None:
                    self.reasoning = self.b.open_reasoning()
                self.b.summary_delta(self.reasoning, text)
                self.dirty = True
            return
        if isinstance(signature, str):
            self._signatures.append({"signature": signature})
        if isinstance(text, str) and text:
            self._close_reasoning()
            if self.message is None:
                self.message = self.b.open_message()
                self._text = []
            self.b.text_delta(self.message, text)
            self._text.append(text)
            self.dirty = True

    def _function_call(self, call: JSON, signature: str | None) -> None:
        streaming = self._streaming
        name = call.get("name")
        if streaming is not None and not name:
            for arg in call.get("partialArgs") or []:
                present, value = _partial_value(arg) if isinstance(arg, dict) else (False, None)
                if not present:
                    continue
                path = str(arg.get("jsonPath", ""))
                _set_path(streaming.args, path, value, append=True)
                if streaming.custom and path == _INPUT_PATH and isinstance(value, str) and value:
                    self.b.custom_input_delta(streaming.item, value)
                    streaming.streamed.append(value)
                    self.dirty = True
            if not call.get("willContinue"):
                self._end_streaming()
            return
        if not name:
            # Argument pieces or an end marker with no streamed call open: nothing to attach them to.
            log.debug("ignoring a functionCall part without a name")
            return
        if streaming is not None:
            self._end_streaming()
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else new_id("call")
        if signature is not None:
            self._signatures.append({"signature": signature, "call_id": call_id})
        self._close_message()
        self._close_reasoning(force=signature is not None)
        args = call.get("args")
        self.dirty = True
        if str(name) in self.custom_tools:
            item = self.b.open_custom_tool_call(str(name), call_id=call_id)
            if call.get("willContinue"):
                self._streaming = _Streaming(item, dict(args or {}), custom=True)
                return
            self.b.custom_input_delta(item, custom_input(args if isinstance(args, dict) else {}))
            self.b.close_custom_tool_call(item)
            return
        item = self.b.open_function_call(str(name or ""), call_id=call_id)
        if call.get("willContinue"):
            self._streaming = _Streaming(item, dict(args or {}))
            return
        if isinstance(args, dict):
            self.b.arguments_delta(item, orjson.dumps(args).decode())
        self.b.close_function_call(item)

    def _end_streaming(self) -> None:
        streaming, self._streaming = self._streaming, None
        if streaming is None:
            return
        self.dirty = True
        if streaming.custom:
            # What streamed as $.input pieces, then whatever the whole arguments add to it.
            sent = "".join(streaming.streamed)
            final = custom_input(streaming.args)
            self.b.custom_input_delta(streaming.item, final[len(sent) :] if final.startswith(sent) else "")
            self.b.close_custom_tool_call(streaming.item)
            return
        self.b.arguments_delta(streaming.item, orjson.dumps(streaming.args).decode())
        self.b.close_function_call(streaming.item)

    # ------------------------------------------------------------------ closing
    def _close_reasoning(self, *, force: bool = False) -> None:
        """Close the reasoning item, with the signatures so far; ``force`` opens one to carry them."""
        if self.reasoning is None and force and self._signatures:
            self.reasoning = self.b.open_reasoning()
        item, self.reasoning = self.reasoning, None
        if item is None:
            return
        if self._signatures:
            self.b.set_encrypted_content(item, encode_reasoning_state({"signatures": self._signatures}))
            self._signatures = []
        self.b.close_reasoning(item)
        self.dirty = True

    def _close_message(self, status: str = "completed") -> None:
        item, self.message = self.message, None
        if item is None:
            return
        if self.grounding is not None:
            self._annotate(item)
        self.b.close_message(item, status=status)
        self.dirty = True

    def _annotate(self, item: Item) -> None:
        grounding, self.grounding = self.grounding or {}, None
        chunks = grounding.get("groundingChunks") or []
        text = "".join(self._text).encode("utf-8")
        for support in grounding.get("groundingSupports") or []:
            if not isinstance(support, dict):
                continue
            segment = support.get("segment") or {}
            # Gemini's offsets count UTF-8 bytes; Responses counts characters.
            start = len(text[: _int(segment.get("startIndex"))].decode("utf-8", "ignore"))
            end = len(text[: _int(segment.get("endIndex"))].decode("utf-8", "ignore"))
            for index in support.get("groundingChunkIndices") or []:
                web = chunks[index].get("web") if isinstance(index, int) and index < len(chunks) else None
                if isinstance(web, dict) and isinstance(web.get("uri"), str):
                    annotation = {
                        "type": "url_citation",
                        "end_index": end,
                        "start_index": start,
                        "title": str(web.get("title") or ""),
                        "url": web["uri"],
                    }
                    self.b.annotation(item, annotation)

    def close_items(self, status: str = "completed") -> None:
        self._end_streaming()
        self._close_message(status)
        self._close_reasoning(force=True)

    def apply_usage(self) -> None:
        if self.usage is not None:
            prompt, output, cached, reasoning = usage_numbers(self.usage)
            self.b.set_usage(prompt, output, cached_tokens=cached, reasoning_tokens=reasoning)

    def finish(self) -> None:
        """Close everything and emit the terminal event the finishReason calls for."""
        self.dirty = True
        if self.error is not None:
            self.fail(self.error)
            return
        self.apply_usage()
        reason = self.finish_reason
        if reason is None and self.block_reason is not None:
            self.close_items("incomplete")
            self.b.incomplete("content_filter")
        elif reason is None:
            self.fail(ProviderError("The Gemini stream ended before a finishReason.", status=502))
        elif reason in _COMPLETED:
            self.close_items()
            self.b.complete()
        elif reason == "MAX_TOKENS":
            self.close_items("incomplete")
            self.b.incomplete("max_output_tokens")
        elif reason in _FILTERED:
            self.close_items("incomplete")
            self.b.incomplete("content_filter")
        else:
            # MALFORMED_FUNCTION_CALL, UNEXPECTED_TOOL_CALL, MISSING_THOUGHT_SIGNATURE, OTHER...
            detail = f": {self.finish_message}" if self.finish_message else ""
            self.fail(ProviderError(f"Gemini stopped with {reason}{detail}", status=502))

    def fail(self, exc: ProviderError) -> None:
        self.apply_usage()
        self._end_streaming()
        self._close_reasoning(force=True)
        self.b.fail(exc.code or "server_error", exc.message)
        self.dirty = True


# ---------------------------------------------------------------------------------------- provider
class GeminiProvider(HTTPProvider[GeminiTranslator]):
    """A Gemini model behind the Gemini API (or Vertex AI's equivalent endpoint)."""

    name = "gemini"
    capabilities = Capabilities(
        streaming=True,
        tools=True,
        parallel_tool_calls=True,
        reasoning=True,
        structured_output=True,
        images=True,
        tool_types=SUPPORTED_TOOLS,
        file_inputs="media",
    )

    def __init__(
        self,
        *,
        base_url: str = "https://generativelanguage.googleapis.com/v1beta",
        api_key: str | None = None,
        upstream_model: str | None = None,
        transport: Transport | None = None,
        timeouts: Timeouts | None = None,
        thinking_style: ThinkingStyle = "auto",
        include_thoughts: bool | None = None,
        reasoning_output: ReasoningOutput = "summary",
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            base_url=base_url,
            api_key=api_key,
            upstream_model=upstream_model,
            transport=transport,
            timeouts=timeouts,
            extra_headers=extra_headers,
            upstream_name="Gemini",
        )
        self._thinking_style: ThinkingStyle = thinking_style
        self._include_thoughts = include_thoughts
        self._reasoning_output: ReasoningOutput = reasoning_output

    def url(self, model: str) -> str:
        """The stream endpoint for ``model`` (``models/`` prefix optional)."""
        name = model if model.startswith(("models/", "tunedModels/", "projects/")) else f"models/{model}"
        return f"{self.base_url}/{quote(name, safe='/.-_@')}:streamGenerateContent?alt=sse"

    def headers(self) -> dict[str, str]:
        """Request headers (the key among them: never log this)."""
        out = {"accept": "text/event-stream"}
        if self._api_key:
            out["x-goog-api-key"] = self._api_key
        out.update(self._extra_headers)
        return out

    def check_request(self, request: ResponseRequest) -> None:
        for i, tool in enumerate(request.tools):
            if tool.get("type") not in SUPPORTED_TOOLS:
                raise _unsupported(
                    f"Tool type '{tool.get('type')}' is not supported by the Gemini back end.",
                    f"tools[{i}].type",
                )
            if tool["type"] in WEB_SEARCH_TOOLS and tool.get("external_web_access") is False:
                # Codex's cached-only search; this back end only searches the live web.
                raise _unsupported(
                    "Web search without live access ('external_web_access': false) is not available "
                    "from the Gemini back end; send true or leave it out.",
                    f"tools[{i}].external_web_access",
                )
            filters = tool.get("filters") if tool["type"] in WEB_SEARCH_TOOLS else None
            if isinstance(filters, dict) and filters.get("allowed_domains"):
                raise _unsupported(
                    "Google Search grounding cannot be limited to allowed domains.",
                    f"tools[{i}].filters.allowed_domains",
                )
        choice = request.tool_choice
        if isinstance(choice, dict) and choice.get("type") not in ("function", "custom", "allowed_tools"):
            raise _unsupported(
                f"tool_choice '{choice.get('type')}' is not supported here.", "tool_choice.type"
            )
        _convert_input(request.input)

    def build_body(self, request: ResponseRequest) -> JSON:
        """The upstream request body."""
        return build_gemini_body(
            request,
            upstream_model=self.upstream_model,
            thinking_style=self._thinking_style,
            include_thoughts=self._include_thoughts,
        )

    def endpoint(self, request: ResponseRequest) -> str:
        return self.url(self.upstream_model or request.model)

    async def count_input_tokens(self, request: ResponseRequest) -> int:
        """Gemini's ``:countTokens`` on the request a generation would send (tools, system text)."""
        model = self.upstream_model or request.model
        name = model if model.startswith(("models/", "tunedModels/", "projects/")) else f"models/{model}"
        url = f"{self.base_url}/{quote(name, safe='/.-_@')}:countTokens"
        return await self.count_with(
            url, {"generateContentRequest": {"model": name, **self.build_body(request)}}, "totalTokens"
        )

    def translator(self, request: ResponseRequest, builder: StreamBuilder) -> GeminiTranslator:
        return GeminiTranslator(builder, self._reasoning_output, custom_tool_names(request.tools))

    def replay(self, turn: GeminiTranslator, body: Any) -> None:
        # Without alt=sse (a proxy dropped it) the stream endpoint answers with a JSON array.
        for chunk in body if isinstance(body, list) else [body]:
            if isinstance(chunk, dict):
                turn.on_chunk(chunk)

    def dispatcher(self) -> Callable[[GeminiTranslator, SSEMessage], None]:
        return _dispatch


def _dispatch(turn: GeminiTranslator, msg: SSEMessage) -> None:
    if turn.error is not None:
        return
    try:
        payload = orjson.loads(msg.data)
    except orjson.JSONDecodeError:
        log.debug("ignoring a chunk that is not JSON")
        return
    if isinstance(payload, list):
        payload = payload[0] if payload and isinstance(payload[0], dict) else {}
    if isinstance(payload, dict):
        translate(turn.on_chunk, payload)
