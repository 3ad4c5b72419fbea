"""The Files API: ``/v1/files``, as OpenAI serves it.

The metadata lives in the store (``store/files.py``, SQLite or PostgreSQL); the bytes on disk under
``<data dir>/files/`` (a temporary directory without one), one file per id. An upload is parsed as it
arrives (``python-multipart``) and written straight to disk: memory stays flat whatever the size, and
past ``--max-file-bytes`` the request is a 413 at once. Every file belongs to the API key that
uploaded it; another key's file is a 404 exactly like a missing one. ``expires_after`` (``anchor``
``created_at``, ``seconds`` 3600 to 2592000; ``purpose=batch`` defaults to 30 days, as OpenAI) makes
a file a 404 once it passes; the gateway's expiry sweep then deletes it, its bytes, and detaches it
from the vector stores holding it, as ``DELETE`` does.

=======================================  ====================================================
``POST /v1/files``                        upload (multipart: ``file``, ``purpose``, ``expires_after``)
``GET /v1/files``                         list (``purpose``, ``after``, ``limit``, ``order``)
``GET /v1/files/{file_id}``               retrieve
``GET /v1/files/{file_id}/content``       the bytes
``DELETE /v1/files/{file_id}``            delete -> ``{id, object: "file", deleted: true}``
=======================================  ====================================================
"""

from __future__ import annotations

import asyncio
import mimetypes
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ..paths import LazyDirectory
from ..store import FileNotFound, Store
from ..store.files import MAX_PAGE
from .errors import HTTPError, send_json
from .query import ListQuery, invalid
from .router import Router
from .types import Receive, Scope, Send

__all__ = ["PURPOSES", "FileStorage", "FilesAPI"]

JSON = dict[str, Any]
OwnerOf = Callable[[Scope], str]
StoreGetter = Callable[[], Store | None]

PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
_CHUNK = 1 << 20
_MAX_NAME = 512
# OpenAI's bounds of ``expires_after.seconds``, and the default of ``purpose=batch`` files.
MIN_EXPIRY, MAX_EXPIRY = 3600, 30 * 86400


class FileStorage:
    """Where the bytes of uploaded files live: one file per id under ``root`` (made on first use)."""

    def __init__(self, root: Callable[[], Path | None]) -> None:
        self._dir = LazyDirectory(root, prefix="rg-files-")

    @property
    def root(self) -> Path:
        return self._dir.path

    def path(self, file_id: str) -> Path:
        return self.root / file_id

    def read(self, file_id: str) -> bytes:
        return self.path(file_id).read_bytes()

    def remove(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)

    def close(self) -> None:
        self._dir.close()


class _Upload:
    """One multipart body, parsed as it arrives: the ``file`` part to a temporary file, fields kept."""

    def __init__(self, boundary: bytes, directory: Path, limit: int) -> None:
        from python_multipart.multipart import MultipartParser

        self.limit = limit
        self.fields: dict[str, bytes] = {}
        self.filename: str | None = None
        self.size = 0
        self.too_large = False
        self.file_done = False
        self._dir = directory
        self.tmp: Path | None = None
        self._out: BinaryIO | None = None
        self._header_field = b""
        self._header_value = b""
        self._disposition = b""
        self._name = ""
        self._value = bytearray()
        self.parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begin,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
                "on_header_field": self._header_field_data,
                "on_header_value": self._header_value_data,
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
            },
        )

    def _part_begin(self) -> None:
        self._disposition, self._name, self._value = b"", "", bytearray()

    def _header_field_data(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_field.lower() == b"content-disposition":
            self._disposition = self._header_value
        self._header_field, self._header_value = b"", b""

    def _headers_finished(self) -> None:
        from python_multipart.multipart import parse_options_header

        _, params = parse_options_header(self._disposition)
        self._name = params.get(b"name", b"").decode("utf-8", "replace")
        if self._name == "file" and self._out is None:
            name = params.get(b"filename", b"").decode("utf-8", "replace")
            self.filename = name.replace("\\", "/").rsplit("/", 1)[-1]
            fd, path = tempfile.mkstemp(dir=self._dir, prefix=".upload-")
            self.tmp = Path(path)
            self._out = os.fdopen(fd, "wb")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name == "file" and self._out is not None and not self.file_done:
            self.size += end - start
            if self.size > self.limit:
                self.too_large = True
                return
            self._out.write(data[start:end])
        elif len(self._value) < 4096:
            self._value += data[start:end]

    def _part_end(self) -> None:
        if self._name == "file" and self._out is not None and not self.file_done:
            self._out.close()
            self.file_done = True
        elif self._name:
            self.fields[self._name] = bytes(self._value)

    def discard(self) -> None:
        if self._out is not None and not self._out.closed:
            self._out.close()
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


class FilesAPI:
    """The file routes over the store and ``storage``, for the owner of each request."""

    def __init__(
        self, store: StoreGetter, storage: FileStorage, owner: OwnerOf, max_file_bytes: Callable[[], int]
    ) -> None:
        self._store = store
        self.storage = storage
        self._owner = owner
        self._max = max_file_bytes

    def register(self, router: Router) -> None:
        router.add("/v1/files", POST=self._upload, GET=self._list)
        router.add("/v1/files/{file_id}", GET=self._retrieve, DELETE=self._delete)
        router.add("/v1/files/{file_id}/content", GET=self._content)

    def store(self) -> Store:
        store = self._store()
        if store is None:
            raise HTTPError(
                404,
                "This gateway keeps no files (it runs without a store: serve --store none).",
                code="not_found",
            )
        return store

    async def read(self, owner: str, file_id: str) -> tuple[JSON, bytes]:
        """A file's metadata and bytes, for the gateway's own use (a container's ``file_ids``)."""
        meta = await self.store().files.get_file(owner, file_id)
        data = await asyncio.to_thread(self.storage.read, file_id)
        return meta, data

    # ------------------------------------------------------------------ routes
    async def _upload(self, scope: Scope, receive: Receive, send: Send) -> None:
        store = self.store()
        owner = self._owner(scope)
        headers = {k.lower(): v for k, v in scope["headers"]}
        from python_multipart.multipart import parse_options_header

        kind, params = parse_options_header(headers.get(b"content-type", b""))
        boundary = params.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise invalid(
                "Upload a file as multipart/form-data with the fields 'file' and 'purpose'.",
                "file",
                "invalid_value",
            )
        limit = self._max()
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit + (1 << 16):
            raise _too_large(limit)
        upload = _Upload(boundary, self.storage.root, limit)
        try:
            await self._receive_into(upload, receive)
            if upload.too_large:
                raise _too_large(limit)
            purpose = upload.fields.get("purpose", b"").decode("utf-8", "replace")
            if purpose not in PURPOSES:
                raise invalid(
                    f"Invalid value for 'purpose': '{purpose[:40]}'. Supported values are: "
                    + ", ".join(f"'{p}'" for p in PURPOSES)
                    + ".",
                    "purpose",
                    "invalid_value" if purpose else "missing_required_parameter",
                )
            expires_in = _expires_after(upload.fields, purpose)
            if upload.tmp is None or upload.filename is None or not upload.file_done:
                raise invalid("The multipart body has no 'file' part.", "file", "missing_required_parameter")
            filename = upload.filename or "upload"
            if len(filename) > _MAX_NAME or "\x00" in filename:
                raise invalid(
                    f"The file name must be at most {_MAX_NAME} characters.", "file", "invalid_value"
                )
            # Time first, so ids sort in upload order (lists page by created_at, then id).
            file_id = f"file-{time.time_ns():016x}{os.urandom(6).hex()}"
            now = int(time.time())
            os.replace(upload.tmp, self.storage.path(file_id))
            upload.tmp = None
            try:
                meta = await store.files.create_file(
                    owner,
                    file_id,
                    filename=filename,
                    purpose=purpose,
                    size=upload.size,
                    created_at=now,
                    expires_at=None if expires_in is None else now + expires_in,
                )
            except BaseException:
                self.storage.remove(file_id)
                raise
        finally:
            upload.discard()
        await send_json(send, 200, orjson.dumps(meta))

    async def _receive_into(self, upload: _Upload, receive: Receive) -> None:
        from python_multipart.exceptions import MultipartParseError

        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HTTPError(400, "The client disconnected before sending the whole body.")
            chunk: bytes = message.get("body", b"")
            if chunk and not upload.too_large:
                try:
                    await asyncio.to_thread(upload.parser.write, chunk)  # writes the file part to disk
                except MultipartParseError as exc:
                    raise invalid(
                        f"The multipart body could not be read: {exc}", "file", "invalid_value"
                    ) from None
            if not message.get("more_body", False):
                return

    async def _list(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = ListQuery(scope)
        purpose = query.last("purpose") or None
        try:
            page = await self.store().files.list_files(
                self._owner(scope),
                purpose=purpose,
                after=query.after(),
                limit=query.limit(default=MAX_PAGE, maximum=MAX_PAGE),
                order=query.order(),
            )
        except FileNotFound as exc:
            raise invalid(str(exc), "after", "invalid_value") from None
        await send_json(send, 200, orjson.dumps(page))

    async def _meta(self, scope: Scope, file_id: str) -> JSON:
        try:
            return await self.store().files.get_file(self._owner(scope), file_id)
        except FileNotFound as exc:
            raise HTTPError(404, str(exc), code="not_found") from None

    async def _retrieve(self, scope: Scope, receive: Receive, send: Send, *, file_id: str) -> None:
        await send_json(send, 200, orjson.dumps(await self._meta(scope, file_id)))

    async def _content(self, scope: Scope, receive: Receive, send: Send, *, file_id: str) -> None:
        meta = await self._meta(scope, file_id)
        path = self.storage.path(file_id)
        try:
            handle = await asyncio.to_thread(open, path, "rb")
        except OSError:
            raise HTTPError(404, f"The content of file '{file_id}' is gone.", code="not_found") from None
        with handle:
            size = os.fstat(handle.fileno()).st_size
            kind = mimetypes.guess_type(meta["filename"])[0] or "application/octet-stream"
            name = meta["filename"].replace('"', "")
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", kind.encode()),
                        (b"content-length", str(size).encode()),
                        (b"content-disposition", f'attachment; filename="{name}"'.encode("utf-8", "replace")),
                        (b"x-content-type-options", b"nosniff"),
                    ],
                }
            )
            sent = 0
            while True:
                data = await asyncio.to_thread(handle.read, _CHUNK)
                sent += len(data)
                more = bool(data) and sent < size
                await send({"type": "http.response.body", "body": data, "more_body": more})
                if not more:
                    return

    async def sweep(self, now: int | None = None, *, batch: int = 100) -> int:
        """Delete the files whose ``expires_after`` has passed (rows, vector store attachments, bytes);
        the number deleted. Each in its own transaction that checks it is still there, so instances
        sharing the store and the files directory delete each file once."""
        store = self._store()
        if store is None:
            return 0
        when = int(time.time()) if now is None else now
        deleted = 0
        while True:
            found = await store.files.expired_files(when, batch)
            for file_id in found:
                if await store.files.delete_expired(file_id, when):
                    await asyncio.to_thread(self.storage.remove, file_id)
                    deleted += 1
            if len(found) < batch:
                return deleted

    async def _delete(self, scope: Scope, receive: Receive, send: Send, *, file_id: str) -> None:
        try:
            await self.store().files.delete_file(self._owner(scope), file_id)
        except FileNotFound as exc:
            raise HTTPError(404, str(exc), code="not_found") from None
        await asyncio.to_thread(self.storage.remove, file_id)
        await send_json(send, 200, orjson.dumps({"id": file_id, "object": "file", "deleted": True}))


def _expires_after(fields: dict[str, bytes], purpose: str) -> int | None:
    """Seconds from the upload to the file's expiry (None: kept until deleted), from the multipart
    fields ``expires_after[anchor]`` and ``expires_after[seconds]`` the SDKs send."""
    anchor = fields.get("expires_after[anchor]")
    seconds = fields.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return MAX_EXPIRY if purpose == "batch" else None
    if anchor != b"created_at":
        raise invalid(
            "Invalid value for 'expires_after.anchor': the supported anchor is 'created_at'.",
            "expires_after.anchor",
            "invalid_value" if anchor else "missing_required_parameter",
        )
    text = (seconds or b"").decode("utf-8", "replace")
    if not text.isdigit() or not MIN_EXPIRY <= int(text) <= MAX_EXPIRY:
        raise invalid(
            f"Invalid 'expires_after.seconds': expected an integer from {MIN_EXPIRY} (1 hour) to "
            f"{MAX_EXPIRY} (30 days), but got '{text[:20]}'.",
            "expires_after.seconds",
            "invalid_value" if seconds else "missing_required_parameter",
        )
    return int(text)


def _too_large(limit: int) -> HTTPError:
    return HTTPError(
        413,
        f"The file is larger than this gateway accepts ({limit} bytes; serve --max-file-bytes).",
        code="file_too_large",
    )
