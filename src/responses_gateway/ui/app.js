// The playground: chat with any model the gateway serves, every stream shown in the inspector beside
// it, and the history of stored responses.
import { api, apiKey, setApiKey, streamResponse, streamStored, storedTimedEvents, APIError } from "./api.js";
import { el, clear, formatTime } from "./dom.js";
import { TurnView, userTurn, inputText } from "./render.js";
import { Inspector, TERMINAL } from "./inspector.js";
import { Attachments } from "./attachments.js";
import { parseRecorded } from "./sse.js";

const $ = (id) => document.getElementById(id);

const state = {
  previousResponseId: null, // the turn the next message continues
  conversationId: null, // or the Conversation object the chat lives in
  turns: [], // {responseId, nodes: [Node]}
  controller: null,
  historyCursor: null,
};

// ------------------------------------------------------------------------------ banner
function showError(err) {
  let text;
  if (err instanceof APIError) {
    text = `Error ${err.status}${err.code ? ` (${err.code})` : ""}: ${err.message}`;
    if (err.status === 401) openKeyDialog();
  } else if (err && err.name === "AbortError") {
    return;
  } else {
    text = `Error: ${err && err.message ? err.message : String(err)}`;
  }
  $("banner-text").textContent = text;
  $("banner").className = "banner error";
  $("banner").hidden = false;
}

function showNotice(text) {
  $("banner-text").textContent = text;
  $("banner").className = "banner notice";
  $("banner").hidden = false;
}

function hideBanner() {
  $("banner").hidden = true;
}

$("banner-close").addEventListener("click", hideBanner);

const inspector = new Inspector($("inspector"), { onError: showError });
const attachments = new Attachments($("attachments"), { box: $("attachments-box"), note: $("attachments-note"), onError: showError });

// ------------------------------------------------------------------------------ API key
function showKeyState() {
  $("key-button").textContent = apiKey() ? "API key: set" : "API key: none";
}

function openKeyDialog() {
  const dialog = $("key-dialog");
  if (dialog.open) return;
  $("key-input").value = "";
  dialog.showModal();
}

$("key-button").addEventListener("click", openKeyDialog);
$("key-dialog").addEventListener("close", () => {
  const action = $("key-dialog").returnValue;
  if (action === "save") setApiKey($("key-input").value.trim());
  else if (action === "forget") setApiKey("");
  $("key-input").value = "";
  showKeyState();
  if (action === "save" || action === "forget") loadModels();
});

// ------------------------------------------------------------------------------ models
async function loadModels() {
  try {
    const list = await api.models();
    const names = list.data.map((m) => m.id);
    for (const select of [$("model"), $("h-model")]) {
      const keep = select.value;
      for (const o of [...select.options]) if (o.value) o.remove();
      for (const name of names) select.append(el("option", { value: name }, name));
      if (names.includes(keep)) select.value = keep;
    }
    hideBanner();
  } catch (err) {
    showError(err);
  }
}

// ------------------------------------------------------------------------------ views
for (const tab of document.querySelectorAll(".view-tab")) {
  tab.addEventListener("click", () => showView(tab.dataset.view));
}

function showView(id) {
  for (const tab of document.querySelectorAll(".view-tab")) {
    const on = tab.dataset.view === id;
    if (on) tab.setAttribute("aria-current", "page");
    else tab.removeAttribute("aria-current");
    $(tab.dataset.view).hidden = !on;
  }
  if (id === "history-view") searchHistory(true);
}

// ------------------------------------------------------------------------------ chat
function showChain() {
  $("chain").textContent = state.conversationId
    ? `in conversation ${state.conversationId}`
    : state.previousResponseId
      ? `continues ${state.previousResponseId}`
      : "new conversation";
}

function newConversation() {
  state.previousResponseId = null;
  state.conversationId = null;
  state.turns = [];
  clear($("transcript"));
  attachments.reset(); // a new chat starts without files (its own vector store on the first upload)
  showChain();
}

$("attach-input").addEventListener("change", () => {
  const files = [...$("attach-input").files];
  $("attach-input").value = ""; // the same file can be picked again
  if (files.length) attachments.add(files);
});

$("new-chat").addEventListener("click", newConversation);
$("new-conversation").addEventListener("click", async () => {
  try {
    const conversation = await api.createConversation();
    newConversation();
    state.conversationId = conversation.id;
    showChain();
    $("composer-input").focus();
  } catch (err) {
    showError(err);
  }
});

// The request's options from the settings panel; throws a readable Error for bad JSON.
function requestOptions() {
  const body = { model: $("model").value, store: true };
  const instructions = $("instructions").value.trim();
  if (instructions) body.instructions = instructions;
  if ($("effort").value) body.reasoning = { effort: $("effort").value };
  const tools = [];
  const toolsText = $("tools").value.trim();
  if (toolsText) {
    let parsed;
    try {
      parsed = JSON.parse(toolsText);
    } catch (err) {
      throw new Error(`Function tools are not valid JSON: ${err.message}`);
    }
    if (!Array.isArray(parsed)) throw new Error("Function tools must be a JSON array");
    tools.push(...parsed);
  }
  if ($("tool-code").checked) {
    tools.push({ type: "code_interpreter", container: { type: "auto" } });
    body.include = ["code_interpreter_call.outputs"]; // the logs and images, not only the code
  }
  const search = attachments.tool();
  if (search) {
    tools.push(search);
    body.include = [...(body.include || []), "file_search_call.results"]; // the passages, not only the queries
  }
  if (tools.length) body.tools = tools;
  if ($("structured").checked) {
    let schema;
    try {
      schema = JSON.parse($("schema").value);
    } catch (err) {
      throw new Error(`The schema is not valid JSON: ${err.message}`);
    }
    body.text = { format: { type: "json_schema", name: $("schema-name").value || "answer", schema, strict: true } };
  }
  return body;
}

function assistantTurn() {
  const box = el("div", { class: "turn" });
  const actions = el("div", { class: "turn-actions" });
  const view = new TurnView(box, { onCallOutput: sendCallOutput });
  box.append(actions);
  return { box, actions, view };
}

function addTurnActions(turn, responseId) {
  turn.actions.append(
    el("span", { class: "muted rid" }, responseId),
    el("button", { type: "button", onclick: () => inspectResponse(responseId) }, "Inspect"),
    el("button", { type: "button", onclick: () => fork(responseId) }, "Fork from here"),
  );
}

// Continue from an earlier turn: later turns leave the transcript (they stay in the history).
function fork(responseId) {
  const at = state.turns.findIndex((t) => t.responseId === responseId);
  if (at < 0) return;
  for (const turn of state.turns.slice(at + 1)) for (const node of turn.nodes) node.remove();
  state.turns = state.turns.slice(0, at + 1);
  state.previousResponseId = responseId;
  const left = state.conversationId;
  state.conversationId = null; // a Conversation only grows at its end: a fork chains by response id
  showChain();
  showNotice(`Forked: the next message continues from ${responseId}${left ? ` (outside ${left})` : ""}.`);
  $("composer-input").focus();
}

async function run(input, label) {
  let options;
  try {
    options = requestOptions();
  } catch (err) {
    showError(err);
    return;
  }
  if (!options.model) {
    showError(new Error("No model to talk to: the gateway lists none (or the API key is missing)."));
    return;
  }
  hideBanner();
  const body = { ...options, input };
  if (state.conversationId) body.conversation = state.conversationId;
  else if (state.previousResponseId) body.previous_response_id = state.previousResponseId;
  const userNode = userTurn(label);
  const turn = assistantTurn();
  $("transcript").append(userNode, turn.box);
  const record = { responseId: null, nodes: [userNode, turn.box] };
  state.turns.push(record);
  userNode.scrollIntoView({ block: "nearest" });

  const controller = new AbortController();
  state.controller = controller;
  $("send").disabled = true;
  $("stop").disabled = false;
  $("transcript").setAttribute("aria-busy", "true");
  inspector.reset(`Live · ${options.model}`, performance.now());
  let responseId = null;
  let final = null;
  let httpError = null;
  try {
    await streamResponse(
      body,
      (event, time) => {
        inspector.frame(event, time);
        turn.view.apply(event);
        if (event.response && event.response.id) responseId = event.response.id;
        if (event.response && ["completed", "incomplete", "failed", "cancelled"].includes(event.response.status)) final = event.response;
        if (event.type === "error") showStreamError(event);
      },
      controller.signal,
    );
    if (final && final.status === "failed" && final.error) {
      showError(new APIError(0, final.error));
      $("banner-text").textContent = `The response failed${final.error.code ? ` (${final.error.code})` : ""}: ${final.error.message}`;
    } else if (!final && responseId) {
      showError(new Error("The stream ended without a terminal event."));
    }
  } catch (err) {
    if (err && err.name === "AbortError") turn.view.status.textContent = "stopped";
    else {
      showError(err);
      if (err instanceof APIError) httpError = err;
      turn.view.status.textContent = "no response";
      turn.box.classList.add("failed");
    }
  } finally {
    state.controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    $("transcript").setAttribute("aria-busy", "false");
  }
  if (responseId) {
    record.responseId = responseId;
    addTurnActions(turn, responseId);
    turn.view.finished(responseId);
    if (final && (final.status === "completed" || final.status === "incomplete")) {
      state.previousResponseId = responseId;
      showChain();
    }
  }
  if (httpError && inspector.events.length === 0) inspector.noStream(`HTTP ${httpError.status} before the first event`);
  else await inspector.end(responseId);
}

function showStreamError(event) {
  const e = event.error || event;
  showError(new APIError(0, { message: e.message || "stream error", code: e.code }));
  $("banner-text").textContent = `Stream error${e.code ? ` (${e.code})` : ""}: ${e.message || ""}`;
}

function sendCallOutput(call, text, responseId) {
  if (!state.conversationId) state.previousResponseId = responseId;
  const type = call.type === "custom_tool_call" ? "custom_tool_call_output" : "function_call_output";
  run([{ type, call_id: call.call_id, output: text }], `↩ ${call.name || "call"}: ${text}`);
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("composer-input").value;
  if (!text.trim() || state.controller) return;
  $("composer-input").value = "";
  run(text, text);
});

$("composer-input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});

$("stop").addEventListener("click", () => state.controller && state.controller.abort());

// ------------------------------------------------------------------------------ inspecting stored responses
async function storedEvents(id) {
  const events = [];
  await streamStored(id, (event) => events.push(event));
  return events;
}

async function inspectResponse(id) {
  const capture = inspector.captures.get(id);
  if (capture) {
    await inspector.load(capture.events, { label: `Response ${id}`, times: capture.times, t0: capture.t0, responseId: id });
    return;
  }
  try {
    const timed = await storedTimedEvents(id);
    const events = timed.map((t) => t.event);
    const last = events[events.length - 1];
    if ((!last || !TERMINAL.has(last.type)) && ["queued", "in_progress"].includes((await api.response(id)).status)) {
      // Still running: its stored prefix, then live until it ends (no recorded times for the rest).
      await inspector.load(await storedEvents(id), { label: `Stored ${id} (followed live: no recorded arrival times)`, responseId: id });
      return;
    }
    if (timed.every((t) => t.at_ms === null)) {
      await inspector.load(events, { label: `Stored ${id} (stored before arrival times were kept: replayed evenly)`, responseId: id });
      return;
    }
    // The recorded arrival times (ms since the response was created); an event stored without one
    // (closing events added by crash recovery) takes the time of the one before it.
    let previous = 0;
    const times = timed.map((t) => (previous = t.at_ms ?? previous));
    await inspector.load(events, { label: `Stored ${id} (recorded arrival times)`, times, t0: 0, responseId: id });
  } catch (err) {
    showError(err);
  }
}

// Reopen a stored response in the chat (its turn's input and output) and the inspector.
async function openResponse(id) {
  showView("chat-view");
  try {
    const [response, items] = await Promise.all([api.response(id), api.inputItems(id)]);
    newConversation();
    const search = (response.tools || []).find((t) => t.type === "file_search" && (t.vector_store_ids || []).length);
    if (search) attachments.adopt(search.vector_store_ids[0]); // the next message searches it again
    const label = items.data.map(inputText).join("\n") || "(no input)";
    const userNode = userTurn(label);
    const turn = assistantTurn();
    $("transcript").append(userNode, turn.box);
    turn.view.showResponse(response);
    addTurnActions(turn, id);
    state.turns.push({ responseId: id, nodes: [userNode, turn.box] });
    if (response.status === "completed" || response.status === "incomplete") {
      state.previousResponseId = id;
      turn.view.finished(id);
    }
    if ([...$("model").options].some((o) => o.value === response.model)) $("model").value = response.model;
    showChain();
    await inspectResponse(id);
  } catch (err) {
    showError(err);
  }
}

// Reopen a Conversation object: its items as a transcript; the next message goes on in it.
async function openConversation(id) {
  showView("chat-view");
  try {
    const items = (await api.conversationItems(id)).data;
    newConversation();
    state.conversationId = id;
    let turn = null;
    for (const item of items) {
      if ((item.type === "message" && item.role !== "assistant") || item.type === "function_call_output") {
        $("transcript").append(userTurn(inputText(item)));
        turn = null;
        continue;
      }
      if (!turn) {
        turn = assistantTurn();
        $("transcript").append(turn.box);
      }
      turn.view.showResponse({ output: [item], status: "", model: "" });
      turn.view.status.textContent = "";
    }
    showChain();
    inspector.reset(`Conversation ${id}: ${items.length} items (inspect a response from the history)`, null);
  } catch (err) {
    showError(err);
  }
}

// ------------------------------------------------------------------------------ history
function historyKind() {
  return document.querySelector('input[name="h-kind"]:checked').value;
}

function dayStart(value, end) {
  if (!value) return "";
  const t = Date.parse(`${value}T00:00:00`) / 1000;
  return String(end ? t + 86399 : t);
}

async function searchHistory(fresh) {
  const conversations = historyKind() === "conversations";
  $("history-table").hidden = conversations;
  $("conversation-table").hidden = !conversations;
  $("h-model").disabled = conversations;
  $("h-status").disabled = conversations;
  if (conversations) return searchConversations(fresh);
  const params = { limit: "20" };
  if ($("h-model").value) params.model = $("h-model").value;
  if ($("h-status").value) params.status = $("h-status").value;
  const from = dayStart($("h-from").value, false);
  const to = dayStart($("h-to").value, true);
  if (from) params.created_after = from;
  if (to) params.created_before = to;
  if (!fresh && state.historyCursor) params.after = state.historyCursor;
  try {
    const page = await api.history(params);
    const body = $("history-table").querySelector("tbody");
    if (fresh) clear(body);
    for (const r of page.data) {
      const usage = r.usage ? `${r.usage.input_tokens} / ${r.usage.output_tokens}` : "—";
      body.append(
        el("tr", { dataset: { id: r.id } },
          el("td", {}, formatTime(r.created_at)),
          el("td", {}, el("code", {}, r.id)),
          el("td", {}, r.model || "—"),
          el("td", {}, el("span", { class: `status ${r.status}` }, r.status)),
          el("td", { class: "num" }, usage),
          el("td", {},
            r.previous_response_id ? el("button", { type: "button", class: "link", onclick: () => openResponse(r.previous_response_id) }, "previous") : "",
            r.conversation_id ? el("button", { type: "button", class: "link", onclick: () => openConversation(r.conversation_id) }, "conversation") : "",
          ),
          el("td", {}, el("button", { type: "button", onclick: () => openResponse(r.id), "aria-label": `Open ${r.id}` }, "Open")),
        ),
      );
    }
    state.historyCursor = page.last_id;
    $("history-more").hidden = !page.has_more;
    $("history-empty").hidden = body.childElementCount > 0;
  } catch (err) {
    showError(err);
  }
}

async function searchConversations(fresh) {
  const params = { limit: "20" };
  const from = dayStart($("h-from").value, false);
  const to = dayStart($("h-to").value, true);
  if (from) params.created_after = from;
  if (to) params.created_before = to;
  if (!fresh && state.historyCursor) params.after = state.historyCursor;
  try {
    const page = await api.conversations(params);
    const body = $("conversation-table").querySelector("tbody");
    if (fresh) clear(body);
    for (const c of page.data) {
      body.append(
        el("tr", { dataset: { id: c.id } },
          el("td", {}, formatTime(c.created_at)),
          el("td", {}, el("code", {}, c.id)),
          el("td", { class: "num" }, c.items),
          el("td", {}, el("code", {}, JSON.stringify(c.metadata))),
          el("td", {}, el("button", { type: "button", onclick: () => openConversation(c.id), "aria-label": `Open ${c.id}` }, "Open")),
        ),
      );
    }
    state.historyCursor = page.last_id;
    $("history-more").hidden = !page.has_more;
    $("history-empty").hidden = body.childElementCount > 0;
  } catch (err) {
    showError(err);
  }
}

for (const radio of document.querySelectorAll('input[name="h-kind"]')) {
  radio.addEventListener("change", () => searchHistory(true));
}

$("history-filters").addEventListener("submit", (ev) => {
  ev.preventDefault();
  searchHistory(true);
});
$("history-more").addEventListener("click", () => searchHistory(false));

// ------------------------------------------------------------------------------ recordings
let loadedName = null; // the file the text came from, until it is edited
$("load-file").addEventListener("change", async () => {
  const file = $("load-file").files[0];
  if (file) {
    $("load-text").value = await file.text();
    loadedName = file.name;
  }
});
$("load-text").addEventListener("input", () => {
  loadedName = null;
});

$("load-go").addEventListener("click", async () => {
  const text = $("load-text").value;
  if (!text.trim()) return;
  let parsed;
  try {
    parsed = parseRecorded(text);
  } catch (err) {
    showError(new Error(`Could not read the recording: ${err.message}`));
    return;
  }
  await inspector.load(parsed.events, { label: `Recording${loadedName ? ` ${loadedName}` : " (pasted)"}, ${parsed.format}` });
  document.getElementById("t-frames").click();
});

// ------------------------------------------------------------------------------ start
showKeyState();
showChain();
loadModels();
