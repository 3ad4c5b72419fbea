// Files attached to the chat for file_search: each is uploaded (POST /v1/files, purpose "assistants")
// and put in a vector store the chat owns (created on the first upload), then watched until its
// ingestion ends (completed, or failed with its last_error). From then on every request carries the
// file_search tool over that store. "New chat" starts a chat without attachments (the old store stays
// on the gateway, as its responses refer to it); a reopened response that searched a store adopts it.
import { api, uploadFile } from "./api.js";
import { el } from "./dom.js";

const POLL_MS = 200;
const POLL_LIMIT = 600; // 2 minutes of polling, then the entry says it is still ingesting

export class Attachments {
  // list: the <ul> that shows the files, in box (hidden while empty) with note (what requests carry);
  // onError(err): the page's error banner.
  constructor(list, { box, note, onError }) {
    this.list = list;
    this.box = box;
    this.note = note;
    this.onError = onError;
    this.storeId = null;
    this.storePending = null; // the POST /v1/vector_stores in flight
    this.entries = new Set();
    this.generation = 0; // bumped by reset(): uploads and polls of an earlier chat stop there
  }

  // The file_search tool for a request, or null while no file is (being) ingested.
  tool() {
    if (!this.storeId) return null;
    const live = [...this.entries].some((e) => e.status === "in_progress" || e.status === "completed");
    return live ? { type: "file_search", vector_store_ids: [this.storeId] } : null;
  }

  reset() {
    this.generation += 1;
    this.storeId = null;
    this.storePending = null;
    this.entries.clear();
    this.list.replaceChildren();
    this.refresh();
  }

  // The box shows while a file is listed; the note says whether requests carry file_search.
  refresh() {
    this.box.hidden = this.entries.size === 0;
    const tool = this.tool();
    const ready = [...this.entries].filter((e) => e.status === "completed").length;
    this.note.textContent = tool
      ? `Messages search vector store ${this.storeId} with file_search (${ready} of ${this.entries.size} files ready).`
      : "No file is attached: messages are sent without file_search.";
  }

  // Upload and attach each file of a FileList (one after the other: ingestion is serial anyway).
  async add(files) {
    const generation = this.generation;
    const entries = [...files].map((file) => this.entry(file.name));
    for (let i = 0; i < entries.length; i++) {
      if (generation !== this.generation) return;
      await this.attach(files[i], entries[i], generation);
    }
  }

  entry(name) {
    const status = el("span", { class: "badge attach-status" }, "uploading");
    const error = el("span", { class: "attach-error" });
    const entry = { name, fileId: null, attached: null, status: "uploading", node: null, statusNode: status, errorNode: error };
    const remove = el("button", { type: "button", class: "link", "aria-label": `Remove ${name}`, onclick: () => this.remove(entry) }, "remove");
    entry.node = el("li", { class: "attachment", dataset: { name } }, el("span", { class: "attach-name" }, name), " ", status, " ", error, " ", remove);
    this.entries.add(entry);
    this.list.append(entry.node);
    this.refresh();
    return entry;
  }

  show(entry, status, error = "") {
    entry.status = status;
    entry.statusNode.textContent = status;
    entry.statusNode.className = `badge attach-status ${status}`;
    entry.errorNode.textContent = error;
    entry.node.dataset.status = status;
    this.refresh();
  }

  async store() {
    if (this.storeId) return this.storeId;
    if (!this.storePending) this.storePending = api.createVectorStore();
    const generation = this.generation;
    const created = await this.storePending;
    if (generation === this.generation) this.storeId = created.id;
    return created.id;
  }

  async attach(file, entry, generation) {
    let uploaded;
    try {
      uploaded = await uploadFile(file);
    } catch (err) {
      this.show(entry, "failed", err.message);
      this.onError(err);
      return;
    }
    entry.fileId = uploaded.id;
    entry.node.dataset.fileId = uploaded.id;
    if (!this.entries.has(entry)) return void this.forget(entry); // removed while uploading
    let store;
    let attached;
    try {
      store = await this.store();
      if (generation !== this.generation) return;
      attached = await api.attachFile(store, uploaded.id);
    } catch (err) {
      // Refused (an empty or unreadable file is a 400): nothing was attached; the upload goes too.
      this.show(entry, "failed", err.message);
      this.onError(err);
      entry.fileId = null;
      api.deleteFile(uploaded.id).catch(() => {});
      return;
    }
    entry.attached = store;
    if (!this.entries.has(entry)) return void this.forget(entry); // removed while attaching
    this.show(entry, attached.status, attached.last_error ? attached.last_error.message : "");
    await this.watch(entry, generation);
  }

  // Poll a file's ingestion until it ends.
  async watch(entry, generation) {
    for (let n = 0; entry.status === "in_progress" && n < POLL_LIMIT; n++) {
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
      if (generation !== this.generation || !this.entries.has(entry)) return;
      try {
        const current = await api.storeFile(entry.attached, entry.fileId);
        this.show(entry, current.status, current.last_error ? current.last_error.message : "");
      } catch (err) {
        this.show(entry, "failed", err.message);
        this.onError(err);
      }
    }
  }

  // Take over a vector store a reopened response searched (the first of its file_search tool's
  // stores): its files are listed, and the next messages search it again.
  async adopt(storeId) {
    this.reset();
    const generation = this.generation;
    this.storeId = storeId;
    try {
      const files = (await api.storeFiles(storeId)).data;
      for (const f of files) {
        let name = f.id;
        try {
          name = (await api.file(f.id)).filename || f.id;
        } catch {
          // the upload is gone (deleted): the row shows the id
        }
        if (generation !== this.generation) return;
        const entry = this.entry(name);
        entry.fileId = f.id;
        entry.attached = storeId;
        entry.node.dataset.fileId = f.id;
        this.show(entry, f.status, f.last_error ? f.last_error.message : "");
        this.watch(entry, generation);
      }
    } catch (err) {
      if (generation === this.generation) this.storeId = null; // deleted since: start without it
      this.onError(err);
    }
  }

  // Detach the file from the store and delete the upload; the row goes at once.
  async remove(entry) {
    this.entries.delete(entry);
    entry.node.remove();
    this.refresh();
    await this.forget(entry);
  }

  async forget(entry) {
    if (!entry.fileId) return;
    try {
      if (entry.attached) await api.detachFile(entry.attached, entry.fileId);
      await api.deleteFile(entry.fileId);
    } catch (err) {
      this.onError(err);
    }
  }
}
