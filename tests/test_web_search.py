"""web_search run by the gateway for back ends without native search, seen by real clients over HTTP.

A local mock search engine (a tiny HTTP server speaking SearXNG's JSON API, and Brave's) serves
results whose pages it also serves; a scripted model searches, opens a page and finds text in it.
Every stream passes the checker and validates against the openai SDK's types; the answer carries
``url_citation`` annotations; page fetches pass the network guard (a private address, directly or
through a redirect, fails the call).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from conftest import Gateway, check_stream, decode_sse, start_gateway
from responses_gateway.engine.tools.web_search import BraveBackend, SearxngBackend
from responses_gateway.providers.scripted import ScriptedProvider

JSON = dict[str, Any]
EVENT = TypeAdapter(ResponseStreamEvent)
PAGE = (
    "<html><head><title>Paris</title><script>steal()</script></head>"
    "<body><h1>Weather</h1><p>Paris is sunny today, 21 degrees &amp; calm.</p></body></html>"
)


class SearchEngine:
    """The mock: ``/search`` (SearXNG JSON), ``/brave`` (Brave's JSON), ``/page/…`` and ``/redirect``."""

    def __init__(self) -> None:
        self.queries: list[dict[str, list[str]]] = []
        self.headers: list[dict[str, str]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                engine.headers.append({k.lower(): v for k, v in self.headers.items()})
                base = f"http://127.0.0.1:{engine.port}"
                results = [
                    {"title": "Paris weather", "url": f"{base}/page/paris", "content": "Sunny in Paris."},
                    {"title": "Lyon weather", "url": f"{base}/page/lyon", "content": "Rain in Lyon."},
                    {"title": "Nice weather", "url": f"{base}/page/nice", "content": "Warm in Nice."},
                    {"title": "Lille weather", "url": f"{base}/page/lille", "content": "Grey in Lille."},
                ]
                if parts.path == "/search":
                    engine.queries.append(query)
                    self._send(200, "application/json", json.dumps({"results": results}).encode())
                elif parts.path == "/brave":
                    engine.queries.append(query)
                    web = [
                        {"title": r["title"], "url": r["url"], "description": f"<b>{r['content']}</b>"}
                        for r in results
                    ]
                    self._send(200, "application/json", json.dumps({"web": {"results": web}}).encode())
                elif parts.path.startswith("/page/"):
                    self._send(200, "text/html; charset=utf-8", PAGE.encode())
                elif parts.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", "http://10.255.255.1/secret")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._send(404, "text/plain", b"no")

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def engine() -> Iterator[SearchEngine]:
    mock = SearchEngine()
    yield mock
    mock.stop()


def ws_call(**arguments: str) -> JSON:
    return {"function_call": {"name": "web_search", "arguments": [json.dumps(arguments)]}}


@pytest.fixture(scope="module")
def providers(engine: SearchEngine) -> dict[str, ScriptedProvider]:
    page = f"{engine.url}/page/paris"
    scripts: dict[str, Any] = {
        "browse": {
            "turns": [
                {
                    "when": {"text_contains": "21 degrees"},
                    "steps": [{"message": [f"Sunny [1], see {page} ."]}],
                },
                {
                    "when": {"input_has": "function_call_output"},
                    "steps": [ws_call(action="open_page", url=page)],
                },
                {"steps": [ws_call(action="search", query="weather in Paris")]},
            ]
        },
        "find": {
            "turns": [
                {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["Found."]}]},
                {"steps": [ws_call(action="find_in_page", url=page, pattern="degrees")]},
            ]
        },
        "redirect": {
            "turns": [
                {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["Could not."]}]},
                {"steps": [ws_call(action="open_page", url=f"{engine.url}/redirect")]},
            ]
        },
        "search": {
            "turns": [
                {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["Done."]}]},
                {"steps": [ws_call(action="search", query="weather")]},
            ]
        },
    }
    return {name: ScriptedProvider(script, name=name) for name, script in scripts.items()}


@pytest.fixture(scope="module")
def gw(providers: dict[str, ScriptedProvider], engine: SearchEngine) -> Iterator[Gateway]:
    gateway = start_gateway(
        list(providers.values()),
        search_backend=SearxngBackend(engine.url),
        tool_allow_networks=("127.0.0.0/8",),
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def guarded(providers: dict[str, ScriptedProvider], engine: SearchEngine) -> Iterator[Gateway]:
    gateway = start_gateway(list(providers.values()), search_backend=SearxngBackend(engine.url))
    yield gateway
    gateway.stop()


def stream(base_url: str, **body: Any) -> tuple[list[JSON], JSON]:
    got = httpx.post(f"{base_url}/responses", json={"stream": True, **body}, timeout=60)
    assert got.status_code == 200, got.text
    events = decode_sse(got.content)
    for event in events:
        typed = EVENT.validate_python(event)
        assert typed.to_dict() == event, event["type"]
    check_stream(events, strict=False)
    Response.model_validate(events[-1]["response"])
    return events, events[-1]["response"]


def test_search_open_page_and_citations(
    gw: Gateway, engine: SearchEngine, providers: dict[str, ScriptedProvider]
) -> None:
    events, response = stream(
        gw.base_url,
        model="browse",
        input="Weather in Paris?",
        tools=[{"type": "web_search"}],
        include=["web_search_call.action.sources"],
    )
    phases = [e["type"] for e in events if e["type"].startswith("response.web_search_call.")]
    assert (
        phases
        == [
            "response.web_search_call.in_progress",
            "response.web_search_call.searching",
            "response.web_search_call.completed",
        ]
        * 2
    )
    search, opened, message = response["output"]
    assert search["type"] == "web_search_call" and search["status"] == "completed"
    assert search["action"]["type"] == "search" and search["action"]["query"] == "weather in Paris"
    page = f"{engine.url}/page/paris"
    assert search["action"]["sources"][0] == {"type": "url", "url": page}
    assert opened["action"] == {"type": "open_page", "url": page}
    text = message["content"][0]["text"]
    annotations = message["content"][0]["annotations"]
    assert [a["type"] for a in annotations] == ["url_citation", "url_citation"]
    assert all(a["url"] == page and a["title"] == "Paris weather" for a in annotations)
    assert text[annotations[0]["start_index"] : annotations[0]["end_index"]] == "[1]"
    assert text[annotations[1]["start_index"] : annotations[1]["end_index"]] == page
    assert not any(e["type"].startswith("response.function_call") for e in events)
    # The model read numbered results, then the page as text (no markup, no script).
    second, third = providers["browse"].requests[-2:]
    assert "[1] Paris weather" in second.input[-1]["output"]
    read = third.input[-1]["output"]
    assert "Paris is sunny today, 21 degrees & calm." in read and "steal" not in read and "<" not in read
    assert engine.queries[-1]["format"] == ["json"] and engine.queries[-1]["q"] == ["weather in Paris"]


def test_preview_spelling_location_and_context_size(
    gw: Gateway, engine: SearchEngine, providers: dict[str, ScriptedProvider]
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    response = client.responses.create(
        model="search",
        input="Weather?",
        tools=[
            {
                "type": "web_search_preview",
                "search_context_size": "low",
                "user_location": {"type": "approximate", "country": "FR"},
            }
        ],
    )
    call = response.output[0]
    assert call.type == "web_search_call" and call.action.type == "search"
    assert call.action.sources is None  # not included
    assert engine.queries[-1]["language"] == ["all-FR"]
    read = providers["search"].requests[-1].input[-1]["output"]
    assert "[3]" in read and "[4]" not in read  # low: three results


def test_find_in_page(gw: Gateway, providers: dict[str, ScriptedProvider]) -> None:
    _, response = stream(gw.base_url, model="find", input="Find", tools=[{"type": "web_search"}])
    action = response["output"][0]["action"]
    assert action["type"] == "find_in_page" and action["pattern"] == "degrees"
    assert "21 degrees" in providers["find"].requests[-1].input[-1]["output"]


def test_pages_pass_the_network_guard(guarded: Gateway, gw: Gateway, providers: dict[str, Any]) -> None:
    # Loopback without --tool-allow-network: the call fails, the model reads why.
    _, response = stream(guarded.base_url, model="browse", input="x", tools=[{"type": "web_search"}])
    opened = response["output"][1]
    assert opened["status"] == "failed" and response["status"] == "completed"
    assert "non-public address" in providers["browse"].requests[-1].input[-1]["output"]
    # Loopback allowed, but the page redirects to a private address: refused at connect time.
    _, response = stream(gw.base_url, model="redirect", input="x", tools=[{"type": "web_search"}])
    assert response["output"][0]["status"] == "failed"
    assert "10.255.255.1" in providers["redirect"].requests[-1].input[-1]["output"]


def test_without_a_search_back_end(providers: dict[str, ScriptedProvider]) -> None:
    gateway = start_gateway([providers["search"]])
    dropping = start_gateway([providers["search"]], drop_unsupported_tools=("web_search",))
    try:
        got = httpx.post(
            f"{gateway.base_url}/responses",
            json={"model": "search", "input": "x", "tools": [{"type": "web_search"}]},
        )
        assert got.status_code == 400
        error = got.json()["error"]
        assert error["param"] == "tools[0].type" and "web_search: {backend: searxng" in error["message"]
        assert error["message"].startswith(
            "Unsupported parameter: 'tools[0].type' (web_search) is not supported with this model ("
        )
        got = httpx.post(
            f"{dropping.base_url}/responses",
            json={"model": "search", "input": "x", "tools": [{"type": "web_search"}]},
        )
        assert got.status_code == 200 and got.json()["tools"] == []
    finally:
        gateway.stop()
        dropping.stop()


def test_brave_backend_against_the_mock(engine: SearchEngine) -> None:
    backend = BraveBackend("brave-key", f"{engine.url}/brave")
    found = asyncio.run(backend.search("paris", count=2, location={"country": "FR"}))
    assert [r.title for r in found] == ["Paris weather", "Lyon weather"]
    assert found[0].snippet == "Sunny in Paris."
    assert engine.headers[-1]["x-subscription-token"] == "brave-key"
    assert engine.queries[-1]["country"] == ["fr"] and engine.queries[-1]["count"] == ["2"]


def test_models_file_web_search(monkeypatch: pytest.MonkeyPatch) -> None:
    from responses_gateway.config import ConfigError, parse_config

    config = parse_config("models: []\nweb_search: {backend: brave, api_key_env: BRAVE_KEY}\n", "m.yaml")
    assert config.web_search is not None and config.web_search.backend == "brave"
    monkeypatch.setenv("BRAVE_KEY", "k")
    assert config.web_search.api_key() == "k"
    with pytest.raises(ConfigError, match="backend 'searxng' needs 'url'"):
        parse_config("models: []\nweb_search: {backend: searxng}\n", "m.yaml")


def test_serve_with_a_search_back_end(engine: SearchEngine, tmp_path: Path) -> None:
    """``responses-gateway serve`` with the models file's ``web_search:`` (SearXNG, the mock)."""
    from serve_process import serving

    script = tmp_path / "searcher.yaml"
    script.write_text(
        json.dumps(
            {
                "model": "searcher",
                "turns": [
                    {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["See [2]."]}]},
                    {"steps": [ws_call(action="search", query="served search")]},
                ],
            }
        )
    )
    models = tmp_path / "models.yaml"
    models.write_text(f"local: false\nmodels: []\nweb_search: {{backend: searxng, url: '{engine.url}'}}\n")
    with serving(tmp_path, "--no-local", "--config", str(models), "--script", str(script)) as served:
        _, response = stream(served.base_url, model="searcher", input="x", tools=[{"type": "web_search"}])
    assert engine.queries[-1]["q"] == ["served search"]
    (annotation,) = response["output"][1]["content"][0]["annotations"]
    assert annotation["title"] == "Lyon weather"


def test_cached_only_search_is_refused_or_dropped(
    gw: Gateway, providers: dict[str, ScriptedProvider], engine: SearchEngine
) -> None:
    """Codex's cached-only search (``external_web_access: false``): this search is live, so it is
    refused naming the setting, or left out with ``--drop-unsupported-tool web_search``."""
    body = {"model": "search", "input": "x", "tools": [{"type": "web_search", "external_web_access": False}]}
    got = httpx.post(f"{gw.base_url}/responses", json=body)
    assert got.status_code == 400 and got.json()["error"]["param"] == "tools[0].external_web_access"
    dropping = start_gateway(
        [providers["search"]],
        search_backend=SearxngBackend(engine.url),
        drop_unsupported_tools=("web_search",),
    )
    try:
        got = httpx.post(f"{dropping.base_url}/responses", json=body)
    finally:
        dropping.stop()
    assert got.status_code == 200 and got.json()["tools"] == []
    live = {**body, "tools": [{"type": "web_search", "external_web_access": True}]}
    assert httpx.post(f"{gw.base_url}/responses", json=live).status_code == 200
