"""``file_search``, run by the gateway for any model: search the caller's vector stores between turns.

The model is offered a function ``file_search(queries: string[])`` (strict schema); its call is shown
to the client as a ``file_search_call`` item (``response.file_search_call.in_progress``,
``.searching``, ``.completed``). The engine then runs each query through a :class:`Searcher` (the
vector stores service, ``retrieval/service.py``), merges the hits (best score per chunk, at most the
tool's ``max_num_results``) and gives the model the passages in its next turn. ``results`` (file_id,
filename, score, text, attributes) are on the item only when ``include`` has
``file_search_call.results``, as OpenAI does.

How the model cites: each passage it reads is headed by its file's name and id
(``[1] report.pdf (file_id: file-…)``) and the function's description asks it to name the file where
it uses a passage. Where the answer names a file that a search of this conversation returned (its
filename or its id), the text carries a ``file_citation`` annotation (``file_id``, ``filename``,
``index``: the position just after the mention), at each place it names it.

History: a ``file_search_call`` from an earlier turn or response reaches the back end as the function
call (its ``queries``) and, as output, what the model was told then: kept in memory per API key (the
last 10,000 calls), else rebuilt from the item's ``results`` when the client included them, else a
note that the results are gone (the model may search again).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from ...protocol.builder import HostedCall, HostedSpec, Item, StreamBuilder
from ...protocol.request import RequestError
from ..hosted import HostedTool, HostedUse, RunContext
from ..results import Kept, ResultLog

__all__ = ["RESULTS_INCLUDE", "FileSearch", "Searcher"]

JSON = dict[str, Any]

log = logging.getLogger("responses_gateway.tools")

RESULTS_INCLUDE = "file_search_call.results"
FUNCTION_NAME = "file_search"
MAX_VECTOR_STORES = 10
MAX_NUM_RESULTS = 50
DEFAULT_NUM_RESULTS = 10
MAX_QUERIES = 5  # per call
MAX_QUERY_CHARS = 1000
_MODEL_RESULT_CHARS = 24_000  # what the model reads of one call's results at most
_GONE = "(The results of this search are no longer available; search again if you need them.)"

DESCRIPTION = (
    "Search the user's uploaded files (their vector stores) for passages relevant to the question. "
    "Give one or more short search queries (different phrasings or sub-questions). Each result is a "
    "passage headed by its file's name and file_id. When your answer uses a passage, name the file it "
    "came from (for example: 'according to report.pdf, ...'), so the answer cites its sources."
)


class Searcher(Protocol):
    """The search service the tool runs queries through (``app.vector_stores``)."""

    async def search_for_tool(
        self,
        owner: str | None,
        vector_store_ids: Sequence[str],
        query: str,
        *,
        max_num_results: int,
        filters: dict[str, Any] | None,
        ranking_options: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:
        """Hits best first, each ``{file_id, filename, score, attributes, text}``; raises
        ``LookupError(vector_store_id)`` for a store the owner does not have."""
        ...

    async def check_for_tool(
        self,
        owner: str | None,
        vector_store_ids: Sequence[str],
        *,
        filters: dict[str, Any] | None,
        ranking_options: dict[str, Any] | None,
    ) -> None:
        """Raises what :meth:`search_for_tool` would (``LookupError``, ``ValueError`` for a bad filter
        or ranking option) without searching: a request's tool is checked before the first turn."""
        ...


class FileSearch(HostedTool):
    results: ResultLog
    type = "file_search"
    kind = "file_search_call"
    function_name = FUNCTION_NAME

    def __init__(self, searcher: Searcher | None) -> None:
        self.searcher = searcher
        # What each call told the model, with the hits it saw as ``extra`` (engine/results.py).
        self.results = ResultLog()

    def unavailable(self) -> str | None:
        if self.searcher is None:
            return "it needs vector stores, which this gateway serves only with a store"
        return None

    def function(self, config: JSON) -> JSON:
        return {
            "type": "function",
            "name": FUNCTION_NAME,
            "description": DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "queries": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": f"1 to {MAX_QUERIES} search queries.",
                    }
                },
                "required": ["queries"],
                "additionalProperties": False,
            },
            "strict": True,
        }

    async def use(self, config: JSON, *, param: str, history: list[JSON], ctx: RunContext) -> HostedUse:
        ids = config.get("vector_store_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(v, str) and v for v in ids):
            raise RequestError(
                "'vector_store_ids' must be a non-empty list of vector store ids.",
                param=f"{param}.vector_store_ids",
            )
        if len(ids) > MAX_VECTOR_STORES:
            raise RequestError(
                f"At most {MAX_VECTOR_STORES} vector stores may be searched by one file_search tool.",
                param=f"{param}.vector_store_ids",
            )
        count = config.get("max_num_results")
        if count is None:
            count = DEFAULT_NUM_RESULTS
        elif isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_NUM_RESULTS:
            raise RequestError(
                f"'max_num_results' must be an integer from 1 to {MAX_NUM_RESULTS}.",
                param=f"{param}.max_num_results",
            )
        filters, ranking = config.get("filters"), config.get("ranking_options")
        for name, value in (("filters", filters), ("ranking_options", ranking)):
            if value is not None and not isinstance(value, dict):
                raise RequestError(f"'{name}' must be an object.", param=f"{param}.{name}")
        use = _Use(self, ctx.owner, list(ids), count, filters, ranking)
        # Every store must be the caller's, and the filters valid: a 400 now, not a failed call later.
        assert self.searcher is not None
        try:
            await self.searcher.check_for_tool(ctx.owner, ids, filters=filters, ranking_options=ranking)
        except LookupError as exc:
            missing = str(exc.args[0]) if exc.args else ""
            at = ids.index(missing) if missing in ids else 0
            raise RequestError(
                f"Vector store '{missing}' not found.",
                param=f"{param}.vector_store_ids[{at}]",
                code="not_found",
            ) from None
        except ValueError as exc:  # the service's RetrievalError: a bad filter or option, an expired store
            where, code = getattr(exc, "param", None), getattr(exc, "code", None)
            raise RequestError(
                str(exc),
                param=f"{param}.{where}" if isinstance(where, str) and where else param,
                code=code if isinstance(code, str) else None,
            ) from None
        for item in history:
            if item.get("type") == self.kind:
                use.remember(self.seen(ctx.owner, item))
        return use

    def history(self, item: JSON, owner: str | None, items: list[JSON]) -> tuple[JSON, JSON] | None:
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            raise RequestError("A file_search_call item needs its 'id'.", param=".id")
        queries = item.get("queries")
        if queries is None:
            queries = []
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise RequestError("'queries' must be a list of strings.", param=".queries")
        kept = self.results.get(owner, item_id)
        if kept is not None:
            call_id, text = kept.call_id, kept.text
        else:
            call_id = item_id
            results = _valid_results(item.get("results"))
            text = model_text(queries, results) if results is not None else _GONE
        arguments = json.dumps({"queries": queries}, ensure_ascii=False)
        call = {"type": "function_call", "call_id": call_id, "name": FUNCTION_NAME, "arguments": arguments}
        return call, {"type": "function_call_output", "call_id": call_id, "output": text}

    async def keep(self, owner: str | None, item_id: str, call_id: str, text: str, hits: list[JSON]) -> None:
        """Keep what the model is told, stored before the call's item closes: a continuation on another
        instance right after the response (``previous_response_id``) reads it from the store."""
        await self.results.keep_logged(owner, item_id, Kept(call_id, text, hits))

    def keep_soon(self, owner: str | None, item_id: str, call_id: str, text: str) -> None:
        """:meth:`keep` for a call that was not run (``skip``, which cannot wait): stored in the
        background."""
        self.results.keep_soon(owner, item_id, Kept(call_id, text, []))

    def seen(self, owner: str | None, item: JSON) -> list[JSON]:
        """The hits an earlier ``file_search_call`` gave the model (for citations), if known."""
        item_id = item.get("id")
        kept = self.results.get(owner, item_id) if isinstance(item_id, str) else None
        if kept is not None and isinstance(kept.extra, list):
            return [hit for hit in kept.extra if isinstance(hit, dict)]
        return _valid_results(item.get("results")) or []


class _Use(HostedUse):
    tool: FileSearch

    def __init__(
        self,
        tool: FileSearch,
        owner: str | None,
        ids: list[str],
        count: int,
        filters: JSON | None,
        ranking: JSON | None,
    ) -> None:
        self.tool = tool
        self.owner = owner
        self.ids = ids
        self.count = count
        self.filters = filters
        self.ranking = ranking
        # Files the model has read passages of in this conversation: file_id -> filename.
        self.sources: dict[str, str] = {}

    def remember(self, hits: list[JSON]) -> None:
        for hit in hits:
            self.sources.setdefault(str(hit["file_id"]), str(hit["filename"]))

    def spec(self) -> HostedSpec:
        return HostedSpec("file_search_call", {"queries": [], "results": None})

    def citations(self, text: str) -> list[JSON]:
        """``file_citation`` wherever the answer names a file the searches returned (name or id)."""
        out: list[JSON] = []
        taken: list[tuple[int, int]] = []
        # Longer mentions first, so "report.pdf" inside "old-report.pdf" is not a second citation.
        mentions = sorted(
            (
                (mention, fid, name)
                for fid, name in self.sources.items()
                for mention in (name, fid)
                if mention
            ),
            key=lambda m: -len(m[0]),
        )
        for mention, fid, name in mentions:
            start = text.find(mention)
            while start >= 0:
                end = start + len(mention)
                if not any(a < end and start < b for a, b in taken):
                    taken.append((start, end))
                    out.append({"type": "file_citation", "file_id": fid, "filename": name, "index": end})
                start = text.find(mention, end)
        out.sort(key=lambda a: int(a["index"]))
        return out

    def skip(self, call: HostedCall, item: Item, builder: StreamBuilder, why: str) -> None:
        self.tool.keep_soon(self.owner, item.id, call.call_id, why)
        builder.close_tool_call(item, status="incomplete")

    async def run(
        self, call: HostedCall, item: Item, builder: StreamBuilder, ctx: RunContext
    ) -> AsyncIterator[None]:
        queries = _queries(call.arguments)
        if isinstance(queries, str):  # what was wrong with the call
            await self.tool.keep(self.owner, item.id, call.call_id, queries, [])
            builder.close_tool_call(item, status="failed", queries=[])
            yield
            return
        item.data["queries"] = queries
        builder.tool_progress(item, "searching")
        yield
        searcher = self.tool.searcher
        assert searcher is not None
        best: dict[tuple[str, str], JSON] = {}
        try:
            for query in queries:
                hits = await searcher.search_for_tool(
                    self.owner,
                    self.ids,
                    query,
                    max_num_results=self.count,
                    filters=self.filters,
                    ranking_options=self.ranking,
                )
                for hit in hits:
                    key = (str(hit["file_id"]), str(hit["text"]))
                    if key not in best or float(hit["score"]) > float(best[key]["score"]):
                        best[key] = hit
        except (LookupError, ValueError) as exc:  # a store deleted meanwhile, a refused query
            why = f"Error: the search failed ({exc})."
            if isinstance(exc, LookupError):
                why = f"Error: vector store '{exc.args[0] if exc.args else ''}' is no longer available."
            await self.tool.keep(self.owner, item.id, call.call_id, why, [])
            builder.close_tool_call(item, status="failed", results=None)
            yield
            return
        results = sorted(best.values(), key=lambda h: -float(h["score"]))[: self.count]
        results = [_result(hit) for hit in results]
        self.remember(results)
        await self.tool.keep(self.owner, item.id, call.call_id, model_text(queries, results), results)
        shown = results if RESULTS_INCLUDE in ctx.include else None
        builder.close_tool_call(item, status="completed", results=shown)
        yield


def _queries(arguments: str) -> list[str] | str:
    """The call's queries, or the reason they are unusable (told to the model)."""
    try:
        value = json.loads(arguments, strict=False)
    except ValueError:
        value = None
    queries = value.get("queries") if isinstance(value, dict) else None
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        return 'Error: the call must give search queries as {"queries": ["..."]}.'
    queries = [" ".join(q.split())[:MAX_QUERY_CHARS] for q in queries]
    queries = [q for q in dict.fromkeys(queries) if q]
    if not queries:
        return "Error: the queries were empty; give at least one search query."
    return queries[:MAX_QUERIES]


def _result(hit: JSON) -> JSON:
    attributes = hit.get("attributes")
    return {
        "attributes": attributes if isinstance(attributes, dict) else None,
        "file_id": str(hit["file_id"]),
        "filename": str(hit["filename"]),
        "score": float(hit["score"]),
        "text": str(hit["text"]),
    }


def _valid_results(value: Any) -> list[JSON] | None:
    if not isinstance(value, list):
        return None
    out = []
    for hit in value:
        if not isinstance(hit, dict) or not isinstance(hit.get("file_id"), str):
            continue
        out.append(
            {
                "attributes": hit.get("attributes") if isinstance(hit.get("attributes"), dict) else None,
                "file_id": hit["file_id"],
                "filename": str(hit.get("filename") or hit["file_id"]),
                "score": float(hit.get("score") or 0.0),
                "text": str(hit.get("text") or ""),
            }
        )
    return out


def model_text(queries: list[str], results: list[JSON]) -> str:
    """One call's results as the model reads them: each passage headed by its file's name and id."""
    asked = "; ".join(json.dumps(q, ensure_ascii=False) for q in queries)
    if not results:
        return f"No results found for {asked}."
    parts = [f"Results for {asked} (cite a passage by naming its file):"]
    size = len(parts[0])
    for n, hit in enumerate(results, start=1):
        block = (
            f"[{n}] {hit['filename']} (file_id: {hit['file_id']}, score {hit['score']:.3f})\n{hit['text']}"
        )
        if size + len(block) > _MODEL_RESULT_CHARS:
            block = block[: max(0, _MODEL_RESULT_CHARS - size)] + "\n[… cut …]"
            parts.append(block)
            break
        parts.append(block)
        size += len(block) + 2
    return "\n\n".join(parts)
