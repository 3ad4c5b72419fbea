"""The four HTTP back ends, and a complete text answer in each one's own wire format, for fault cases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.base import Provider
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from responses_gateway.providers.transport import Timeouts, Transport
from upstream_mock import encode_chunks

JSON = dict[str, Any]
BACKENDS = ("anthropic", "gemini", "openai", "openai-chat")


def provider(
    name: str,
    url: str,
    *,
    api_key: str = "test-key-0000",
    read_timeout: float | None = None,
    extra_headers: dict[str, str] | None = None,
    transport: Transport | None = None,
) -> Provider:
    """Back end ``name`` pointed at the mock upstream ``url``."""
    common: JSON = {"api_key": api_key, "extra_headers": extra_headers, "transport": transport}
    if read_timeout is not None:
        common["timeouts"] = Timeouts(connect=5, read=read_timeout, total=None)
    factories: dict[str, Callable[[], Provider]] = {
        "anthropic": lambda: AnthropicProvider(base_url=url, upstream_model="claude-x", **common),
        "openai-chat": lambda: OpenAIChatProvider(base_url=url + "/v1", upstream_model="gpt", **common),
        "openai": lambda: OpenAIResponsesProvider(base_url=url + "/v1", upstream_model="gpt", **common),
        "gemini": lambda: GeminiProvider(base_url=url, upstream_model="gemini-x", **common),
    }
    return factories[name]()


def anthropic_start() -> list[JSON]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 3, "output_tokens": 0},
    }
    """An Anthropic stream's opening: message_start and an empty text block at index 0."""
    return [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]


def _responses(status: str, text: str = "", **extra: Any) -> JSON:
    output = []
    if text:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        output = [
            {"id": "msg_u", "type": "message", "role": "assistant", "status": "completed", "content": content}
        ]
    return {
        "id": "resp_up",
        "object": "response",
        "status": status,
        "model": "gpt",
        "output": output,
        **extra,
    }


def answer(name: str, pieces: list[str]) -> bytes:
    """A complete streamed answer of ``pieces`` of text (each a delta), finished as the vendor does."""
    text = "".join(pieces)
    if name == "anthropic":
        deltas = [
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
            for p in pieces
        ]
        end = [
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
            {"type": "message_stop"},
        ]
        return encode_chunks([*anthropic_start(), *deltas, *end], "anthropic")
    if name == "openai-chat":
        chunks: list[JSON] = [
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": p}}],
            }
            for p in pieces
        ]
        chunks.append({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        chunks.append({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
        return encode_chunks(chunks, "openai-chat")  # ends with data: [DONE]
    if name == "gemini":
        gchunks: list[JSON] = [
            {"candidates": [{"content": {"role": "model", "parts": [{"text": p}]}}]} for p in pieces
        ]
        gchunks[-1]["candidates"][0]["finishReason"] = "STOP"
        gchunks[-1]["usageMetadata"] = {"promptTokenCount": 3, "candidatesTokenCount": 5}
        return encode_chunks(gchunks, "gemini")
    item = {"id": "msg_u", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    events: list[JSON] = [
        {"type": "response.created", "response": _responses("in_progress")},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {
            "type": "response.content_part.added",
            "item_id": "msg_u",
            "output_index": 0,
            "content_index": 0,
            "part": part,
        },
    ]
    for p in pieces:
        events.append(
            {
                "type": "response.output_text.delta",
                "item_id": "msg_u",
                "output_index": 0,
                "content_index": 0,
                "delta": p,
            }
        )
    done_item = dict(item, status="completed", content=[dict(part, text=text)])
    events += [
        {
            "type": "response.output_text.done",
            "item_id": "msg_u",
            "output_index": 0,
            "content_index": 0,
            "text": text,
        },
        {
            "type": "response.content_part.done",
            "item_id": "msg_u",
            "output_index": 0,
            "content_index": 0,
            "part": dict(part, text=text),
        },
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": _responses("completed", text)},
    ]
    for n, event in enumerate(events):
        event["sequence_number"] = n
    return encode_chunks(events, "openai-responses")


def error_body(name: str, message: str) -> JSON:
    """An HTTP error body in the vendor's shape."""
    if name == "anthropic":
        return {"type": "error", "error": {"type": "api_error", "message": message}}
    if name == "gemini":
        return {"error": {"code": 500, "status": "INTERNAL", "message": message}}
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
