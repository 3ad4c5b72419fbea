"""Chat translator properties (sans-IO): any chunk sequence gives a valid stream; splits do not matter."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures_loader import load_sse
from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.response import new_response
from responses_gateway.protocol.sse import SSEDecoder
from responses_gateway.providers.openai_chat import ChatTranslator

TEXT = st.text(alphabet="ab é\n", min_size=0, max_size=4)
FRAGMENT = st.fixed_dictionaries(
    {"index": st.integers(0, 2)},
    optional={
        "id": st.sampled_from(["c0", "c1", "c2"]),
        "function": st.fixed_dictionaries(
            {}, optional={"name": st.sampled_from(["f", "g"]), "arguments": TEXT}
        ),
    },
)
DELTA = st.fixed_dictionaries(
    {},
    optional={
        "content": TEXT,
        "reasoning_content": TEXT,
        "reasoning": TEXT,
        "refusal": TEXT,
        "tool_calls": st.lists(FRAGMENT, max_size=2),
        "reasoning_details": st.lists(
            st.fixed_dictionaries(
                {"type": st.just("reasoning.text"), "text": TEXT, "index": st.integers(0, 1)}
            ),
            max_size=2,
        ),
    },
)
FINISH = st.sampled_from([None, None, None, "stop", "length", "tool_calls", "content_filter"])
CHUNK = st.builds(lambda d, f: {"choices": [{"index": 0, "delta": d, "finish_reason": f}]}, DELTA, FINISH)


def translate(chunks: list[dict[str, Any]], *, done: bool, output: str = "summary") -> list[dict[str, Any]]:
    builder = StreamBuilder(new_response("m"))
    builder.start()
    turn = ChatTranslator(builder, output)  # type: ignore[arg-type]
    for chunk in chunks:
        turn.on_chunk(chunk)
    turn.done = done
    turn.finish()
    return builder.take()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(CHUNK, max_size=12),
    st.booleans(),
    st.sampled_from(["summary", "reasoning_text", "none"]),
)
def test_any_chunk_sequence_gives_a_valid_stream(
    chunks: list[dict[str, Any]], done: bool, output: str
) -> None:
    events = translate(chunks, done=done, output=output)
    assert check(events) == []
    final = events[-1]["response"]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    text = "".join(d.get("content") or "" for d in deltas)
    got = "".join(
        p["text"]
        for o in final["output"]
        if o["type"] == "message"
        for p in o["content"]
        if p["type"] == "output_text"
    )
    assert got == text


def events_of(body: bytes, pieces: list[bytes]) -> list[dict[str, Any]]:
    decoder = SSEDecoder()
    chunks: list[dict[str, Any]] = []
    done = False
    for piece in pieces:
        for msg in decoder.feed(piece):
            if msg.data == "[DONE]":
                done = True
            else:
                chunks.append(orjson.loads(msg.data))
    events = translate(chunks, done=done)
    for event in events:
        # Ids and timestamps are fresh per run; everything else must be identical.
        event.pop("response", None)
        event.pop("item", None)
        event.pop("item_id", None)
    return events


def test_every_byte_split_gives_the_same_events() -> None:
    body = load_sse("openai-chat__openrouter-kimi-k2-tool-call-name-then-args-chunk__simonw-llm.sse")
    whole = events_of(body, [body])
    assert events_of(body, [body[i : i + 1] for i in range(len(body))]) == whole
    for cut in range(0, len(body), 7):
        assert events_of(body, [body[:cut], body[cut:]]) == whole
