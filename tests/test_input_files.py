"""input_file parts (file_id, file_data) reach every back end in the form it reads, over HTTP.

The files are uploaded with the openai SDK (``client.files.create``) and named by id, or sent inline as
data URLs. A scripted back end (text form) answers only when the file's text reached it; the mock
upstreams show what Anthropic (``document`` blocks), Gemini (``inlineData``), a Chat Completions server
(the extracted text) and the OpenAI passthrough (file_id resolved to file_data) are sent.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import Response

from conftest import Gateway, check_stream, start_gateway, stream_events
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.gemini import GeminiProvider
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from responses_gateway.providers.scripted import ScriptedProvider
from test_documents import make_pdf
from upstream_mock import UpstreamMock, fixture_reply

JSON = dict[str, Any]

ANTHROPIC_PLAIN = "anthropic-messages__plain-text-with-ping-sonnet-4.5__vercel-ai.chunks.jsonl"
GEMINI_PLAIN = "gemini__stream-plain-text-gemini-2.0-flash__pydantic-pydantic-ai.sse"
CHAT_PLAIN = "openai-chat__plain-text-include-usage-final-chunk-gpt-4.1-nano__vercel-ai.chunks.jsonl"
RESPONSES_PLAIN = "openai-responses__reasoning-empty-summary-plain-text-gpt-5-mini__wavetermdev-waveterm.sse"

PDF = make_pdf("The capital of Freedonia is Fredville.", "Population: 12,345.")
HTML = (
    b"<html><head><script>var leak='SCRIPT-TEXT';</script></head><body><p>Blue &amp; green.</p></body></html>"
)

READER = {
    "turns": [
        {"when": {"text_contains": "Fredville"}, "steps": [{"message": ["The capital is Fredville."]}]},
        {"when": {"text_contains": "Blue & green."}, "steps": [{"message": ["Blue and green."]}]},
        {"steps": [{"message": ["I see no file."]}]},
    ]
}


@pytest.fixture(scope="module")
def reader() -> ScriptedProvider:
    return ScriptedProvider(READER, name="reader")


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    with UpstreamMock() as mock:
        yield mock


@pytest.fixture(scope="module")
def gw(
    reader: ScriptedProvider, upstream: UpstreamMock, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("files")
    providers: list[Any] = [reader]
    for name, provider in (
        ("claude", AnthropicProvider(base_url=upstream.url, api_key="sk-ant-x", upstream_model="claude-x")),
        ("gemini", GeminiProvider(base_url=upstream.url, api_key="AIzaTESTKEY0123456789")),
        ("chat", OpenAIChatProvider(base_url=upstream.url + "/v1", api_key="sk-x", upstream_model="gpt-4o")),
        ("openai", OpenAIResponsesProvider(base_url=upstream.url + "/v1", api_key="sk-test-relay-0000001")),
    ):
        provider.name = name
        providers.append(provider)
    gateway = start_gateway(
        providers, store_url=f"sqlite://{data}/gateway.db", data_dir=str(data), api_keys=("key-a", "key-b")
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=0)


@pytest.fixture(scope="module")
def pdf_id(client: openai.OpenAI) -> str:
    return client.files.create(file=("freedonia.pdf", PDF), purpose="user_data").id


def ask(*parts: JSON, text: str = "What does the file say?") -> list[JSON]:
    return [{"role": "user", "content": [*parts, {"type": "input_text", "text": text}]}]


def test_a_pdf_by_file_id_reaches_a_text_back_end_as_its_text(
    client: openai.OpenAI, reader: ScriptedProvider, pdf_id: str
) -> None:
    response = client.responses.create(model="reader", input=ask({"type": "input_file", "file_id": pdf_id}))
    assert response.output_text == "The capital is Fredville."
    part = reader.requests[-1].input[0]["content"][0]
    assert part["type"] == "input_text"
    assert part["text"].startswith('<file name="freedonia.pdf">\nThe capital of Freedonia is Fredville.')
    assert "Population: 12,345." in part["text"] and part["text"].endswith("\n</file>")
    # What is stored is what the client sent (the id), not the text.
    items = client.responses.input_items.list(response.id).data
    stored = items[0].to_dict()["content"][0]
    assert stored["type"] == "input_file" and stored["file_id"] == pdf_id and "file_data" not in stored


def test_the_file_stays_readable_in_later_turns(
    client: openai.OpenAI, reader: ScriptedProvider, pdf_id: str
) -> None:
    first = client.responses.create(model="reader", input=ask({"type": "input_file", "file_id": pdf_id}))
    second = client.responses.create(model="reader", input="And again?", previous_response_id=first.id)
    assert second.output_text == "The capital is Fredville."
    assert reader.requests[-1].input[0]["content"][0]["text"].startswith('<file name="freedonia.pdf">')


def test_file_data_html_streamed(gw: Gateway, reader: ScriptedProvider) -> None:
    data = "data:text/html;base64," + base64.b64encode(HTML).decode()
    events = stream_events(
        gw.url("/v1/responses"),
        {
            "model": "reader",
            "stream": True,
            "input": ask({"type": "input_file", "filename": "page.html", "file_data": data}),
        },
        headers={"authorization": "Bearer key-a"},
    )
    check_stream(events)
    response = Response.model_validate(events[-1]["response"])
    assert response.output_text == "Blue and green."
    text = reader.requests[-1].input[0]["content"][0]["text"]
    assert "SCRIPT-TEXT" not in text and text == '<file name="page.html">\nBlue & green.\n</file>'


def test_a_file_in_a_tool_output(client: openai.OpenAI, reader: ScriptedProvider) -> None:
    data = "data:text/markdown;base64," + base64.b64encode(b"# Notes\n\nThe capital is Fredville.").decode()
    client.responses.create(
        model="reader",
        input=[
            {"role": "user", "content": "Read the notes."},
            {"type": "function_call", "call_id": "c1", "name": "read_notes", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_file", "filename": "notes.md", "file_data": data}],
            },
        ],
        tools=[
            {"type": "function", "name": "read_notes", "parameters": {"type": "object", "properties": {}}}
        ],
    )
    (part,) = reader.requests[-1].input[2]["output"]
    assert part == {
        "type": "input_text",
        "text": '<file name="notes.md">\n# Notes\n\nThe capital is Fredville.\n</file>',
    }


def test_mistakes_are_400s_naming_the_part(gw: Gateway, client: openai.OpenAI, pdf_id: str) -> None:
    other = openai.OpenAI(base_url=gw.base_url, api_key="key-b", max_retries=0)
    corrupt = "data:application/pdf;base64," + base64.b64encode(PDF[:200]).decode()
    png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="
    at = "input[0].content[0]"
    cases: list[tuple[openai.OpenAI, JSON, str, str]] = [
        # Another key's file is not found, exactly like a missing one.
        (other, {"type": "input_file", "file_id": pdf_id}, f"{at}.file_id", pdf_id),
        (client, {"type": "input_file", "file_id": "file-nope"}, f"{at}.file_id", "file-nope"),
        (
            client,
            {"type": "input_file", "file_data": corrupt, "filename": "x.pdf"},
            f"{at}.file_data",
            "x.pdf",
        ),
        (
            client,
            {"type": "input_file", "file_data": png, "filename": "pic.png"},
            f"{at}.file_data",
            "pic.png",
        ),
        (client, {"type": "input_file", "file_data": "%%%not base64%%%"}, f"{at}.file_data", "base64"),
    ]
    for who, part, param, named in cases:
        with pytest.raises(openai.BadRequestError) as info:
            who.responses.create(model="reader", input=ask(part))
        error = info.value.body
        assert isinstance(error, dict) and error["param"] == param, error
        assert named in error["message"], error


# ------------------------------------------------------------------------------------ mock upstreams
def _send(client: openai.OpenAI, upstream: UpstreamMock, model: str, reply: str, *parts: JSON) -> JSON:
    upstream.reset([fixture_reply(reply)])
    response = client.responses.create(model=model, input=ask(*parts))
    assert response.status == "completed"
    body = upstream.requests[-1].json
    assert isinstance(body, dict)
    return body


def test_anthropic_gets_document_blocks(client: openai.OpenAI, upstream: UpstreamMock, pdf_id: str) -> None:
    html = "data:text/html;base64," + base64.b64encode(HTML).decode()
    body = _send(
        client,
        upstream,
        "claude",
        ANTHROPIC_PLAIN,
        {"type": "input_file", "file_id": pdf_id},
        {"type": "input_file", "file_data": html, "filename": "page.html"},
    )
    pdf, page, _ = body["messages"][0]["content"]
    assert pdf == {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(PDF).decode()},
        "title": "freedonia.pdf",
    }
    assert page == {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "Blue & green."},
        "title": "page.html",
    }


def test_gemini_gets_inline_data(client: openai.OpenAI, upstream: UpstreamMock, pdf_id: str) -> None:
    body = _send(client, upstream, "gemini", GEMINI_PLAIN, {"type": "input_file", "file_id": pdf_id})
    part = body["contents"][0]["parts"][0]
    assert part == {"inlineData": {"mimeType": "application/pdf", "data": base64.b64encode(PDF).decode()}}


def test_gemini_gets_media_as_data_and_documents_as_text(
    client: openai.OpenAI, upstream: UpstreamMock
) -> None:
    audio = "data:audio/wav;base64,UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAIA+AAACABAAZGF0YQAAAAA="
    html = "data:text/html;base64," + base64.b64encode(HTML).decode()
    body = _send(
        client,
        upstream,
        "gemini",
        GEMINI_PLAIN,
        {"type": "input_file", "file_data": audio, "filename": "hello.wav"},
        {"type": "input_file", "file_data": html, "filename": "page.html"},
    )
    wav, page, _ = body["contents"][0]["parts"]
    assert wav == {"inlineData": {"mimeType": "audio/wav", "data": audio.split(",", 1)[1]}}
    assert page == {
        "inlineData": {"mimeType": "text/plain", "data": base64.b64encode(b"Blue & green.").decode()}
    }


def test_chat_completions_gets_the_text(client: openai.OpenAI, upstream: UpstreamMock, pdf_id: str) -> None:
    body = _send(client, upstream, "chat", CHAT_PLAIN, {"type": "input_file", "file_id": pdf_id})
    content = body["messages"][0]["content"]
    assert content[0]["type"] == "text"
    assert content[0]["text"].startswith(
        '<file name="freedonia.pdf">\nThe capital of Freedonia is Fredville.'
    )


def test_the_openai_passthrough_gets_file_data_for_our_ids(
    client: openai.OpenAI, upstream: UpstreamMock, pdf_id: str
) -> None:
    inline = {"type": "input_file", "file_data": "data:application/pdf;base64,AAAA", "filename": "x.pdf"}
    url = {"type": "input_file", "file_url": "https://example.com/a.pdf"}
    body = _send(
        client, upstream, "openai", RESPONSES_PLAIN, {"type": "input_file", "file_id": pdf_id}, inline, url
    )
    ours, theirs, link, _ = body["input"][0]["content"]
    assert ours == {
        "type": "input_file",
        "file_data": "data:application/pdf;base64," + base64.b64encode(PDF).decode(),
        "filename": "freedonia.pdf",
    }
    assert theirs == inline and link == url  # untouched


def test_without_a_store_file_ids_are_refused(tmp_path: Path) -> None:
    gateway = start_gateway([ScriptedProvider(READER, name="reader")])
    try:
        got = httpx.post(
            gateway.url("/v1/responses"),
            json={"model": "reader", "input": ask({"type": "input_file", "file_id": "file-1"})},
        )
        assert got.status_code == 400
        assert got.json()["error"]["param"] == "input[0].content[0].file_id"
        data = (
            "data:text/plain;base64," + base64.b64encode(b"The capital is Fredville, says the note.").decode()
        )
        got = httpx.post(
            gateway.url("/v1/responses"),
            json={
                "model": "reader",
                "input": ask({"type": "input_file", "file_data": data, "filename": "n.txt"}),
            },
        )
        assert (
            got.status_code == 200
            and got.json()["output"][0]["content"][0]["text"] == "The capital is Fredville."
        )
    finally:
        gateway.stop()
