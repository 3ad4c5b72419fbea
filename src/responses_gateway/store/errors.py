"""What the store raises; the server maps each to one HTTP answer."""

from __future__ import annotations

__all__ = [
    "ConversationNotFound",
    "FileBatchNotFound",
    "ItemNotFound",
    "ItemReferenceNotFound",
    "NotFound",
    "PreviousResponseNotFound",
    "ResponseNotFound",
    "StoreError",
    "VectorStoreExpired",
    "VectorStoreFileNotFound",
    "VectorStoreNotFound",
]


class StoreError(Exception):
    """Base of every store error."""


class NotFound(StoreError):
    """Absent, deleted, or owned by someone else (which must look the same): HTTP 404."""

    kind = "object"
    param: str | None = None

    def __init__(self, object_id: str) -> None:
        super().__init__(f"No {self.kind} found with id '{object_id}'.")
        self.object_id = object_id


class ResponseNotFound(NotFound):
    kind = "response"


class PreviousResponseNotFound(NotFound):
    """``previous_response_id`` names no stored response: 404 ``previous_response_not_found``."""

    kind = "response"
    param = "previous_response_id"
    code = "previous_response_not_found"

    def __init__(self, object_id: str) -> None:
        super().__init__(object_id)
        self.args = (f"Previous response with id '{object_id}' not found.",)


class ConversationNotFound(NotFound):
    kind = "conversation"


class ItemNotFound(NotFound):
    kind = "item"


class FileNotFound(NotFound):
    kind = "file"


class VectorStoreNotFound(NotFound):
    kind = "vector store"


class VectorStoreExpired(StoreError):
    """The vector store's ``expires_after`` has passed: it may be read and deleted, not searched or
    added to (HTTP 400), until the sweep deletes it."""

    def __init__(self, store_id: str) -> None:
        super().__init__(
            f"Vector store '{store_id}' has expired (its expires_after passed); create a new vector store."
        )
        self.object_id = store_id


class VectorStoreFileNotFound(NotFound):
    kind = "vector store file"


class FileBatchNotFound(NotFound):
    kind = "vector store file batch"


class ItemReferenceNotFound(ItemNotFound):
    """An ``item_reference`` input item names no stored item; ``param`` is ``input[i]``."""

    def __init__(self, object_id: str, index: int) -> None:
        super().__init__(object_id)
        self.param = f"input[{index}]"
        self.args = (f"Item with id '{object_id}' not found.",)
