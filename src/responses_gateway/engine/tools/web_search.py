"""``web_search`` (and ``web_search_preview``), run by the gateway for back ends without native search.

The model is offered a function ``web_search(action, query, url, pattern)``; its call is shown as a
``web_search_call`` item (``response.web_search_call.in_progress``, ``.searching``, ``.completed``)
whose ``action`` says what it did: ``search`` (a query sent to the configured search back end),
``open_page`` (a page fetched, through the network guard, ``netguard.py``) or ``find_in_page`` (a
pattern looked for in a page). With ``include: ["web_search_call.action.sources"]`` a search's action
lists its sources. The model reads numbered results and is asked to cite them as ``[n]``; the answer's
``[n]`` markers and the result URLs it writes out become ``url_citation`` annotations.

The search back end is the operator's choice (the models file's ``web_search:``): SearXNG's JSON API
(:class:`SearxngBackend`) or the Brave Search API (:class:`BraveBackend`, its key in an environment
variable), behind the :class:`SearchBackend` protocol. Without one the tool is unavailable: a request
with it gets a 400 saying how to configure one (or the tool is dropped with
``--drop-unsupported-tool``).
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx2

from ...netguard import NetGuard, NetRefused, guarded_client
from ...protocol.builder import HostedCall, HostedSpec, Item, StreamBuilder
from ...protocol.json_field import clean_text
from ...protocol.request import RequestError
from ..hosted import HostedTool, HostedUse, RunContext
from ..results import Kept, ResultLog

__all__ = [
    "SOURCES_INCLUDE",
    "BraveBackend",
    "SearchBackend",
    "SearchError",
    "SearchResult",
    "SearxngBackend",
    "WebSearch",
]

JSON = dict[str, Any]

log = logging.getLogger("responses_gateway.tools")

SOURCES_INCLUDE = "web_search_call.action.sources"
FUNCTION_NAME = "web_search"
WEB_SEARCH_TYPES = (
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
)
# Results per search, and characters of each snippet, by search_context_size.
_CONTEXT = {"low": (3, 300), "medium": (5, 600), "high": (10, 1200)}
_PAGE_BYTES = 2 * 1024 * 1024  # one page fetched
_PAGE_CHARS = 20_000  # what the model reads of one page
_FIND_MATCHES = 10
_TIMEOUT = 15.0
_MAX_QUERY = 1000
_MARKER = re.compile(r"\[(\d{1,3})\]")
_URL = re.compile(r"https?://[^\s)\]>\"']+")

DESCRIPTION = (
    "Search the web, open a page, or find text in a page. Use action 'search' with a query; "
    "'open_page' with a url (from the results) to read it; 'find_in_page' with a url and a pattern. "
    "Results are numbered: cite them in your answer as [1], [2]…"
)


class SearchError(Exception):
    """The search back end failed (the message is safe to show)."""


@dataclass(frozen=True, slots=True)
class SearchResult:
    title: str
    url: str
    snippet: str


class SearchBackend(Protocol):
    """A web search engine the gateway asks (one per gateway, chosen in the models file)."""

    name: str

    async def search(self, query: str, *, count: int, location: JSON | None) -> list[SearchResult]:
        """Up to ``count`` results for ``query``; ``location`` is the request's ``user_location``."""
        ...


class SearxngBackend:
    """SearXNG's JSON API (``GET <url>/search?q=…&format=json``; the instance must enable JSON)."""

    name = "searxng"

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    async def search(self, query: str, *, count: int, location: JSON | None) -> list[SearchResult]:
        params = {"q": query, "format": "json"}
        country = (location or {}).get("country")
        if isinstance(country, str) and len(country) == 2:
            params["language"] = f"all-{country.upper()}"  # SearXNG's region form
        body = await _get_json(f"{self.url}/search", params, {})
        results = body.get("results") if isinstance(body, dict) else None
        return [
            SearchResult(str(r.get("title") or ""), str(r["url"]), str(r.get("content") or ""))
            for r in (results or [])
            if isinstance(r, dict) and isinstance(r.get("url"), str)
        ][:count]


class BraveBackend:
    """The Brave Search API (``X-Subscription-Token`` from the environment variable the config names)."""

    name = "brave"
    URL = "https://api.search.brave.com/res/v1/web/search"

    def __init__(self, api_key: str, url: str | None = None) -> None:
        self._key = api_key
        self.url = url or self.URL

    def secrets(self) -> tuple[str, ...]:
        return (self._key,)

    async def search(self, query: str, *, count: int, location: JSON | None) -> list[SearchResult]:
        params = {"q": query, "count": str(count)}
        country = (location or {}).get("country")
        if isinstance(country, str) and len(country) == 2:
            params["country"] = country.lower()
        headers = {"Accept": "application/json", "X-Subscription-Token": self._key}
        body = await _get_json(self.url, params, headers)
        web = body.get("web") if isinstance(body, dict) else None
        results = web.get("results") if isinstance(web, dict) else None
        return [
            SearchResult(
                str(r.get("title") or ""), str(r["url"]), _strip_tags(str(r.get("description") or ""))
            )
            for r in (results or [])
            if isinstance(r, dict) and isinstance(r.get("url"), str)
        ][:count]


async def _get_json(url: str, params: Mapping[str, str], headers: Mapping[str, str]) -> Any:
    """A search back end's JSON (the operator's URL: trusted, no network guard)."""
    try:
        async with guarded_client(None, dict(headers), httpx2.Timeout(_TIMEOUT)) as http:
            got = await http.get(url, params=dict(params))
            if got.status_code != 200:
                raise SearchError(f"the search back end answered HTTP {got.status_code}")
            return got.json()
    except httpx2.HTTPError as exc:
        raise SearchError(f"the search back end cannot be reached ({type(exc).__name__})") from None
    except ValueError:
        raise SearchError("the search back end did not answer JSON") from None


class WebSearch(HostedTool):
    results: ResultLog
    type = "web_search"
    kind = "web_search_call"
    function_name = FUNCTION_NAME
    optional = True

    def __init__(self, backend: SearchBackend | None, guard: NetGuard) -> None:
        self.backend = backend
        self.guard = guard
        self.results = ResultLog()  # what each call told the model (engine/results.py)

    def unavailable(self) -> str | None:
        if self.backend is None:
            return (
                "no search back end is configured; add 'web_search: {backend: searxng, url: …}' (or "
                "'{backend: brave, api_key_env: …}') to the models file (docs/configuration.md), or "
                "serve with --drop-unsupported-tool web_search to leave the tool out"
            )
        return None

    def refuse(self, config: JSON, param: str) -> RequestError | None:
        if config.get("external_web_access") is False:
            return RequestError(
                "Web search without live access ('external_web_access': false) is not available with "
                "this model: this gateway's web_search searches the live web.",
                param=f"{param}.external_web_access",
            )
        return None

    def function(self, config: JSON) -> JSON:
        return {
            "type": "function",
            "name": FUNCTION_NAME,
            "description": DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": ["search", "open_page", "find_in_page"]},
                    "query": {"type": "string", "description": "What to search for (action search)."},
                    "url": {"type": "string", "description": "The page (open_page, find_in_page)."},
                    "pattern": {"type": "string", "description": "The text to find (find_in_page)."},
                },
                "required": ["action"],
            },
            "strict": False,
        }

    async def use(self, config: JSON, *, param: str, history: list[JSON], ctx: RunContext) -> HostedUse:
        size = config.get("search_context_size", "medium")
        if size not in _CONTEXT:
            raise RequestError(
                "'search_context_size' must be 'low', 'medium' or 'high'.",
                param=f"{param}.search_context_size",
            )
        location = config.get("user_location")
        if location is not None and not isinstance(location, dict):
            raise RequestError("'user_location' must be an object.", param=f"{param}.user_location")
        filters = config.get("filters")
        domains = (filters or {}).get("allowed_domains") if isinstance(filters, dict) else None
        if domains is not None and not (
            isinstance(domains, list) and all(isinstance(d, str) for d in domains)
        ):
            raise RequestError(
                "'filters.allowed_domains' must be a list of domains.",
                param=f"{param}.filters.allowed_domains",
            )
        return _Use(self, str(size), location, tuple(domains or ()), ctx.owner)

    async def keep(self, owner: str | None, item_id: str, text: str) -> None:
        """Keep what the model is told, stored before the call's item closes: a continuation on another
        instance right after the response (``previous_response_id``) reads it from the store."""
        await self.results.keep_logged(owner, item_id, Kept(item_id, text))

    def keep_soon(self, owner: str | None, item_id: str, text: str) -> None:
        """:meth:`keep` for a call that was not run (``skip``, which cannot wait): stored in the
        background."""
        self.results.keep_soon(owner, item_id, Kept(item_id, text))

    def history(self, item: JSON, owner: str | None, items: list[JSON]) -> tuple[JSON, JSON] | None:
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            raise RequestError("A web_search_call item needs its 'id'.", param=".id")
        action = item.get("action") if isinstance(item.get("action"), dict) else {}
        assert isinstance(action, dict)
        arguments = {k: v for k, v in action.items() if k in ("query", "url", "pattern")}
        arguments["action"] = action.get("type", "search")
        kept = self.results.get(owner, item_id)
        result = kept.text if kept is not None else "(The results of this call are no longer available.)"
        call = {
            "type": "function_call",
            "call_id": item_id,
            "name": FUNCTION_NAME,
            "arguments": json.dumps(arguments, ensure_ascii=False),
        }
        return call, {"type": "function_call_output", "call_id": item_id, "output": result}


class _Use(HostedUse):
    tool: WebSearch

    def __init__(
        self, tool: WebSearch, size: str, location: JSON | None, domains: tuple[str, ...], owner: str | None
    ) -> None:
        self.tool = tool
        self._owner = owner
        self._count, self._snippet = _CONTEXT[size]
        self._location = location
        self._domains = domains
        self.sources: list[SearchResult] = []  # numbered for the model, [1] first
        self._pages: dict[str, str] = {}

    def spec(self) -> HostedSpec:
        return HostedSpec("web_search_call", {"action": {"type": "search"}})

    def citations(self, text: str) -> list[JSON]:
        out: list[JSON] = []
        for match in _MARKER.finditer(text):
            n = int(match.group(1))
            if 1 <= n <= len(self.sources):
                out.append(_citation(self.sources[n - 1], match.start(), match.end()))
        known = {s.url: s for s in self.sources}
        for match in _URL.finditer(text):
            url = match.group(0).rstrip(".,;:!?")
            if url in known:
                out.append(_citation(known[url], match.start(), match.start() + len(url)))
        return sorted(out, key=lambda a: int(a["start_index"]))

    def skip(self, call: HostedCall, item: Item, builder: StreamBuilder, why: str) -> None:
        self.tool.keep_soon(self._owner, item.id, why)
        builder.close_tool_call(item, status="incomplete")

    async def run(
        self, call: HostedCall, item: Item, builder: StreamBuilder, ctx: RunContext
    ) -> AsyncIterator[None]:
        builder.tool_progress(item, "searching")
        yield
        try:
            args = json.loads(call.arguments or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            args = {}
        kind = args.get("action") or ("open_page" if args.get("url") and not args.get("query") else "search")
        action: JSON
        status = "completed"
        try:
            if kind == "search":
                query = str(args.get("query") or "").strip()[:_MAX_QUERY]
                action = {"type": "search", "query": query}
                text, found = await self._search(query)
                if SOURCES_INCLUDE in ctx.include:
                    action["sources"] = [{"type": "url", "url": r.url} for r in found]
            elif kind == "open_page":
                url = str(args.get("url") or "")
                action = {"type": "open_page", "url": url}
                page = await self._page(url)
                text = page[:_PAGE_CHARS] + ("\n[… page cut …]" if len(page) > _PAGE_CHARS else "")
            elif kind == "find_in_page":
                url, pattern = str(args.get("url") or ""), str(args.get("pattern") or "")
                action = {"type": "find_in_page", "url": url, "pattern": pattern}
                text = _find(await self._page(url), pattern)
            else:
                action = {"type": "search"}
                text = "Error: 'action' must be search, open_page or find_in_page."
                status = "failed"
        except (SearchError, NetRefused) as exc:
            text = f"Error: {exc}."
            status = "failed"
        await self.tool.keep(ctx.owner, item.id, text)
        builder.close_tool_call(item, status=status, action=action)
        yield

    async def _search(self, query: str) -> tuple[str, list[SearchResult]]:
        backend = self.tool.backend
        if backend is None or not query:
            raise SearchError("a search needs a query" if backend else "no search back end")
        full = query
        if self._domains:
            full += " (" + " OR ".join(f"site:{d}" for d in self._domains) + ")"
        found = await backend.search(full, count=self._count, location=self._location)
        if self._domains:
            found = [r for r in found if _in_domains(r.url, self._domains)]
        lines = []
        for result in found:
            self.sources.append(result)
            snippet = clean_text(result.snippet)[: self._snippet]
            lines.append(f"[{len(self.sources)}] {clean_text(result.title)}\n{result.url}\n{snippet}")
        return ("\n\n".join(lines) if lines else "No results."), found

    async def _page(self, url: str) -> str:
        if url in self._pages:
            return self._pages[url]
        guard = self.tool.guard
        await guard.check_url(url)
        try:
            async with guarded_client(guard, None, httpx2.Timeout(_TIMEOUT)) as http:
                text = await asyncio.wait_for(_fetch(http, url), _TIMEOUT * 2)
        except httpx2.ConnectError as exc:
            raise NetRefused(str(exc) or "the page cannot be reached") from None
        except (httpx2.HTTPError, TimeoutError) as exc:
            raise SearchError(f"the page cannot be read ({type(exc).__name__})") from None
        self._pages[url] = text
        return text


async def _fetch(http: httpx2.AsyncClient, url: str) -> str:
    """A page as text (HTML reduced to its text), at most ``_PAGE_BYTES`` read; redirects followed,
    each hop through the guard (its own connection)."""
    for _ in range(5):
        async with http.stream("GET", url) as got:
            if got.status_code in (301, 302, 303, 307, 308) and got.headers.get("location"):
                url = str(got.url.join(got.headers["location"]))
                continue
            if got.status_code != 200:
                raise SearchError(f"the page answered HTTP {got.status_code}")
            data = bytearray()
            async for chunk in got.aiter_bytes():
                data.extend(chunk)
                if len(data) >= _PAGE_BYTES:
                    break
            kind = got.headers.get("content-type", "")
            text = bytes(data[:_PAGE_BYTES]).decode(got.encoding or "utf-8", errors="replace")
            return _strip_tags(text) if "html" in kind or text.lstrip().startswith("<") else clean_text(text)
    raise SearchError("the page redirects too many times")


def _strip_tags(text: str) -> str:
    text = re.sub(r"(?is)<(script|style|noscript)[^>]*>.*?</\1>", " ", text)
    text = re.sub(r"(?s)<[^>]+>", " ", text)
    text = html.unescape(text)
    return clean_text(re.sub(r"[ \t\r\f\v]+", " ", re.sub(r"\n\s*\n+", "\n\n", text)).strip())


def _find(page: str, pattern: str) -> str:
    if not pattern:
        return "Error: find_in_page needs a pattern."
    lower, needle = page.lower(), pattern.lower()
    out: list[str] = []
    start = 0
    while len(out) < _FIND_MATCHES:
        at = lower.find(needle, start)
        if at < 0:
            break
        out.append("…" + page[max(0, at - 200) : at + len(pattern) + 200].replace("\n", " ") + "…")
        start = at + len(pattern)
    return "\n\n".join(out) if out else f"'{pattern}' was not found on the page."


def _in_domains(url: str, domains: tuple[str, ...]) -> bool:
    host = httpx2.URL(url).host.lower()
    return any(host == d.lower() or host.endswith("." + d.lower()) for d in domains)


def _citation(source: SearchResult, start: int, end: int) -> JSON:
    return {
        "type": "url_citation",
        "end_index": end,
        "start_index": start,
        "title": source.title,
        "url": source.url,
    }
