"""The Conversations API: ``/v1/conversations`` and its items, as OpenAI serves them.

Requests are validated here, at the edge, with the same checks and wording as create-response
(``param`` names the field: ``items[2].role``, ``metadata.topic``, ``limit``); the store then reads and
writes as the caller's owner, so another owner's conversation is a 404 exactly like a missing one.

Routes (``{id}`` is a conversation id, ``{item}`` an item id):

=======================================  ==========================================================
``POST /v1/conversations``               create (``items`` up to 20, ``metadata``)
``GET /v1/conversations/{id}``           retrieve
``POST /v1/conversations/{id}``          update the metadata
``DELETE /v1/conversations/{id}``        delete -> ``{id, object: "conversation.deleted", deleted}``
``GET /v1/conversations/{id}/items``     list (``after``, ``limit``, ``order``, ``include``)
``POST /v1/conversations/{id}/items``    add up to 20 items -> a list of the added items
``GET /v1/conversations/{id}/items/{item}``     retrieve one item (``include``)
``DELETE /v1/conversations/{id}/items/{item}``  delete one item -> the conversation
=======================================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

# The create-response checks, so both APIs validate items and metadata with the same wording.
from ..protocol.request import INCLUDABLE, RequestError, check_input_item, check_list, check_metadata
from ..sealing import Sealer, SealError
from ..store import ItemReferenceNotFound, NotFound, Store, apply_include
from .bodies import parse_json_body
from .errors import HTTPError, send_json
from .query import ListQuery
from .query import invalid as _invalid
from .responses import ENCRYPTED, present_item, reasoning_state
from .router import Router
from .types import Receive, Scope, Send

__all__ = ["PREFIX", "ConversationsAPI"]

JSON = dict[str, Any]
StoreGetter = Callable[[], Store | None]
OwnerOf = Callable[[Scope], str]
BodyReader = Callable[[Scope, Receive], Awaitable[bytes]]
SealerGetter = Callable[[], Sealer]

PREFIX = "/v1/conversations"
MAX_ITEMS = 20  # OpenAI: "You may add up to 20 items at a time."
# Items whose OpenAI model has a required ``status``; items given without one are complete.
_STATUS_ITEMS = frozenset({"message", "function_call", "function_call_output"})


def _bad(exc: RequestError) -> HTTPError:
    return HTTPError.from_request_error(exc)


def _not_found(exc: NotFound) -> HTTPError:
    return HTTPError(404, str(exc), param=exc.param, code=getattr(exc, "code", None))


def present(item: JSON) -> JSON:
    """An item as the Conversations API shows it (messages and calls always carry ``status``)."""
    if item.get("type") in _STATUS_ITEMS and item.get("status") is None:
        return {**item, "status": "completed"}
    return item


def _items(value: Any, *, required: bool) -> list[JSON]:
    """``items``: up to 20 input items, checked as create-response checks ``input``."""
    if value is None:
        if required:
            raise _invalid("Missing required parameter: 'items'.", "items", "missing_required_parameter")
        return []
    try:
        check_list(value, "items")
    except RequestError as exc:
        raise _bad(exc) from None
    if len(value) > MAX_ITEMS:
        raise _invalid(
            f"Invalid 'items': array too long. Expected an array with maximum length {MAX_ITEMS}, "
            f"but got an array with length {len(value)} instead.",
            "items",
            "array_above_max_length",
        )
    if required and not value:
        raise _invalid(
            "Invalid 'items': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "items",
            "empty_array",
        )
    out: list[JSON] = []
    for i, raw in enumerate(value):
        param = f"items[{i}]"
        try:
            out.append(present(check_input_item(raw, param)))
        except RequestError as exc:
            raise _bad(exc) from None
    return out


def _metadata(value: Any) -> JSON:
    if value is None:
        return {}
    try:
        return check_metadata(value)
    except RequestError as exc:
        raise _bad(exc) from None


def _only(body: JSON, allowed: tuple[str, ...]) -> None:
    for key in body:
        if key not in allowed:
            raise _invalid(f"Unknown parameter: '{key}'.", key, "unknown_parameter")


class _Query(ListQuery):
    """The query string of a list or retrieve request, checked with OpenAI's wording."""

    def include(self) -> list[str]:
        # The openai SDKs send arrays as ``include[]=a&include[]=b``; plain repeats work too.
        values = [v for k, v in self.pairs if k in ("include", "include[]")]
        for i, value in enumerate(values):
            if value not in INCLUDABLE:
                allowed = ", ".join(f"'{a}'" for a in INCLUDABLE)
                raise _invalid(
                    f"Invalid value: '{value}'. Supported values are: {allowed}.",
                    f"include[{i}]",
                    "invalid_value",
                )
        return values


class ConversationsAPI:
    """The conversation routes over the gateway's store, for the owner of each request.

    ``store()`` returns the running store (``None`` when the gateway runs without one),
    ``owner(scope)`` who the request acts for, ``read_body(scope, receive)`` the size-limited body,
    ``sealer()`` the key for reasoning state: all four belong to the app, which calls :meth:`route`
    for paths under ``/v1/conversations``.

    Reasoning state is handled as on ``/v1/responses``: state this gateway sealed is opened before it
    is stored (altered or another owner's is a 400), and reads that ``include``
    ``reasoning.encrypted_content`` get it sealed for the caller; it never leaves unsealed.
    """

    def __init__(
        self, store: StoreGetter, owner: OwnerOf, read_body: BodyReader, sealer: SealerGetter
    ) -> None:
        self._store = store
        self._owner = owner
        self._read_body = read_body
        self._sealer = sealer

    def register(self, router: Router) -> None:
        """The routes under ``/v1/conversations``."""
        router.add(PREFIX, POST=self._create)
        router.add(PREFIX + "/{cid}", GET=self._get, POST=self._update, DELETE=self._delete)
        router.add(PREFIX + "/{cid}/items", GET=self._list_items, POST=self._add_items)
        router.add(PREFIX + "/{cid}/items/{item_id}", GET=self._get_item, DELETE=self._delete_item)

    # ------------------------------------------------------------------------------------ plumbing
    def _need_store(self) -> Store:
        store = self._store()
        if store is None:
            raise HTTPError(
                404,
                "This gateway keeps no conversations (it runs without a store: serve --store none).",
                code="not_found",
            )
        return store

    async def _body(self, scope: Scope, receive: Receive) -> JSON:
        raw = await self._read_body(scope, receive)
        if not raw.strip():
            return {}
        body = parse_json_body(raw)
        if not isinstance(body, dict):
            raise HTTPError(400, "The request body must be a JSON object.", code="invalid_type")
        return body

    @staticmethod
    async def _ok(send: Send, value: JSON) -> None:
        await send_json(send, 200, orjson.dumps(value))

    def _unseal(self, items: list[JSON], owner: str) -> list[JSON]:
        """Items with the reasoning state this gateway sealed opened (stored as the back end made it)."""
        out = items
        for index, item in enumerate(items):
            state = reasoning_state(item)
            if state is None:
                continue
            sealer = self._sealer()
            if not sealer.is_sealed(state):
                continue  # an upstream's own encrypted_content: kept as it came
            param = f"items[{index}].encrypted_content"
            try:
                value = sealer.unseal(state, context=owner)
            except SealError as exc:
                raise HTTPError(
                    400, f"Invalid 'encrypted_content': {exc}.", param=param, code="invalid_encrypted_content"
                ) from None
            if not isinstance(value, str):
                raise HTTPError(
                    400, "Invalid 'encrypted_content'.", param=param, code="invalid_encrypted_content"
                )
            if out is items:
                out = list(items)
            out[index] = {**item, "encrypted_content": value}
        return out

    def _show(self, items: list[JSON], include: list[str], owner: str) -> list[JSON]:
        """Items as they leave: ``status`` filled in, reasoning state sealed when ``include`` asks."""
        sealer = self._sealer() if ENCRYPTED in include else None
        return [present(present_item(item, sealer, owner)) for item in items]

    async def _items_to_store(self, store: Store, owner: str, items: list[JSON]) -> list[JSON]:
        """Resolve ``item_reference`` items here so a miss names ``items[i]``, not ``input[i]``."""
        items = self._unseal(items, owner)
        try:
            resolved = await store.resolve_item_references(owner, items)
        except ItemReferenceNotFound as exc:
            index = exc.param[len("input") :] if exc.param else ""
            raise HTTPError(404, str(exc), param=f"items{index}") from None
        return [present(item) for item in resolved]

    # ------------------------------------------------------------------------------------ routes
    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        store = self._need_store()
        body = await self._body(scope, receive)
        _only(body, ("items", "metadata"))
        items = _items(body.get("items"), required=False)
        metadata = _metadata(body.get("metadata"))
        owner = self._owner(scope)
        items = await self._items_to_store(store, owner, items)
        await self._ok(
            send, await store.conversations.create_conversation(owner, items=items, metadata=metadata)
        )

    async def _get(self, scope: Scope, receive: Receive, send: Send, *, cid: str) -> None:
        store = self._need_store()
        try:
            conversation = await store.conversations.get_conversation(self._owner(scope), cid)
        except NotFound as exc:
            raise _not_found(exc) from None
        await self._ok(send, conversation)

    async def _update(self, scope: Scope, receive: Receive, send: Send, *, cid: str) -> None:
        store = self._need_store()
        body = await self._body(scope, receive)
        _only(body, ("metadata",))
        if "metadata" not in body:
            raise _invalid(
                "Missing required parameter: 'metadata'.", "metadata", "missing_required_parameter"
            )
        metadata = _metadata(body["metadata"])
        try:
            conversation = await store.conversations.update_conversation(self._owner(scope), cid, metadata)
        except NotFound as exc:
            raise _not_found(exc) from None
        await self._ok(send, conversation)

    async def _delete(self, scope: Scope, receive: Receive, send: Send, *, cid: str) -> None:
        store = self._need_store()
        try:
            deleted = await store.conversations.delete_conversation(self._owner(scope), cid)
        except NotFound as exc:
            raise _not_found(exc) from None
        await self._ok(send, deleted)

    async def _list_items(self, scope: Scope, receive: Receive, send: Send, *, cid: str) -> None:
        store = self._need_store()
        query = _Query(scope)
        include, limit, order, after = query.include(), query.limit(), query.order(), query.after()
        try:
            page = await store.conversations.list_conversation_items(
                self._owner(scope), cid, after=after, limit=limit, order=order, include=include
            )
        except NotFound as exc:
            raise _not_found(exc) from None
        page["data"] = self._show(page["data"], include, self._owner(scope))
        await self._ok(send, page)

    async def _add_items(self, scope: Scope, receive: Receive, send: Send, *, cid: str) -> None:
        store = self._need_store()
        include = _Query(scope).include()
        body = await self._body(scope, receive)
        _only(body, ("items",))
        items = _items(body.get("items"), required=True)
        owner = self._owner(scope)
        try:
            # Checked before resolving references, so a missing conversation is the 404 reported.
            await store.conversations.get_conversation(owner, cid)
            items = await self._items_to_store(store, owner, items)
            page = await store.conversations.add_conversation_items(owner, cid, items)
        except NotFound as exc:
            raise _not_found(exc) from None
        # Stored items keep everything; the answer hides what ``include`` does not ask for.
        shown = [apply_include(item, include) for item in page["data"]]
        page["data"] = self._show(shown, include, owner)
        await self._ok(send, page)

    async def _get_item(self, scope: Scope, receive: Receive, send: Send, *, cid: str, item_id: str) -> None:
        store = self._need_store()
        include = _Query(scope).include()
        owner = self._owner(scope)
        try:
            item = await store.conversations.get_conversation_item(owner, cid, item_id, include=include)
        except NotFound as exc:
            raise _not_found(exc) from None
        await self._ok(send, self._show([item], include, owner)[0])

    async def _delete_item(
        self, scope: Scope, receive: Receive, send: Send, *, cid: str, item_id: str
    ) -> None:
        store = self._need_store()
        try:
            conversation = await store.conversations.delete_conversation_item(
                self._owner(scope), cid, item_id
            )
        except NotFound as exc:
            raise _not_found(exc) from None
        await self._ok(send, conversation)
