"""The two front ends' stream translators agree with their one-body translations, on real event
sequences: scripts played through the StreamBuilder (each stream passes the checker first) and every
recorded upstream stream of the openai-chat, Anthropic and Gemini fixtures (a failed one must end with
the dialect's error)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest

from conftest import check_stream
from fixtures_loader import list_fixtures
from responses_gateway.protocol.chat_completions import ChatOptions, ChatStream, completion_from_response
from responses_gateway.protocol.messages import MessagesStream, message_from_response
from responses_gateway.providers.scripted import ScriptedProvider
from test_frontend_chat import upstream_provider
from upstream_mock import UpstreamMock, drive, fixture_reply

JSON = dict[str, Any]

SCRIPTS: dict[str, list[JSON]] = {
    "everything": [
        {"reasoning": {"summary": [["a", "b"], "c"], "encrypted_content": "s1"}},
        {"message": ["Hel", "lo"]},
        {"function_call": {"name": "f", "arguments": ['{"x":', "1}"], "call_id": "c1"}},
        {"function_call": {"name": "g", "arguments": [], "call_id": "c2"}},
        {"usage": {"input_tokens": 5, "output_tokens": 6, "cached_tokens": 1, "reasoning_tokens": 2}},
    ],
    "raw reasoning": [{"reasoning": {"text": ["th", "ink"]}}, {"message": "x"}],
    "state only": [{"reasoning": {"encrypted_content": "opaque"}}, {"message": "y"}],
    "refusal": [{"refusal": ["I can", "not"]}],
    "incomplete": [{"message": ["part"]}, {"incomplete": "max_output_tokens"}],
    "filtered": [{"message": ["part"]}, {"incomplete": "content_filter"}],
    "two messages": [{"message": "one "}, {"message": "two"}],
}


def _sign(item: JSON) -> str:
    return (
        "sig:"
        + orjson.dumps([item.get("summary"), item.get("content"), item.get("encrypted_content")]).decode()
    )


def _messages_blocks(events: list[JSON]) -> tuple[list[JSON], JSON]:
    """Content blocks and the final delta rebuilt from MessagesStream's events, as a client would."""
    stream = MessagesStream("m", _sign)
    blocks: dict[int, JSON] = {}
    partial: dict[int, str] = {}
    closed: list[int] = []
    end: JSON = {}
    names: list[str] = []
    for event in events:
        for name, payload in stream.feed(event):
            names.append(name)
            if name == "content_block_start":
                assert payload["index"] == len(blocks)
                blocks[payload["index"]] = dict(payload["content_block"])
            elif name == "content_block_delta":
                block, delta = blocks[payload["index"]], payload["delta"]
                assert payload["index"] not in closed
                if delta["type"] == "text_delta":
                    block["text"] += delta["text"]
                elif delta["type"] == "thinking_delta":
                    block["thinking"] += delta["thinking"]
                elif delta["type"] == "signature_delta":
                    block["signature"] = delta["signature"]
                elif delta["type"] == "input_json_delta":
                    partial[payload["index"]] = partial.get(payload["index"], "") + delta["partial_json"]
            elif name == "content_block_stop":
                closed.append(payload["index"])
            elif name == "message_delta":
                end = payload
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"
    assert sorted(closed) == list(range(len(blocks)))
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    return [blocks[i] for i in range(len(blocks))], end


def _chat_message(events: list[JSON]) -> tuple[JSON, str | None, JSON | None]:
    stream = ChatStream(ChatOptions("m", True, True, False))
    content, reasoning, refusal = "", "", ""
    calls: dict[int, JSON] = {}
    finish = None
    usage = None
    for event in events:
        for chunk in stream.feed(event):
            if not chunk["choices"]:
                usage = chunk["usage"]
                continue
            choice = chunk["choices"][0]
            delta = choice["delta"]
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            refusal += delta.get("refusal") or ""
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], {"function": {"arguments": ""}})
                if "id" in call:
                    entry.update(id=call["id"], type=call["type"], name=call["function"]["name"])
                entry["function"]["arguments"] += call["function"]["arguments"]
            finish = choice["finish_reason"] or finish
    message: JSON = {"content": content, "reasoning_content": reasoning, "refusal": refusal}
    message["tool_calls"] = [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": c["function"]["arguments"]},
        }
        for _, c in sorted(calls.items())
    ]
    return message, finish, usage


def _compare(events: list[JSON]) -> None:
    final = events[-1]["response"]
    assert final["status"] in ("completed", "incomplete")
    blocks, end = _messages_blocks(events)
    whole = message_from_response(final, "m", _sign)
    assert blocks == whole["content"]
    assert end["delta"]["stop_reason"] == whole["stop_reason"] and end["usage"] == whole["usage"]

    message, finish, usage = _chat_message(events)
    reply = completion_from_response(final, ChatOptions("m", False, False, False))
    expected = reply["choices"][0]["message"]
    assert message["content"] == (expected["content"] or "")
    assert message["refusal"] == (expected["refusal"] or "")
    assert message["reasoning_content"] == expected.get("reasoning_content", "")
    assert message["tool_calls"] == expected.get("tool_calls", [])
    assert finish == reply["choices"][0]["finish_reason"] and usage == reply["usage"]


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_scripted_streams_translate_like_their_final_response(name: str) -> None:
    events = asyncio.run(drive(ScriptedProvider(SCRIPTS[name]), {"model": "m", "input": "hi"}))
    check_stream(events, strict=False)
    _compare(events)


RECORDED = [
    (kind, name)
    for kind, prefix in (
        ("openai-chat", "openai-chat__"),
        ("anthropic", "anthropic-messages__"),
        ("gemini", "gemini__"),
    )
    for name in list_fixtures(prefix, suffixes=(".sse", ".chunks.jsonl"))
]


@pytest.mark.parametrize(("kind", "name"), RECORDED, ids=[n for _, n in RECORDED])
def test_recorded_streams_translate_like_their_final_response(kind: str, name: str) -> None:
    with UpstreamMock() as upstream:
        upstream.enqueue(fixture_reply(name))
        events = asyncio.run(drive(upstream_provider(kind, upstream.url), {"model": "m", "input": "hi"}))
    if events[-1]["type"] != "response.failed":
        _compare(events)
        return
    # A failed stream ends with the dialect's error, and nothing after it.
    error = events[-1]["response"]["error"]
    stream = MessagesStream("m", _sign)
    messages = [pair for event in events for pair in stream.feed(event)]
    assert messages[-1][0] == "error" and messages[-1][1]["error"]["message"] == error["message"]
    assert "message_stop" not in [name for name, _ in messages]
    chat = ChatStream(ChatOptions("m", True, True, False))
    chunks = [chunk for event in events for chunk in chat.feed(event)]
    assert chunks[-1]["error"]["message"] == error["message"] and chat.failed
    assert all("error" not in chunk for chunk in chunks[:-1])
