// The gateway's HTTP API as the UI uses it. The API key lives in sessionStorage only (this tab, until
// it closes); it is sent as a bearer token and never written anywhere else.
import { SSEParser, decodeMessage } from "./sse.js";

const KEY = "rg.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

function headers(extra = {}) {
  const h = { ...extra };
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// An HTTP error in OpenAI's shape, as the UI shows it.
export class APIError extends Error {
  constructor(status, error) {
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || null;
    this.param = error.param || null;
    this.type = error.type || null;
  }
}

async function failure(response) {
  let error = {};
  try {
    const body = await response.json();
    if (body && typeof body.error === "object" && body.error) error = body.error;
  } catch {
    error = { message: `HTTP ${response.status} ${response.statusText}` };
  }
  return new APIError(response.status, error);
}

export async function getJSON(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function postJSON(path, body) {
  const response = await fetch(path, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function deleteJSON(path) {
  const response = await fetch(path, { method: "DELETE", headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// POST /v1/files (multipart): one File from an <input type="file">, for file_search.
export async function uploadFile(file, purpose = "assistants") {
  const form = new FormData();
  form.append("purpose", purpose);
  form.append("file", file, file.name);
  const response = await fetch("/v1/files", { method: "POST", headers: headers(), body: form });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// Read an SSE response; onEvent(event, time) for each event with its arrival time (performance.now()).
async function readEvents(response, onEvent) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const parser = new SSEParser();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const now = performance.now();
    for (const message of parser.feed(value)) {
      const event = decodeMessage(message);
      if (event !== null) onEvent(event, now);
    }
  }
  parser.flush();
  return parser.comments;
}

// POST /v1/responses with stream: true. Throws APIError for an HTTP error (nothing streamed).
export async function streamResponse(body, onEvent, signal) {
  const response = await fetch("/v1/responses", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify({ ...body, stream: true }),
    signal,
  });
  if (!response.ok) throw await failure(response);
  return readEvents(response, onEvent);
}

// A stored response's events from the start (the resume endpoint), then live until it ends.
export async function streamStored(id, onEvent, signal) {
  const url = `/v1/responses/${encodeURIComponent(id)}?stream=true&starting_after=-1`;
  const response = await fetch(url, { headers: headers({ Accept: "text/event-stream" }), signal });
  if (!response.ok) throw await failure(response);
  return readEvents(response, onEvent);
}

// A stored response's events as stored, with their recorded arrival times (the gateway's own
// GET /v1/gateway/responses/{id}/events, page by page): [{sequence_number, at_ms, event}].
export async function storedTimedEvents(id) {
  const out = [];
  let after = "";
  for (;;) {
    const page = await getJSON(`/v1/gateway/responses/${encodeURIComponent(id)}/events?limit=1000${after}`);
    out.push(...page.data);
    if (!page.has_more || !page.data.length) return out;
    after = `&after=${page.data[page.data.length - 1].sequence_number}`;
  }
}

export const api = {
  models: () => getJSON("/v1/models"),
  response: (id) => getJSON(`/v1/responses/${encodeURIComponent(id)}`),
  inputItems: (id) => getJSON(`/v1/responses/${encodeURIComponent(id)}/input_items?order=asc&limit=100`),
  check: (events) => postJSON("/v1/gateway/check", { events }),
  history: (params) => getJSON(`/v1/gateway/responses?${new URLSearchParams(params)}`),
  conversations: (params) => getJSON(`/v1/gateway/conversations?${new URLSearchParams(params)}`),
  conversationItems: (id) => getJSON(`/v1/conversations/${encodeURIComponent(id)}/items?order=asc&limit=100`),
  createConversation: () => postJSON("/v1/conversations", { metadata: { source: "playground" } }),
  createVectorStore: () => postJSON("/v1/vector_stores", { name: "playground attachments", metadata: { source: "playground" } }),
  attachFile: (store, fileId) => postJSON(`/v1/vector_stores/${encodeURIComponent(store)}/files`, { file_id: fileId }),
  storeFile: (store, fileId) => getJSON(`/v1/vector_stores/${encodeURIComponent(store)}/files/${encodeURIComponent(fileId)}`),
  storeFiles: (store) => getJSON(`/v1/vector_stores/${encodeURIComponent(store)}/files?limit=100&order=asc`),
  file: (fileId) => getJSON(`/v1/files/${encodeURIComponent(fileId)}`),
  detachFile: (store, fileId) => deleteJSON(`/v1/vector_stores/${encodeURIComponent(store)}/files/${encodeURIComponent(fileId)}`),
  deleteFile: (fileId) => deleteJSON(`/v1/files/${encodeURIComponent(fileId)}`),
};

// An authorized download (container files): the bytes as an object URL.
export async function blobURL(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw await failure(response);
  return URL.createObjectURL(await response.blob());
}
