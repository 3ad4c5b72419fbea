"""The start-up warm-up of the file search indexes (docs/file-search.md, "Warm-up"), against real
``responses-gateway serve`` processes on one SQLite file, with the openai SDK: a restarted gateway
loads its live vector stores' BM25 and in-memory vector indexes before any search (its
``/metrics`` count the chunks taken in), an expired store is left out, and the first search then
returns exactly what the search before the restart returned, loading nothing again; with the
warm-up turned off (``serve --no-warm-indexes``, or the models file's ``file_search:
{warm_indexes: false}``) nothing is loaded until the first search."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import openai
from prometheus_client.parser import text_string_to_metric_families

from direct_sql import sql
from serve_process import Served, serve, serving, stop

STATIC = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 20}}
FILES = {
    name: " ".join(
        f"Line {n} of the {name} logbook: the {cargo} barge number {n * 11} moored at the {pier} pier "
        f"after {n + 2} hours, checked by {clerk}, marked {'late' if n % 4 == 0 else 'on time'}."
        for n, cargo, pier, clerk in zip(
            range(1, 13),
            ["grain", "timber", "coal", "brick", "sand", "lime"] * 2,
            ["east", "west", "mill", "lock"] * 3,
            ["Abara", "Brandt", "Castillo", "Dubois"] * 3,
            strict=False,
        )
    ).encode()
    for name in ("north", "south", "canal")
}
QUERIES = ["coal barge east pier", "late Castillo", "timber checked by Dubois"]
SIDES: list[dict[str, Any] | None] = [
    None,  # hybrid
    {"hybrid_search": {"embedding_weight": 0, "text_weight": 1}},  # BM25 alone
    {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}},  # vectors alone
]


def _client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=60)


def _metrics(served: Served) -> dict[str, float]:
    text = served.get("/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(
                ("responses_gateway_bm25", "responses_gateway_vector_chunks", "responses_gateway_index")
            ):
                label = s.labels.get("source")
                out[s.name + (f"{{{label}}}" if label else "")] = s.value
    return out


def _loaded(served: Served) -> tuple[float, float]:
    """(chunks the BM25 index took in, vectors the vector index read) so far."""
    m = _metrics(served)
    return (
        m.get("responses_gateway_bm25_chunks_read_total{postings}", 0)
        + m.get("responses_gateway_bm25_chunks_read_total{texts}", 0),
        m["responses_gateway_vector_chunks_read_total"],
    )


def _results(client: openai.OpenAI, store_id: str) -> list[list[tuple[str, float, str]]]:
    out = []
    for side in SIDES:
        for query in QUERIES:
            extra: dict[str, Any] = {} if side is None else {"ranking_options": side}
            page = client.vector_stores.search(store_id, query=query, max_num_results=8, **extra)
            out.append([(h.file_id, h.score, h.content[0].text) for h in page.data])
    return out


def _attach(client: openai.OpenAI, store_id: str, name: str) -> None:
    file_id = client.files.create(file=(f"{name}.txt", FILES[name]), purpose="assistants").id
    done = client.vector_stores.files.create_and_poll(
        vector_store_id=store_id, file_id=file_id, chunking_strategy=STATIC, poll_interval_ms=100
    )
    assert done.status == "completed", done


def test_a_restart_loads_the_live_stores_before_any_search(tmp_path: Path) -> None:
    script = tmp_path / "m.yaml"
    script.write_text("model: m\nsteps:\n  - message: ['hi']\n")
    # One process: its /metrics count what the searches made it load (with a worker per core, the
    # search and the scrape may reach different workers; each worker warms up alike).
    args = ("--no-local", "--script", str(script), "--workers", "1")
    url = f"sqlite://{tmp_path / 'gateway.db'}"
    with serving(tmp_path, *args) as served:
        client = _client(served)
        store = client.vector_stores.create(name="logbooks")
        for name in ("north", "south"):
            _attach(client, store.id, name)
        aged = client.vector_stores.create(name="aged", expires_after={"anchor": "last_active_at", "days": 1})
        _attach(client, aged.id, "canal")
        before = _results(client, store.id)
        assert all(before) and len({tuple(r) for r in before}) > 1
    chunks = int(sql(url, "SELECT COUNT(*) FROM rg_vs_chunks WHERE vector_store_id = ?", store.id)[0][0])
    assert chunks > 2 * 3
    # The second store's expiry passes while no gateway runs.
    sql(url, "UPDATE rg_vector_stores SET expires_at = 1 WHERE id = ?", aged.id)

    # Warm-up on (the default): the live store is loaded with no search, the expired one is not.
    served = serve(tmp_path, *args)
    try:
        deadline = time.monotonic() + 60
        while (m := _metrics(served))["responses_gateway_index_warmup_running"] or not m[
            "responses_gateway_index_warmup_stores_total"
        ]:
            assert time.monotonic() < deadline, f"the warm-up did not end: {m}"
            time.sleep(0.1)
        assert m["responses_gateway_index_warmup_stores_total"] == 1
        assert m["responses_gateway_index_warmup_chunks_total"] == chunks
        assert _loaded(served) == (chunks, chunks)
        # The first search: the results of before the restart, nothing loaded again.
        assert _results(_client(served), store.id) == before
        assert _loaded(served) == (chunks, chunks)
    finally:
        stop(served)

    # Warm-up off, by the flag or by the models file: loaded by the first search only.
    models = tmp_path / "models.yaml"
    models.write_text(
        "local: false\nmodels:\n  - name: up\n    provider: openai-chat\n    upstream_model: x\n"
        "    base_url: http://127.0.0.1:9/v1\nfile_search:\n  warm_indexes: false\n"
    )
    for off in (("--no-warm-indexes",), ("--config", str(models))):
        with serving(tmp_path, *args, *off) as served:
            client = _client(served)
            assert client.vector_stores.retrieve(store.id).file_counts.completed == 2
            time.sleep(0.5)  # room for a warm-up that should not run (no timing is asserted)
            m = _metrics(served)
            assert m["responses_gateway_index_warmup_stores_total"] == 0
            assert m["responses_gateway_index_warmup_running"] == 0
            assert _loaded(served) == (0, 0)
            assert _results(client, store.id) == before
            assert _loaded(served) == (chunks, chunks)
