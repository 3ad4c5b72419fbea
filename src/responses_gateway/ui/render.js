// One assistant turn: the Response's output items drawn as they stream (or from a stored Response).
// Messages with their annotations, reasoning (collapsible), function / custom / hosted tool calls as
// cards with their arguments streaming in and their outputs.
import { el, clear, pretty } from "./dom.js";
import { blobURL } from "./api.js";

const CALL_TYPES = new Set([
  "function_call",
  "custom_tool_call",
  "code_interpreter_call",
  "web_search_call",
  "file_search_call",
  "mcp_call",
  "image_generation_call",
  "local_shell_call",
  "computer_call",
]);

const EXCERPT = 400; // characters of a file_search result shown
let citations = 0; // numbers the citation marks of the page (their ids)

export class TurnView {
  // onCallOutput(call, text): the user answers a function call (only offered once the turn ended).
  constructor(container, { onCallOutput } = {}) {
    this.root = container;
    this.items = new Map(); // item id -> view
    this.onCallOutput = onCallOutput;
    this.status = el("div", { class: "turn-status", "aria-live": "polite" });
    this.list = el("div", { class: "items" });
    container.append(this.list, this.status);
  }

  view(item) {
    let view = this.items.get(item.id);
    if (!view) {
      view = makeView(item);
      this.items.set(item.id, view);
      this.list.append(view.node);
    }
    return view;
  }

  apply(event) {
    const type = event.type || "";
    if (type === "response.output_item.added" || type === "response.output_item.done") {
      if (event.item && event.item.id) this.view(event.item).update(event.item, type.endsWith("done"));
      return;
    }
    const view = event.item_id ? this.items.get(event.item_id) : null;
    if (view) view.event(event);
    if (type === "response.completed" || type === "response.incomplete" || type === "response.failed" ||
        type === "response.cancelled") {
      const r = event.response || {};
      const why = r.incomplete_details ? r.incomplete_details.reason : r.error ? r.error.code || r.error.message : "";
      this.status.textContent = `${r.status}${why ? ` (${why})` : ""} · ${r.model || ""}`;
      this.root.classList.toggle("failed", r.status === "failed");
    }
  }

  // A stored Response, drawn whole.
  showResponse(response) {
    for (const item of response.output || []) if (item.id) this.view(item).update(item, true);
    this.status.textContent = `${response.status} · ${response.model || ""}`;
  }

  // The turn ended: function calls can now be answered.
  finished(responseId) {
    if (!this.onCallOutput) return;
    for (const view of this.items.values()) {
      if (view.item.type === "function_call" || view.item.type === "custom_tool_call") {
        view.offerOutput((text) => this.onCallOutput(view.item, text, responseId));
      }
    }
  }
}

function makeView(item) {
  if (item.type === "message") return new MessageView(item);
  if (item.type === "reasoning") return new ReasoningView(item);
  if (CALL_TYPES.has(item.type) || item.type.endsWith("_call")) return new CallView(item);
  return new GenericView(item);
}

class MessageView {
  constructor(item) {
    this.item = item;
    this.node = el("div", { class: "message assistant", dataset: { itemId: item.id } });
    this.parts = [];
  }
  part(index) {
    while (this.parts.length <= index) {
      const text = el("div", { class: "text" });
      const notes = el("ul", { class: "annotations", hidden: true, "aria-label": "Citations" });
      this.node.append(text, notes);
      this.parts.push({ text, notes, annotations: [] });
    }
    return this.parts[index];
  }
  event(e) {
    if (e.type === "response.output_text.delta" || e.type === "response.refusal.delta") {
      const p = this.part(e.content_index || 0);
      if (e.type === "response.refusal.delta") p.text.classList.add("refusal");
      p.text.append(e.delta || "");
    } else if (e.type === "response.output_text.annotation.added") {
      this.annotate(this.part(e.content_index || 0), e.annotation);
    } else if (e.type === "response.content_part.added" && e.part) {
      this.part(e.content_index || 0);
    }
  }
  annotate(p, a) {
    if (!a) return;
    p.notes.hidden = false;
    let label = a.type;
    let node;
    if (a.type === "url_citation" && /^https?:\/\//i.test(String(a.url))) {
      // Only web links: a model's "javascript:" or "data:" URL never becomes a link.
      node = el("a", { href: a.url, rel: "noopener noreferrer", target: "_blank" }, a.title || a.url);
    } else if (a.type === "container_file_citation" && a.container_id && a.file_id) {
      node = el("button", {
        type: "button",
        class: "link",
        onclick: async () => {
          const href = await blobURL(
            `/v1/containers/${encodeURIComponent(a.container_id)}/files/${encodeURIComponent(a.file_id)}/content`,
          );
          const link = el("a", { href, download: a.filename || a.file_id, hidden: true });
          document.body.append(link);
          link.click();
          link.remove();
          setTimeout(() => URL.revokeObjectURL(href), 60_000);
        },
      }, a.filename || a.file_id);
      label = "file";
    } else if (a.type === "file_citation") {
      // A file of a vector store (file_search): numbered, and marked in the text (see update).
      const number = p.notes.querySelectorAll("li.file-citation").length + 1;
      const li = el("li", { class: "file-citation", id: `cite-${++citations}`, dataset: { fileId: a.file_id || "" } },
        el("span", { class: "cite-num" }, `[${number}]`), " ",
        el("span", { class: "badge" }, "file"), " ",
        el("span", { class: "cite-file" }, a.filename || a.file_id || "(file)"), " ",
        a.file_id ? el("code", { class: "muted" }, a.file_id) : "",
      );
      p.notes.append(li);
      return { li, number, name: a.filename || a.file_id || "file" };
    } else {
      node = el("span", {}, a.filename || a.file_id || a.title || a.url || JSON.stringify(a));
    }
    p.notes.append(el("li", {}, el("span", { class: "badge" }, label), " ", node));
    return null;
  }
  update(item, done) {
    this.item = item;
    if (!done) return;
    (item.content || []).forEach((c, i) => {
      const p = this.part(i);
      const text = c.type === "refusal" ? c.refusal : c.text;
      if (c.type === "refusal") p.text.classList.add("refusal");
      const annotations = c.annotations || [];
      const key = JSON.stringify([text, annotations]);
      if (p.key === key) return;
      p.key = key;
      clear(p.notes);
      p.notes.hidden = true;
      const marks = [];
      for (const a of annotations) {
        const mark = this.annotate(p, a);
        if (mark && Number.isInteger(a.index)) marks.push({ ...mark, index: a.index });
      }
      if (typeof text === "string") showText(p.text, text, marks);
    });
  }
}

// A message part's text with a numbered mark at each file citation's index (a link to its entry in
// the citations list, naming the file). Indexes count code points, as the gateway's do.
function showText(node, text, marks) {
  if (!marks.length) {
    if (node.textContent !== text) node.textContent = text;
    return;
  }
  const chars = Array.from(text);
  const nodes = [];
  let at = 0;
  for (const m of [...marks].sort((a, b) => a.index - b.index)) {
    const index = Math.max(at, Math.min(m.index, chars.length));
    nodes.push(chars.slice(at, index).join(""));
    nodes.push(el("a", { class: "cite", href: `#${m.li.id}`, title: m.name, "aria-label": `citation ${m.number}: ${m.name}` },
      el("sup", {}, `[${m.number}]`)));
    at = index;
  }
  nodes.push(chars.slice(at).join(""));
  node.replaceChildren(...nodes);
}

class ReasoningView {
  constructor(item) {
    this.item = item;
    this.body = el("div", { class: "reasoning-text" });
    this.summary = el("summary", {}, "Reasoning");
    this.node = el("details", { class: "reasoning", dataset: { itemId: item.id } }, this.summary, this.body);
    this.parts = [];
  }
  part(index) {
    while (this.parts.length <= index) {
      const p = el("p");
      this.body.append(p);
      this.parts.push(p);
    }
    return this.parts[index];
  }
  event(e) {
    if (e.type === "response.reasoning_summary_text.delta") this.part(e.summary_index || 0).append(e.delta || "");
    else if (e.type === "response.reasoning_text.delta" || e.type === "response.reasoning.delta") {
      this.raw = this.raw || el("pre", { class: "raw-reasoning" });
      this.body.append(this.raw);
      this.raw.append(e.delta || "");
    }
  }
  update(item, done) {
    this.item = item;
    if (!done) return;
    (item.summary || []).forEach((s, i) => {
      const p = this.part(i);
      if (p.textContent !== s.text) p.textContent = s.text;
    });
    const words = this.body.textContent.trim().split(/\s+/).filter(Boolean).length;
    this.summary.textContent = `Reasoning${words ? ` (${words} words)` : ""}`;
  }
}

class CallView {
  constructor(item) {
    this.item = item;
    this.title = el("span", { class: "call-name" });
    this.state = el("span", { class: "badge" });
    this.args = el("pre", { class: "call-args", "aria-label": "Arguments" });
    this.outputs = el("div", { class: "call-outputs" });
    this.node = el(
      "section",
      { class: `card call ${item.type}`, dataset: { itemId: item.id }, "aria-label": `${item.type} card` },
      el("header", {}, el("span", { class: "call-type" }, item.type.replaceAll("_", " ")), " ", this.title, " ", this.state),
      this.args,
      this.outputs,
    );
    this.update(item, false);
  }
  event(e) {
    const t = e.type;
    if (t.endsWith("arguments.delta") || t.endsWith("input.delta") || t.endsWith("code.delta")) {
      this.args.append(e.delta || "");
    } else if (t.endsWith(".in_progress") || t.endsWith(".interpreting") || t.endsWith(".searching") ||
               t.endsWith(".generating") || t.endsWith(".completed")) {
      this.state.textContent = t.split(".").pop();
    }
  }
  update(item, done) {
    this.item = item;
    this.title.textContent = item.name || item.server_label || "";
    if (item.status) this.state.textContent = item.status;
    if (Array.isArray(item.queries) && item.queries.length) {
      // file_search_call: its queries, one a line (they come with the item, not as deltas).
      this.args.setAttribute("aria-label", "Queries");
      this.args.textContent = item.queries.join("\n");
    }
    const text = item.arguments ?? item.input ?? item.code ?? (item.action ? pretty(item.action) : null);
    if (done && typeof text === "string") this.args.textContent = text;
    if (done) this.showOutputs(item);
  }
  showOutputs(item) {
    clear(this.outputs);
    for (const out of item.outputs || []) {
      if (out.type === "logs") this.outputs.append(el("pre", { class: "logs", "aria-label": "Logs" }, out.logs));
      else if (out.type === "image" && typeof out.url === "string" && /^(data:image\/|https?:)/.test(out.url)) {
        this.outputs.append(el("img", { src: out.url, alt: "Image the code produced", class: "call-image" }));
      } else this.outputs.append(el("pre", {}, pretty(out)));
    }
    if (item.type === "file_search_call") this.showSearchResults(item);
    else for (const r of item.results || []) this.outputs.append(el("pre", {}, pretty(r)));
    if (typeof item.output === "string") this.outputs.append(el("pre", { class: "logs" }, item.output));
  }
  // file_search results, best first: file name, score and the passage's text (an excerpt).
  showSearchResults(item) {
    if (!Array.isArray(item.results)) {
      if (item.status === "completed") this.outputs.append(el("p", { class: "muted" }, "Results not included."));
      return;
    }
    if (!item.results.length) {
      this.outputs.append(el("p", { class: "muted" }, "No results."));
      return;
    }
    const list = el("ol", { class: "search-results", "aria-label": "Search results" });
    for (const r of item.results) {
      const text = typeof r.text === "string" ? r.text : "";
      const excerpt = text.length > EXCERPT ? `${text.slice(0, EXCERPT)}…` : text;
      list.append(
        el("li", { class: "search-result", dataset: { fileId: r.file_id || "" } },
          el("span", { class: "result-file" }, r.filename || r.file_id || "(file)"),
          " ",
          el("span", { class: "badge result-score", title: "score" }, typeof r.score === "number" ? r.score.toFixed(3) : "—"),
          el("blockquote", { class: "result-text" }, excerpt),
        ),
      );
    }
    this.outputs.append(list);
  }
  offerOutput(submit) {
    if (this.form) return;
    const input = el("textarea", { rows: 2, "aria-label": `Output for ${this.item.name || "call"}`, placeholder: "Tool output to send back" });
    const button = el("button", { type: "submit" }, "Send output");
    this.form = el("form", { class: "call-reply", onsubmit: (ev) => {
      ev.preventDefault();
      const text = input.value;
      this.form.replaceChildren(el("span", { class: "badge" }, "output sent"), el("pre", { class: "logs" }, text));
      submit(text);
    } }, input, button);
    this.node.append(this.form);
  }
}

class GenericView {
  constructor(item) {
    this.item = item;
    this.body = el("pre");
    this.node = el("section", { class: "card", dataset: { itemId: item.id } }, el("header", {}, item.type), this.body);
  }
  event() {}
  update(item) {
    this.item = item;
    this.body.textContent = pretty(item);
  }
}

// A user turn (text or items) as the transcript shows it.
export function userTurn(text) {
  return el("div", { class: "message user" }, el("div", { class: "text" }, text));
}

export function inputText(item) {
  if (typeof item === "string") return item;
  if (item.type === "message" || item.role) {
    if (typeof item.content === "string") return item.content;
    return (item.content || []).map((c) => c.text || (c.type ? `[${c.type}]` : "")).join("");
  }
  if (item.type === "function_call_output") return `↩ ${item.call_id}: ${typeof item.output === "string" ? item.output : pretty(item.output)}`;
  return `[${item.type}]`;
}
