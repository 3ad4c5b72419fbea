"""The Containers API: ``/v1/containers`` and their files, as OpenAI serves them.

A container is where ``code_interpreter`` runs code (``engine/tools/containers.py``): made here or by a
request with ``container: {"type": "auto"}``; its files are what users uploaded and what code wrote
under ``/mnt/data``. Every container belongs to the API key that made it; another key's is a 404
exactly like a missing one.

=============================================================  ====================================
``POST /v1/containers``                                         create (``name``, ``expires_after``)
``GET /v1/containers``                                          list (``after``, ``limit``, ``order``)
``GET /v1/containers/{id}``                                     retrieve
``DELETE /v1/containers/{id}``                                  delete (its kernel and files)
``POST /v1/containers/{id}/files``                              upload (multipart ``file``)
``GET /v1/containers/{id}/files``                               list
``GET /v1/containers/{id}/files/{file}``                        retrieve
``GET /v1/containers/{id}/files/{file}/content``                the bytes
``DELETE /v1/containers/{id}/files/{file}``                     delete
=============================================================  ====================================

Containers live in the gateway process that made them (docs/hosted-tools.md).
"""

from __future__ import annotations

import asyncio
import io
import mimetypes
import os
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from ..engine.tools.containers import (
    Container,
    ContainerPool,
    check_path,
    file_size,
    open_file,
    write_file,
)
from ..store.rows import page
from .bodies import parse_json_body
from .errors import HTTPError, send_json
from .query import ListQuery, invalid
from .router import Router
from .types import Receive, Scope, Send

__all__ = ["PREFIX", "ContainersAPI"]

JSON = dict[str, Any]
OwnerOf = Callable[[Scope], str]
BodyReader = Callable[[Scope, Receive], Awaitable[bytes]]

PREFIX = "/v1/containers"
MAX_NAME = 256
MAX_EXPIRY_MINUTES = 7 * 24 * 60
_CHUNK = 1 << 20


def _page(query: ListQuery, items: list[JSON]) -> bytes:
    """One page of ``items`` (oldest first) in OpenAI's list shape."""
    order, limit, after = query.order(), query.limit(), query.after()
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i["id"] for i in ordered]
        ordered = ordered[ids.index(after) + 1 :] if after in ids else []
    return orjson.dumps(page(ordered[: limit + 1], limit))


class ContainersAPI:
    """The container routes over ``pool``, for the owner of each request."""

    def __init__(self, pool: ContainerPool, owner: OwnerOf, read_body: BodyReader) -> None:
        self.pool = pool
        self._owner = owner
        self._read_body = read_body

    def register(self, router: Router) -> None:
        """The routes under ``/v1/containers``."""
        router.add(PREFIX, POST=self._create, GET=self._list)
        router.add(PREFIX + "/{cid}", GET=self._retrieve, DELETE=self._delete)
        router.add(PREFIX + "/{cid}/files", POST=self._upload, GET=self._list_files)
        router.add(PREFIX + "/{cid}/files/{fid}", GET=self._file, DELETE=self._delete_file)
        router.add(PREFIX + "/{cid}/files/{fid}/content", GET=self._content)

    # ------------------------------------------------------------------ containers
    async def _container(self, scope: Scope, cid: str) -> Container:
        found = await self.pool.get(cid, self._owner(scope))
        if found is None:
            raise HTTPError(404, f"No container found with id '{cid}'.", code="not_found")
        return found

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        owner = self._owner(scope)
        body = parse_json_body(await self._read_body(scope, receive))
        for key in body:
            if key not in ("name", "expires_after", "file_ids", "memory_limit", "network_policy"):
                raise invalid(f"Unknown parameter: '{key}'.", key, "unknown_parameter")
        name = body.get("name")
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise invalid(f"'name' must be a string of 1 to {MAX_NAME} characters.", "name", "invalid_value")
        minutes: float | None = None
        expires = body.get("expires_after")
        if expires is not None:
            value = expires.get("minutes") if isinstance(expires, dict) else None
            anchor = expires.get("anchor") if isinstance(expires, dict) else None
            if anchor != "last_active_at":
                raise invalid(
                    "'expires_after.anchor' must be 'last_active_at'.",
                    "expires_after.anchor",
                    "invalid_value",
                )
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_EXPIRY_MINUTES:
                raise invalid(
                    f"'expires_after.minutes' must be an integer from 1 to {MAX_EXPIRY_MINUTES}.",
                    "expires_after.minutes",
                    "invalid_value",
                )
            minutes = float(value)
        file_ids = body.get("file_ids") or []
        if not isinstance(file_ids, list) or not all(isinstance(f, str) for f in file_ids):
            raise invalid("'file_ids' must be a list of file ids.", "file_ids", "invalid_type")
        if body.get("memory_limit") not in (None, "1g"):
            raise invalid(
                "This gateway's containers have 1g of memory: 'memory_limit' may only be '1g'.",
                "memory_limit",
                "invalid_value",
            )
        policy = body.get("network_policy")
        if policy is not None and policy != {"type": "disabled"}:
            raise invalid(
                "Containers on this gateway have no network: 'network_policy' may only be "
                '{"type": "disabled"}.',
                "network_policy",
                "invalid_value",
            )
        container = await self.pool.new(owner, name=name, idle_minutes=minutes)
        try:
            await self.pool.add_files(container, owner, file_ids)
        except LookupError as exc:
            await self.pool.delete(container)
            missing = str(exc.args[0])
            raise invalid(
                f"No file found with id '{missing}'.", f"file_ids[{file_ids.index(missing)}]", "not_found"
            ) from None
        await send_json(send, 200, orjson.dumps(container.describe()))

    async def _list(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = ListQuery(scope)
        name = query.last("name")
        items = [c for c in await self.pool.owned(self._owner(scope)) if name is None or c["name"] == name]
        await send_json(send, 200, _page(query, items))

    async def _retrieve(self, scope: Scope, receive: Receive, send: Send, *, cid: str) -> None:
        await send_json(send, 200, orjson.dumps((await self._container(scope, cid)).describe()))

    async def _delete(self, scope: Scope, receive: Receive, send: Send, *, cid: str) -> None:
        await self.pool.delete(await self._container(scope, cid))
        await send_json(send, 200, orjson.dumps({"id": cid, "object": "container.deleted", "deleted": True}))

    # ------------------------------------------------------------------ files
    async def _upload(self, scope: Scope, receive: Receive, send: Send, *, cid: str) -> None:
        container = await self._container(scope, cid)
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        kind = headers.get("content-type", b"").decode("latin-1")
        body = await self._read_body(scope, receive)
        if not kind.startswith("multipart/form-data"):
            file_id = parse_json_body(body).get("file_id") if kind.startswith("application/json") else None
            if not isinstance(file_id, str):
                raise invalid(
                    "Upload the file as multipart/form-data with a 'file' field, or send {\"file_id\": …}.",
                    "file",
                    "invalid_value",
                )
            owner = self._owner(scope)
            try:
                (entry,) = await self.pool.add_files(container, owner, [file_id])
            except LookupError:
                raise HTTPError(
                    404, f"No file found with id '{file_id}'.", param="file_id", code="not_found"
                ) from None
            size = await asyncio.to_thread(file_size, container, entry.path)
            await send_json(send, 200, orjson.dumps(entry.describe(container, size or 0)))
            return
        name, data = _multipart_file(kind, body)
        why = check_path(name)
        if why is not None:
            raise invalid(f"The file name {why}.", "file", "invalid_value")
        try:
            await asyncio.to_thread(write_file, container, name, data)
        except OSError:
            raise invalid(f"'{name}' cannot be written in this container.", "file", "invalid_value") from None
        entry = container.file_for(name, "user")
        self.pool.touch(container)
        await self.pool.sync(container)
        await send_json(send, 200, orjson.dumps(entry.describe(container, len(data))))

    async def _list_files(self, scope: Scope, receive: Receive, send: Send, *, cid: str) -> None:
        container = await self._container(scope, cid)
        items = []
        for entry in sorted(container.files.values(), key=lambda f: f.created_at):
            size = await asyncio.to_thread(file_size, container, entry.path)
            if size is None:  # the code deleted it
                await self.pool.remove_file(container, entry.id)
                continue
            items.append(entry.describe(container, size))
        await send_json(send, 200, _page(ListQuery(scope), items))

    async def _entry(self, scope: Scope, cid: str, fid: str) -> tuple[Container, Any]:
        container = await self._container(scope, cid)
        entry = container.files.get(fid)
        if entry is None:
            raise HTTPError(404, f"No file found with id '{fid}' in container '{cid}'.", code="not_found")
        return container, entry

    async def _file(self, scope: Scope, receive: Receive, send: Send, *, cid: str, fid: str) -> None:
        container, entry = await self._entry(scope, cid, fid)
        size = await asyncio.to_thread(file_size, container, entry.path)
        if size is None:
            await self.pool.remove_file(container, fid)
            raise HTTPError(404, f"No file found with id '{fid}' in container '{cid}'.", code="not_found")
        await send_json(send, 200, orjson.dumps(entry.describe(container, size)))

    async def _content(self, scope: Scope, receive: Receive, send: Send, *, cid: str, fid: str) -> None:
        container, entry = await self._entry(scope, cid, fid)
        found = await asyncio.to_thread(open_file, container, entry.path, self.pool.limits.max_file_bytes)
        if found is None:
            await self.pool.remove_file(container, fid)
            raise HTTPError(404, f"No file found with id '{fid}' in container '{cid}'.", code="not_found")
        _, data = found
        kind = mimetypes.guess_type(entry.path)[0] or "application/octet-stream"
        filename = os.path.basename(entry.path).replace('"', "")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", kind.encode()),
                    (b"content-length", str(len(data)).encode()),
                    (b"content-disposition", f'attachment; filename="{filename}"'.encode("utf-8", "replace")),
                    (b"x-content-type-options", b"nosniff"),
                ],
            }
        )
        for start in range(0, max(len(data), 1), _CHUNK):
            more = start + _CHUNK < len(data)
            await send(
                {"type": "http.response.body", "body": data[start : start + _CHUNK], "more_body": more}
            )

    async def _delete_file(self, scope: Scope, receive: Receive, send: Send, *, cid: str, fid: str) -> None:
        container, _ = await self._entry(scope, cid, fid)
        await self.pool.remove_file(container, fid)
        await send_json(
            send, 200, orjson.dumps({"id": fid, "object": "container.file.deleted", "deleted": True})
        )


def _multipart_file(content_type: str, body: bytes) -> tuple[str, bytes]:
    """The ``file`` part of a multipart body: (its file name, without directories; its bytes)."""
    from python_multipart import parse_form
    from python_multipart.exceptions import FormParserError

    found: list[tuple[str, bytes]] = []

    def on_file(file: Any) -> None:
        if file.field_name == b"file":
            file.file_object.seek(0)
            name = (file.file_name or b"").decode("utf-8", "replace")
            found.append((name.replace("\\", "/").rsplit("/", 1)[-1], file.file_object.read()))

    headers = {"Content-Type": content_type.encode("latin-1"), "Content-Length": str(len(body)).encode()}
    try:
        parse_form(headers, io.BytesIO(body), lambda field: None, on_file)
    except (FormParserError, ValueError) as exc:
        raise invalid(f"The multipart body could not be read: {exc}", "file", "invalid_value") from None
    if not found:
        raise invalid("The multipart body has no 'file' part.", "file", "missing_required_parameter")
    return found[0]
