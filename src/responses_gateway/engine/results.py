"""What hosted calls told the model, kept for the turns and responses that follow.

A hosted call's item (``code_interpreter_call``, ``file_search_call``, ``web_search_call``) carries what
the client asked to see (``outputs`` or ``results`` only with ``include``); the model was told more: the
logs, the passages, the pages. A later turn — the next one, or a request continuing through
``previous_response_id`` on any instance — must give the back end that same text, so each tool keeps it
here: in memory (the last 10,000 calls per process) and, once the app has a store, in the store
(``store/tool_results.py``, shared by every instance, pruned after 30 days). ``extra`` is a tool's own
JSON beside the text (file_search keeps the hits it cites from).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Kept", "ResultCatalog", "ResultLog"]

log = logging.getLogger("responses_gateway.tools")

_KEPT = 10_000


@dataclass(frozen=True, slots=True)
class Kept:
    """One call's result as the model read it: the model's own ``call_id``, the text, the tool's extra."""

    call_id: str
    text: str
    extra: Any = None


class ResultCatalog(Protocol):
    """The store's side (``store.tool_results``)."""

    async def put_result(
        self, owner: str | None, item_id: str, call_id: str, text: str, extra: Any = None
    ) -> None: ...

    async def result(self, owner: str | None, item_id: str) -> tuple[str, str, Any] | None: ...


class ResultLog:
    """One tool's kept results, by (owner, item id): another owner's call is simply unknown."""

    def __init__(self) -> None:
        self.catalog: ResultCatalog | None = None
        self._kept: OrderedDict[tuple[str | None, str], Kept] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, owner: str | None, item_id: str) -> Kept | None:
        return self._kept.get((owner, item_id))

    async def keep(self, owner: str | None, item_id: str, kept: Kept) -> None:
        """Keep ``kept`` here and, with a store, for every instance (written before this returns)."""
        self._remember(owner, item_id, kept)
        if self.catalog is not None:
            await self.catalog.put_result(owner, item_id, kept.call_id, kept.text, kept.extra)

    async def keep_logged(self, owner: str | None, item_id: str, kept: Kept) -> None:
        """:meth:`keep`, but a failed store write is logged, not raised: the call's result is still
        kept in this process, and the response goes on (as :meth:`keep_soon`, without the race: the
        store has it when this returns)."""
        await _logged(self.keep(owner, item_id, kept))

    def keep_soon(self, owner: str | None, item_id: str, kept: Kept) -> None:
        """:meth:`keep` from code that cannot wait: the store is written in the background."""
        self._remember(owner, item_id, kept)
        if self.catalog is not None:
            self._later(self.catalog.put_result(owner, item_id, kept.call_id, kept.text, kept.extra))

    async def recall(self, owner: str | None, item_ids: Iterable[str]) -> None:
        """Fetch from the store the results of these calls this process does not know (made on another
        instance, or before a restart), so :meth:`get` has them."""
        if self.catalog is None:
            return
        for item_id in item_ids:
            if (owner, item_id) not in self._kept:
                found = await self.catalog.result(owner, item_id)
                if found is not None:
                    self._remember(owner, item_id, Kept(*found))

    async def aclose(self) -> None:
        """Finish the background writes (before the store closes)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _remember(self, owner: str | None, item_id: str, kept: Kept) -> None:
        self._kept[(owner, item_id)] = kept
        self._kept.move_to_end((owner, item_id))
        while len(self._kept) > _KEPT:
            self._kept.popitem(last=False)

    def _later(self, work: Awaitable[None]) -> None:
        task = asyncio.get_running_loop().create_task(_logged(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _logged(work: Awaitable[None]) -> None:
    try:
        await work
    except Exception:
        log.exception("keeping a hosted call's result failed")
