"""Gemini translator properties (sans-IO): any part sequence is a valid stream keeping every signature."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from responses_gateway.protocol.builder import StreamBuilder
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.gemini import GeminiTranslator, decode_reasoning_state

TEXT = st.text(alphabet="ab é", max_size=3)
SIG = st.none() | st.sampled_from(["S1", "S2", "S3"])


def _with_sig(part: dict[str, Any], sig: str | None) -> dict[str, Any]:
    return {**part, "thoughtSignature": sig} if sig else part


PART = st.one_of(
    st.builds(lambda t, s: _with_sig({"text": t}, s), TEXT, SIG),
    st.builds(lambda t, s: _with_sig({"text": t, "thought": True}, s), TEXT, SIG),
    st.builds(
        lambda n, s: _with_sig({"functionCall": {"name": n, "args": {"a": 1}}}, s), st.sampled_from("fg"), SIG
    ),
    st.just({"functionCall": {"name": "s", "willContinue": True}}),
    st.builds(
        lambda v: {
            "functionCall": {"partialArgs": [{"jsonPath": "$.q", "stringValue": v}], "willContinue": True}
        },
        TEXT,
    ),
    st.just({"functionCall": {}}),
)
FINISH = st.sampled_from([None, None, "STOP", "MAX_TOKENS", "SAFETY", "MALFORMED_FUNCTION_CALL"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.lists(PART, max_size=3), FINISH), max_size=8), st.sampled_from(["summary", "none"])
)
def test_any_part_sequence_is_valid_and_keeps_signatures(
    chunks: list[tuple[list[Any], str | None]], shown: str
) -> None:
    builder = StreamBuilder(new_response("g"))
    builder.start()
    turn = GeminiTranslator(builder, shown)  # type: ignore[arg-type]
    for parts, finish in chunks:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}}
        if finish:
            candidate["finishReason"] = finish
        turn.on_chunk({"candidates": [candidate]})
    turn.finish()
    events = builder.take()
    assert check(events) == []
    output = events[-1]["response"]["output"]
    kept = [
        s["signature"]
        for o in output
        if o["type"] == "reasoning"
        for s in (decode_reasoning_state(o.get("encrypted_content")) or {"signatures": []})["signatures"]
    ]
    sent = [p["thoughtSignature"] for parts, _ in chunks for p in parts if "thoughtSignature" in p]
    assert sorted(kept) == sorted(sent)
    text = "".join(
        p.get("text", "") for parts, _ in chunks for p in parts if "text" in p and not p.get("thought")
    )
    got = "".join(p["text"] for o in output if o["type"] == "message" for p in o["content"])
    assert got == text
    assert all(o["name"] for o in output if o["type"] == "function_call")
