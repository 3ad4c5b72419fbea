"""Vector stores, hybrid search and POST /v1/embeddings with the openai SDK against a running gateway
(docs/file-search.md): the whole API, ownership, bad uploads, SQLite and PostgreSQL giving the same
answers on one corpus, and ``search_for_tool`` (what the file_search tool calls)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import openai
import pytest

from conftest import Gateway, start_gateway
from responses_gateway.config import parse_config
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.retrieval.chunking import cl100k
from responses_gateway.retrieval.service import VectorStores
from responses_gateway.server.registry import registry_from_config
from responses_gateway.store import open_store
from serve_process import serving
from test_chunking import HELLO, MIXED, assert_tiles, expected_count, oracle
from test_documents import make_pdf
from test_store_services import fresh_pg_database

KEY_A, KEY_B = "vs-key-a", "vs-key-b"
MODEL = "all-MiniLM-L6-v2"

# A small corpus: one topic per file, so each question has one right file.
CORPUS: dict[str, tuple[bytes, dict[str, Any]]] = {
    "cats.txt": (
        b"Cats are small domesticated carnivores. A cat purrs when content, grooms its fur with a rough "
        b"tongue and hunts mice at night. Kittens open their eyes after about ten days.",
        {"topic": "animals", "year": 2021},
    ),
    "volcanoes.md": (
        b"# Volcanoes\n\nA volcano is a rupture in the crust where magma reaches the surface as lava. "
        b"Eruptions throw out ash and gas; Mount Etna in Sicily erupts every few years.",
        {"topic": "geology", "year": 2019},
    ),
    "quicksort.py": (
        b"def quicksort(items):\n    '''Sort a list: pick a pivot, partition the rest into smaller and\n"
        b"    larger elements, and sort each part recursively.'''\n    if len(items) <= 1:\n"
        b"        return items\n    pivot, rest = items[0], items[1:]\n"
        b"    smaller = [x for x in rest if x < pivot]\n    larger = [x for x in rest if x >= pivot]\n"
        b"    return quicksort(smaller) + [pivot] + quicksort(larger)\n",
        {"topic": "code", "year": 2023},
    ),
    "bread.html": (
        b"<html><body><h1>Baking bread</h1><p>Mix flour, water, salt and yeast into a dough, knead it, "
        b"let it rise for an hour and bake it in a hot oven until the crust is brown.</p></body></html>",
        {"topic": "cooking", "year": 2022},
    ),
    "orbits.json": (
        b'{"title": "Planetary orbits", "text": "Planets follow elliptical orbits around the Sun; '
        b'Kepler described their motion and Newton explained it with gravity."}',
        {"topic": "astronomy", "year": 2020},
    ),
}
QUESTIONS = {
    "Why does my kitten purr?": "cats.txt",
    "lava and ash from an eruption": "volcanoes.md",
    "how to partition around a pivot when sorting": "quicksort.py",
    "knead the dough and let it rise": "bread.html",
    "what keeps planets on elliptical paths": "orbits.json",
}


def _client(gw: Gateway, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=60)


def _start(url: str, data_dir: Path) -> Gateway:
    return start_gateway(
        [ScriptedProvider([{"message": ["ok"]}], name="m")],
        store_url=url,
        data_dir=str(data_dir),
        api_keys=(KEY_A, KEY_B),
        max_file_bytes=64 * 1024,
    )


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    data = tmp_path_factory.mktemp("vs-sqlite")
    served = _start(f"sqlite://{data}/gateway.db", data)
    yield served
    served.stop()


def _load_corpus(client: openai.OpenAI, **create: Any) -> tuple[str, dict[str, str]]:
    """A vector store holding the corpus (one batch); its id and file id by name."""
    store = client.vector_stores.create(name="corpus", **create)
    ids = {}
    for name, (data, _) in CORPUS.items():
        ids[name] = client.files.create(file=(name, data), purpose="assistants").id
    batch = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=store.id,
        files=[{"file_id": ids[name], "attributes": attrs} for name, (_, attrs) in CORPUS.items()],
        poll_interval_ms=100,
    )
    assert batch.status == "completed", batch
    assert batch.file_counts.completed == len(CORPUS) and batch.file_counts.failed == 0
    return store.id, ids


@pytest.fixture(scope="module")
def corpus(gw: Gateway) -> tuple[str, dict[str, str]]:
    return _load_corpus(_client(gw))


def _top_files(client: openai.OpenAI, store_id: str, query: str, **kw: Any) -> list[str]:
    return [hit.filename for hit in client.vector_stores.search(store_id, query=query, **kw).data]


# ------------------------------------------------------------------ the API with the SDK
def test_upload_and_poll_then_search(gw: Gateway) -> None:
    client = _client(gw)
    store = client.vector_stores.create(name="notes", metadata={"team": "docs"})
    assert store.object == "vector_store" and store.id.startswith("vs_")
    assert store.status == "completed" and store.file_counts.total == 0 and store.usage_bytes == 0
    done = client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id,
        file=("cats.txt", CORPUS["cats.txt"][0]),
        attributes={"topic": "animals"},
        poll_interval_ms=100,
    )
    assert done.object == "vector_store.file" and done.status == "completed" and done.last_error is None
    assert done.vector_store_id == store.id and done.attributes == {"topic": "animals"}
    assert done.chunking_strategy.type == "static"
    assert done.usage_bytes == len(CORPUS["cats.txt"][0])
    page = client.vector_stores.search(store.id, query="purring kitten")
    assert page.search_query == ["purring kitten"]
    [hit] = page.data
    assert hit.file_id == done.id and hit.filename == "cats.txt" and hit.attributes == {"topic": "animals"}
    assert hit.content[0].type == "text" and "purrs" in hit.content[0].text
    assert 0 < hit.score <= 1
    again = client.vector_stores.retrieve(store.id)
    assert again.file_counts.completed == 1 and again.file_counts.total == 1
    assert again.usage_bytes == done.usage_bytes and again.metadata == {"team": "docs"}


def test_hybrid_search_finds_each_topic(gw: Gateway, corpus: tuple[str, dict[str, str]]) -> None:
    client = _client(gw)
    store_id, ids = corpus
    for question, expected in QUESTIONS.items():
        page = client.vector_stores.search(store_id, query=question, max_num_results=3)
        assert page.data[0].filename == expected, (question, [h.filename for h in page.data])
        assert page.data[0].file_id == ids[expected]
        assert len(page.data) <= 3
        scores = [h.score for h in page.data]
        assert scores == sorted(scores, reverse=True)


def test_search_options(gw: Gateway, corpus: tuple[str, dict[str, str]]) -> None:
    client = _client(gw)
    store_id, _ = corpus
    assert len(client.vector_stores.search(store_id, query="the", max_num_results=1).data) == 1
    # Filters on attributes: comparison and compound.
    only = _top_files(client, store_id, "lava", filters={"type": "eq", "key": "topic", "value": "code"})
    assert only == ["quicksort.py"]
    recent = _top_files(
        client,
        store_id,
        "anything at all",
        filters={
            "type": "and",
            "filters": [
                {"type": "gte", "key": "year", "value": 2021},
                {"type": "nin", "key": "topic", "value": ["code"]},
            ],
        },
    )
    assert sorted(recent) == ["bread.html", "cats.txt"]
    assert _top_files(client, store_id, "lava", filters={"type": "eq", "key": "topic", "value": "none"}) == []
    # ranking_options: a threshold of 1 keeps only a chunk first on both lists.
    best = client.vector_stores.search(
        store_id, query="volcano lava eruption", ranking_options={"score_threshold": 1.0}
    )
    assert [h.filename for h in best.data] == ["volcanoes.md"] and best.data[0].score == 1.0
    # Text weight only: pure BM25, so a query sharing no word with any chunk finds nothing.
    text_only = {"hybrid_search": {"embedding_weight": 0, "text_weight": 1}, "score_threshold": 0.01}
    assert _top_files(client, store_id, "feline", ranking_options=text_only) == []
    vector_only = {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}}
    assert _top_files(client, store_id, "feline", ranking_options=vector_only, max_num_results=1) == [
        "cats.txt"
    ]
    # A list of queries is one search.
    assert client.vector_stores.search(store_id, query=["magma", "Etna"]).search_query == ["magma", "Etna"]
    for bad in (
        {"max_num_results": 0},
        {"max_num_results": 51},
        {"filters": {"type": "like", "key": "a", "value": 1}},
        {"ranking_options": {"score_threshold": 2}},
        {"ranking_options": {"ranker": "best"}},
        {"rewrite_query": True},
    ):
        with pytest.raises(openai.BadRequestError):
            client.vector_stores.search(store_id, query="x", **bad)
    with pytest.raises(openai.BadRequestError):
        client.vector_stores.search(store_id, query="")


def test_list_update_delete(gw: Gateway) -> None:
    client = _client(gw)
    first = client.vector_stores.create(name="one")
    second = client.vector_stores.create(name="two", expires_after={"anchor": "last_active_at", "days": 7})
    assert second.expires_after is not None and second.expires_after.days == 7
    assert second.expires_at == second.last_active_at + 7 * 86400
    listed = [s.id for s in client.vector_stores.list(limit=100)]
    assert listed.index(second.id) < listed.index(first.id)  # newest first
    page = client.vector_stores.list(limit=1, order="asc", after=first.id)
    assert page.data[0].id != first.id
    renamed = client.vector_stores.update(first.id, name="uno", metadata={"k": "v"})
    assert (renamed.name, renamed.metadata) == ("uno", {"k": "v"})
    file_id = client.files.create(file=("a.txt", b"alpha beta gamma"), purpose="assistants").id
    attached = client.vector_stores.files.create_and_poll(
        vector_store_id=first.id, file_id=file_id, poll_interval_ms=100
    )
    assert attached.status == "completed"
    assert [f.id for f in client.vector_stores.files.list(first.id)] == [file_id]
    assert [f.id for f in client.vector_stores.files.list(first.id, filter="completed")] == [file_id]
    assert list(client.vector_stores.files.list(first.id, filter="failed")) == []
    updated = client.vector_stores.files.update(
        file_id=file_id, vector_store_id=first.id, attributes={"x": 1}
    )
    assert updated.attributes == {"x": 1}
    assert client.vector_stores.files.retrieve(file_id=file_id, vector_store_id=first.id).attributes == {
        "x": 1
    }
    assert _top_files(client, first.id, "gamma") == ["a.txt"]
    gone = client.vector_stores.files.delete(file_id=file_id, vector_store_id=first.id)
    assert gone.deleted and gone.object == "vector_store.file.deleted"
    assert _top_files(client, first.id, "gamma") == []
    assert client.vector_stores.retrieve(first.id).file_counts.total == 0
    deleted = client.vector_stores.delete(first.id)
    assert deleted.deleted and deleted.object == "vector_store.deleted"
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve(first.id)
    for bad in (
        {"expires_after": {"anchor": "created_at", "days": 1}},
        {"name": "x" * 300},
        {"extra_body": {"shape": 1}},
    ):
        with pytest.raises(openai.BadRequestError):
            client.vector_stores.create(**bad)  # type: ignore[arg-type]


def test_file_batches(gw: Gateway) -> None:
    client = _client(gw)
    store = client.vector_stores.create(name="batch")
    ids = [
        client.files.create(file=(f"n{i}.txt", f"note {i}".encode()), purpose="assistants").id
        for i in range(3)
    ]
    bad = client.files.create(file=("blank.txt", b"   \n"), purpose="assistants").id
    batch = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=store.id, file_ids=[*ids, bad], attributes={"kind": "note"}, poll_interval_ms=100
    )
    assert batch.object == "vector_store.files_batch" and batch.id.startswith("vsfb_")
    assert batch.status == "completed"
    counts = batch.file_counts
    assert (counts.completed, counts.failed, counts.total) == (3, 1, 4)
    listed = client.vector_stores.file_batches.list_files(batch_id=batch.id, vector_store_id=store.id)
    assert sorted(f.id for f in listed) == sorted([*ids, bad])
    failed = client.vector_stores.file_batches.list_files(
        batch_id=batch.id, vector_store_id=store.id, filter="failed"
    )
    [blank] = list(failed)
    assert blank.id == bad and blank.last_error is not None and "no text" in blank.last_error.message
    assert all(f.attributes == {"kind": "note"} for f in listed if f.status == "completed")
    again = client.vector_stores.file_batches.retrieve(batch_id=batch.id, vector_store_id=store.id)
    assert again.file_counts.total == 4
    cancelled = client.vector_stores.file_batches.cancel(batch_id=batch.id, vector_store_id=store.id)
    assert cancelled.status == "cancelled" and cancelled.file_counts.completed == 3
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.file_batches.retrieve(batch_id="vsfb_missing", vector_store_id=store.id)
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.file_batches.create(vector_store_id=store.id, file_ids=["file-missing"])


def test_ownership(gw: Gateway) -> None:
    """Another API key sees nothing of a store: every endpoint answers 404."""
    mine = _client(gw)
    other = _client(gw, KEY_B)
    store_id = mine.vector_stores.create(name="mine").id
    file_id = mine.vector_stores.files.upload_and_poll(
        vector_store_id=store_id, file=("cats.txt", CORPUS["cats.txt"][0]), poll_interval_ms=100
    ).id
    batch = mine.vector_stores.file_batches.create(vector_store_id=store_id, file_ids=[file_id])
    assert store_id not in [s.id for s in other.vector_stores.list()]
    calls = [
        lambda: other.vector_stores.retrieve(store_id),
        lambda: other.vector_stores.update(store_id, name="x"),
        lambda: other.vector_stores.delete(store_id),
        lambda: other.vector_stores.search(store_id, query="cat"),
        lambda: other.vector_stores.files.list(store_id),
        lambda: other.vector_stores.files.create(vector_store_id=store_id, file_id=file_id),
        lambda: other.vector_stores.files.retrieve(file_id=file_id, vector_store_id=store_id),
        lambda: other.vector_stores.files.update(file_id=file_id, vector_store_id=store_id, attributes={}),
        lambda: other.vector_stores.files.delete(file_id=file_id, vector_store_id=store_id),
        lambda: other.vector_stores.file_batches.create(vector_store_id=store_id, file_ids=[file_id]),
        lambda: other.vector_stores.file_batches.retrieve(batch_id=batch.id, vector_store_id=store_id),
        lambda: other.vector_stores.file_batches.cancel(batch_id=batch.id, vector_store_id=store_id),
        lambda: other.vector_stores.file_batches.list_files(batch_id=batch.id, vector_store_id=store_id),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError):
            call()
    # Nor can another key put my file in its own store.
    theirs = other.vector_stores.create(name="theirs")
    with pytest.raises(openai.NotFoundError):
        other.vector_stores.files.create(vector_store_id=theirs.id, file_id=file_id)
    with pytest.raises(openai.NotFoundError):
        other.vector_stores.file_batches.create(vector_store_id=theirs.id, file_ids=[file_id])
    assert mine.vector_stores.retrieve(store_id).name == "mine"
    _wait_idle(mine, store_id)


def _wait_idle(client: openai.OpenAI, store_id: str) -> None:
    deadline = time.monotonic() + 60
    while client.vector_stores.retrieve(store_id).file_counts.in_progress:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_bad_uploads_leave_nothing(gw: Gateway) -> None:
    client = _client(gw)
    store = client.vector_stores.create(name="bad")
    cases = {
        "empty.txt": b"",
        "binary.bin": bytes(range(256)) * 4,
        "broken.pdf": b"%PDF-1.7\n1 0 obj << /Type /Catalog >>\nthis is not a pdf body\x00\xff",
    }
    for name, data in cases.items():
        file_id = client.files.create(file=(name, data), purpose="assistants").id
        with pytest.raises(openai.BadRequestError) as caught:
            client.vector_stores.files.create(vector_store_id=store.id, file_id=file_id)
        assert caught.value.body is not None and caught.value.code in ("invalid_file", "unsupported_file"), (
            name
        )
    with pytest.raises(openai.APIStatusError) as too_big:
        client.vector_stores.files.upload(vector_store_id=store.id, file=("big.txt", b"x" * (65 * 1024)))
    assert too_big.value.status_code == 413
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.files.create(vector_store_id=store.id, file_id="file-none")
    with pytest.raises(openai.BadRequestError):
        client.vector_stores.files.create(
            vector_store_id=store.id,
            file_id=client.files.create(file=("ok.txt", b"fine"), purpose="assistants").id,
            chunking_strategy={
                "type": "static",
                "static": {"max_chunk_size_tokens": 50, "chunk_overlap_tokens": 0},
            },
        )
    after = client.vector_stores.retrieve(store.id)
    assert after.file_counts.total == 0 and after.usage_bytes == 0
    assert list(client.vector_stores.files.list(store.id)) == []


def test_pdf_and_html_are_read_as_text(gw: Gateway) -> None:
    client = _client(gw)
    store = client.vector_stores.create(name="docs")
    pdf = client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id,
        file=("facts.pdf", make_pdf("The capital of Freedonia is Fredville.", "Its river is the Fred.")),
        poll_interval_ms=100,
    )
    assert pdf.status == "completed"
    [hit] = client.vector_stores.search(store.id, query="capital of Freedonia").data
    assert (
        hit.filename == "facts.pdf" and "Fredville" in hit.content[0].text and "river" in hit.content[0].text
    )
    html = client.vector_stores.files.upload_and_poll(
        vector_store_id=store.id, file=("bread.html", CORPUS["bread.html"][0]), poll_interval_ms=100
    )
    assert html.status == "completed"
    top = client.vector_stores.search(store.id, query="knead the dough", max_num_results=1).data[0]
    assert (
        top.filename == "bread.html" and "knead" in top.content[0].text and "<p>" not in top.content[0].text
    )


def test_static_chunking(gw: Gateway) -> None:
    client = _client(gw)
    store = client.vector_stores.create(name="chunks")
    words = " ".join(f"word{i}" for i in range(400))
    file_id = client.files.create(file=("long.txt", words.encode()), purpose="assistants").id
    done = client.vector_stores.files.create_and_poll(
        vector_store_id=store.id,
        file_id=file_id,
        chunking_strategy={
            "type": "static",
            "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 50},
        },
        poll_interval_ms=100,
    )
    assert done.chunking_strategy.static.max_chunk_size_tokens == 100  # type: ignore[union-attr]
    hits = client.vector_stores.search(store.id, query="word399", max_num_results=50).data
    # Several overlapping chunks of the one file; the last word is in the last chunk and the one before.
    assert len(hits) > 5
    assert sum("word399" in h.content[0].text for h in hits) >= 1
    assert all(h.file_id == file_id for h in hits)
    # Chunks overlap: usage counts the overlapping text twice.
    assert done.usage_bytes > len(words)


def test_chunk_sizes_are_openais_tokens(gw: Gateway) -> None:
    """``max_chunk_size_tokens`` counts OpenAI's tokens (cl100k_base): the content of a file of a
    known token count comes back in chunks of exactly those sizes."""
    client = _client(gw)
    store = client.vector_stores.create(name="tokens")
    encoding = cl100k().encoding

    def chunks_of(name: str, text: str, strategy: Any) -> list[str]:
        done = client.vector_stores.files.upload_and_poll(
            vector_store_id=store.id,
            file=(name, text.encode()),
            chunking_strategy=strategy,
            poll_interval_ms=100,
        )
        assert done.status == "completed", done.last_error
        page = client.vector_stores.files.content(done.id, vector_store_id=store.id)
        return [part.text or "" for part in page]

    # 1,000 tokens (HELLO, test_chunking.py), static 100/0: ten chunks of exactly 100 tokens.
    static = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 0}}
    texts = chunks_of("hello.txt", HELLO, static)
    assert texts == ["hello" + " hello" * 99] + [" hello" * 100] * 9
    assert [len(encoding.encode_ordinary(t)) for t in texts] == [100] * 10
    # 2,000 tokens with the default strategy (auto: 800 overlapping by 400): four chunks of 800.
    long = "hello" + " hello" * 1999
    texts = chunks_of("long.txt", long, None)
    assert [len(encoding.encode_ordinary(t)) for t in texts] == [800] * 4
    assert texts[1:] == [" hello" * 800] * 3
    # Multi-byte characters split across tokens: tiktoken's own placement, nothing lost or doubled.
    mixed = MIXED * 12
    overlapping = {"type": "static", "static": {"max_chunk_size_tokens": 128, "chunk_overlap_tokens": 32}}
    texts = chunks_of("mixed.txt", mixed, overlapping)
    assert texts == oracle(mixed, 128, 32)
    assert len(texts) == expected_count(len(encoding.encode_ordinary(mixed)), 128, 32)
    assert_tiles(mixed, texts, 128, 32)


# ------------------------------------------------------------------ embeddings
def test_embeddings(gw: Gateway) -> None:
    client = _client(gw)
    out = client.embeddings.create(
        model=MODEL, input=["a cat purrs", "a kitten purring", "the compiler failed"]
    )
    assert out.model == MODEL and out.object == "list" and [d.index for d in out.data] == [0, 1, 2]
    vectors = np.array([d.embedding for d in out.data])
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-4)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    assert out.usage.prompt_tokens == out.usage.total_tokens > 6
    single = client.embeddings.create(model=MODEL, input="a cat purrs", encoding_format="float")
    assert np.allclose(single.data[0].embedding, vectors[0], atol=1e-5)
    # The SDK asks for base64 by default and decodes it; ask for it by hand too.
    raw = client.embeddings.with_raw_response.create(
        model=MODEL, input="a cat purrs", encoding_format="base64"
    )
    decoded = np.frombuffer(base64.b64decode(raw.http_response.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, vectors[0], atol=1e-5)
    assert client.embeddings.create(model=MODEL, input="x", dimensions=384).data[0].embedding
    for bad in ({"dimensions": 128}, {"input": []}, {"input": [1, 2, 3]}, {"input": ""}):
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(**{"model": MODEL, "input": "x", **bad})  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base_url, api_key="wrong", max_retries=0).embeddings.create(
            model=MODEL, input="x"
        )


# ------------------------------------------------------------------ SQLite and PostgreSQL
def test_sqlite_and_postgresql_give_the_same_results(
    gw: Gateway, corpus: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    pg = _start(fresh_pg_database("rg_vector_stores_test"), tmp_path)
    try:
        pg_store, _ = _load_corpus(_client(pg))
        sqlite_store, _ = corpus
        vectors_only = {"ranking_options": {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}}}
        text_only = {"ranking_options": {"hybrid_search": {"embedding_weight": 0, "text_weight": 1}}}
        older = {"filters": {"type": "lt", "key": "year", "value": 2022}}
        for question in [*QUESTIONS, "anything about animals or code", "Etna"]:
            # The same chunks, vectors and BM25 index code on both (vectors by default: in memory on
            # SQLite, pgvector on PostgreSQL): the same ranking, whole.
            for options in (
                vectors_only,
                {**vectors_only, **older},
                {},
                {"max_num_results": 2},
                older,
                text_only,
            ):
                lite = _top_files(_client(gw), sqlite_store, question, **options)
                post = _top_files(_client(pg), pg_store, question, **options)
                assert lite == post, (question, options, lite, post)
        for question, expected in QUESTIONS.items():
            assert _top_files(_client(pg), pg_store, question)[0] == expected
    finally:
        pg.stop()


def test_a_write_through_one_instance_reaches_the_other(tmp_path: Path) -> None:
    """Two gateways on one PostgreSQL database: the BM25 and vector indexes one holds in memory follow
    the other's writes (the store's version moves), for a file attached and then detached."""
    url = fresh_pg_database("rg_vector_stores_two")
    one, two = _start(url, tmp_path / "one"), _start(url, tmp_path / "two")
    try:
        text_only = {"hybrid_search": {"embedding_weight": 0, "text_weight": 1}}
        first, second = _client(one), _client(two)
        store = first.vector_stores.create(name="shared")
        cats = first.files.create(file=("cats.txt", CORPUS["cats.txt"][0]), purpose="assistants")
        first.vector_stores.files.create_and_poll(
            vector_store_id=store.id, file_id=cats.id, poll_interval_ms=100
        )
        # Both indexes of the first gateway are built now, without the volcano file.
        assert _top_files(first, store.id, "magma Etna", ranking_options=text_only) == []
        assert _top_files(first, store.id, "magma Etna", max_num_results=5) == ["cats.txt"]
        lava = second.files.create(file=("volcanoes.md", CORPUS["volcanoes.md"][0]), purpose="assistants")
        second.vector_stores.files.create_and_poll(
            vector_store_id=store.id, file_id=lava.id, poll_interval_ms=100
        )
        assert _top_files(first, store.id, "magma Etna", ranking_options=text_only) == ["volcanoes.md"]
        assert _top_files(first, store.id, "magma Etna", max_num_results=5) == ["volcanoes.md", "cats.txt"]
        second.vector_stores.files.delete(lava.id, vector_store_id=store.id)
        assert _top_files(first, store.id, "magma Etna", ranking_options=text_only) == []
        assert _top_files(first, store.id, "magma Etna", max_num_results=5) == ["cats.txt"]
    finally:
        one.stop()
        two.stop()


# ------------------------------------------------------------------ the file_search tool's entry point
def test_search_for_tool(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await open_store(f"sqlite://{tmp_path}/gateway.db")
        blobs = {
            "file-a": ("cats.txt", CORPUS["cats.txt"][0]),
            "file-b": ("volcanoes.md", CORPUS["volcanoes.md"][0]),
        }

        async def read(owner: str, file_id: str) -> tuple[dict[str, Any], bytes]:
            name, data = blobs[file_id]
            return {"filename": name}, data

        service = VectorStores(lambda: store, read)
        await service.start()
        try:
            ids = []
            for file_id in blobs:
                created = await service.create("alice", {"name": file_id, "chunking_strategy": None})
                await service.attach(
                    "alice",
                    created["id"],
                    file_id,
                    attributes={"f": file_id},
                    chunking={
                        "type": "static",
                        "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400},
                    },
                )
                ids.append(created["id"])
            await service.idle()
            hits = await service.search_for_tool(
                "alice", ids, "lava from Etna", max_num_results=5, filters=None, ranking_options=None
            )
            assert [h["filename"] for h in hits] == ["volcanoes.md", "cats.txt"]
            assert set(hits[0]) == {"file_id", "filename", "score", "attributes", "text"}
            assert hits[0]["file_id"] == "file-b" and hits[0]["attributes"] == {"f": "file-b"}
            assert hits[0]["score"] >= hits[1]["score"] and "Etna" in hits[0]["text"]
            one = await service.search_for_tool(
                "alice",
                ids,
                "lava",
                max_num_results=1,
                filters={"type": "eq", "key": "f", "value": "file-a"},
                ranking_options={"score_threshold": 0},
            )
            assert [h["file_id"] for h in one] == ["file-a"]
            with pytest.raises(LookupError) as missing:
                await service.search_for_tool(
                    "bob", ids, "lava", max_num_results=5, filters=None, ranking_options=None
                )
            assert missing.value.args == (ids[0],)
        finally:
            await service.aclose()
            await store.close()

    asyncio.run(scenario())


# ------------------------------------------------------------ an embeddings upstream (models file)
class _HashEmbeddings(BaseHTTPRequestHandler):
    """An OpenAI-compatible POST /v1/embeddings: a hashed bag of words, ``dimensions[0]`` wide."""

    dimensions: ClassVar[list[int]] = [16]
    seen: ClassVar[list[tuple[str | None, dict[str, Any]]]] = []
    fail: ClassVar[list[bool]] = [False]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        type(self).seen.append((self.headers.get("authorization"), body))
        if self.fail[0]:
            self.send_response(500)
            self.end_headers()
            return
        data = []
        for i, text in enumerate(body["input"]):
            vector = [0.0] * self.dimensions[0]
            for word in text.lower().split():
                vector[zlib.crc32(word.strip(".,?").encode()) % self.dimensions[0]] += 1.0
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = sum(len(t.split()) for t in body["input"])
        out = json.dumps(
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


def test_embeddings_upstream_from_the_models_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _HashEmbeddings)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    monkeypatch.setenv("HASH_EMBED_KEY", "sk-hash-secret")
    config = parse_config(
        "models:\n"
        "  - name: hash-embed\n"
        "    provider: openai-chat\n"
        f"    base_url: http://127.0.0.1:{upstream.server_port}/v1\n"
        "    upstream_model: hash-v1\n"
        "    api_key_env: HASH_EMBED_KEY\n"
    )
    registry = registry_from_config(config, local=False)
    gw = start_gateway(
        registry, store_url=f"sqlite://{tmp_path}/gateway.db", data_dir=str(tmp_path), api_keys=(KEY_A,)
    )
    try:
        client = _client(gw)
        out = client.embeddings.create(model="hash-embed", input=["red apple", "green apple pie"])
        assert out.model == "hash-embed" and len(out.data[0].embedding) == 16
        assert out.usage.prompt_tokens == 5
        auth, body = _HashEmbeddings.seen[-1]
        assert auth == "Bearer sk-hash-secret" and body["model"] == "hash-v1"
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="hash-embed", input="x", dimensions=8)
        store = client.vector_stores.create(name="remote", extra_body={"embedding_model": "hash-embed"})
        assert store.model_extra is not None
        assert (store.model_extra["embedding_model"], store.model_extra["dimensions"]) == ("hash-embed", 16)
        for name in ("cats.txt", "volcanoes.md"):
            done = client.vector_stores.files.upload_and_poll(
                vector_store_id=store.id, file=(name, CORPUS[name][0]), poll_interval_ms=100
            )
            assert done.status == "completed", done.last_error
        vectors_only = {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}}
        assert _top_files(client, store.id, "lava ash", ranking_options=vectors_only)[0] == "volcanoes.md"
        # The upstream now answers with another dimension: refused, never compared across spaces.
        _HashEmbeddings.dimensions[0] = 8
        with pytest.raises(openai.BadRequestError) as mismatch:
            client.vector_stores.search(store.id, query="lava")
        assert mismatch.value.code == "embedding_mismatch"
        late = client.vector_stores.files.upload_and_poll(
            vector_store_id=store.id, file=("bread.html", CORPUS["bread.html"][0]), poll_interval_ms=100
        )
        assert late.status == "failed" and late.last_error is not None
        assert late.last_error.code == "embedding_mismatch"  # type: ignore[comparison-overlap]
        # An upstream failure is a 502 that does not reveal the key.
        _HashEmbeddings.fail[0] = True
        with pytest.raises(openai.APIStatusError) as failed:
            client.embeddings.create(model="hash-embed", input="x")
        assert failed.value.status_code == 502 and "sk-hash-secret" not in failed.value.response.text
    finally:
        gw.stop()
        upstream.shutdown()
        _HashEmbeddings.dimensions[0] = 16
        _HashEmbeddings.fail[0] = False


# ------------------------------------------------------------------ the CLI's gateway process
def test_vector_stores_through_a_serve_process(tmp_path: Path) -> None:
    """``responses-gateway serve`` as a user starts it: the vector store API and embeddings are there."""
    script = tmp_path / "m.json"
    script.write_text('{"model": "m", "turns": [{"steps": [{"message": "ok"}]}]}')
    with serving(tmp_path, "--no-local", "--script", str(script), "--api-key", KEY_A) as served:
        client = openai.OpenAI(base_url=served.base_url, api_key=KEY_A, max_retries=0, timeout=60)
        store = client.vector_stores.create(name="cli")
        done = client.vector_stores.files.upload_and_poll(
            vector_store_id=store.id, file=("volcanoes.md", CORPUS["volcanoes.md"][0]), poll_interval_ms=100
        )
        assert done.status == "completed"
        [hit] = client.vector_stores.search(store.id, query="Etna").data
        assert hit.filename == "volcanoes.md" and "Etna" in hit.content[0].text
        assert len(client.embeddings.create(model=MODEL, input="Etna").data[0].embedding) == 384


def test_ingestion_left_in_progress_resumes_at_start(tmp_path: Path) -> None:
    """A file a stopped gateway left ``in_progress`` is ingested when the next one starts."""

    async def scenario() -> None:
        store = await open_store(f"sqlite://{tmp_path}/gateway.db")

        async def read(owner: str, file_id: str) -> tuple[dict[str, Any], bytes]:
            assert owner == "alice"
            return {"filename": "orbits.json"}, CORPUS["orbits.json"][0]

        try:
            first = VectorStores(lambda: store, read)
            await first.start()
            created = await first.create("alice", {"name": "resume", "chunking_strategy": None})
            # As a crash would leave it: attached, never ingested.
            await first.tables.add_file(
                "alice",
                created["id"],
                "file-o",
                filename="orbits.json",
                created_at=0,
                attributes={},
                chunking_strategy={
                    "type": "static",
                    "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400},
                },
            )
            await first.aclose()
            second = VectorStores(lambda: store, read)
            await second.start()
            await second.idle()
            found = await second.tables.get_file("alice", created["id"], "file-o")
            assert found["status"] == "completed", found
            hits = await second.search(
                "alice", created["id"], "Kepler", max_num_results=3, filters=None, ranking_options=None
            )
            assert [h["file_id"] for h in hits] == ["file-o"]
            await second.aclose()
        finally:
            await store.close()

    asyncio.run(scenario())
