"""The Files API (/v1/files) with the openai SDK, on SQLite and PostgreSQL; files into containers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from conftest import Gateway
from responses_gateway.providers.scripted import ScriptedProvider
from responses_gateway.sandbox import probe
from test_store_services import fresh_pg_database

Factory = Callable[..., Gateway]
PG_DB = "rg_files_api_test"
_pg_ready: dict[str, str] = {}
KEY_A, KEY_B = "key-a", "key-b"


def _pg_url() -> str:
    """A database of this module's own on the test server, emptied once per session."""
    if "url" not in _pg_ready:
        _pg_ready["url"] = fresh_pg_database(PG_DB)
    return _pg_ready["url"]


@pytest.fixture(params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, gateway: Factory, tmp_path: Path) -> Iterator[Gateway]:
    url = f"sqlite://{tmp_path}/data/gateway.db" if request.param == "sqlite" else _pg_url()
    provider = ScriptedProvider([{"message": ["ok"]}], name="m")
    yield gateway(
        [provider],
        store_url=url,
        data_dir=str(tmp_path / "data"),
        api_keys=(KEY_A, KEY_B),
        max_file_bytes=4096,
    )


def _client(gw: Gateway, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def test_upload_list_retrieve_download_delete(served: Gateway, tmp_path: Path) -> None:
    client = _client(served)
    notes = client.files.create(file=("notes.txt", b"hello files\n"), purpose="user_data")
    assert notes.id.startswith("file-") and notes.object == "file"
    assert (notes.filename, notes.bytes, notes.purpose, notes.status) == (
        "notes.txt",
        12,
        "user_data",
        "processed",
    )
    data = client.files.create(file=("data.csv", b"a,b\n1,2\n"), purpose="assistants")
    assert client.files.retrieve(notes.id).model_dump() == notes.model_dump()
    assert client.files.content(notes.id).read() == b"hello files\n"
    # On disk under the data directory, one file per id.
    assert (tmp_path / "data" / "files" / notes.id).read_bytes() == b"hello files\n"
    # Lists: newest first by default, a purpose filter, pages.
    assert [f.id for f in client.files.list()] == [data.id, notes.id]
    assert [f.id for f in client.files.list(purpose="user_data")] == [notes.id]
    first = client.files.list(limit=1, order="asc")
    assert [f.id for f in first.data] == [notes.id] and first.has_more
    assert [f.id for f in client.files.list(limit=1, order="asc", after=notes.id).data] == [data.id]
    # Another key sees none of it.
    other = _client(served, KEY_B)
    assert list(other.files.list()) == []
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(notes.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(notes.id)
    deleted = client.files.delete(notes.id)
    assert deleted.id == notes.id and deleted.deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(notes.id)
    assert not (tmp_path / "data" / "files" / notes.id).exists()


def test_limits_and_mistakes(served: Gateway, tmp_path: Path) -> None:
    client = _client(served)
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("big.bin", b"x" * 5000), purpose="user_data")
    assert err.value.status_code == 413 and "--max-file-bytes" in err.value.message
    assert not any(p.name.startswith(".upload-") for p in (tmp_path / "data" / "files").iterdir())
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=("a.txt", b"x"), purpose="homework")  # type: ignore[arg-type]
    assert bad.value.body["param"] == "purpose"  # type: ignore[index]
    got = httpx.post(
        f"{served.base_url}/files",
        json={"purpose": "user_data"},
        headers={"authorization": f"Bearer {KEY_A}"},
    )
    assert got.status_code == 400 and got.json()["error"]["param"] == "file"
    got = httpx.post(
        f"{served.base_url}/files",
        data={"purpose": "user_data"},
        files={"other": ("a", b"x")},
        headers={"authorization": f"Bearer {KEY_A}"},
    )
    assert got.status_code == 400 and got.json()["error"]["code"] == "missing_required_parameter"


def test_list_pages_as_openai(served: Gateway) -> None:
    """OpenAI's Files list: one page of up to 10,000 files by default (not 20), newest first."""
    client = _client(served)
    ids = [client.files.create(file=(f"f{n}.txt", b"x"), purpose="user_data").id for n in range(23)]
    mine = set(ids)  # on PostgreSQL the module's database also holds the other tests' files
    first = client.files.list()
    assert [f.id for f in first.data if f.id in mine] == ids[::-1] and not first.has_more
    assert len(client.files.list(limit=10_000).data) == len(first.data) > 20
    with pytest.raises(openai.BadRequestError) as err:
        client.files.list(limit=10_001)
    assert err.value.param == "limit"
    # The SDK's auto-pagination walks small pages with after=<last id>.
    assert [f.id for f in client.files.list(limit=5, order="asc") if f.id in mine] == ids


def test_without_a_store_files_are_a_clear_404(gateway: Factory) -> None:
    gw = gateway([ScriptedProvider([{"message": ["ok"]}], name="m")])
    got = httpx.get(f"{gw.base_url}/files")
    assert got.status_code == 404 and "without a store" in got.json()["error"]["message"]


@pytest.mark.skipif(probe() is not None, reason="the code sandbox cannot start here")
def test_uploaded_files_reach_a_container(gateway: Factory, tmp_path: Path) -> None:
    code = "print(open('/mnt/data/data.csv').read().count('\\n'))"
    script = {
        "turns": [
            {"when": {"input_has": "function_call_output"}, "steps": [{"message": ["done"]}]},
            {
                "steps": [
                    {"function_call": {"name": "code_interpreter", "arguments": [json.dumps({"code": code})]}}
                ]
            },
        ]
    }
    provider = ScriptedProvider(script, name="m")
    gw = gateway([provider], store_url=f"sqlite://{tmp_path}/gateway.db", data_dir=str(tmp_path))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    upload = client.files.create(file=("data.csv", b"a\n1\n2\n"), purpose="user_data")
    tool = {"type": "code_interpreter", "container": {"type": "auto", "file_ids": [upload.id]}}
    client.responses.create(model="m", input="count", tools=[tool])  # type: ignore[list-item]
    assert provider.requests[-1].input[-1]["output"] == "3\n"
    # The Containers API takes file ids too, at creation and one at a time.
    container = client.containers.create(name="c", file_ids=[upload.id])
    assert [f.path for f in client.containers.files.list(container.id)] == ["/mnt/data/data.csv"]
    again = client.containers.files.create(container.id, file_id=upload.id)
    assert again.path == "/mnt/data/data.csv" and again.bytes == 6
    with pytest.raises(openai.BadRequestError):
        client.containers.create(name="c", file_ids=["file-nope"])
    bad = {"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["file-nope"]}}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input="count", tools=[bad])  # type: ignore[list-item]
    assert err.value.body["param"] == "tools[0].container.file_ids[0]"  # type: ignore[index]
