"""Stop sequences, ``seed`` and ``n`` > 1 on the Chat Completions and Messages front ends.

Scripted back ends (the gateway enforces the stop sequences: the text is cut before the first one,
across deltas, and the back end's turn is cancelled) through the openai and anthropic SDKs; mock
upstreams show which back ends get them natively (Chat Completions ``stop``/``seed``, Anthropic
``stop_sequences``, Gemini ``stopSequences``/``seed``) and that the OpenAI Responses passthrough,
which takes none, is cut off by the gateway.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from conftest import Gateway, check_stream, start_gateway
from responses_gateway.engine.stop import StopSequences
from responses_gateway.protocol.request import parse_request
from responses_gateway.protocol.stop import StopScanner
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.server.registry import ModelRegistry
from test_frontend_chat import upstream_provider
from upstream_mock import UpstreamMock, drive, encode_chunks, fixture_reply, stream_reply

JSON = dict[str, Any]
USER: list[Any] = [{"role": "user", "content": "hi"}]

# "STOP" arrives split across deltas; a slow tail follows that a cut run never plays.
STORY = [
    {"message": ["Hello wor", "ld. ST", "OP here", " and more"]},
    {"sleep": 3},
    {"message": ["never sent"]},
    {"usage": {"input_tokens": 5, "output_tokens": 9}},
]
SCRIPTED: dict[str, Any] = {
    "story": STORY,
    "plain": [{"message": ["Hel", "lo", " there"]}, {"usage": {"input_tokens": 7, "output_tokens": 3}}],
    "slow": [{"message": ["first"]}, {"sleep": 5}, {"message": ["late"]}],
    "broken": [{"message": ["partial"]}, {"fail": {"code": "server_error", "message": "upstream broke"}}],
}


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[Gateway, dict[str, ScriptedProvider]]]:
    providers = {name: ScriptedProvider(script, name=name) for name, script in SCRIPTED.items()}
    gw = start_gateway(list(providers.values()))
    yield gw, providers
    gw.stop()


def _openai(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)


def _anthropic(gw: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.origin, api_key="unused", max_retries=0, timeout=30)


# ------------------------------------------------------------------------------ the scanner
def test_scanner_holds_back_only_what_could_begin_a_sequence() -> None:
    scanner = StopScanner(("STOP", "END!"))
    assert scanner.feed("abc S") == "abc "  # "S" may begin STOP
    assert scanner.held == "S"
    assert scanner.feed("T") == ""  # "ST"
    assert scanner.feed("x EN") == "STx "
    assert scanner.feed("D") == ""  # "END"
    assert scanner.feed("?") == "END?"
    assert scanner.flush() == "" and scanner.matched is None
    assert scanner.feed("tail S") == "tail "
    assert scanner.flush() == "S"  # the part ended: it was text after all

    scanner = StopScanner(("STOP",))
    assert scanner.feed("one ST") == "one "
    assert scanner.feed("OP two") == "" and scanner.matched == "STOP"
    assert scanner.feed("more") == "" and scanner.flush() == ""

    # The earliest occurrence wins; at one place the longest.
    scanner = StopScanner(("b", "abc", "ab"))
    assert scanner.feed("xxabc") == "xx" and scanner.matched == "abc"


def test_cut_stream_passes_the_checker() -> None:
    provider = ScriptedProvider(STORY, name="story")
    request = parse_request({"model": "story", "input": "hi", "stream": True})
    request.stop = ("STOP",)
    started = time.monotonic()
    events = asyncio.run(drive(StopSequences(provider), request))
    assert time.monotonic() - started < 2  # the scripted sleep after the stop never ran
    check_stream(events)
    assert events[-1]["type"] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    assert text == "Hello world. " and done == ["Hello world. "]
    assert provider.cancelled == 1  # the back end's turn was closed, not run to its end


# ------------------------------------------------------------------------------ Chat Completions
def test_chat_stop_cuts_the_text_streamed_or_not(scripted: Any) -> None:
    gw, providers = scripted
    client = _openai(gw)
    before = providers["story"].cancelled
    started = time.monotonic()
    completion = client.chat.completions.create(model="story", messages=USER, stop="STOP", seed=7)
    assert completion.choices[0].message.content == "Hello world. "
    assert completion.choices[0].finish_reason == "stop"

    chunks = list(
        client.chat.completions.create(model="story", messages=USER, stop=["nope", "STOP"], stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello world. "
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]
    with client.chat.completions.stream(model="story", messages=USER, stop=["STOP"]) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == "Hello world. "
    # Three runs, none waited for the script's sleep: each turn was cancelled at the stop.
    assert time.monotonic() - started < 3
    assert providers["story"].cancelled == before + 3

    # A text that never reaches a stop sequence keeps every character, the held-back ones included.
    completion = client.chat.completions.create(model="plain", messages=USER, stop=["therein", "lo!"])
    assert completion.choices[0].message.content == "Hello there"


def test_chat_n_runs_the_engine_per_choice(scripted: Any) -> None:
    gw, providers = scripted
    client = _openai(gw)
    served = len(providers["plain"].requests)
    completion = client.chat.completions.create(model="plain", messages=USER, n=3)
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert {c.message.content for c in completion.choices} == {"Hello there"}
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (21, 9)
    assert len(providers["plain"].requests) == served + 3

    chunks = list(
        client.chat.completions.create(
            model="plain", messages=USER, n=2, stream=True, stream_options={"include_usage": True}
        )
    )
    assert len({c.id for c in chunks}) == 1
    texts = {0: "", 1: ""}
    finishes = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert texts == {0: "Hello there", 1: "Hello there"}
    assert finishes == {0: "stop", 1: "stop"}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 20

    # The SDK's helper accumulates the choices by index; stop applies to each.
    with client.chat.completions.stream(model="story", messages=USER, n=2, stop="STOP") as stream:
        final = stream.get_final_completion()
    assert [(c.index, c.message.content) for c in final.choices] == [
        (0, "Hello world. "),
        (1, "Hello world. "),
    ]


def test_chat_n_failure_ends_the_stream_with_openai_error(scripted: Any) -> None:
    gw, _ = scripted
    client = _openai(gw)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="broken", messages=USER, n=2)
    with httpx.Client(timeout=30) as http:
        reply = http.post(
            gw.url("/v1/chat/completions"),
            json={"model": "broken", "messages": USER, "n": 2, "stream": True},
        )
    assert reply.status_code == 200
    frames = [f.removeprefix("data: ") for f in reply.text.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] != "[DONE]" and "[DONE]" not in frames
    assert json.loads(frames[-1])["error"]["message"] == "upstream broke"
    assert sum("error" in json.loads(f) for f in frames) == 1  # one error, then the stream ends
    with pytest.raises(openai.APIError, match="upstream broke"):
        list(client.chat.completions.create(model="broken", messages=USER, n=2, stream=True))


def test_chat_n_client_gone_stops_every_choice(scripted: Any) -> None:
    gw, providers = scripted
    before = providers["slow"].cancelled
    with (
        httpx.Client(timeout=30) as http,
        http.stream(
            "POST",
            gw.url("/v1/chat/completions"),
            json={"model": "slow", "messages": USER, "n": 3, "stream": True},
        ) as reply,
    ):
        seen = ""
        for text in reply.iter_text():
            seen += text
            if seen.count('"content":"first"') == 3:
                break  # every choice has started; leave while they sleep
    deadline = time.monotonic() + 3
    while providers["slow"].cancelled < before + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert providers["slow"].cancelled == before + 3


def test_chat_n_with_store_keeps_the_first_choice(tmp_path: Any) -> None:
    provider = ScriptedProvider([{"message": ["Hi", " there"]}], name="m")
    gw = start_gateway([provider], store_url=f"sqlite:///{tmp_path / 'store.db'}")
    try:
        completion = _openai(gw).chat.completions.create(model="m", messages=USER, n=2, store=True)
        assert len(completion.choices) == 2
        rid = "resp_" + completion.id.removeprefix("chatcmpl-")
        with httpx.Client(timeout=30) as http:
            stored = http.get(gw.url(f"/v1/responses/{rid}"))
            listed = http.get(gw.url("/v1/gateway/responses"))
        assert stored.status_code == 200, stored.text
        assert stored.json()["output"][0]["content"][0]["text"] == "Hi there"
        assert [r["id"] for r in listed.json()["data"]] == [rid]
    finally:
        gw.stop()


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop[0]"),
        ({"stop": ["x" * 1025]}, "stop[0]"),
        ({"stop": 5}, "stop"),
        ({"n": 9}, "n"),
        ({"n": 0}, "n"),
        ({"seed": "7"}, "seed"),
    ],
)
def test_chat_limits_are_openai_errors(scripted: Any, extra: JSON, param: str) -> None:
    gw, _ = scripted
    with pytest.raises(openai.BadRequestError) as caught:
        _openai(gw).chat.completions.create(model="plain", messages=USER, extra_body=extra)
    assert caught.value.status_code == 400
    assert caught.value.param == param  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ Messages
def test_messages_stop_sequences_name_the_one_that_stopped(scripted: Any) -> None:
    gw, _ = scripted
    client = _anthropic(gw)
    message = client.messages.create(
        model="story", max_tokens=64, messages=USER, stop_sequences=["never", "STOP"]
    )
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello world. "  # type: ignore[union-attr]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "STOP")

    with client.messages.stream(model="story", max_tokens=64, messages=USER, stop_sequences=["STOP"]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "Hello world. "
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "STOP")

    # Not reached: an ordinary end.
    message = client.messages.create(model="plain", max_tokens=64, messages=USER, stop_sequences=["zzz"])
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)


def test_messages_limits_are_anthropic_errors(scripted: Any) -> None:
    gw, _ = scripted
    for bad in (["x"] * 33, [""], "STOP"):
        with pytest.raises(anthropic.BadRequestError) as caught:
            _anthropic(gw).messages.create(
                model="plain",
                max_tokens=8,
                messages=USER,
                stop_sequences=bad,  # type: ignore[arg-type]
            )
        body: Any = caught.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "stop_sequences" in body["error"]["message"]


# ------------------------------------------------------------------------------ upstreams
RECORDED = {
    "openai-chat": "openai-chat__plain-text-include-usage-final-chunk-gpt-4.1-nano__vercel-ai.chunks.jsonl",
    "anthropic": "anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl",
    "gemini": "gemini__stream-plain-text-gemini-2.0-flash__pydantic-pydantic-ai.sse",
}


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[Gateway, dict[str, UpstreamMock]]]:
    mocks = {kind: UpstreamMock() for kind in [*RECORDED, "openai"]}
    for mock in mocks.values():
        mock.__enter__()
    registry = ModelRegistry()
    for kind, mock in mocks.items():
        if kind == "openai":
            registry.add(OpenAIResponsesProvider(base_url=mock.url + "/v1", api_key="sk-fixtures-1"), kind)
        else:
            registry.add(upstream_provider(kind, mock.url), kind)
    gw = start_gateway(registry)
    yield gw, mocks
    gw.stop()
    for mock in mocks.values():
        mock.__exit__(None, None, None)


def test_native_back_ends_receive_stop_and_seed(upstreams: Any) -> None:
    gw, mocks = upstreams
    mocks["openai-chat"].reset([fixture_reply(RECORDED["openai-chat"])])
    _openai(gw).chat.completions.create(model="openai-chat", messages=USER, stop=["\n\n", "END"], seed=42)
    sent = mocks["openai-chat"].requests[-1].json
    assert (sent["stop"], sent["seed"]) == (["\n\n", "END"], 42)

    mocks["gemini"].reset([fixture_reply(RECORDED["gemini"])])
    _openai(gw).chat.completions.create(model="gemini", messages=USER, stop="END", seed=42)
    config = mocks["gemini"].requests[-1].json["generationConfig"]
    assert (config["stopSequences"], config["seed"]) == (["END"], 42)

    mocks["anthropic"].reset([fixture_reply(RECORDED["anthropic"])])
    _anthropic(gw).messages.create(model="anthropic", max_tokens=64, messages=USER, stop_sequences=["END"])
    sent = mocks["anthropic"].requests[-1].json
    assert sent["stop_sequences"] == ["END"] and "seed" not in sent  # Anthropic takes no seed


def _anthropic_stopped(text: str, sequence: str) -> bytes:
    chunks: list[JSON] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_up",
                "type": "message",
                "role": "assistant",
                "model": "claude",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 4, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "stop_sequence", "stop_sequence": sequence},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    ]
    return encode_chunks(chunks, "anthropic")


def test_anthropic_upstream_reports_its_stop_sequence(upstreams: Any) -> None:
    gw, mocks = upstreams
    mocks["anthropic"].reset([stream_reply(_anthropic_stopped("Hello ", "END")) for _ in range(2)])
    client = _anthropic(gw)
    message = client.messages.create(
        model="anthropic", max_tokens=64, messages=USER, stop_sequences=["END", "FIN"]
    )
    assert message.content[0].text == "Hello "  # type: ignore[union-attr]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    with client.messages.stream(
        model="anthropic", max_tokens=64, messages=USER, stop_sequences=["END", "FIN"]
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")


def _responses_stream(deltas: list[str]) -> bytes:
    """An OpenAI Responses upstream that streams ``deltas`` (and would go on)."""
    response = {
        "id": "resp_up",
        "object": "response",
        "created_at": 1,
        "model": "gpt",
        "status": "in_progress",
    }
    item = {"id": "msg_up", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    chunks: list[JSON] = [
        {"type": "response.created", "sequence_number": 0, "response": {**response, "output": []}},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": item},
        {
            "type": "response.content_part.added",
            "sequence_number": 2,
            "item_id": "msg_up",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
    ]
    for i, delta in enumerate(deltas):
        chunks.append(
            {
                "type": "response.output_text.delta",
                "sequence_number": 3 + i,
                "item_id": "msg_up",
                "output_index": 0,
                "content_index": 0,
                "delta": delta,
                "logprobs": [],
            }
        )
    return encode_chunks(chunks, "openai-responses")


def test_responses_passthrough_is_cut_by_the_gateway(upstreams: Any) -> None:
    gw, mocks = upstreams
    body = _responses_stream(["Hello wor", "ld. ST", "OP and on", " and on"])
    # The upstream stalls after its deltas: only the gateway's stop can end this run.
    mocks["openai"].reset([stream_reply(body, stall_after=len(body))])
    completion = _openai(gw).chat.completions.create(model="openai", messages=USER, stop="STOP")
    assert completion.choices[0].message.content == "Hello world. "
    assert completion.choices[0].finish_reason == "stop"
    assert mocks["openai"].wait_disconnect()  # the upstream request was closed
    assert "stop" not in mocks["openai"].requests[-1].json  # the Responses API takes none
