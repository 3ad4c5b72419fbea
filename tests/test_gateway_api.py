"""The gateway's own endpoints the web UI reads (server/gateway.py) and the UI's asset handler (server/ui.py),
over HTTP against a real gateway: ``POST /v1/gateway/check``, ``GET /v1/gateway/responses``, ``GET /``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import Gateway, check_stream, start_gateway, stream_events
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.sse import encode_event
from responses_gateway.providers.scripted import ScriptedProvider
from test_store_services import fresh_pg_database

KEYS = ("sk-ui-alice", "sk-ui-bob")
JSON = dict[str, Any]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("gateway-api")
    if request.param == "sqlite":
        url = f"sqlite://{tmp}/gateway.db"
    else:
        url = fresh_pg_database("rg_gateway_api_test")
    models = [
        ScriptedProvider(
            [{"message": ["Hel", "lo"]}, {"usage": {"input_tokens": 3, "output_tokens": 2}}], name="alpha"
        ),
        ScriptedProvider([{"message": "beta says hi"}], name="beta"),
        ScriptedProvider(
            [{"message": "partial"}, {"fail": {"code": "server_error", "message": "boom"}}], name="broken"
        ),
    ]
    gateway = start_gateway(models, api_keys=KEYS, store_url=url, data_dir=str(tmp))
    yield gateway
    gateway.stop()


def auth(key: str = KEYS[0]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def create(gw: Gateway, model: str, key: str = KEYS[0]) -> JSON:
    response = httpx.post(
        gw.url("/v1/responses"), json={"model": model, "input": "hi"}, headers=auth(key), timeout=10
    )
    assert response.status_code in (200, 500), response.text
    return dict(response.json()) if response.status_code == 200 else {}


def listing(gw: Gateway, key: str = KEYS[0], **params: Any) -> httpx.Response:
    return httpx.get(gw.url("/v1/gateway/responses"), params=params, headers=auth(key), timeout=10)


# ------------------------------------------------------------------------------------------ check
def recorded(gw: Gateway) -> list[JSON]:
    events = stream_events(
        gw.url("/v1/responses"), {"model": "alpha", "input": "hi", "stream": True}, headers=auth()
    )
    check_stream(events)
    return events


def test_check_passes_a_real_stream_as_events_and_as_sse(gw: Gateway) -> None:
    events = recorded(gw)
    for body in ({"events": events}, {"sse": b"".join(encode_event(e) for e in events).decode()}):
        result = httpx.post(gw.url("/v1/gateway/check"), json=body, headers=auth(), timeout=10).json()
        assert result == {
            "object": "gateway.check",
            "profile": "openai",
            "events": len(events),
            "ok": True,
            "violations": [],
        }


def test_check_names_the_event_each_violation_refers_to(gw: Gateway) -> None:
    events = recorded(gw)
    delta = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta")
    broken = [e for i, e in enumerate(events) if i != delta]  # a delta lost: sequence gap, done mismatch
    result = httpx.post(
        gw.url("/v1/gateway/check"), json={"events": broken}, headers=auth(), timeout=10
    ).json()
    assert result["ok"] is False and result["events"] == len(broken)
    expected = check(broken)
    assert [(v["rule"], v["sequence_number"]) for v in result["violations"]] == [
        (v.rule, v.sequence_number) for v in expected
    ]
    by_rule: dict[str, JSON] = {}
    for v in result["violations"]:
        by_rule.setdefault(v["rule"], v)  # the first of each rule
    # The first event after the gap carries the sequence violation, at its own index.
    assert by_rule["sequence.contiguous"]["index"] == delta
    done = next(i for i, e in enumerate(broken) if e["type"] == "response.output_text.done")
    assert by_rule["delta.done_mismatch"]["index"] == done
    assert by_rule["delta.done_mismatch"]["meaning"]
    # A stream cut short: what never happened names no event.
    cut = httpx.post(
        gw.url("/v1/gateway/check"), json={"events": events[:5]}, headers=auth(), timeout=10
    ).json()
    missing = [v for v in cut["violations"] if v["rule"] == "lifecycle.terminal_missing"]
    assert missing and missing[0]["index"] is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "events"),
        ({"events": [], "sse": ""}, "events"),
        ({"events": {"type": "x"}}, "events"),
        ({"sse": 5}, "sse"),
        ({"events": [], "profile": "nope"}, "profile"),
        ({"events": [{}] * 100_001}, "events"),
    ],
)
def test_check_refuses_bad_bodies_in_openai_shape(gw: Gateway, body: JSON, param: str) -> None:
    response = httpx.post(gw.url("/v1/gateway/check"), json=body, headers=auth(), timeout=10)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_check_needs_the_api_key(gw: Gateway) -> None:
    response = httpx.post(gw.url("/v1/gateway/check"), json={"events": []}, timeout=10)
    assert response.status_code == 401


# ------------------------------------------------------------------------------------------ history
def test_history_lists_the_callers_responses_with_filters_and_pages(gw: Gateway) -> None:
    # created_at is whole seconds: start on a fresh second so earlier tests' responses fall before it.
    time.sleep(1 - time.time() % 1)
    start = int(time.time())
    a1 = create(gw, "alpha")
    b1 = create(gw, "beta")
    a2 = create(gw, "alpha")
    create(gw, "broken")  # failed
    other = create(gw, "alpha", key=KEYS[1])

    page = listing(gw, model="alpha", created_after=start).json()
    # Only alpha, only this owner (newest first by created_at, whole seconds: ties in id order).
    assert {r["id"] for r in page["data"]} == {a1["id"], a2["id"]} and len(page["data"]) == 2
    times = [r["created_at"] for r in page["data"]]
    assert times == sorted(times, reverse=True)
    first = next(r for r in page["data"] if r["id"] == a2["id"])
    assert first["model"] == "alpha" and first["status"] == "completed" and first["object"] == "response"
    assert first["usage"]["output_tokens"] == 2
    assert other["id"] not in [r["id"] for r in listing(gw, limit=100).json()["data"]]
    assert [r["id"] for r in listing(gw, KEYS[1]).json()["data"]] == [other["id"]]

    failed = listing(gw, status="failed").json()["data"]
    assert failed and all(r["status"] == "failed" for r in failed)
    assert failed[0]["error"]["code"] == "server_error"

    # Pages: limit + after, in both orders; the model filter holds across pages.
    one = listing(gw, limit=1, created_after=start).json()
    assert one["has_more"] is True and len(one["data"]) == 1
    rest = listing(gw, after=one["last_id"], limit=100, created_after=start).json()
    assert [r["id"] for r in one["data"] + rest["data"]] == [
        r["id"] for r in listing(gw, limit=100, created_after=start).json()["data"]
    ]
    asc = listing(gw, model="alpha", order="asc", limit=1, created_after=start).json()
    assert asc["has_more"] is True
    nxt = listing(gw, model="alpha", order="asc", limit=1, after=asc["last_id"], created_after=start).json()
    assert nxt["has_more"] is False
    assert {asc["data"][0]["id"], nxt["data"][0]["id"]} == {a1["id"], a2["id"]}
    assert [r["id"] for r in asc["data"] + nxt["data"]] == [r["id"] for r in reversed(page["data"])]
    assert [r["id"] for r in listing(gw, model="beta", created_after=start).json()["data"]] == [b1["id"]]
    assert listing(gw, created_before=start - 86400).json()["data"] == []


def test_conversations_are_listed_per_owner_with_their_item_counts(gw: Gateway) -> None:
    start = int(time.time())
    made = []
    for n in range(3):
        body = {
            "items": [{"type": "message", "role": "user", "content": f"hi {i}"} for i in range(n)],
            "metadata": {"n": str(n)},
        }
        made.append(httpx.post(gw.url("/v1/conversations"), json=body, headers=auth(), timeout=10).json())
    other = httpx.post(gw.url("/v1/conversations"), json={}, headers=auth(KEYS[1]), timeout=10).json()

    def conversations(key: str = KEYS[0], **params: Any) -> httpx.Response:
        return httpx.get(gw.url("/v1/gateway/conversations"), params=params, headers=auth(key), timeout=10)

    page = conversations(created_after=start, limit=100).json()
    mine = {c["id"]: c for c in page["data"]}
    assert set(mine) == {c["id"] for c in made} and other["id"] not in mine
    for n, c in enumerate(made):
        assert mine[c["id"]] == {
            "id": c["id"],
            "object": "conversation",
            "created_at": c["created_at"],
            "metadata": {"n": str(n)},
            "items": n,
        }
    # A response in a conversation adds its turn's input and output to the count.
    create_body = {"model": "alpha", "input": "hello", "conversation": made[0]["id"]}
    assert (
        httpx.post(gw.url("/v1/responses"), json=create_body, headers=auth(), timeout=10).status_code == 200
    )
    counts = {c["id"]: c["items"] for c in conversations(created_after=start).json()["data"]}
    assert counts[made[0]["id"]] == 2
    first = conversations(created_after=start, limit=2).json()
    rest = conversations(created_after=start, limit=2, after=first["last_id"]).json()
    assert first["has_more"] and not rest["has_more"]
    assert [c["id"] for c in first["data"] + rest["data"]] == [c["id"] for c in page["data"]]
    assert [c["id"] for c in conversations(KEYS[1]).json()["data"]] == [other["id"]]
    missing = conversations(after="conv_missing")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "after"
    assert conversations(limit=0).status_code == 400


@pytest.mark.parametrize(
    ("params", "status", "param"),
    [
        ({"status": "done"}, 400, "status"),
        ({"limit": "0"}, 400, "limit"),
        ({"limit": "101"}, 400, "limit"),
        ({"order": "up"}, 400, "order"),
        ({"created_after": "yesterday"}, 400, "created_after"),
        ({"after": "resp_missing"}, 404, "after"),
    ],
)
def test_history_refuses_bad_queries(gw: Gateway, params: JSON, status: int, param: str) -> None:
    response = listing(gw, **params)
    assert response.status_code == status
    assert response.json()["error"]["param"] == param


# ------------------------------------------------------------------------------------------ assets
def test_ui_is_served_without_a_key_with_a_strict_policy(gw: Gateway) -> None:
    page = httpx.get(gw.url("/"), timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
    assert "<script>" not in page.text and 'src="/ui/app.js"' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere
    for asset, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        got = httpx.get(gw.url(f"/ui/{asset}"), timeout=10)
        assert got.status_code == 200 and got.headers["content-type"].startswith(kind)
        assert (
            got.headers["cache-control"] == "no-cache" and got.headers["x-content-type-options"] == "nosniff"
        )
        again = httpx.get(gw.url(f"/ui/{asset}"), headers={"If-None-Match": got.headers["etag"]}, timeout=10)
        assert again.status_code == 304 and again.content == b""
    for path in ("/ui/missing.js", "/ui/%2e%2e/pyproject.toml", "/ui/"):
        missing = httpx.get(gw.url(path), timeout=10)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    # The API itself still needs the key.
    assert httpx.get(gw.url("/v1/models"), timeout=10).status_code == 401


def test_no_ui_turns_the_pages_off(tmp_path: Path) -> None:
    gateway = start_gateway([ScriptedProvider([{"message": "x"}], name="m")], ui=False)
    try:
        assert httpx.get(gateway.url("/"), timeout=10).status_code == 404
        assert httpx.get(gateway.url("/ui/app.js"), timeout=10).status_code == 404
    finally:
        gateway.stop()


# ------------------------------------------------------------------------------------------ events
def events_of(gw: Gateway, rid: str, key: str = KEYS[0], **params: Any) -> httpx.Response:
    return httpx.get(
        gw.url(f"/v1/gateway/responses/{rid}/events"), params=params, headers=auth(key), timeout=10
    )


def test_a_stored_responses_events_come_with_their_arrival_times(gw: Gateway) -> None:
    streamed = recorded(gw)
    rid = streamed[0]["response"]["id"]
    page = events_of(gw, rid)
    assert page.status_code == 200, page.text
    body = page.json()
    assert body["object"] == "list" and body["has_more"] is False
    assert [d["event"] for d in body["data"]] == streamed  # what the client was sent, as stored
    assert [d["sequence_number"] for d in body["data"]] == [e["sequence_number"] for e in streamed]
    times = [d["at_ms"] for d in body["data"]]
    assert all(isinstance(t, int) and t >= 0 for t in times) and times == sorted(times), times
    # Pages: after a sequence number, at most limit.
    first = events_of(gw, rid, after=1, limit=2).json()
    assert first["has_more"] is True and first["data"] == body["data"][2:4]
    rest = events_of(gw, rid, after=len(streamed) - 2, limit=5).json()
    assert rest["has_more"] is False and rest["data"] == body["data"][-1:]
    # Owner-scoped: another key's response is not found, like an unknown id.
    for missing in (events_of(gw, rid, key=KEYS[1]), events_of(gw, "resp_nope")):
        assert missing.status_code == 404
        assert (
            missing.json()["error"]["code"] == "not_found" and "resp_" in missing.json()["error"]["message"]
        )
    assert httpx.get(gw.url(f"/v1/gateway/responses/{rid}/events"), timeout=10).status_code == 401


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"after": "x"}, "after"),
        ({"after": "-3"}, "after"),
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
    ],
)
def test_events_refuse_bad_queries(gw: Gateway, params: JSON, param: str) -> None:
    rid = create(gw, "beta")["id"]
    response = events_of(gw, rid, **params)
    assert response.status_code == 400
    assert (
        response.json()["error"]["param"] == param
        and response.json()["error"]["type"] == "invalid_request_error"
    )
