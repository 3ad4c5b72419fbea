"""The Conversations API over real HTTP with the openai SDK, on SQLite and on a real PostgreSQL.

Every endpoint's shape is what the SDK parses into its own types; errors are OpenAI's shape with
the right status and ``param``; another API key sees none of it (404 on every endpoint, and its
writes change nothing); ``conversation=`` on create-response carries the earlier turns upstream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from conftest import Gateway
from responses_gateway.providers.scripted import ScriptedProvider
from test_store_services import fresh_pg_database

KEY_A, KEY_B = "sk-conv-a", "sk-conv-b"
ENCRYPTED = "reasoning.encrypted_content"
PG_DB = "rg_conv_api_test"
_pg_ready: dict[str, str] = {}

Factory = Callable[..., Gateway]


def _pg_url() -> str:
    """A database of this module's own on the test server, emptied once per session."""
    if "url" not in _pg_ready:
        _pg_ready["url"] = fresh_pg_database(PG_DB)
    return _pg_ready["url"]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/data/gateway.db"
    return _pg_url()


def _provider() -> ScriptedProvider:
    return ScriptedProvider(
        {
            "turns": [
                {"when": {"text_contains": "What is my name"}, "steps": [{"message": ["You are ", "Ada."]}]},
                {"steps": [{"message": ["Nice to ", "meet you."]}]},
            ]
        },
        name="m",
    )


@pytest.fixture
def served(gateway: Factory, store_url: str) -> Iterator[tuple[Gateway, ScriptedProvider]]:
    provider = _provider()
    yield gateway([provider], store_url=store_url, api_keys=(KEY_A, KEY_B)), provider


def _client(gw: Gateway, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _texts(items: list[Any]) -> list[tuple[str, str]]:
    return [(i.role, "".join(getattr(p, "text", "") for p in i.content)) for i in items]


# ------------------------------------------------------------------------------------ lifecycle
def test_create_retrieve_update_list_add_delete(served: tuple[Gateway, ScriptedProvider]) -> None:
    gw, _ = served
    client = _client(gw)
    conv = client.conversations.create(
        items=[user("hello"), {"type": "message", "role": "assistant", "content": "hi there"}],
        metadata={"topic": "greeting"},
    )
    assert conv.object == "conversation"
    assert conv.id.startswith("conv_")
    assert conv.metadata == {"topic": "greeting"}
    assert conv.created_at > 1_700_000_000

    got = client.conversations.retrieve(conv.id)
    assert got.model_dump() == conv.model_dump()

    updated = client.conversations.update(conv.id, metadata={"topic": "names", "lang": "en"})
    assert updated.metadata == {"topic": "names", "lang": "en"}
    assert client.conversations.retrieve(conv.id).metadata == {"topic": "names", "lang": "en"}

    # Default order is newest first.
    page = client.conversations.items.list(conv.id)
    assert page.object == "list"
    assert _texts(page.data) == [("assistant", "hi there"), ("user", "hello")]
    assert page.has_more is False
    assert page.first_id == page.data[0].id and page.last_id == page.data[-1].id
    first = page.data[1]
    assert first.type == "message" and first.status == "completed" and first.id.startswith("msg_")
    assert first.content[0].type == "input_text"
    assert page.data[0].content[0].type == "output_text"

    added = client.conversations.items.create(
        conv.id,
        items=[
            user("call the tool"),
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q":"x"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        ],
    )
    assert added.object == "list"
    assert [i.type for i in added.data] == ["message", "function_call", "function_call_output"]
    assert added.has_more is False
    assert added.first_id == added.data[0].id and added.last_id == added.data[-1].id
    assert added.data[2].status == "completed" and added.data[2].output == "42"

    # The SDK's auto-pagination walks every page with after=last_id.
    walked = list(client.conversations.items.list(conv.id, limit=2, order="asc"))
    assert [i.type for i in walked] == [*["message"] * 3, "function_call", "function_call_output"]
    one = client.conversations.items.list(conv.id, limit=2, order="asc")
    assert len(one.data) == 2 and one.has_more is True
    rest = client.conversations.items.list(conv.id, order="asc", after=one.last_id)
    assert [i.id for i in rest.data] == [i.id for i in walked[2:]]

    call = added.data[1]
    fetched = client.conversations.items.retrieve(call.id, conversation_id=conv.id)
    assert fetched.type == "function_call" and fetched.id == call.id and fetched.arguments == '{"q":"x"}'

    after_delete = client.conversations.items.delete(call.id, conversation_id=conv.id)
    assert after_delete.object == "conversation" and after_delete.id == conv.id
    assert call.id not in [i.id for i in client.conversations.items.list(conv.id, limit=100).data]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(call.id, conversation_id=conv.id)

    deleted = client.conversations.delete(conv.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (conv.id, "conversation.deleted", True)
    with pytest.raises(openai.NotFoundError) as err:
        client.conversations.retrieve(conv.id)
    assert err.value.body == {
        "message": f"No conversation found with id '{conv.id}'.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(conv.id)


def test_empty_conversation_and_include(served: tuple[Gateway, ScriptedProvider]) -> None:
    gw, provider = served
    client = _client(gw)
    conv = client.conversations.create()
    assert conv.metadata == {}
    empty = client.conversations.items.list(conv.id)
    assert empty.data == [] and empty.has_more is False
    # Stored items keep the reasoning state; reads show it only when include asks, and then sealed
    # for the caller, as on /v1/responses: it never leaves the gateway unsealed.
    added = client.conversations.items.create(
        conv.id, items=[{"type": "reasoning", "summary": [], "encrypted_content": "opaque-state"}]
    )
    rid = added.data[0].id
    assert rid.startswith("rs_")
    assert added.data[0].encrypted_content is None
    assert client.conversations.items.retrieve(rid, conversation_id=conv.id).encrypted_content is None
    shown = client.conversations.items.retrieve(rid, conversation_id=conv.id, include=[ENCRYPTED])
    sealed = shown.encrypted_content
    assert sealed is not None and sealed.startswith("rgs1.") and "opaque-state" not in sealed
    listed = client.conversations.items.list(conv.id, include=[ENCRYPTED])
    assert listed.data[0].encrypted_content is not None and listed.data[0].encrypted_content.startswith(
        "rgs1."
    )
    again = client.conversations.items.create(
        conv.id,
        items=[{"type": "reasoning", "summary": [], "encrypted_content": "more"}],
        include=[ENCRYPTED],
    )
    assert again.data[0].encrypted_content is not None and again.data[0].encrypted_content.startswith("rgs1.")

    # Sealed state sent back is opened before it is stored: the back end gets the original.
    other = client.conversations.create(
        items=[{"type": "reasoning", "summary": [], "encrypted_content": sealed}, user("go on")]
    )
    client.responses.create(model="m", input="and then?", conversation=other.id)
    upstream = provider.requests[-1].input
    assert [i.get("encrypted_content") for i in upstream if i["type"] == "reasoning"] == ["opaque-state"]

    # Altered state, or state sealed for another key, is refused naming the item.
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    for blob, key in ((tampered, KEY_A), (sealed, KEY_B)):
        with pytest.raises(openai.BadRequestError) as err:
            _client(gw, key).conversations.create(
                items=[user("x"), {"type": "reasoning", "summary": [], "encrypted_content": blob}]
            )
        assert err.value.body["param"] == "items[1].encrypted_content"
        assert err.value.body["code"] == "invalid_encrypted_content"


def test_item_reference_copies_an_item_of_the_same_owner(served: tuple[Gateway, ScriptedProvider]) -> None:
    gw, _ = served
    a, b = _client(gw, KEY_A), _client(gw, KEY_B)
    source = a.conversations.create(items=[user("remember me")])
    item_id = a.conversations.items.list(source.id).data[0].id
    copy = a.conversations.create(items=[{"type": "item_reference", "id": item_id}])
    assert _texts(a.conversations.items.list(copy.id).data) == [("user", "remember me")]
    # Another key cannot reach the item through a reference either.
    with pytest.raises(openai.NotFoundError) as err:
        b.conversations.create(items=[user("x"), {"type": "item_reference", "id": item_id}])
    assert err.value.body["param"] == "items[1]"
    theirs = b.conversations.create()
    with pytest.raises(openai.NotFoundError):
        b.conversations.items.create(theirs.id, items=[{"type": "item_reference", "id": item_id}])
    assert b.conversations.items.list(theirs.id).data == []


# ------------------------------------------------------------------------------------ isolation
def test_another_key_gets_404_on_every_endpoint(served: tuple[Gateway, ScriptedProvider]) -> None:
    gw, _ = served
    a, b = _client(gw, KEY_A), _client(gw, KEY_B)
    conv = a.conversations.create(items=[user("secret")], metadata={"owner": "a"})
    item = a.conversations.items.list(conv.id).data[0]
    calls: dict[str, Callable[[], Any]] = {
        "retrieve": lambda: b.conversations.retrieve(conv.id),
        "update": lambda: b.conversations.update(conv.id, metadata={"owner": "b"}),
        "delete": lambda: b.conversations.delete(conv.id),
        "items.list": lambda: b.conversations.items.list(conv.id),
        "items.create": lambda: b.conversations.items.create(conv.id, items=[user("intruder")]),
        "items.retrieve": lambda: b.conversations.items.retrieve(item.id, conversation_id=conv.id),
        "items.delete": lambda: b.conversations.items.delete(item.id, conversation_id=conv.id),
    }
    for name, call in calls.items():
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.status_code == 404, name
        assert "secret" not in str(err.value.body), name
        # The same answer as for an id that never existed: nothing tells B the conversation exists.
        assert err.value.body["message"] in (
            f"No conversation found with id '{conv.id}'.",
            f"No item found with id '{item.id}'.",
        ), name
    # Nothing B did changed A's conversation.
    assert a.conversations.retrieve(conv.id).metadata == {"owner": "a"}
    assert _texts(a.conversations.items.list(conv.id).data) == [("user", "secret")]
    # And B's own conversation is invisible to A.
    mine = b.conversations.create(items=[user("b's")])
    with pytest.raises(openai.NotFoundError):
        a.conversations.items.list(mine.id)


def test_without_a_key_nothing_is_served(served: tuple[Gateway, ScriptedProvider]) -> None:
    gw, _ = served
    with httpx.Client(timeout=10) as http:
        for method, path in [
            ("POST", "/v1/conversations"),
            ("GET", "/v1/conversations/conv_x"),
            ("GET", "/v1/conversations/conv_x/items"),
        ]:
            response = http.request(method, gw.url(path), json={} if method == "POST" else None)
            assert response.status_code == 401, path
            assert response.json()["error"]["code"] == "invalid_api_key"


# ------------------------------------------------------------------------------------ validation
def _post(gw: Gateway, path: str, body: Any, query: str = "") -> httpx.Response:
    with httpx.Client(timeout=10) as http:
        return http.post(gw.url(path) + query, json=body, headers={"authorization": f"Bearer {KEY_A}"})


def _get(gw: Gateway, path: str, query: str = "") -> httpx.Response:
    with httpx.Client(timeout=10) as http:
        return http.get(gw.url(path) + query, headers={"authorization": f"Bearer {KEY_A}"})


def _error(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"items": "hello"}, "items", "invalid_type"),
        ({"items": [user(str(i)) for i in range(21)]}, "items", "array_above_max_length"),
        ({"items": [{"role": "robot", "content": "x"}]}, "items[0].role", "invalid_value"),
        ({"items": [user("ok"), {"type": "message", "role": "user"}]}, "items[1].content", None),
        ({"items": [{"type": "no_such_item"}]}, "items[0].type", "invalid_value"),
        ({"items": [{"type": "item_reference"}]}, "items[0].id", "missing_required_parameter"),
        ({"metadata": {"k": 1}}, "metadata.k", "invalid_value"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "object_above_max_properties"),
        ({"metadata": "x"}, "metadata", "invalid_type"),
        ({"model": "m"}, "model", "unknown_parameter"),
    ],
)
def test_create_rejects_bad_input_naming_the_param(
    served: tuple[Gateway, ScriptedProvider], body: dict[str, Any], param: str, code: str | None
) -> None:
    gw, _ = served
    error = _error(_post(gw, "/v1/conversations", body))
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code


def test_other_endpoints_reject_bad_input(served: tuple[Gateway, ScriptedProvider]) -> None:
    gw, _ = served
    conv = _client(gw).conversations.create(items=[user("x")])
    base = f"/v1/conversations/{conv.id}"
    assert _error(_post(gw, base, {}))["param"] == "metadata"
    assert _error(_post(gw, base, {"metadata": {"a": "b"}, "title": "t"}))["param"] == "title"
    assert _error(_post(gw, base + "/items", {}))["param"] == "items"
    assert _error(_post(gw, base + "/items", {"items": []}))["param"] == "items"
    assert _error(_post(gw, base + "/items", {"items": [user("x")] * 21}))["code"] == "array_above_max_length"
    bogus = _post(gw, base + "/items", {"items": [user("x")]}, "?include[]=bogus")
    assert _error(bogus)["param"] == "include[0]"
    for query, param in [
        ("?limit=0", "limit"),
        ("?limit=101", "limit"),
        ("?limit=ten", "limit"),
        ("?order=sideways", "order"),
        ("?include[]=reasoning.encrypted_content&include[]=nope", "include[1]"),
    ]:
        assert _error(_get(gw, base + "/items", query))["param"] == param, query
    # Bad JSON, and a body that is not an object.
    with httpx.Client(timeout=10) as http:
        bad = http.post(
            gw.url("/v1/conversations"),
            content=b"{nope",
            headers={"authorization": f"Bearer {KEY_A}", "content-type": "application/json"},
        )
    assert "could not parse the JSON body" in _error(bad)["message"]
    assert _error(_post(gw, "/v1/conversations", [1, 2]))["code"] == "invalid_type"
    # A cursor naming no item of the conversation is a 404, like OpenAI's.
    _error(_get(gw, base + "/items", "?after=msg_nope"), 404)
    # Unknown sub-paths and methods.
    _error(_get(gw, base + "/things"), 404)
    with httpx.Client(timeout=10) as http:
        put = http.put(gw.url(base), json={}, headers={"authorization": f"Bearer {KEY_A}"})
    assert _error(put, 405)["code"] == "method_not_allowed"
    # Nothing of this reached the store.
    assert _texts(_client(gw).conversations.items.list(conv.id).data) == [("user", "x")]


# ------------------------------------------------------------------------------------ with responses
def _role_texts(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (item["role"], "".join(part.get("text", "") for part in item["content"]))
        for item in items
        if item.get("type") == "message"
    ]


def test_two_turn_chat_through_conversation(served: tuple[Gateway, ScriptedProvider]) -> None:
    gw, provider = served
    client = _client(gw)
    conv = client.conversations.create(metadata={"app": "chat"})

    first = client.responses.create(model="m", input="Hi, I am Ada.", conversation=conv.id)
    assert first.output_text == "Nice to meet you."
    assert first.conversation is not None and first.conversation.id == conv.id
    with client.responses.stream(model="m", input="What is my name?", conversation={"id": conv.id}) as stream:
        second = stream.get_final_response()
    assert second.output_text == "You are Ada."

    # The second turn's upstream input held the first turn, in order, then the new message.
    assert _role_texts(provider.requests[0].input) == [("user", "Hi, I am Ada.")]
    assert _role_texts(provider.requests[1].input) == [
        ("user", "Hi, I am Ada."),
        ("assistant", "Nice to meet you."),
        ("user", "What is my name?"),
    ]
    # The conversation lists both turns, each answer under the id the response gave it.
    items = list(client.conversations.items.list(conv.id, order="asc"))
    assert _texts(items) == [
        ("user", "Hi, I am Ada."),
        ("assistant", "Nice to meet you."),
        ("user", "What is my name?"),
        ("assistant", "You are Ada."),
    ]
    assert [items[1].id, items[3].id] == [first.output[0].id, second.output[0].id]
    assert all(item.status == "completed" for item in items)
    newest = client.conversations.items.list(conv.id, limit=1)
    assert _texts(newest.data) == [("assistant", "You are Ada.")] and newest.has_more is True

    # An item added by hand joins the context of the next turn.
    client.conversations.items.create(conv.id, items=[user("My name is now Bea.")])
    client.responses.create(model="m", input="ok?", conversation=conv.id)
    assert _role_texts(provider.requests[2].input)[-2:] == [("user", "My name is now Bea."), ("user", "ok?")]

    # Another key can neither use the conversation nor see what it gathered.
    other = _client(gw, KEY_B)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model="m", input="What is my name?", conversation=conv.id)
    assert len(provider.requests) == 3
    assert len(list(client.conversations.items.list(conv.id))) == 7


def test_without_a_store_conversations_are_not_found(gateway: Factory) -> None:
    gw = gateway([_provider()])  # no store_url: serve --store none
    client = _client(gw)
    with pytest.raises(openai.NotFoundError) as err:
        client.conversations.create(items=[user("x")])
    assert err.value.body["code"] == "not_found"
    assert "without a store" in err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list("conv_x")
