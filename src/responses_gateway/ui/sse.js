// Server-Sent Events read from a fetch() body (EventSource cannot POST), per the WHATWG parsing rules:
// lines end in \n, \r\n or \r; "data:" lines join with \n; a blank line dispatches; ":" is a comment.

export class SSEParser {
  constructor() {
    this.buffer = "";
    this.data = [];
    this.eventName = "";
    this.comments = 0;
    this.pendingCR = false;
  }

  // Feed decoded text; returns the messages it completes: {event, data}.
  feed(text) {
    if (this.pendingCR && text.startsWith("\n")) text = text.slice(1);
    this.pendingCR = false;
    this.buffer += text;
    const out = [];
    let start = 0;
    for (let i = 0; i < this.buffer.length; i++) {
      const ch = this.buffer[i];
      if (ch !== "\n" && ch !== "\r") continue;
      const line = this.buffer.slice(start, i);
      if (ch === "\r") {
        if (i + 1 === this.buffer.length) this.pendingCR = true;
        else if (this.buffer[i + 1] === "\n") i++;
      }
      start = i + 1;
      const message = this.line(line);
      if (message) out.push(message);
    }
    this.buffer = this.buffer.slice(start);
    return out;
  }

  // End of stream: an unterminated last message is dropped, as a browser's EventSource does.
  flush() {
    this.buffer = "";
    this.data = [];
    this.eventName = "";
    return [];
  }

  line(line) {
    if (line === "") {
      if (this.data.length === 0) {
        this.eventName = "";
        return null;
      }
      const message = { event: this.eventName || "message", data: this.data.join("\n") };
      this.data = [];
      this.eventName = "";
      return message;
    }
    if (line.startsWith(":")) {
      this.comments++;
      return null;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.eventName = value;
    return null;
  }
}

// A message's JSON event, or null for the [DONE] sentinel; a non-JSON payload becomes an object the
// checker reports ({type: undefined}) with the raw text kept for the frame list.
export function decodeMessage(message) {
  if (message.data === "[DONE]") return null;
  try {
    return JSON.parse(message.data);
  } catch {
    return { _unparsed: message.data };
  }
}

// A recorded stream pasted or loaded into the inspector: raw SSE, JSON lines, or a JSON array.
export function parseRecorded(text) {
  const trimmed = text.trim();
  if (trimmed.startsWith("[")) {
    const value = JSON.parse(trimmed);
    if (!Array.isArray(value)) throw new Error("expected a JSON array of events");
    return { events: value, format: "json" };
  }
  if (/^(data|event|id|retry):|^:/m.test(trimmed.split("\n", 1)[0])) {
    const parser = new SSEParser();
    const events = [];
    for (const m of parser.feed(text.endsWith("\n\n") ? text : text + "\n\n")) {
      const event = decodeMessage(m);
      if (event !== null) events.push(event);
    }
    return { events, format: "sse" };
  }
  const events = trimmed
    .split(/\r?\n/)
    .filter((l) => l.trim())
    .map((l, n) => {
      try {
        return JSON.parse(l);
      } catch {
        throw new Error(`line ${n + 1} is not JSON`);
      }
    });
  return { events, format: "jsonl" };
}
