"""The web playground and inspector (docs/ui.md) in a real headless Chromium, against a real gateway.

One ``responses-gateway serve`` (scripted models, an OpenAI-compatible model whose upstream fails, an API
key) and one browser page are shared by the module; the tests run in file order on that page, as a
person would use it. Chromium is Debian's (``scripts/browser-deps.sh``), driven by Playwright for
Python; nothing is downloaded. Screenshots of every page go to ``tests/.artifacts/ui/<build>/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import decode_sse
from responses_gateway.protocol.checker import check
from responses_gateway.protocol.sse import encode_event
from serve_process import Served, serve, stop
from upstream_mock import UpstreamMock, error_reply

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect
expect.set_options(timeout=15_000)

CHROMIUM = Path("/usr/bin/chromium")
# One folder per build: `make test` runs the suite on both builds at once.
ARTIFACTS = Path(__file__).parent / ".artifacts" / "ui" / os.environ.get("RG_TEST_BUILD", "interpreted")
KEY = "sk-ui-browser-test"
SLOW_TEXT = ["Hello", " from", " the", " scripted", " gateway,", " streaming", " slowly."]
JSON = dict[str, Any]

DEMO = """
model: demo
turns:
  - when: {input_has: function_call_output}
    steps:
      - message: ["It is ", "sunny ", "in Paris."]
  - when: {text_contains: take your time}
    steps:
      - message: ["Before the pause,", " and after it."]
        delay: 0.3
  - when: {text_contains: weather}
    steps:
      - reasoning: {summary: [["Checking ", "the weather"]]}
      - function_call: {name: get_weather, arguments: ['{"city":', ' "Paris"}'], call_id: call_ui}
        delay: 0.05
      - usage: {input_tokens: 12, output_tokens: 9}
  - steps:
      - reasoning: {summary: [["Thinking ", "it over"]]}
      - message: SLOW_TEXT
        delay: 0.12
      - usage: {input_tokens: 5, output_tokens: 7}
""".replace("SLOW_TEXT", json.dumps(SLOW_TEXT))

MIDFAIL = """
model: midfail
steps:
  - message: ["partial ", "answer"]
  - fail: {code: server_error, message: "the model fell over"}
"""

# The hosted code_interpreter, run by the gateway in its sandbox: a plot and a file the answer cites.
PLOT_CODE = (
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\n"
    "open('/mnt/data/squares.csv', 'w').write('x,y\\n1,1\\n2,4\\n3,9\\n')\nprint('plotted')"
)
PLOT = {
    "model": "plot",
    "turns": [
        {
            "when": {"input_has": "function_call_output"},
            "steps": [{"message": ["Here is the plot; the data is in sandbox:/mnt/data/squares.csv."]}],
        },
        {
            "steps": [
                {
                    "function_call": {
                        "name": "code_interpreter",
                        "arguments": [json.dumps({"code": PLOT_CODE})],
                    }
                }
            ]
        },
    ],
}

# The hosted file_search over the files the page attached: one search, then an answer naming the file.
OTTERS = (
    "Sea otters hold hands while they sleep so that they do not drift apart. A group of resting otters "
    "is called a raft. They keep a favourite stone in a pouch of loose skin under the forearm."
)
LIBRARIAN = {
    "model": "librarian",
    "turns": [
        {
            "when": {"input_has": "function_call_output"},
            "steps": [{"message": ["Otters hold hands while they sleep (see ", "otters.txt", ")."]}],
        },
        {
            "steps": [
                {
                    "function_call": {
                        "name": "file_search",
                        "arguments": [json.dumps({"queries": ["why do otters hold hands"]})],
                    }
                }
            ]
        },
    ],
}

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="no /usr/bin/chromium: run scripts/browser-deps.sh (make test does)"
)


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamMock]:
    error = {"error": {"message": "upstream exploded", "type": "server_error", "code": "server_error"}}
    with UpstreamMock() as mock:
        mock.enqueue(error_reply(500, error))
        yield mock


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, upstream: UpstreamMock) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("ui")
    (tmp / "demo.yaml").write_text(DEMO)
    (tmp / "midfail.yaml").write_text(MIDFAIL)
    (tmp / "plot.json").write_text(json.dumps(PLOT))
    (tmp / "librarian.json").write_text(json.dumps(LIBRARIAN))
    (tmp / "models.yaml").write_text(
        "local: false\nmodels:\n"
        "  - name: demo\n    provider: scripted\n    script: demo.yaml\n"
        "  - name: midfail\n    provider: scripted\n    script: midfail.yaml\n"
        "  - name: plot\n    provider: scripted\n    script: plot.json\n"
        "  - name: librarian\n    provider: scripted\n    script: librarian.json\n"
        "  - name: flaky\n    provider: openai-chat\n    upstream_model: m\n"
        f"    base_url: {upstream.url}/v1\n    retries: 0\n"
    )
    gateway = serve(tmp, "--no-local", "--config", str(tmp / "models.yaml"), "--api-key", KEY)
    yield gateway
    stop(gateway)


@pytest.fixture(scope="module")
def page(served: Served) -> Iterator[Any]:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.set_default_timeout(15_000)
        tab = context.new_page()
        tab.problems = []  # console errors and uncaught exceptions (a CSP refusal shows up here)
        tab.on("console", lambda m: m.type == "error" and tab.problems.append(m.text))
        tab.on("pageerror", lambda e: tab.problems.append(str(e)))
        tab.goto(f"http://127.0.0.1:{served.port}/")
        yield tab
        context.close()
        browser.close()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def api(served: Served, path: str) -> httpx.Response:
    return httpx.get(
        f"http://127.0.0.1:{served.port}{path}", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    )


def stored_events(served: Served, rid: str) -> list[JSON]:
    return decode_sse(api(served, f"/v1/responses/{rid}?stream=true&starting_after=-1").content)


def send(page: Any, text: str) -> None:
    page.fill("#composer-input", text)
    page.press("#composer-input", "Enter")


def last_rid(page: Any) -> str:
    return str(page.locator(".turn-actions .rid").last.text_content())


def wait_verdict(page: Any) -> str:
    expect(page.locator("#inspector-verdict")).to_contain_text("checker:")
    return str(page.locator("#inspector-verdict").text_content())


# ------------------------------------------------------------------------------------------ the tests
def test_without_a_key_the_page_says_so_and_asks_for_it(page: Any) -> None:
    banner = page.locator("#banner")
    expect(banner).to_be_visible()
    expect(banner).to_have_attribute("role", "alert")
    expect(banner).to_contain_text("Error 401")
    expect(page.locator("#key-dialog")).to_be_visible()
    shot(page, "01-key-dialog")
    page.fill("#key-input", KEY)
    page.click("#key-form button[value=save]")
    expect(page.locator("#key-button")).to_have_text("API key: set")
    expect(page.locator("#model option")).to_have_count(5)
    expect(banner).to_be_hidden()
    # Kept for this tab only: in session storage, not in local storage or a cookie.
    assert page.evaluate("sessionStorage.getItem('rg.apiKey')") == KEY
    assert page.evaluate("localStorage.length") == 0 and page.evaluate("document.cookie") == ""
    assert page.problems == [
        "Failed to load resource: the server responded with a status of 401 (Unauthorized)"
    ]
    page.problems.clear()


def test_a_message_streams_in(page: Any) -> None:
    page.select_option("#model", "demo")
    send(page, "hello there")
    answer = page.locator(".message.assistant .text").last
    seen: list[str] = []
    final = "".join(SLOW_TEXT)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        text = answer.text_content() if answer.count() else ""
        if text and (not seen or seen[-1] != text):
            seen.append(text)
        if text == final:
            break
        time.sleep(0.03)
    assert seen and seen[-1] == final, seen
    partial = [s for s in seen if s != final]
    assert partial and all(final.startswith(s) for s in partial), seen  # it grew, delta by delta
    expect(page.locator(".turn-status").last).to_have_text("completed · demo")
    expect(page.locator("details.reasoning").last).to_contain_text("Thinking it over")
    wait_verdict(page)
    shot(page, "02-chat-streamed")
    assert page.problems == []


def test_inspector_shows_every_frame_of_the_stream(page: Any, served: Served) -> None:
    rid = last_rid(page)
    events = stored_events(served, rid)
    assert events and check(events) == []
    assert "no violations" in wait_verdict(page)
    inspector = page.locator("#inspector")
    expect(inspector).to_have_attribute("data-frames", str(len(events)))
    rows = page.locator("#frames tbody tr")
    expect(rows).to_have_count(len(events))
    assert page.locator("#frames tbody td.type").all_text_contents() == [e["type"] for e in events]
    seqs = page.locator("#frames tbody tr td:nth-child(2)").all_text_contents()
    assert seqs == [str(e["sequence_number"]) for e in events]
    times = [int(t.lstrip("+")) for t in page.locator("#frames tbody tr td:nth-child(3)").all_text_contents()]
    assert times == sorted(times) and times[-1] >= 0.12 * 1000 * (len(SLOW_TEXT) - 1) * 0.9  # real arrival
    assert re.fullmatch(r"\d+ ms|\d+\.\d\d s", str(page.locator("#stat-ttft").text_content()))
    expect(page.locator("#stat-tokens")).to_have_text("7")
    assert float(str(page.locator("#stat-tps").text_content())) > 0
    # 7 text deltas 0.12 s apart (and 2 reasoning deltas before them): about 8 deltas per second.
    assert 2 < float(str(page.locator("#stat-dps").text_content())) < 20
    shot(page, "03-inspector-frames")
    page.click("#t-items")
    tree = page.locator("#item-tree")
    expect(tree).to_contain_text("message")
    expect(tree).to_contain_text(f"{len(SLOW_TEXT)} deltas")
    page.click("#t-diff")
    expect(page.locator("#diff")).to_contain_text("2 of 2 items identical")
    shot(page, "04-inspector-diff")
    page.click("#t-frames")
    # A frame opens as JSON.
    rows.nth(2).click()
    expect(page.locator("#frame-detail")).to_contain_text('"type": "response.output_item.added"')
    # The keyboard walks the frames: one tab stop, arrow keys move and open the next frame.
    page.keyboard.press("ArrowDown")
    expect(rows.nth(3)).to_be_focused()
    expect(page.locator("#frame-detail")).to_contain_text(f'"type": "{events[3]["type"]}"')
    assert page.locator('#frames tbody tr[tabindex="0"]').count() == 1


def test_a_function_call_is_a_card_and_its_output_goes_back(page: Any, served: Served) -> None:
    page.click(".settings summary")
    page.fill(
        "#tools",
        '[{"type":"function","name":"get_weather","parameters":{"type":"object",'
        '"properties":{"city":{"type":"string"}}}}]',
    )
    send(page, "what is the weather in Paris?")
    card = page.locator(".card.function_call").last
    expect(card.locator(".call-name")).to_have_text("get_weather")
    expect(card.locator(".call-args")).to_have_text('{"city": "Paris"}')
    expect(card.locator(".badge").first).to_have_text("completed")
    call_turn = last_rid(page)
    card.locator("textarea").fill("sunny, 21 C")
    card.locator("button", has_text="Send output").click()
    expect(page.locator(".message.assistant .text").last).to_have_text("It is sunny in Paris.")
    wait_verdict(page)
    answer = last_rid(page)
    assert answer != call_turn
    stored = api(served, f"/v1/responses/{answer}").json()
    assert stored["previous_response_id"] == call_turn
    items = api(served, f"/v1/responses/{answer}/input_items").json()["data"]
    assert [(i["type"], i["call_id"], i["output"]) for i in items] == [
        ("function_call_output", "call_ui", "sunny, 21 C")
    ]
    page.fill("#tools", "")
    page.click(".settings summary")
    shot(page, "05-tool-call-card")


def test_fork_continues_from_an_earlier_turn(page: Any, served: Served) -> None:
    first = page.locator(".turn-actions .rid").first.text_content()
    turns = page.locator(".turn").count()
    page.locator(".turn-actions").first.get_by_role("button", name="Fork from here").click()
    expect(page.locator(".turn")).to_have_count(1)
    assert turns > 1
    expect(page.locator("#chain")).to_have_text(f"continues {first}")
    send(page, "and now?")
    expect(page.locator(".turn")).to_have_count(2)
    wait_verdict(page)
    forked = last_rid(page)
    assert api(served, f"/v1/responses/{forked}").json()["previous_response_id"] == first
    # Inspect an earlier turn: its own stream, with the arrival times this tab saw.
    page.locator(".turn-actions").first.get_by_role("button", name="Inspect").click()
    expect(page.locator("#inspector-title")).to_have_text(f"Response {first}")
    events = stored_events(served, str(first))
    expect(page.locator("#inspector")).to_have_attribute("data-frames", str(len(events)))
    assert page.locator("#frames tbody td.type").all_text_contents() == [e["type"] for e in events]
    assert all(
        t.startswith("+") for t in page.locator("#frames tbody tr td:nth-child(3)").all_text_contents()
    )


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap: run scripts/sandbox-deps.sh")
def test_a_code_interpreter_card_shows_its_code_logs_image_and_cited_file(page: Any) -> None:
    pytest.importorskip("matplotlib")
    page.click(".settings summary")
    page.check("#tool-code")
    page.select_option("#model", "plot")
    page.click("#new-chat")  # the plot script starts over when its input holds a call output
    expect(page.locator("#chain")).to_have_text("new conversation")
    send(page, "plot the squares")
    card = page.locator(".card.code_interpreter_call").last
    expect(card.locator(".call-args")).to_have_text(PLOT_CODE)
    expect(card.locator("pre.logs")).to_contain_text("plotted")
    image = card.locator("img.call-image")
    expect(image).to_have_attribute("src", re.compile(r"^data:image/png;base64,iVBORw0KGgo"))
    assert image.evaluate("img => img.complete && img.naturalWidth > 100")  # a real, decoded picture
    answer = page.locator(".message.assistant").last
    expect(answer.locator(".text")).to_contain_text("Here is the plot")
    citation = answer.locator(".annotations li")
    expect(citation).to_contain_text("squares.csv")
    wait_verdict(page)
    assert "no violations" in str(page.locator("#inspector-verdict").text_content())
    shot(page, "05b-code-interpreter")
    # The cited file downloads through the Containers API with the key.
    with page.expect_download() as download:
        citation.get_by_role("button", name="squares.csv").click()
    assert Path(download.value.path()).read_text() == "x,y\n1,1\n2,4\n3,9\n"
    page.uncheck("#tool-code")
    page.click(".settings summary")
    page.select_option("#model", "demo")


def test_attached_files_are_searched_and_cited(page: Any, served: Served, tmp_path: Path) -> None:
    page.select_option("#model", "librarian")
    page.click("#new-chat")
    (tmp_path / "otters.txt").write_text(OTTERS)
    (tmp_path / "empty.txt").write_bytes(b"")
    page.set_input_files("#attach-input", str(tmp_path / "otters.txt"))
    entry = page.locator('#attachments li[data-name="otters.txt"]')
    expect(entry.locator(".attach-status")).to_have_text("completed")  # uploaded, ingested
    file_id = str(entry.get_attribute("data-file-id"))
    assert file_id.startswith("file-")
    # A file the gateway refuses: its error on its row and in the banner; nothing stays stored.
    page.set_input_files("#attach-input", str(tmp_path / "empty.txt"))
    refused = page.locator('#attachments li[data-name="empty.txt"]')
    expect(refused.locator(".attach-status")).to_have_text("failed")
    expect(refused.locator(".attach-error")).to_contain_text("empty")
    expect(page.locator("#banner")).to_contain_text("Error 400 (invalid_file)")
    shot(page, "05c-attachments")
    assert page.problems == [
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    ]
    page.problems.clear()
    refused.get_by_role("button", name="Remove empty.txt").click()
    expect(refused).to_have_count(0)
    page.click("#banner-close")
    files = api(served, "/v1/files").json()["data"]
    assert [f["filename"] for f in files if f["filename"] in ("otters.txt", "empty.txt")] == ["otters.txt"]

    send(page, "why do otters hold hands?")
    card = page.locator(".card.file_search_call").last
    expect(card.locator(".call-args")).to_have_text("why do otters hold hands")
    expect(card.locator(".badge").first).to_have_text("completed")
    result = card.locator(".search-result").first
    expect(result.locator(".result-file")).to_have_text("otters.txt")
    expect(result.locator(".result-text")).to_contain_text("hold hands while they sleep")
    answer = page.locator(".message.assistant").last
    expect(answer.locator(".text")).to_have_text("Otters hold hands while they sleep (see otters.txt[1]).")
    mark = answer.locator("a.cite")
    mark_label = "citation 1: otters.txt"
    expect(mark).to_have_attribute("aria-label", mark_label)
    citation = answer.locator(".annotations li.file-citation")
    expect(citation).to_contain_text("otters.txt")
    expect(citation).to_contain_text(file_id)
    assert "no violations" in wait_verdict(page)
    shot(page, "05d-file-search")
    # What the page asked for, as the gateway stored it: the tool over the chat's own store, the
    # results included (shown above, with the stored score), the citation after the file's name.
    stored = api(served, f"/v1/responses/{last_rid(page)}").json()
    (tool,) = stored["tools"]
    assert tool["type"] == "file_search" and len(tool["vector_store_ids"]) == 1
    store = tool["vector_store_ids"][0]
    search, message = stored["output"]
    assert search["results"][0]["file_id"] == file_id
    expect(result.locator(".result-score")).to_have_text(f"{search['results'][0]['score']:.3f}")
    text = message["content"][0]["text"]
    assert message["content"][0]["annotations"] == [
        {"type": "file_citation", "file_id": file_id, "filename": "otters.txt", "index": text.index(")")}
    ]
    note = page.locator("#attachments-note")
    expect(note).to_contain_text(f"vector store {store} with file_search (1 of 1")
    attached = api(served, f"/v1/vector_stores/{store}/files").json()["data"]
    assert [f["id"] for f in attached] == [file_id]
    # A new chat starts without files; reopening the response from the history takes its store back.
    rid = last_rid(page)
    page.click("#new-chat")
    expect(page.locator("#attachments-box")).to_be_hidden()
    page.click("#tab-history")
    page.locator(f'#history-table tbody tr[data-id="{rid}"]').get_by_role("button", name="Open").click()
    expect(page.locator(".card.file_search_call .result-file")).to_have_text("otters.txt")
    entry = page.locator('#attachments li[data-name="otters.txt"]')
    expect(entry.locator(".attach-status")).to_have_text("completed")
    expect(entry).to_have_attribute("data-file-id", file_id)
    expect(note).to_contain_text(f"vector store {store} with file_search (1 of 1")
    expect(page.locator(".message.assistant a.cite")).to_have_attribute("aria-label", mark_label)
    shot(page, "05e-file-search-reopened")
    # Remove: detached from the store and the upload deleted.
    entry.get_by_role("button", name="Remove otters.txt").click()
    expect(page.locator("#attachments-box")).to_be_hidden()
    deadline = time.monotonic() + 10
    while api(served, f"/v1/files/{file_id}").status_code != 404 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api(served, f"/v1/vector_stores/{store}/files").json()["data"] == []
    assert api(served, f"/v1/files/{file_id}").status_code == 404
    assert page.problems == []
    page.select_option("#model", "demo")
    page.click("#new-chat")


def test_a_broken_recording_shows_its_violations(page: Any, served: Served) -> None:
    body = {"model": "demo", "input": "record me", "stream": True}
    raw = httpx.post(
        f"http://127.0.0.1:{served.port}/v1/responses",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    ).content
    events = decode_sse(raw)
    delta = next(i for i, e in enumerate(events) if e["type"] == "response.output_text.delta")
    broken = [e for i, e in enumerate(events) if i != delta][:-1]  # one delta lost, no terminal event
    path = ARTIFACTS / "broken.sse"
    path.write_bytes(b"".join(encode_event(e) for e in broken))
    verdict = httpx.post(
        f"http://127.0.0.1:{served.port}/v1/gateway/check",
        json={"events": broken},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    ).json()
    assert not verdict["ok"]
    page.click("#t-load")
    page.set_input_files("#load-file", str(path))
    expect(page.locator("#load-text")).not_to_have_value("")
    page.click("#load-go")
    text = wait_verdict(page)
    assert f"{len(verdict['violations'])} violation" in text
    expect(page.locator("#inspector-title")).to_have_text("Recording broken.sse, sse")
    expect(page.locator("#inspector")).to_have_attribute("data-frames", str(len(broken)))
    marked = {
        int(i)
        for i in page.locator("#frames tbody tr.violation").evaluate_all(
            "rows => rows.map(r => r.dataset.index)"
        )
    }
    assert marked == {v["index"] for v in verdict["violations"] if v["index"] is not None}
    assert delta in marked  # the frame after the gap
    listed = page.locator("#violations li").all_text_contents()
    assert any("sequence.contiguous" in t for t in listed)
    assert any("end of stream" in t and "lifecycle.terminal_missing" in t for t in listed)
    shot(page, "06-broken-recording")
    # The same recording with CRLF line ends, pasted: the page's SSE parser reads the same events.
    page.click("#t-load")
    page.fill("#load-text", path.read_text().replace("\n", "\r\n"))
    page.click("#load-go")
    assert f"{len(verdict['violations'])} violation" in wait_verdict(page)
    expect(page.locator("#inspector")).to_have_attribute("data-frames", str(len(broken)))
    # A final Response that disagrees with what was streamed: the diff says where.
    tampered = json.loads(json.dumps(events))
    tampered[-1]["response"]["output"][-1]["content"][0]["text"] = "Something else."
    page.click("#t-load")
    page.fill("#load-text", "\n".join(json.dumps(e) for e in tampered))  # JSON lines
    page.click("#load-go")
    assert "violation" in wait_verdict(page)
    expect(page.locator("#violations")).to_contain_text("output.mismatch")
    page.click("#t-diff")
    diff = page.locator("#diff")
    expect(diff).to_contain_text("1 of 2 items identical")
    expect(diff.locator(".differs summary")).to_contain_text("differs at .content[0].text")
    expect(diff.locator(".differs pre").last).to_contain_text("Something else.")
    expect(page.locator("#inspector-title")).to_have_text("Recording (pasted), jsonl")
    shot(page, "06b-diff-mismatch")
    page.click("#t-frames")


def test_stop_ends_the_stream_and_the_gateway_keeps_the_cancel(page: Any, served: Served) -> None:
    page.select_option("#model", "demo")
    page.click("#new-chat")
    send(page, "a long one")
    answer = page.locator(".message.assistant .text").last
    expect(answer).to_contain_text("Hello")
    page.click("#stop")
    expect(page.locator(".turn-status").last).to_have_text("stopped")
    text = wait_verdict(page)
    assert "violation" in text  # cut short: no terminal event
    expect(page.locator("#violations")).to_contain_text("lifecycle.terminal_missing")
    rid = last_rid(page)
    deadline = time.monotonic() + 10
    while (
        api(served, f"/v1/responses/{rid}").json()["status"] == "in_progress" and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert api(served, f"/v1/responses/{rid}").json()["status"] == "cancelled"
    assert "".join(SLOW_TEXT) != answer.text_content()


def test_an_upstream_failure_shows_an_error_banner(page: Any, upstream: UpstreamMock, served: Served) -> None:
    page.select_option("#model", "flaky")
    send(page, "anyone there?")
    banner = page.locator("#banner")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("Error 502 (server_error)")  # the gateway answers 502 for a bad upstream
    expect(banner).to_contain_text("HTTP 500")
    expect(banner).to_contain_text("upstream exploded")
    assert upstream.requests, "the gateway never called the upstream"
    expect(page.locator(".turn-status").last).to_have_text("no response")
    expect(page.locator("#inspector-verdict")).to_have_text("No stream: HTTP 502 before the first event")
    shot(page, "07-upstream-error")
    assert page.problems == [
        "Failed to load resource: the server responded with a status of 502 (Bad Gateway)"
    ]
    page.problems.clear()
    page.click("#banner-close")
    expect(banner).to_be_hidden()
    # A failure after the stream started: the stream's own error, and the partial answer kept; sent to
    # another model than the turn it continues (the model changes mid-conversation).
    page.select_option("#model", "demo")
    send(page, "before the switch")
    expect(page.locator(".turn-status").last).to_have_text("completed · demo")
    wait_verdict(page)
    chained = last_rid(page)
    page.select_option("#model", "midfail")
    send(page, "try again")
    expect(banner).to_contain_text("the model fell over")
    expect(page.locator(".message.assistant .text").last).to_have_text("partial answer")
    expect(page.locator(".turn-status").last).to_have_text("failed (server_error) · midfail")
    wait_verdict(page)
    # The model changed mid-conversation: the new model got the same chain.
    failed = api(served, f"/v1/responses/{last_rid(page)}").json()
    assert failed["model"] == "midfail" and failed["previous_response_id"] == chained
    expect(page.locator("#stat-status")).to_have_text("failed")
    shot(page, "08-stream-failed")
    page.click("#banner-close")
    page.select_option("#model", "demo")


def test_structured_output_mode_sends_the_schema(page: Any) -> None:
    page.click(".settings summary")
    page.check("#structured")
    turns = page.locator(".turn").count()
    page.fill("#schema", '{"type": "object",')
    send(page, "answer in JSON")
    expect(page.locator("#banner")).to_contain_text("The schema is not valid JSON")
    assert page.locator(".turn").count() == turns  # nothing was sent
    page.fill("#schema", '{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}')
    send(page, "answer in JSON")
    # The scripted back end cannot follow a schema: the gateway's 400 names what the page sent.
    expect(page.locator("#banner")).to_contain_text("Error 400")
    expect(page.locator("#banner")).to_contain_text("json_schema")
    assert page.problems == [
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    ]
    page.problems.clear()
    page.uncheck("#structured")
    page.click(".settings summary")
    page.click("#banner-close")


def test_a_conversation_object_is_kept_listed_and_reopened(page: Any, served: Served) -> None:
    page.select_option("#model", "demo")
    page.click("#new-conversation")
    expect(page.locator("#chain")).to_have_text(re.compile(r"^in conversation conv_"))
    cid = str(page.locator("#chain").text_content()).removeprefix("in conversation ")
    for n, text in enumerate(("first in conv", "second in conv"), 1):
        send(page, text)
        expect(page.locator(".turn-status")).to_have_count(n)
        expect(page.locator(".turn-status").last).to_have_text("completed · demo")
        wait_verdict(page)
    stored = api(served, f"/v1/conversations/{cid}/items?order=asc&limit=100").json()["data"]
    assert [i["type"] for i in stored] == ["message", "reasoning", "message"] * 2
    page.click("#tab-history")
    page.check('input[name="h-kind"][value="conversations"]')
    row = page.locator(f'#conversation-table tbody tr[data-id="{cid}"]')
    expect(row).to_contain_text("6")
    expect(page.locator("#history-table")).to_be_hidden()
    shot(page, "09b-conversations")
    row.get_by_role("button", name=re.compile("Open")).click()
    expect(page.locator("#chain")).to_have_text(f"in conversation {cid}")
    expect(page.locator(".message.user")).to_have_text(["first in conv", "second in conv"])
    expect(page.locator(".message.assistant .text")).to_have_text(["".join(SLOW_TEXT)] * 2)
    send(page, "third in conv")
    expect(page.locator(".turn-status").last).to_have_text("completed · demo")
    wait_verdict(page)
    after = api(served, f"/v1/conversations/{cid}/items?order=asc&limit=100").json()["data"]
    assert len(after) == 9 and after[6]["content"][0]["text"] == "third in conv"
    shot(page, "09c-conversation-reopened")
    page.click("#tab-history")
    page.check('input[name="h-kind"][value="responses"]')
    page.click("#tab-chat")


def test_history_lists_and_reopens_a_response(page: Any, served: Served) -> None:
    page.reload()  # a new page: what it shows comes from the store, not from streams this tab saw
    listed = api(served, "/v1/gateway/responses?model=demo&limit=100").json()["data"]
    page.click("#tab-history")
    page.select_option("#h-model", "demo")
    page.click("#history-filters button[type=submit]")
    rows = page.locator("#history-table tbody tr")
    expect(rows).to_have_count(min(20, len(listed)))
    assert rows.evaluate_all("rows => rows.map(r => r.dataset.id)") == [r["id"] for r in listed[:20]]
    page.select_option("#h-status", "failed")
    page.click("#history-filters button[type=submit]")
    expect(page.locator("#history-empty")).to_be_visible()  # demo never failed
    page.select_option("#h-model", "")
    page.click("#history-filters button[type=submit]")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("midfail")
    page.select_option("#h-status", "")
    page.select_option("#h-model", "demo")
    page.click("#history-filters button[type=submit]")
    shot(page, "09-history")
    # Reopen the first answer (the slow one): chat, inspector from the stored events, replay.
    target = next(r for r in reversed(listed) if r["usage"] and r["usage"]["output_tokens"] == 7)
    page.locator(f'#history-table tbody tr[data-id="{target["id"]}"]').get_by_role(
        "button", name=re.compile("Open")
    ).click()
    expect(page.locator("#chat-view")).to_be_visible()
    expect(page.locator(".message.user").first).to_have_text("hello there")
    expect(page.locator(".message.assistant .text").first).to_have_text("".join(SLOW_TEXT))
    expect(page.locator("#chain")).to_have_text(f"continues {target['id']}")
    wait_verdict(page)
    events = stored_events(served, target["id"])
    expect(page.locator("#inspector")).to_have_attribute("data-frames", str(len(events)))
    expect(page.locator("#inspector-title")).to_contain_text("recorded arrival times")
    assert page.locator("#frames tbody td.type").all_text_contents() == [e["type"] for e in events]
    shot(page, "10-history-reopened")
    page.select_option("#replay-speed", "20")
    page.click("#replay")
    expect(page.locator("#inspector-title")).to_contain_text("Replay of")
    expect(page.locator("#replay-output .message .text")).to_have_text("".join(SLOW_TEXT))
    expect(page.locator("#inspector")).to_have_attribute("data-frames", str(len(events)))
    assert "no violations" in wait_verdict(page)


def frame_times(page: Any) -> list[int]:
    """The frame list's arrival times (ms, the third column: "+N")."""
    cells = page.locator("#frames tbody tr td:nth-child(3)").all_text_contents()
    return [int(c.lstrip("+")) for c in cells]


def test_a_reopened_stored_response_replays_at_its_recorded_pace(page: Any, served: Served) -> None:
    page.click("#new-chat")
    page.select_option("#model", "demo")
    send(page, "take your time")
    expect(page.locator("#transcript .message.assistant .text").last).to_have_text(
        "Before the pause, and after it."
    )
    rid = last_rid(page)
    wait_verdict(page)
    page.reload()  # this tab's own capture is gone: the times must come from the store
    page.click("#tab-history")
    page.select_option("#h-model", "demo")
    page.click("#history-filters button[type=submit]")
    page.locator(f'#history-table tbody tr[data-id="{rid}"]').get_by_role(
        "button", name=re.compile("Open")
    ).click()
    wait_verdict(page)
    expect(page.locator("#inspector-title")).to_contain_text("recorded arrival times")
    stored = api(served, f"/v1/gateway/responses/{rid}/events").json()["data"]
    expect(page.locator("#inspector")).to_have_attribute("data-frames", str(len(stored)))
    # The frame list shows the stored times (ms since the response was created).
    assert frame_times(page) == [d["at_ms"] for d in stored]
    deltas = [i for i, d in enumerate(stored) if d["event"]["type"] == "response.output_text.delta"]
    assert len(deltas) == 2
    recorded = frame_times(page)
    # Each delta came after a 300 ms pause of the scripted model (the first 300 ms after the create).
    assert recorded[deltas[0]] >= 250 and recorded[deltas[1]] - recorded[deltas[0]] >= 250, recorded
    # Replayed at 1x, the frames arrive with the same gaps.
    page.select_option("#replay-speed", "1")
    page.click("#replay")
    expect(page.locator("#inspector-title")).to_contain_text("Replay of")
    expect(page.locator("#replay-output .message .text")).to_have_text("Before the pause, and after it.")
    expect(page.locator("#inspector")).to_have_attribute("data-frames", str(len(stored)))
    assert "no violations" in wait_verdict(page)
    replayed = frame_times(page)
    a, b = deltas
    assert replayed[b] - replayed[a] >= 250, replayed
    assert abs((replayed[b] - replayed[a]) - (recorded[b] - recorded[a])) < 150, (recorded, replayed)
    shot(page, "11-replay-recorded-pace")
    assert page.problems == []


def test_narrow_window_and_keyboard(page: Any) -> None:
    page.set_viewport_size({"width": 420, "height": 900})
    page.reload()
    expect(page.locator("#model option")).to_have_count(5)  # the key survived the reload (session)
    assert page.evaluate("document.documentElement.scrollWidth") <= 420
    # The inspector stacks under the chat instead of beside it.
    chat = page.locator(".panel.chat").bounding_box()
    inspector = page.locator("#inspector").bounding_box()
    assert inspector["y"] >= chat["y"] + chat["height"] - 1
    # Keyboard: the inspector's tabs move with the arrow keys.
    page.focus("#t-frames")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#t-items")).to_be_focused()
    expect(page.locator("#t-items")).to_have_attribute("aria-selected", "true")
    shot(page, "12-narrow")
    page.set_viewport_size({"width": 1400, "height": 900})
    assert page.problems == []
