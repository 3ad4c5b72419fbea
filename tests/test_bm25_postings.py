"""The BM25 postings stored at ingestion (docs/file-search.md, Storage), over HTTP with the openai
SDK on SQLite and PostgreSQL: a restarted gateway's first search returns exactly what the search
before the restart returned (ids, scores and texts), loading the stored postings instead of
tokenizing the texts (the gateway's ``responses_gateway_bm25_chunks_read_total`` counts the chunks
taken each way); a store written by an older gateway (no stored postings) or by another tokenizer
version is tokenized from its texts, only for those files, with the same results, and their
postings stored then, so the next restart tokenizes nothing; detaching a file,
deleting a Files API file and deleting the store leave no stored postings behind (expiry:
tests/test_vector_store_lifecycle.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import Gateway, start_gateway
from direct_sql import sql
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.retrieval.keyword_index import TOKENIZER
from test_store_services import fresh_pg_database

KEY = "bm25-key"
STATIC = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 20}}
FILES = {
    name: " ".join(
        f"Entry {n} of the {name} ledger: the {kind} crate number {n * 7} left the {port} dock at "
        f"{n + 4} o'clock, weighed by {clerk} and stamped {'urgent' if n % 3 == 0 else 'routine'}."
        for n, kind, port, clerk in zip(
            range(1, 15),
            ["tea", "salt", "copper", "wool", "cotton", "indigo", "pepper"] * 2,
            ["north", "south", "river", "harbour"] * 4,
            ["Marsh", "Okafor", "Lindqvist", "Tanaka", "Reyes"] * 3,
            strict=False,
        )
    ).encode()
    for name in ("alpha", "bravo", "charlie", "delta")
}
QUERIES = ["copper crate north dock", "urgent stamp Tanaka", "salt weighed by Reyes", "ledger entry 9"]
SIDES: list[dict[str, Any] | None] = [
    None,  # hybrid
    {"hybrid_search": {"embedding_weight": 0, "text_weight": 1}},  # BM25 alone
]


class Served:
    """A gateway on a database the test also reads and writes directly; ``restart`` starts a new one
    (a new process's memory: a fresh BM25 index) on the same database and files."""

    def __init__(self, url: str, data: Path) -> None:
        self.url = url
        self.data = data
        self.gw = self._start()

    def _start(self) -> Gateway:
        return start_gateway(
            [ScriptedProvider([{"message": ["hi"]}], name="m")],
            store_url=self.url,
            data_dir=str(self.data),
            api_keys=(KEY,),
            # What the first search loads is counted here: no start-up warm-up loading it before
            # (tests/test_index_warmup.py tests that).
            warm_indexes=False,
        )

    def restart(self) -> None:
        self.gw.stop()
        self.gw = self._start()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gw.base_url, api_key=KEY, max_retries=0, timeout=60)

    def reads(self) -> dict[str, float]:
        """The gateway's count of chunks its BM25 index took in, by source."""
        text = httpx.get(self.gw.url("/metrics"), headers={"authorization": f"Bearer {KEY}"}, timeout=10).text
        return {
            s.labels["source"]: s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "responses_gateway_bm25_chunks_read_total"
        }

    def sql(self, statement: str, *args: Any) -> list[tuple[Any, ...]]:
        return sql(self.url, statement, *args)

    def count(self, table: str, store_id: str, file_id: str | None = None) -> int:
        where, args = "vector_store_id = ?", [store_id]
        if file_id is not None:
            where += " AND file_id = ?"
            args.append(file_id)
        return int(self.sql(f"SELECT COUNT(*) FROM {table} WHERE {where}", *args)[0][0])


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data = tmp_path_factory.mktemp(f"bm25-{request.param}")
    url = (
        f"sqlite://{data}/gateway.db" if request.param == "sqlite" else fresh_pg_database("rg_bm25_postings")
    )
    both = Served(url, data)
    yield both
    both.gw.stop()


def _results(client: openai.OpenAI, store_id: str) -> list[list[tuple[str, float, str]]]:
    out = []
    for side in SIDES:
        for query in QUERIES:
            extra: dict[str, Any] = {} if side is None else {"ranking_options": side}
            page = client.vector_stores.search(store_id, query=query, max_num_results=10, **extra)
            out.append([(h.file_id, h.score, h.content[0].text) for h in page.data])
    return out


def test_a_restart_loads_the_stored_postings(served: Served) -> None:
    client = served.client()
    store = client.vector_stores.create(name="ledgers")
    ids = {}
    for name, data in FILES.items():
        ids[name] = client.files.create(file=(f"{name}.txt", data), purpose="assistants").id
        done = client.vector_stores.files.create_and_poll(
            vector_store_id=store.id, file_id=ids[name], chunking_strategy=STATIC, poll_interval_ms=100
        )
        assert done.status == "completed", done
    chunks = served.count("rg_vs_chunks", store.id)
    assert chunks > 4 * 3
    assert served.count("rg_vs_bm25", store.id) == len(FILES)
    before = _results(client, store.id)
    assert all(before) and len({tuple(r) for r in before}) > 1
    # Even in the gateway that ingested them, attachments were taken from their stored postings.
    assert served.reads() == {"postings": chunks, "texts": 0}

    served.restart()
    assert served.reads() == {"postings": 0, "texts": 0}
    assert _results(served.client(), store.id) == before
    assert served.reads() == {"postings": chunks, "texts": 0}

    # A store ingested by an older gateway (no stored postings for alpha) and one whose postings were
    # made by another tokenizer version (bravo): those two files' texts are tokenized, the same
    # results come back.
    served.sql("DELETE FROM rg_vs_bm25 WHERE vector_store_id = ? AND file_id = ?", store.id, ids["alpha"])
    served.sql(
        "UPDATE rg_vs_bm25 SET tokenizer = ? WHERE vector_store_id = ? AND file_id = ?",
        TOKENIZER + 1,
        store.id,
        ids["bravo"],
    )
    tokenized = served.count("rg_vs_chunks", store.id, ids["alpha"]) + served.count(
        "rg_vs_chunks", store.id, ids["bravo"]
    )
    served.restart()
    assert _results(served.client(), store.id) == before
    assert served.reads() == {"postings": chunks - tokenized, "texts": tokenized}
    # What was tokenized is stored (in the background, by this tokenizer): the next restart
    # tokenizes nothing.
    deadline = time.monotonic() + 30
    while served.sql(
        "SELECT COUNT(*) FROM rg_vs_bm25 WHERE vector_store_id = ? AND tokenizer = ?", store.id, TOKENIZER
    )[0][0] != len(FILES):
        assert time.monotonic() < deadline, "the tokenized postings were not stored"
        time.sleep(0.1)
    served.restart()
    assert _results(served.client(), store.id) == before
    assert served.reads() == {"postings": chunks, "texts": 0}

    # A damaged row (charlie's blob cut short): dropped, its texts tokenized, the same results; its
    # postings are stored again, whole.
    whole = served.sql(
        "SELECT postings FROM rg_vs_bm25 WHERE vector_store_id = ? AND file_id = ?", store.id, ids["charlie"]
    )[0][0]
    served.sql(
        "UPDATE rg_vs_bm25 SET postings = ? WHERE vector_store_id = ? AND file_id = ?",
        bytes(whole)[: len(whole) // 2],
        store.id,
        ids["charlie"],
    )
    damaged = served.count("rg_vs_chunks", store.id, ids["charlie"])
    served.restart()
    assert _results(served.client(), store.id) == before
    assert served.reads() == {"postings": chunks - damaged, "texts": damaged}
    deadline = time.monotonic() + 30
    while served.sql(
        "SELECT postings FROM rg_vs_bm25 WHERE vector_store_id = ? AND file_id = ?", store.id, ids["charlie"]
    ) != [(whole,)]:
        assert time.monotonic() < deadline, "the damaged postings were not stored again"
        time.sleep(0.1)


def test_stored_postings_go_with_their_chunks(served: Served) -> None:
    client = served.client()
    store = client.vector_stores.create(name="gone")
    ids = {}
    for name in ("alpha", "bravo", "charlie"):
        ids[name] = client.files.create(file=(f"{name}.txt", FILES[name]), purpose="assistants").id
        done = client.vector_stores.files.create_and_poll(
            vector_store_id=store.id, file_id=ids[name], chunking_strategy=STATIC, poll_interval_ms=100
        )
        assert done.status == "completed", done
    assert served.count("rg_vs_bm25", store.id) == 3
    # Detached: its chunks and postings go; search no longer finds it.
    assert client.vector_stores.files.delete(ids["alpha"], vector_store_id=store.id).deleted
    assert served.count("rg_vs_bm25", store.id, ids["alpha"]) == 0
    assert served.count("rg_vs_chunks", store.id, ids["alpha"]) == 0
    # Re-attached with another chunking: one row, the new ingestion's.
    again = client.vector_stores.files.create_and_poll(
        vector_store_id=store.id, file_id=ids["bravo"], poll_interval_ms=100
    )
    assert again.status == "completed"
    version = served.sql(
        "SELECT ingested_version FROM rg_vector_store_files WHERE vector_store_id = ? AND file_id = ?",
        store.id,
        ids["bravo"],
    )
    assert (
        served.sql(
            "SELECT ingested_version FROM rg_vs_bm25 WHERE vector_store_id = ? AND file_id = ?",
            store.id,
            ids["bravo"],
        )
        == version
    )
    # The Files API file deleted: detached from the store, postings and all.
    assert client.files.delete(ids["charlie"]).deleted
    assert served.count("rg_vs_bm25", store.id, ids["charlie"]) == 0
    hits = client.vector_stores.search(store.id, query="ledger crate dock", max_num_results=50).data
    assert hits and {h.file_id for h in hits} == {ids["bravo"]}
    # The store deleted: nothing of it is left.
    assert client.vector_stores.delete(store.id).deleted
    assert served.count("rg_vs_bm25", store.id) == 0 and served.count("rg_vs_chunks", store.id) == 0
