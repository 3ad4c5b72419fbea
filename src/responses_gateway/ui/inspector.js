// The stream inspector: every SSE frame (sequence number, type, arrival time), the item tree, time to
// first token, tokens per second, the gateway checker's verdict (POST /v1/gateway/check) marked on
// the frames, and the streamed items compared with the final Response. Replays a stream at its pace.
import { el, clear, pretty, canonical, formatMs } from "./dom.js";
import { api } from "./api.js";
import { TurnView } from "./render.js";

export const TERMINAL = new Set(["response.completed", "response.incomplete", "response.failed", "response.cancelled"]);

export class Inspector {
  constructor(root, { onError }) {
    this.root = root;
    this.onError = onError;
    this.captures = new Map(); // response id -> {events, times, t0}: streams seen live in this tab
    this.generation = 0;
    this.title = root.querySelector("#inspector-title");
    this.stats = root.querySelector("#inspector-stats");
    this.verdict = root.querySelector("#inspector-verdict");
    this.framesBody = root.querySelector("#frames tbody");
    this.frameDetail = root.querySelector("#frame-detail");
    this.violationList = root.querySelector("#violations");
    this.tree = root.querySelector("#item-tree");
    this.diff = root.querySelector("#diff");
    this.replayBox = root.querySelector("#replay-output");
    this.replayButton = root.querySelector("#replay");
    this.speed = root.querySelector("#replay-speed");
    this.replayButton.addEventListener("click", () => this.replay());
    this.setupTabs();
    this.reset("No stream yet", null);
  }

  setupTabs() {
    const tabs = [...this.root.querySelectorAll('[role="tab"]')];
    const select = (tab) => {
      for (const t of tabs) {
        const on = t === tab;
        t.setAttribute("aria-selected", String(on));
        t.tabIndex = on ? 0 : -1;
        document.getElementById(t.getAttribute("aria-controls")).hidden = !on;
      }
    };
    tabs.forEach((tab, i) => {
      tab.addEventListener("click", () => select(tab));
      tab.addEventListener("keydown", (e) => {
        const step = e.key === "ArrowRight" ? 1 : e.key === "ArrowLeft" ? -1 : 0;
        if (!step) return;
        const next = tabs[(i + step + tabs.length) % tabs.length];
        select(next);
        next.focus();
      });
    });
    select(tabs[0]);
  }

  // Start a new stream: t0 is when the request was sent (performance.now()), or null.
  // No stream at all (an HTTP error before the first event): nothing to check.
  noStream(why) {
    this.verdict.className = "verdict";
    this.verdict.textContent = `No stream: ${why}`;
  }

  reset(label, t0, responseId = null) {
    this.generation++;
    this.events = [];
    this.times = [];
    this.t0 = t0;
    this.responseId = responseId;
    this.violations = [];
    this.title.textContent = label;
    clear(this.framesBody);
    clear(this.violationList);
    clear(this.tree);
    clear(this.diff);
    this.frameDetail.textContent = "";
    this.verdict.textContent = "";
    this.verdict.className = "verdict";
    this.root.dataset.frames = "0";
    this.renderStats();
    this.replayButton.disabled = true;
  }

  frame(event, time) {
    const index = this.events.length;
    this.events.push(event);
    this.times.push(time);
    if (this.t0 === null && time !== null) this.t0 = time;
    if (!this.responseId && event.response && event.response.id) this.responseId = event.response.id;
    const rel = time === null ? "" : `+${Math.round(time - this.t0)}`;
    // One tab stop for the whole table (the first or selected row); arrow keys move between rows.
    const row = el(
      "tr",
      { tabindex: index === 0 ? 0 : -1, dataset: { index }, onclick: () => this.show(index), onkeydown: (e) => this.rowKey(e, index) },
      el("td", { class: "num" }, index),
      el("td", { class: "num" }, event.sequence_number ?? "—"),
      el("td", { class: "num" }, rel),
      el("td", { class: "type" }, event.type ?? "(no type)"),
      el("td", { class: "preview" }, preview(event)),
    );
    this.framesBody.append(row);
    this.root.dataset.frames = String(this.events.length);
    // Live figures, redrawn at most once per animation frame however fast events arrive.
    if (!this.statsPending) {
      this.statsPending = true;
      requestAnimationFrame(() => {
        this.statsPending = false;
        this.renderStats();
      });
    }
  }

  rowKey(e, index) {
    const step = { ArrowDown: 1, ArrowUp: -1, PageDown: 20, PageUp: -20 }[e.key];
    if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      this.show(index);
    } else if (step) {
      e.preventDefault();
      this.jump(Math.max(0, Math.min(this.events.length - 1, index + step)));
    }
  }

  show(index) {
    const event = this.events[index];
    const notes = this.violations.filter((v) => v.index === index);
    this.frameDetail.textContent = (notes.length ? notes.map((v) => `✗ [${v.rule}] ${v.message}`).join("\n") + "\n\n" : "") + pretty(event);
    for (const r of this.framesBody.querySelectorAll("tr.selected, tr[tabindex='0']")) {
      r.classList.remove("selected");
      r.tabIndex = -1;
    }
    const row = this.framesBody.children[index];
    if (row) {
      row.classList.add("selected");
      row.tabIndex = 0;
    }
  }

  // The stream ended (or a recording was loaded): verdict, tree, diff.
  async end(responseId = this.responseId) {
    const generation = this.generation;
    this.responseId = responseId;
    if (responseId && this.times.every((t) => t !== null) && this.events.length) {
      this.captures.set(responseId, { events: [...this.events], times: [...this.times], t0: this.t0 });
    }
    this.renderStats();
    this.renderTree();
    this.renderDiff();
    this.replayButton.disabled = this.events.length === 0;
    this.verdict.textContent = "checking…";
    try {
      const result = await api.check(this.events);
      if (generation !== this.generation) return;
      this.showVerdict(result);
    } catch (err) {
      if (generation !== this.generation) return;
      this.verdict.textContent = "the checker could not run";
      this.onError(err);
    }
  }

  showVerdict(result) {
    this.violations = result.violations;
    this.verdict.className = `verdict ${result.ok ? "ok" : "bad"}`;
    this.verdict.textContent = result.ok
      ? `✓ checker: ${result.events} events, no violations`
      : `✗ checker: ${result.violations.length} violation${result.violations.length === 1 ? "" : "s"}`;
    clear(this.violationList);
    for (const v of result.violations) {
      const where = v.index === null ? "end of stream" : `frame ${v.index}`;
      const item = el(
        "li",
        {},
        el("button", { type: "button", class: "link", onclick: () => v.index !== null && this.jump(v.index) }, where),
        " ",
        el("code", {}, v.rule),
        " ",
        v.message,
      );
      this.violationList.append(item);
      const row = v.index === null ? null : this.framesBody.children[v.index];
      if (row) {
        row.classList.add("violation");
        row.title = `${v.rule}: ${v.message}`;
        row.querySelector(".type").prepend(el("span", { class: "mark", "aria-label": "violation" }, "✗ "));
      }
    }
  }

  jump(index) {
    const row = this.framesBody.children[index];
    if (row) {
      row.scrollIntoView({ block: "center" });
      row.focus();
    }
    this.show(index);
  }

  renderStats() {
    const s = measure(this.events, this.times, this.t0);
    clear(this.stats);
    const add = (label, value, id) => this.stats.append(el("div", {}, el("dt", {}, label), el("dd", { id }, value)));
    add("Events", String(this.events.length), "stat-events");
    add("Time to first token", formatMs(s.ttft), "stat-ttft");
    add("Tokens/s", s.tps === null ? "—" : s.tps.toFixed(1), "stat-tps");
    add("Deltas/s", s.dps === null ? "—" : s.dps.toFixed(1), "stat-dps");
    add("Duration", formatMs(s.duration), "stat-duration");
    add("Output tokens", s.outputTokens === null ? "—" : String(s.outputTokens), "stat-tokens");
    add("Status", s.status || "—", "stat-status");
  }

  renderTree() {
    clear(this.tree);
    for (const item of itemTree(this.events)) {
      const parts = el("ul");
      for (const part of item.parts) {
        parts.append(
          el("li", {}, el("details", {},
            el("summary", {}, `${part.kind} ${part.index}: ${part.type} · ${part.deltas.length} delta${part.deltas.length === 1 ? "" : "s"}${part.done ? "" : " · not done"}`),
            el("ol", { class: "deltas" }, part.deltas.map((d) => el("li", {}, el("code", {}, JSON.stringify(d.text)), el("span", { class: "muted" }, ` #${d.seq}`)))),
          )),
        );
      }
      this.tree.append(
        el("li", {}, el("details", { open: true },
          el("summary", {}, `[${item.output_index}] ${item.type} ${item.id}${item.done ? ` · ${item.status || "done"}` : " · never done"}`),
          parts,
        )),
      );
    }
    if (!this.tree.childElementCount) this.tree.append(el("li", { class: "muted" }, "No output items."));
  }

  renderDiff() {
    clear(this.diff);
    const final = [...this.events].reverse().find((e) => TERMINAL.has(e.type) && e.response);
    const streamed = new Map();
    for (const e of this.events) if (e.type === "response.output_item.done" && e.item) streamed.set(e.output_index, e.item);
    if (!final) {
      this.diff.append(el("p", { class: "muted" }, "No terminal event: there is no final Response to compare with."));
      return;
    }
    const output = final.response.output || [];
    const count = Math.max(output.length, ...[...streamed.keys()].map((k) => k + 1), 0);
    let same = 0;
    for (let i = 0; i < count; i++) {
      const a = streamed.get(i);
      const b = output[i];
      if (a && b && canonical(a) === canonical(b)) {
        same++;
        this.diff.append(el("div", { class: "diff-row same" }, `✓ [${i}] ${b.type} ${b.id || ""}: identical`));
        continue;
      }
      const what = !a ? "only in the final Response" : !b ? "streamed, missing from the final Response" : `differs at ${firstDifference(a, b)}`;
      this.diff.append(
        el("details", { class: "diff-row differs", open: true },
          el("summary", {}, `✗ [${i}] ${(a || b).type} ${(a || b).id || ""}: ${what}`),
          el("div", { class: "diff-cols" },
            el("div", {}, el("h3", {}, "Streamed (output_item.done)"), el("pre", { "aria-label": "Streamed item" }, a ? pretty(a) : "—")),
            el("div", {}, el("h3", {}, "Final Response"), el("pre", { "aria-label": "Final item" }, b ? pretty(b) : "—")),
          ),
        ),
      );
    }
    this.diff.prepend(el("p", {}, `${same} of ${count} item${count === 1 ? "" : "s"} identical between output_item.done and the final Response.`));
  }

  // Load events from elsewhere (a stored response, a recording): times may be null.
  async load(events, { label, times = null, t0 = null, responseId = null }) {
    this.reset(label, times ? (t0 ?? times[0]) : null, responseId);
    events.forEach((e, i) => this.frame(e, times ? times[i] : null));
    await this.end(responseId);
  }

  // Replay the current stream at its arrival times: as this tab saw it live, or as the gateway recorded
  // them (a stored response loaded with its times registers a capture in end()); else evenly over the
  // Response's recorded duration (recordings, responses stored before arrival times were kept).
  async replay() {
    const events = [...this.events];
    const capture = this.responseId ? this.captures.get(this.responseId) : null;
    let offsets;
    if (capture && capture.events.length === events.length) {
      offsets = capture.times.map((t) => t - capture.times[0]);
    } else {
      const final = [...events].reverse().find((e) => e.response);
      const r = final ? final.response : {};
      const span = r.completed_at && r.created_at ? Math.min(30, Math.max(0, r.completed_at - r.created_at)) * 1000 : 0;
      const total = span || Math.min(5000, events.length * 20);
      offsets = events.map((_, i) => (events.length > 1 ? (total * i) / (events.length - 1) : 0));
    }
    const speed = Number(this.speed.value) || 1;
    const label = this.title.textContent.replace(/^Replay of /, "");
    const responseId = this.responseId;
    this.reset(`Replay of ${label}`, performance.now(), responseId);
    const generation = this.generation;
    clear(this.replayBox);
    this.replayBox.hidden = false;
    const view = new TurnView(this.replayBox);
    const start = performance.now();
    for (let i = 0; i < events.length; i++) {
      const wait = start + offsets[i] / speed - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      if (generation !== this.generation) return;
      this.frame(events[i], performance.now());
      view.apply(events[i]);
    }
    await this.end(responseId);
  }
}

function preview(event) {
  const text = event.delta ?? event.text ?? event.arguments ?? (event.item ? `${event.item.type} ${event.item.id || ""}` : null) ??
    (event.response ? event.response.status : null) ?? (event.message || (event._unparsed !== undefined ? `unparsed: ${event._unparsed}` : ""));
  const s = typeof text === "string" ? text : JSON.stringify(text);
  return s.length > 80 ? `${s.slice(0, 80)}…` : s;
}

// Time to first token, tokens per second, duration, from arrival times (ms).
export function measure(events, times, t0) {
  const out = { ttft: null, tps: null, dps: null, duration: null, outputTokens: null, status: null };
  let first = null;
  let last = null;
  let deltas = 0;
  events.forEach((e, i) => {
    if (typeof e.type === "string" && e.type.endsWith(".delta") && times[i] !== null) {
      if (first === null) first = times[i];
      last = times[i];
      deltas++;
    }
    if (e.response && e.response.status) out.status = e.response.status;
    if (TERMINAL.has(e.type) && e.response && e.response.usage) out.outputTokens = e.response.usage.output_tokens ?? null;
  });
  const end = times.length ? times[times.length - 1] : null;
  if (first !== null && t0 !== null) out.ttft = first - t0;
  if (end !== null && t0 !== null) out.duration = end - t0;
  if (first !== null && last !== null && last > first) {
    // Deltas per second is known while the stream runs; tokens per second once usage arrives.
    out.dps = (deltas - 1) / ((last - first) / 1000);
    if (out.outputTokens !== null) out.tps = out.outputTokens / ((last - first) / 1000);
  }
  return out;
}

// items -> content/summary parts -> deltas, from the events.
export function itemTree(events) {
  const items = new Map();
  const partOf = (item, kind, index, type) => {
    const key = `${kind}:${index}`;
    if (!item.partMap.has(key)) {
      const part = { kind, index, type: type || "?", deltas: [], done: false };
      item.partMap.set(key, part);
      item.parts.push(part);
    }
    return item.partMap.get(key);
  };
  for (const e of events) {
    const t = e.type || "";
    if (t === "response.output_item.added" && e.item) {
      items.set(e.item.id, { id: e.item.id, type: e.item.type, output_index: e.output_index, parts: [], partMap: new Map(), done: false });
      continue;
    }
    const item = items.get(e.item_id ?? (e.item && e.item.id));
    if (!item) continue;
    if (t === "response.output_item.done") {
      item.done = true;
      item.status = e.item && e.item.status;
    } else if (t === "response.content_part.added") partOf(item, "content", e.content_index, e.part && e.part.type);
    else if (t === "response.content_part.done") partOf(item, "content", e.content_index).done = true;
    else if (t === "response.reasoning_summary_part.added") partOf(item, "summary", e.summary_index, e.part && e.part.type);
    else if (t === "response.reasoning_summary_part.done") partOf(item, "summary", e.summary_index).done = true;
    else if (t.endsWith(".delta")) {
      const kind = e.summary_index !== undefined ? "summary" : e.content_index !== undefined ? "content" : "arguments";
      const index = e.summary_index ?? e.content_index ?? 0;
      const part = partOf(item, kind, index, kind === "arguments" ? t.replace(/^response\./, "").replace(/\.delta$/, "") : undefined);
      if (kind === "arguments") part.done = true;
      part.deltas.push({ text: typeof e.delta === "string" ? e.delta : JSON.stringify(e.delta), seq: e.sequence_number });
    }
  }
  return [...items.values()];
}

function firstDifference(a, b, path = "") {
  if (canonical(a) === canonical(b)) return null;
  if (a && b && typeof a === "object" && typeof b === "object" && Array.isArray(a) === Array.isArray(b)) {
    const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
    for (const k of [...keys].sort()) {
      const d = firstDifference(a[k], b[k], Array.isArray(a) ? `${path}[${k}]` : `${path}.${k}`);
      if (d) return d;
    }
  }
  return path || "(the whole item)";
}
