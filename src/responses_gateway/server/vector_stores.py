"""The Vector Stores API (``/v1/vector_stores…``) over ``retrieval.service.VectorStores``.

Every store, file and batch belongs to the API key that made it; another key's is a 404 exactly like
a missing one. docs/file-search.md describes ingestion and search.

==========================================================  =========================================
``POST|GET /v1/vector_stores``                               create, list
``GET|POST|DELETE /v1/vector_stores/{vs}``                   retrieve, update, delete
``POST|GET /v1/vector_stores/{vs}/files``                    attach (ingested in the background), list
``GET|POST|DELETE /v1/vector_stores/{vs}/files/{file}``      retrieve, update ``attributes``, detach
``GET /v1/vector_stores/{vs}/files/{file}/content``          the file's chunks, in file order
``POST /v1/vector_stores/{vs}/file_batches``                 attach several
``GET /v1/vector_stores/{vs}/file_batches/{batch}``          retrieve (``/cancel``: POST, ``/files``: GET)
``POST /v1/vector_stores/{vs}/search``                       hybrid search
==========================================================  =========================================
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from ..protocol.request import RequestError, check_metadata
from ..retrieval.chunking import ChunkingError, chunking_strategy
from ..retrieval.service import MAX_QUERY_CHARS, MAX_RESULTS, RetrievalError, VectorStores, check_attributes
from ..store import NotFound
from ..store.vector_stores import FILE_STATUSES
from .bodies import parse_json_body
from .errors import HTTPError, send_json
from .query import ListQuery, invalid
from .router import Router
from .types import Receive, Scope, Send

__all__ = ["VectorStoresAPI"]

JSON = dict[str, Any]
OwnerOf = Callable[[Scope], str]
BodyReader = Callable[[Scope, Receive], Awaitable[bytes]]

MAX_FILES_PER_REQUEST = 500
MAX_NAME = 256
MAX_DESCRIPTION = 512


def _present(store: JSON) -> JSON:
    """A vector store as OpenAI shows it: its status from its files and expiry."""
    out = dict(store)
    if out["expires_at"] is not None and out["expires_at"] <= time.time():
        out["status"] = "expired"
    else:
        out["status"] = "in_progress" if out["file_counts"]["in_progress"] else "completed"
    return out


def _expires_after(value: Any) -> JSON | None:
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or value.get("anchor") != "last_active_at"
        or not isinstance(value.get("days"), int)
        or isinstance(value.get("days"), bool)
        or not 1 <= value["days"] <= 365
    ):
        raise invalid(
            '\'expires_after\' must be {"anchor": "last_active_at", "days": 1 to 365}.',
            "expires_after",
            "invalid_value",
        )
    return {"anchor": "last_active_at", "days": value["days"]}


def _string(body: JSON, key: str, limit: int) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or len(value) > limit):
        raise invalid(f"'{key}' must be a string of at most {limit} characters.", key, "invalid_value")
    return value


def _chunking(value: Any, param: str = "chunking_strategy") -> JSON:
    try:
        return chunking_strategy(value, param)
    except ChunkingError as exc:
        raise invalid(str(exc), exc.param, "invalid_value") from None


def _attributes(value: Any, param: str = "attributes") -> JSON:
    try:
        return check_attributes(value, param)
    except RetrievalError as exc:
        raise invalid(str(exc), param, exc.code) from None


def _file_ids(value: Any, param: str = "file_ids") -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and 0 < len(v) <= 128 for v in value):
        raise invalid(f"'{param}' must be an array of file ids.", param, "invalid_value")
    if len(value) > MAX_FILES_PER_REQUEST:
        raise invalid(
            f"'{param}' may name at most {MAX_FILES_PER_REQUEST} files.", param, "array_above_max_length"
        )
    return list(dict.fromkeys(value))


def _object(raw: bytes) -> JSON:
    body = parse_json_body(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise HTTPError(400, "The request body must be a JSON object.")
    return body


def _only(body: JSON, allowed: tuple[str, ...]) -> None:
    for key in body:
        if key not in allowed:
            raise invalid(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")


def _mapped(exc: Exception) -> HTTPError:
    if isinstance(exc, RetrievalError):
        return HTTPError(exc.status, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, NotFound):
        return HTTPError(404, str(exc), code="not_found")
    raise exc


class VectorStoresAPI:
    """The vector store routes, for the owner of each request."""

    def __init__(self, service: VectorStores, owner: OwnerOf, read_body: BodyReader) -> None:
        self.service = service
        self._owner = owner
        self._read_body = read_body

    def register(self, router: Router) -> None:
        base = "/v1/vector_stores"
        router.add(base, POST=self._guard(self._create), GET=self._guard(self._list))
        router.add(
            base + "/{vs}",
            GET=self._guard(self._retrieve),
            POST=self._guard(self._update),
            DELETE=self._guard(self._delete),
        )
        router.add(base + "/{vs}/files", POST=self._guard(self._attach), GET=self._guard(self._list_files))
        router.add(
            base + "/{vs}/files/{file_id}",
            GET=self._guard(self._get_file),
            POST=self._guard(self._update_file),
            DELETE=self._guard(self._detach),
        )
        router.add(base + "/{vs}/files/{file_id}/content", GET=self._guard(self._file_content))
        router.add(base + "/{vs}/file_batches", POST=self._guard(self._create_batch))
        router.add(base + "/{vs}/file_batches/{batch}", GET=self._guard(self._get_batch))
        router.add(base + "/{vs}/file_batches/{batch}/cancel", POST=self._guard(self._cancel_batch))
        router.add(base + "/{vs}/file_batches/{batch}/files", GET=self._guard(self._batch_files))
        router.add(base + "/{vs}/search", POST=self._guard(self._search))

    def _guard(self, handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[None]]:
        async def run(scope: Scope, receive: Receive, send: Send, **params: str) -> None:
            owner = self._owner(scope)
            try:
                result = await handler(owner, scope, receive, **params)
            except (RetrievalError, NotFound) as exc:
                raise _mapped(exc) from None
            await send_json(send, 200, orjson.dumps(result))

        return run

    # ------------------------------------------------------------------ stores
    async def _create(self, owner: str, scope: Scope, receive: Receive) -> JSON:
        body = _object(await self._read_body(scope, receive))
        _only(
            body,
            (
                "name",
                "description",
                "metadata",
                "expires_after",
                "file_ids",
                "chunking_strategy",
                "embedding_model",
            ),
        )
        request = {
            "name": _string(body, "name", MAX_NAME),
            "description": _string(body, "description", MAX_DESCRIPTION),
            "metadata": self._metadata(body.get("metadata")),
            "expires_after": _expires_after(body.get("expires_after")),
            "file_ids": _file_ids(body["file_ids"]) if body.get("file_ids") is not None else [],
            "chunking_strategy": _chunking(body.get("chunking_strategy")),
            "embedding_model": body.get("embedding_model") or "all-MiniLM-L6-v2",
        }
        return _present(await self.service.create(owner, request))

    @staticmethod
    def _metadata(value: Any) -> JSON:
        if value is None:
            return {}
        try:
            return check_metadata(value)
        except RequestError as exc:
            raise HTTPError.from_request_error(exc) from None

    async def _list(self, owner: str, scope: Scope, receive: Receive) -> JSON:
        query = ListQuery(scope)
        try:
            found = await self.service.tables.list_stores(
                owner, after=query.after(), limit=query.limit(), order=query.order()
            )
        except NotFound as exc:
            raise invalid(str(exc), "after", "invalid_value") from None
        found["data"] = [_present(s) for s in found["data"]]
        return found

    async def _retrieve(self, owner: str, scope: Scope, receive: Receive, *, vs: str) -> JSON:
        return _present(await self.service.tables.get_store(owner, vs))

    async def _update(self, owner: str, scope: Scope, receive: Receive, *, vs: str) -> JSON:
        body = _object(await self._read_body(scope, receive))
        _only(body, ("name", "metadata", "expires_after"))
        changes: JSON = {}
        if "name" in body:
            changes["name"] = _string(body, "name", MAX_NAME)
        if "metadata" in body:
            changes["metadata"] = self._metadata(body["metadata"])
        if "expires_after" in body:
            changes["expires_after"] = _expires_after(body["expires_after"])
        return _present(await self.service.tables.update_store(owner, vs, changes))

    async def _delete(self, owner: str, scope: Scope, receive: Receive, *, vs: str) -> JSON:
        await self.service.delete(owner, vs)
        return {"id": vs, "object": "vector_store.deleted", "deleted": True}

    # ------------------------------------------------------------------ files
    async def _attach(self, owner: str, scope: Scope, receive: Receive, *, vs: str) -> JSON:
        body = _object(await self._read_body(scope, receive))
        _only(body, ("file_id", "attributes", "chunking_strategy"))
        file_id = body.get("file_id")
        if not isinstance(file_id, str) or not file_id:
            raise invalid("'file_id' is required.", "file_id", "missing_required_parameter")
        return await self.service.attach(
            owner,
            vs,
            file_id,
            attributes=_attributes(body.get("attributes")),
            chunking=_chunking(body.get("chunking_strategy")),
        )

    async def _list_files(
        self, owner: str, scope: Scope, receive: Receive, *, vs: str, batch: str | None = None
    ) -> JSON:
        query = ListQuery(scope)
        status = query.last("filter") or None
        if status is not None and status not in FILE_STATUSES:
            raise invalid(
                "'filter' must be one of: " + ", ".join(FILE_STATUSES) + ".", "filter", "invalid_value"
            )
        try:
            return await self.service.tables.list_files(
                owner,
                vs,
                status=status,
                batch_id=batch,
                after=query.after(),
                limit=query.limit(),
                order=query.order(),
            )
        except NotFound as exc:
            if getattr(exc, "object_id", None) == query.after():
                raise invalid(str(exc), "after", "invalid_value") from None
            raise

    async def _get_file(self, owner: str, scope: Scope, receive: Receive, *, vs: str, file_id: str) -> JSON:
        return await self.service.tables.get_file(owner, vs, file_id)

    async def _file_content(
        self, owner: str, scope: Scope, receive: Receive, *, vs: str, file_id: str
    ) -> JSON:
        chunks = await self.service.tables.file_chunks(owner, vs, file_id)
        return {
            "object": "vector_store.file_content.page",
            "data": [{"type": "text", "text": text} for text in chunks],
            "has_more": False,
            "next_page": None,
        }

    async def _update_file(
        self, owner: str, scope: Scope, receive: Receive, *, vs: str, file_id: str
    ) -> JSON:
        body = _object(await self._read_body(scope, receive))
        _only(body, ("attributes",))
        if "attributes" not in body:
            raise invalid("'attributes' is required.", "attributes", "missing_required_parameter")
        return await self.service.tables.update_file(owner, vs, file_id, _attributes(body["attributes"]))

    async def _detach(self, owner: str, scope: Scope, receive: Receive, *, vs: str, file_id: str) -> JSON:
        await self.service.tables.delete_file(owner, vs, file_id)
        return {"id": file_id, "object": "vector_store.file.deleted", "deleted": True}

    # ------------------------------------------------------------------ batches
    async def _create_batch(self, owner: str, scope: Scope, receive: Receive, *, vs: str) -> JSON:
        body = _object(await self._read_body(scope, receive))
        _only(body, ("file_ids", "files", "attributes", "chunking_strategy"))
        attributes = _attributes(body.get("attributes"))
        chunking = _chunking(body.get("chunking_strategy"))
        entries: list[tuple[str, JSON, JSON]] = []
        if body.get("files") is not None:
            if body.get("file_ids") is not None:
                raise invalid("Give either 'file_ids' or 'files', not both.", "files", "invalid_value")
            files = body["files"]
            if not isinstance(files, list) or not files or len(files) > MAX_FILES_PER_REQUEST:
                raise invalid(
                    f"'files' must be an array of 1 to {MAX_FILES_PER_REQUEST} objects.",
                    "files",
                    "invalid_value",
                )
            for i, item in enumerate(files):
                if not isinstance(item, dict) or not isinstance(item.get("file_id"), str):
                    raise invalid(
                        f"'files[{i}].file_id' is required.", f"files[{i}].file_id", "invalid_value"
                    )
                entries.append(
                    (
                        item["file_id"],
                        _attributes(item.get("attributes", attributes), f"files[{i}].attributes"),
                        _chunking(item["chunking_strategy"], f"files[{i}].chunking_strategy")
                        if item.get("chunking_strategy") is not None
                        else chunking,
                    )
                )
        else:
            ids = _file_ids(body.get("file_ids"))
            if not ids:
                raise invalid("'file_ids' must name at least one file.", "file_ids", "invalid_value")
            entries = [(file_id, attributes, chunking) for file_id in ids]
        tables = self.service.tables
        await self.service.usable(owner, vs)  # 404, or 400 once expired: no batch made
        batch_id = f"vsfb_{time.time_ns():016x}{os.urandom(8).hex()}"
        await tables.create_batch(owner, vs, batch_id, int(time.time()))
        for file_id, attrs, strategy in entries:
            await self.service.attach(
                owner, vs, file_id, attributes=attrs, chunking=strategy, batch_id=batch_id
            )
        return await tables.get_batch(owner, vs, batch_id)

    async def _get_batch(self, owner: str, scope: Scope, receive: Receive, *, vs: str, batch: str) -> JSON:
        return await self.service.tables.get_batch(owner, vs, batch)

    async def _cancel_batch(self, owner: str, scope: Scope, receive: Receive, *, vs: str, batch: str) -> JSON:
        return await self.service.tables.cancel_batch(owner, vs, batch)

    async def _batch_files(self, owner: str, scope: Scope, receive: Receive, *, vs: str, batch: str) -> JSON:
        await self.service.tables.get_batch(owner, vs, batch)
        return await self._list_files(owner, scope, receive, vs=vs, batch=batch)

    # ------------------------------------------------------------------ search
    async def _search(self, owner: str, scope: Scope, receive: Receive, *, vs: str) -> JSON:
        body = _object(await self._read_body(scope, receive))
        _only(body, ("query", "filters", "max_num_results", "ranking_options", "rewrite_query"))
        query = body.get("query")
        queries = [query] if isinstance(query, str) else query
        if (
            not isinstance(queries, list)
            or not queries
            or not all(isinstance(q, str) and q.strip() for q in queries)
            or sum(len(q) for q in queries) > MAX_QUERY_CHARS
        ):
            raise invalid(
                "'query' must be a non-empty string or array of strings "
                f"(at most {MAX_QUERY_CHARS} characters).",
                "query",
                "invalid_value" if query is not None else "missing_required_parameter",
            )
        if body.get("rewrite_query"):
            raise invalid(
                "'rewrite_query' is not supported by this gateway "
                "(it would need a model to rewrite the query).",
                "rewrite_query",
                "unsupported_parameter",
            )
        limit = body.get("max_num_results", 10)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_RESULTS:
            raise invalid(
                f"'max_num_results' must be an integer from 1 to {MAX_RESULTS}.",
                "max_num_results",
                "invalid_value",
            )
        hits = await self.service.search(
            owner,
            vs,
            queries,
            max_num_results=limit,
            filters=body.get("filters"),
            ranking_options=body.get("ranking_options"),
        )
        return {
            "object": "vector_store.search_results.page",
            "search_query": queries,
            "data": [
                {
                    "file_id": hit["file_id"],
                    "filename": hit["filename"],
                    "score": hit["score"],
                    "attributes": hit["attributes"],
                    "content": [{"type": "text", "text": hit["text"]}],
                }
                for hit in hits
            ],
            "has_more": False,
            "next_page": None,
        }
