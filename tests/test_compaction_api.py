"""POST /v1/responses/compact with the openai SDK: the gateway compacts for any model, and expands its
sealed compaction item back into context when a later request sends it; the OpenAI passthrough
compacts natively."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from conftest import Gateway
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from responses_gateway.providers.scripted import ScriptedProvider
from upstream_mock import UpstreamMock, json_reply

Factory = Callable[..., Gateway]
JSON = dict[str, Any]
KEY_A, KEY_B = "key-a", "key-b"
SUMMARY = "NOTES: the user is planning a trip to Lisbon in May and wants a budget under 900 EUR."

SCRIPT = {
    "turns": [
        {"when": {"text_contains": "Summarize the conversation so far"}, "steps": [{"message": [SUMMARY]}]},
        {"steps": [{"message": ["ok"]}]},
    ]
}
HISTORY: list[JSON] = [
    {"role": "user", "content": "I want to visit Lisbon in May."},
    {"role": "assistant", "content": "Great choice. What is your budget?"},
    {"role": "user", "content": "Under 900 EUR."},
]


@pytest.fixture
def served(gateway: Factory, tmp_path: Any) -> Iterator[tuple[Gateway, ScriptedProvider]]:
    provider = ScriptedProvider(SCRIPT, name="m")
    yield (
        gateway(
            [provider],
            store_url=f"sqlite://{tmp_path}/gateway.db",
            data_dir=str(tmp_path),
            api_keys=(KEY_A, KEY_B),
        ),
        provider,
    )


def _client(gw: Gateway, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def test_compact_then_continue_from_the_compacted_window(served: tuple[Gateway, ScriptedProvider]) -> None:
    gw, provider = served
    client = _client(gw)
    compacted = client.responses.compact(model="m", input=HISTORY)  # type: ignore[arg-type]
    assert compacted.object == "response.compaction"
    *kept, item = compacted.output
    # The user messages, then one compaction item whose content the client cannot read.
    assert [k.role for k in kept] == ["user", "user"]  # type: ignore[union-attr]
    assert item.type == "compaction" and "Lisbon" not in item.encrypted_content  # type: ignore[union-attr]
    assert compacted.usage is not None
    # The summary turn: the whole conversation, then the ask; the instructions say what to write.
    summary_turn = provider.requests[-1]
    assert "compacting a conversation" in (summary_turn.instructions or "")
    assert len(summary_turn.input) == len(HISTORY) + 1
    # Continuing: the compaction item is context again (a developer message with the summary).
    window = [o.to_dict() for o in compacted.output]
    client.responses.create(model="m", input=[*window, {"role": "user", "content": "Any hotel ideas?"}])
    sent = provider.requests[-1].input
    assert [i.get("type", "message") for i in sent] == ["message"] * 4
    developer = sent[2]
    assert developer["role"] == "developer" and SUMMARY in developer["content"][0]["text"]
    assert not any(i.get("type") == "compaction" for i in sent)


def test_a_compaction_item_is_tamper_evident_and_bound_to_its_key(
    served: tuple[Gateway, ScriptedProvider],
) -> None:
    gw, _ = served
    window = [o.to_dict() for o in _client(gw).responses.compact(model="m", input=HISTORY).output]  # type: ignore[arg-type]
    content = window[-1]["encrypted_content"]
    altered = content[:-4] + ("AAAA" if not content.endswith("AAAA") else "BBBB")
    for key, items in (
        (KEY_A, [*window[:-1], {**window[-1], "encrypted_content": altered}]),
        (KEY_B, window),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            _client(gw, key).responses.create(model="m", input=items)
        assert err.value.body["param"] == f"input[{len(window) - 1}].encrypted_content"  # type: ignore[index]
    # Another server's compaction item cannot be read by this model: a 400, not silence.
    foreign = {"type": "compaction", "encrypted_content": "gAAAAB-opaque"}
    with pytest.raises(openai.BadRequestError):
        _client(gw).responses.create(model="m", input=[foreign, {"role": "user", "content": "hi"}])


def test_compact_a_stored_conversation_by_previous_response_id(
    served: tuple[Gateway, ScriptedProvider],
) -> None:
    gw, provider = served
    client = _client(gw)
    first = client.responses.create(model="m", input="I want to visit Lisbon in May.")
    compacted = client.responses.compact(model="m", previous_response_id=first.id, input="Under 900 EUR.")
    assert [getattr(o, "role", None) for o in compacted.output[:-1]] == ["user", "user"]
    summary_turn = provider.requests[-1]
    assert [i.get("role") for i in summary_turn.input] == ["user", "assistant", "user", "user"]


def test_the_passthrough_compacts_natively(gateway: Factory) -> None:
    native = {
        "id": "resp_up",
        "object": "response.compaction",
        "created_at": 1,
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_text", "text": "hi"}],
            },
            {"id": "cmp_1", "type": "compaction", "encrypted_content": "gAAAAB-openai"},
        ],
        "usage": {
            "input_tokens": 5,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 3,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 8,
        },
    }
    with UpstreamMock() as upstream:
        upstream.reset([json_reply(native)])
        provider = OpenAIResponsesProvider(
            base_url=upstream.url + "/v1", api_key="sk-x", upstream_model="gpt-5"
        )
        provider.name = "gpt"
        gw = gateway([provider])
        got = httpx.post(f"{gw.base_url}/responses/compact", json={"model": "gpt", "input": "hi"})
        assert got.status_code == 200 and got.json() == native
        assert upstream.requests[-1].path == "/v1/responses/compact"
        assert upstream.requests[-1].json["model"] == "gpt-5"
