"""A vector store's life over HTTP with the openai SDK, on SQLite and PostgreSQL (docs/file-search.md):
a file's parsed chunks (``vector_stores.files.content``), deleting a Files API file detaches it from
every store, ``expires_after`` (refused once expired, ``last_active_at`` moved by searches and
``file_search``, deleted with its chunks by the sweep of another instance sharing the database), and
ownership of each of these routes.

Time is moved by ageing a store's ``last_active_at`` in the database (``expires_after.days`` is at
least 1), the only thing a test cannot wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from conftest import Gateway, start_gateway
from direct_sql import sql
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.store import database_for_url
from responses_gateway.store.db import Database
from responses_gateway.store.schema import migrate
from responses_gateway.store.vector_stores import VectorStoreTables
from test_store_services import fresh_pg_database

KEY_A, KEY_B = "life-key-a", "life-key-b"
DAY = 86400
ONE_DAY = {"anchor": "last_active_at", "days": 1}
STATIC = {"type": "static", "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 0}}

# Long enough for several 100-token chunks; every sentence distinct.
ESSAY = " ".join(
    f"Paragraph {n} of the lighthouse keeper's log notes that the {color} lamp was trimmed at "
    f"{n + 5} o'clock and the fog horn sounded {n * 3} times before the {ship} passed the reef."
    for n, color, ship in zip(
        range(1, 13),
        ["red", "green", "amber", "white", "blue", "violet"] * 2,
        ["Endeavour", "Beagle", "Bounty", "Victory", "Resolute", "Discovery"] * 2,
        strict=True,
    )
).encode()
OTHER = b"Sourdough bread needs a starter of flour and water, fed daily, and a long cold proof."
SEARCH_SCRIPT = {
    "turns": [
        {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["Done."]}]},
        {"steps": [{"function_call": {"name": "file_search", "arguments": ['{"queries": ["fog horn"]}']}}]},
    ]
}


def _client(gw: Gateway, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=60)


class Served:
    """A gateway (sweeping once a minute) on a database the test also reads and writes directly."""

    def __init__(self, url: str, data: Path) -> None:
        self.url = url
        self.data = data
        common: dict[str, Any] = {
            "store_url": url,
            "data_dir": str(data),
            "api_keys": (KEY_A, KEY_B),
            "max_file_bytes": 64 * 1024,
        }
        self.gw = start_gateway([ScriptedProvider(SEARCH_SCRIPT, name="searcher")], **common)
        self._common = common

    @contextlib.contextmanager
    def sweeping(self) -> Iterator[Gateway]:
        """A second instance on the same database and files, sweeping expired things every 0.2 s."""
        sweeper = start_gateway(
            [ScriptedProvider(SEARCH_SCRIPT, name="searcher")], expiry_sweep_interval=0.2, **self._common
        )
        try:
            yield sweeper
        finally:
            sweeper.stop()

    def stop(self) -> None:
        self.gw.stop()

    # ---------------------------------------------------------------- the database, directly
    def sql(self, statement: str, *args: Any) -> list[tuple[Any, ...]]:
        return sql(self.url, statement, *args)

    def age(self, store_id: str, seconds: int) -> None:
        """Move the store's last use ``seconds`` into the past (its expiry with it)."""
        self.sql(
            "UPDATE rg_vector_stores SET last_active_at = last_active_at - ?, "
            "expires_at = expires_at - ? WHERE id = ?",
            seconds,
            seconds,
            store_id,
        )

    def chunks(self, store_id: str) -> int:
        return int(self.sql("SELECT COUNT(*) FROM rg_vs_chunks WHERE vector_store_id = ?", store_id)[0][0])

    def postings(self, store_id: str) -> int:
        """The store's attachments with stored BM25 postings (they go with the chunks)."""
        return int(self.sql("SELECT COUNT(*) FROM rg_vs_bm25 WHERE vector_store_id = ?", store_id)[0][0])


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data = tmp_path_factory.mktemp(f"life-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite://{data}/gateway.db"
    else:
        url = fresh_pg_database("rg_vs_lifecycle_test")
    both = Served(url, data)
    yield both
    both.stop()


def _store_with(client: openai.OpenAI, files: dict[str, bytes], **create: Any) -> tuple[str, dict[str, str]]:
    store = client.vector_stores.create(name="log", **create)
    ids = {}
    for name, data in files.items():
        ids[name] = client.files.create(file=(name, data), purpose="assistants").id
        attached = client.vector_stores.files.create_and_poll(
            vector_store_id=store.id, file_id=ids[name], chunking_strategy=STATIC, poll_interval_ms=100
        )
        assert attached.status == "completed", attached
    return store.id, ids


def _no_access(other: openai.OpenAI, store_id: str, file_id: str) -> None:
    with pytest.raises(openai.NotFoundError):
        other.vector_stores.files.content(file_id, vector_store_id=store_id)
    with pytest.raises(openai.NotFoundError):
        other.vector_stores.search(store_id, query="fog horn")


def test_a_files_parsed_chunks(served: Served) -> None:
    client = _client(served.gw)
    store_id, ids = _store_with(client, {"log.txt": ESSAY})
    page = client.vector_stores.files.content(ids["log.txt"], vector_store_id=store_id)
    texts = [part.text for part in page]
    assert len(texts) >= 3 and all(part.type == "text" for part in page)
    # 100-token chunks without overlap, in file order: together they are the file's text.
    assert "".join(t or "" for t in texts) == ESSAY.decode()
    raw = httpx.get(
        f"{served.gw.base_url}/vector_stores/{store_id}/files/{ids['log.txt']}/content",
        headers={"authorization": f"Bearer {KEY_A}"},
    ).json()
    assert raw["object"] == "vector_store.file_content.page"
    assert raw["has_more"] is False and raw["next_page"] is None
    # What search returns is one of these chunks.
    hit = client.vector_stores.search(store_id, query="fog horn sounded 21 times").data[0]
    assert hit.content[0].text in texts
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.files.content("file-missing", vector_store_id=store_id)
    _no_access(_client(served.gw, KEY_B), store_id, ids["log.txt"])


def test_deleting_a_file_detaches_it_everywhere(served: Served) -> None:
    client, other = _client(served.gw), _client(served.gw, KEY_B)
    first, ids = _store_with(client, {"log.txt": ESSAY, "bread.txt": OTHER})
    log_id, bread_id = ids["log.txt"], ids["bread.txt"]
    second = client.vector_stores.create(name="second", file_ids=[log_id], chunking_strategy=STATIC)
    deadline = time.monotonic() + 60
    while client.vector_stores.retrieve(second.id).file_counts.completed != 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert client.vector_stores.search(second.id, query="lighthouse fog horn").data
    # Another key cannot delete it, and nothing changes.
    with pytest.raises(openai.NotFoundError):
        other.files.delete(log_id)
    assert client.vector_stores.retrieve(first).file_counts.completed == 2

    assert client.files.delete(log_id).deleted
    for store_id, left in ((first, [bread_id]), (second.id, [])):
        assert [f.id for f in client.vector_stores.files.list(store_id)] == left
        counts = client.vector_stores.retrieve(store_id).file_counts
        assert (counts.completed, counts.total) == (len(left), len(left))
        with pytest.raises(openai.NotFoundError):
            client.vector_stores.files.retrieve(log_id, vector_store_id=store_id)
        with pytest.raises(openai.NotFoundError):
            client.vector_stores.files.content(log_id, vector_store_id=store_id)
        hits = client.vector_stores.search(store_id, query="lighthouse fog horn", max_num_results=50).data
        assert [h.file_id for h in hits] == [bread_id] * len(hits)
    assert served.chunks(second.id) == 0


def test_last_active_at_moves_on_search_and_file_search(served: Served) -> None:
    client = _client(served.gw)
    policy = {"anchor": "last_active_at", "days": 2}
    store_id, _ = _store_with(client, {"log.txt": ESSAY}, expires_after=policy)
    served.age(store_id, 3600)
    aged = client.vector_stores.retrieve(store_id)
    assert aged.status == "completed" and aged.expires_at == aged.last_active_at + 2 * DAY
    assert aged.last_active_at <= time.time() - 3590

    client.vector_stores.search(store_id, query="fog horn")
    used = client.vector_stores.retrieve(store_id)
    assert used.last_active_at >= time.time() - 5 and used.expires_at == used.last_active_at + 2 * DAY

    served.age(store_id, 3600)
    response = client.responses.create(
        model="searcher",
        input="When did the fog horn sound?",
        tools=[{"type": "file_search", "vector_store_ids": [store_id]}],
    )
    assert response.output[0].type == "file_search_call" and response.output[0].status == "completed"
    assert client.vector_stores.retrieve(store_id).last_active_at >= time.time() - 5
    # A new policy counts from the last use; none removes the expiry.
    longer = client.vector_stores.update(store_id, expires_after={"anchor": "last_active_at", "days": 30})
    assert longer.expires_at == longer.last_active_at + 30 * DAY
    assert client.vector_stores.update(store_id, expires_after=None).expires_at is None


def test_an_expired_store_is_refused_then_swept(served: Served) -> None:
    client, other = _client(served.gw), _client(served.gw, KEY_B)
    store_id, ids = _store_with(client, {"log.txt": ESSAY}, expires_after=ONE_DAY)
    kept, _ = _store_with(client, {"bread.txt": OTHER})
    assert served.chunks(store_id) > 0 and served.postings(store_id) == 1
    served.age(store_id, DAY + 10)

    expired = client.vector_stores.retrieve(store_id)
    assert expired.status == "expired" and expired.expires_at is not None and expired.expires_at < time.time()
    before = expired.last_active_at
    with pytest.raises(openai.BadRequestError) as err:
        client.vector_stores.search(store_id, query="fog horn")
    assert err.value.code == "vector_store_expired" and store_id in err.value.message
    spare = client.files.create(file=("spare.txt", OTHER), purpose="assistants")
    with pytest.raises(openai.BadRequestError) as err:
        client.vector_stores.files.create(vector_store_id=store_id, file_id=spare.id)
    assert err.value.code == "vector_store_expired"
    with pytest.raises(openai.BadRequestError) as err:
        client.vector_stores.file_batches.create(vector_store_id=store_id, file_ids=[spare.id])
    assert err.value.code == "vector_store_expired"
    assert (
        served.sql("SELECT COUNT(*) FROM rg_vector_store_batches WHERE vector_store_id = ?", store_id)[0][0]
        == 0
    )
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="searcher",
            input="When did the fog horn sound?",
            tools=[{"type": "file_search", "vector_store_ids": [kept, store_id]}],
        )
    assert err.value.param == "tools[0].vector_store_ids[1]" and "expired" in err.value.message
    assert err.value.code == "vector_store_expired"
    # Refusals are not uses: it stays expired. Reading it still works; another key sees nothing.
    assert client.vector_stores.retrieve(store_id).last_active_at == before
    assert [p.text for p in client.vector_stores.files.content(ids["log.txt"], vector_store_id=store_id)]
    with pytest.raises(openai.NotFoundError):
        other.vector_stores.retrieve(store_id)
    _no_access(other, store_id, ids["log.txt"])

    # Another instance on the same database sweeps it away, chunks and all; the first sees it gone.
    with served.sweeping():
        deadline = time.monotonic() + 30
        while served.sql("SELECT COUNT(*) FROM rg_vector_stores WHERE id = ?", store_id)[0][0]:
            assert time.monotonic() < deadline, "the sweep did not delete the expired store"
            time.sleep(0.1)
    assert served.chunks(store_id) == 0 and served.postings(store_id) == 0
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve(store_id)
    assert store_id not in [s.id for s in client.vector_stores.list(limit=100)]
    # The store without a policy, and the Files API file, stay.
    assert client.vector_stores.retrieve(kept).status == "completed"
    assert client.files.retrieve(ids["log.txt"]).id == ids["log.txt"]


def test_concurrent_sweeps_delete_each_store_once(served: Served) -> None:
    """Instances (here three connections, as three gateways would hold) sweeping one expired store at
    the same moment: exactly one deletes it, the others find it gone."""
    client = _client(served.gw)
    store_id, _ = _store_with(client, {"bread.txt": OTHER}, expires_after=ONE_DAY)
    served.age(store_id, DAY + 10)

    async def race() -> list[bool]:
        dbs: list[Database] = [database_for_url(served.url) for _ in range(3)]
        for db in dbs:
            await db.open()
            await migrate(db)
        try:
            tables = [VectorStoreTables(db) for db in dbs]
            now = int(time.time())
            return list(await asyncio.gather(*(t.delete_expired(store_id, now) for t in tables)))
        finally:
            for db in dbs:
                await db.close()

    assert sorted(asyncio.run(race())) == [False, False, True]
    assert served.chunks(store_id) == 0
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve(store_id)


def test_a_file_expires_after(served: Served) -> None:
    client = _client(served.gw)
    hour = client.files.create(
        file=("log.txt", ESSAY), purpose="assistants", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    assert hour.expires_at == hour.created_at + 3600
    assert client.files.retrieve(hour.id).expires_at == hour.expires_at
    batch = client.files.create(file=("requests.jsonl", b"{}\n"), purpose="batch")
    assert batch.expires_at == batch.created_at + 30 * DAY  # OpenAI's default for batch files
    assert client.files.create(file=("a.txt", b"a"), purpose="user_data").expires_at is None
    for policy, param in (
        ({"anchor": "created_at", "seconds": 60}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 31 * DAY}, "expires_after.seconds"),
        ({"anchor": "last_active_at", "seconds": 3600}, "expires_after.anchor"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.files.create(file=("a.txt", b"a"), purpose="user_data", expires_after=policy)  # type: ignore[arg-type]
        assert err.value.param == param

    store_id, _ = _store_with(client, {})
    attached = client.vector_stores.files.create_and_poll(
        vector_store_id=store_id, file_id=hour.id, chunking_strategy=STATIC, poll_interval_ms=100
    )
    assert attached.status == "completed" and served.chunks(store_id) > 0 and served.postings(store_id) == 1
    served.sql("UPDATE rg_files SET expires_at = ? WHERE id = ?", int(time.time()) - 1, hour.id)
    # Expired: gone for its owner at once, like a deleted file.
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(hour.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(hour.id)
    assert hour.id not in [f.id for f in client.files.list()]
    # The sweep (another instance) deletes it, its bytes, and its place in the vector store.
    with served.sweeping():
        deadline = time.monotonic() + 30
        while served.sql("SELECT COUNT(*) FROM rg_files WHERE id = ?", hour.id)[0][0]:
            assert time.monotonic() < deadline, "the sweep did not delete the expired file"
            time.sleep(0.1)
    assert not (served.data / "files" / hour.id).exists()
    assert (served.data / "files" / batch.id).exists()
    assert list(client.vector_stores.files.list(store_id)) == []
    assert client.vector_stores.retrieve(store_id).file_counts.total == 0 and served.chunks(store_id) == 0
    assert served.postings(store_id) == 0


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_migration_gives_existing_stores_their_expiry(
    dialect: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database made before ``expires_at`` existed: its stores with a policy get their expiry."""
    from responses_gateway.store import schema

    adds = next(v for v, steps in schema.MIGRATIONS if any("ADD COLUMN expires_at" in str(s) for s in steps))
    url = f"sqlite://{tmp_path}/old.db" if dialect == "sqlite" else fresh_pg_database("rg_vs_backfill_test")

    async def run() -> list[tuple[Any, ...]]:
        db = database_for_url(url)
        await db.open()
        try:
            with monkeypatch.context() as old:
                old.setattr(schema, "MIGRATIONS", [m for m in schema.MIGRATIONS if m[0] < adds])
                old.setattr(schema, "SCHEMA_VERSION", adds - 1)
                await schema.migrate(db)
            async with db.transaction() as tx:
                for store_id, policy in (("vs_a", '{"anchor": "last_active_at", "days": 3}'), ("vs_b", None)):
                    await tx.execute(
                        "INSERT INTO rg_vector_stores (id, owner, created_at, metadata, expires_after, "
                        "last_active_at, embedding_model, dimensions) "
                        "VALUES (?, 'o', 100, '{}', ?, 500, 'm', 3)",
                        store_id,
                        policy,
                    )
            assert await migrate(db) == adds - 1
            async with db.transaction() as tx:
                return list(await tx.fetch("SELECT id, expires_at FROM rg_vector_stores ORDER BY id"))
        finally:
            await db.close()

    assert [tuple(r) for r in asyncio.run(run())] == [("vs_a", 500 + 3 * DAY), ("vs_b", None)]


def test_deleting_a_store_while_an_ingestion_finishes_does_not_deadlock(served: Served) -> None:
    """PostgreSQL: an ingestion finishing (it holds its attachment's row, then bumps the store's
    version) and a delete of the same store at that moment. The delete waits for the attachment
    before it touches the store, so both complete instead of one dying in a deadlock."""
    if not served.url.startswith("postgresql"):
        pytest.skip("SQLite's write transactions are serial: no row locks to order")
    client = _client(served.gw)
    store_id, ids = _store_with(client, {"log.txt": ESSAY})
    owner = served.sql("SELECT owner FROM rg_vector_stores WHERE id = ?", store_id)[0][0]

    async def race() -> None:
        import asyncpg

        ingestion = await asyncpg.connect(served.url)
        db = database_for_url(served.url)
        await db.open()
        try:
            tx = ingestion.transaction()
            await tx.start()
            await ingestion.fetch(
                "SELECT status FROM rg_vector_store_files WHERE vector_store_id = $1 AND file_id = $2 "
                "FOR UPDATE",
                store_id,
                ids["log.txt"],
            )
            delete = asyncio.create_task(VectorStoreTables(db).delete_store(owner, store_id))
            await asyncio.sleep(0.5)
            assert not delete.done()  # waiting for the attachment the ingestion holds
            await ingestion.execute(
                "UPDATE rg_vector_stores SET version = version + 1 WHERE id = $1", store_id
            )
            await tx.commit()
            await asyncio.wait_for(delete, 30)
        finally:
            await ingestion.close()
            await db.close()

    asyncio.run(race())
    assert served.chunks(store_id) == 0
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve(store_id)


@pytest.mark.parametrize(
    ("dialect", "index"), [("sqlite", "auto"), ("sqlite", "sqlite-vec"), ("postgresql", "auto")]
)
def test_an_instance_started_before_any_store_serves_another_instances_stores(
    dialect: str, index: str, tmp_path: Path
) -> None:
    """An instance that started on a database holding no vector store has not opened its indexes
    (nor loaded numpy: ``test_serve_config``): stores another instance made afterwards are deleted,
    their chunks with them, and searched through it, by the API and by file_search."""
    url = f"sqlite://{tmp_path}/gateway.db" if dialect == "sqlite" else fresh_pg_database("rg_vs_late_test")
    common: dict[str, Any] = {
        "store_url": url,
        "data_dir": str(tmp_path),
        "api_keys": (KEY_A, KEY_B),
        "vector_index": index,
    }
    early = start_gateway([ScriptedProvider(SEARCH_SCRIPT, name="searcher")], **common)
    try:
        late = start_gateway([ScriptedProvider(SEARCH_SCRIPT, name="searcher")], **common)
        try:
            kept, _ = _store_with(_client(late), {"log.txt": ESSAY})
            dropped, _ = _store_with(_client(late), {"bread.txt": OTHER})
        finally:
            late.stop()
        count = "SELECT COUNT(*) FROM rg_vs_chunks WHERE vector_store_id = ?"
        # The vectors are also in an in-database search table on PostgreSQL (pgvector) and with
        # sqlite-vec; its rows go with the store (sqlite-vec's through the index's ``forget``).
        synced = "SELECT COUNT(*) FROM rg_vs_vec_sync WHERE vector_store_id = ?"
        assert sql(url, count, dropped)[0][0] > 0
        assert (sql(url, synced, dropped)[0][0] > 0) == (dialect == "postgresql" or index == "sqlite-vec")
        client = _client(early)
        # A delete first (it opens the indexes: the store's in-database rows go too), then searches.
        assert client.vector_stores.delete(dropped).deleted
        assert sql(url, count, dropped)[0][0] == 0
        assert sql(url, synced, dropped)[0][0] == 0
        hits = client.vector_stores.search(kept, query="fog horn")
        assert hits.data and "fog horn" in hits.data[0].content[0].text
        response = client.responses.create(
            model="searcher",
            input="When did the fog horn sound?",
            tools=[{"type": "file_search", "vector_store_ids": [kept]}],
            include=["file_search_call.results"],
        )
        call = response.output[0]
        assert call.type == "file_search_call" and call.status == "completed"
        assert call.results and "fog horn" in (call.results[0].text or "")
    finally:
        early.stop()
