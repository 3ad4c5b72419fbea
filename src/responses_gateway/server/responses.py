"""The Responses API over the store: create (stored, background, chained), retrieve, delete, cancel, list.

=================================================  ==============================================
``POST /v1/responses``                             create (``store``, ``background``,
                                                   ``previous_response_id``, ``conversation``,
                                                   ``item_reference`` inputs)
``GET /v1/responses/{id}``                         the stored Response (``include``)
``GET /v1/responses/{id}?stream=true``             its events as SSE from ``starting_after`` + 1,
                                                   then live until it ends
``DELETE /v1/responses/{id}``                      delete (a running one is stopped)
``GET /v1/responses/{id}/input_items``             ``after``/``before``/``limit``/``order``/``include``
``POST /v1/responses/{id}/cancel``                 stop a background response
=================================================  ==============================================

Everything is read and written as the caller's owner (``GatewayApp.owner_for``): another owner's
response is a 404 exactly like a missing one. Reasoning state leaves the gateway sealed when the
request asks for ``reasoning.encrypted_content`` (see :mod:`responses_gateway.sealing`), and sealed
state that comes back in ``input`` is opened here, before anything else sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol
from urllib.parse import parse_qsl

import orjson

from ..engine import Engine, HostedTool, RunContext, plan_hosted
from ..engine.compaction import ContextCompaction, compact, expand
from ..engine.input_files import resolve_input_files
from ..engine.stop import StopSequences
from ..protocol.builder import StreamBuilder
from ..protocol.request import (
    INCLUDABLE,
    RequestError,
    ResponseRequest,
    echo_tool,
    parse_request,
    public_tools,
)
from ..protocol.response import new_response
from ..providers.base import Provider, ProviderError
from ..providers.fallback import FallbackProvider
from ..redaction import REDACTOR
from ..sealing import Sealer, SealError
from ..store import RUNNING, TERMINAL, NotFound, PreviousResponseNotFound, ResponseNotFound, Store
from .bodies import parse_json_body
from .capabilities import check_capabilities
from .config import ServerConfig
from .errors import HTTPError, send_json
from .http_protocol import ClientGone, body_writer, client_gone
from .namespaces import Flattening, adapt_tools
from .request_log import Observer, RequestLog
from .router import Router
from .streaming import (
    DetachedSink,
    Direct,
    JSONSink,
    Recording,
    Sink,
    SSESink,
    drive,
    follow_stream,
    unsealed,
)
from .types import Receive, Scope, Send


class Host(Protocol):
    """What the Responses endpoints need of the app that serves them (``app.GatewayApp``)."""

    config: ServerConfig
    store: Store | None
    observer: Observer

    @property
    def hosted_tools(self) -> Mapping[str, HostedTool]: ...

    @property
    def sealer(self) -> Sealer: ...

    def owner_for(self, scope: Scope) -> str: ...

    async def read_body(self, scope: Scope, receive: Receive) -> bytes: ...

    async def provider_for(self, model: str) -> Provider: ...

    async def read_file(self, owner: str | None, file_id: str) -> tuple[str, bytes] | None: ...


__all__ = [
    "PREFIX",
    "Client",
    "Host",
    "LocalHistory",
    "Prepared",
    "ResponsesAPI",
    "Seal",
    "not_found",
    "presenter",
    "previous_not_found",
]

log = logging.getLogger("responses_gateway.server")

JSON = dict[str, Any]
Seal = Callable[[list[JSON]], list[JSON]]
# A front end's own record of recent responses: the context a previous_response_id continues, or None.
LocalHistory = Callable[[str], list[JSON] | None]


class Client(Protocol):
    """The front end a Response's events go to (:meth:`ResponsesAPI.run`): SSE or JSON over HTTP
    here; WebSocket messages or another dialect's stream elsewhere."""

    def sink(self, request: ResponseRequest, seal: Seal) -> Sink:
        """Where a foreground run's events go (``seal`` presents them to this caller)."""

    async def background(
        self, request: ResponseRequest, store: Store, owner: str, rid: str, snapshot: JSON, seal: Seal
    ) -> None:
        """The answer to a ``background`` request once its run has started detached."""


PREFIX = "/v1/responses/"
ENCRYPTED = "reasoning.encrypted_content"
_ITEM_EVENTS = frozenset({"response.output_item.added", "response.output_item.done"})


def not_found(exc: NotFound) -> HTTPError:
    """A store NotFound as OpenAI's 404."""
    return HTTPError(404, str(exc), param=exc.param, code=getattr(exc, "code", None))


def previous_not_found(rid: str) -> HTTPError:
    """OpenAI's answer to a ``previous_response_id`` it cannot continue from."""
    return HTTPError(
        400,
        f"Previous response with id '{rid[:200]}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def _bad(message: str, param: str | None = None, code: str | None = None) -> HTTPError:
    return HTTPError(400, message, param=param, code=code)


# ---------------------------------------------------------------------------------------- sealing
def reasoning_state(item: Any) -> str | None:
    if isinstance(item, dict) and item.get("type") == "reasoning":
        value = item.get("encrypted_content")
        if isinstance(value, str) and value:
            return value
    return None


def present_item(item: JSON, sealer: Sealer | None, owner: str, memo: dict[str, str] | None = None) -> JSON:
    """``item`` with its reasoning state sealed (``sealer``) or removed (None); the same object if neither.

    ``memo`` keeps one sealed text per state, so within one stream the same item shows the same
    ``encrypted_content`` in ``output_item.done`` and in the final response (sealing is randomized).
    """
    state = reasoning_state(item)
    if state is None:
        return item
    if sealer is None:
        return {k: v for k, v in item.items() if k != "encrypted_content"}
    if sealer.is_sealed(state):
        return item
    sealed = memo.get(state) if memo is not None else None
    if sealed is None:
        sealed = sealer.seal(state, context=owner)
        if memo is not None:
            memo[state] = sealed
    return {**item, "encrypted_content": sealed}


def _present_event(
    event: JSON, sealer: Sealer | None, owner: str, memo: dict[str, str] | None = None
) -> JSON:
    if event.get("type") in _ITEM_EVENTS:
        item = event.get("item")
        if isinstance(item, dict):
            shown = present_item(item, sealer, owner, memo)
            if shown is not item:
                return {**event, "item": shown}
        return event
    response = event.get("response")
    if isinstance(response, dict):
        shown_response = _present_response(response, sealer, owner, memo)
        if shown_response is not response:
            return {**event, "response": shown_response}
    return event


def _present_response(
    response: JSON, sealer: Sealer | None, owner: str, memo: dict[str, str] | None = None
) -> JSON:
    output = response.get("output")
    if not isinstance(output, list) or not any(reasoning_state(item) for item in output):
        return response
    return {**response, "output": [present_item(item, sealer, owner, memo) for item in output]}


def presenter(sealer: Sealer | None, owner: str) -> Seal:
    """Rewrites events for the client: reasoning state sealed (or removed, without a sealer).

    One presenter serves one stream: an item's state is sealed once and shown the same everywhere.
    """
    memo: dict[str, str] = {}

    def present(events: list[JSON]) -> list[JSON]:
        out = events
        for index, event in enumerate(events):
            shown = _present_event(event, sealer, owner, memo)
            if shown is not event:
                if out is events:
                    out = list(events)
                out[index] = shown
        return out

    return present


# ---------------------------------------------------------------------------------------- queries

# The largest integer a query parameter may carry: the stores keep sequence numbers in signed 64 bits.
MAX_QUERY_INT = 2**63 - 1


class _Query:
    """A GET request's query string, checked with OpenAI's wording."""

    def __init__(self, scope: Scope) -> None:
        raw: bytes = scope.get("query_string", b"")
        self.pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)

    def get(self, name: str) -> str | None:
        for key, value in self.pairs:
            if key == name:
                return value
        return None

    def include(self) -> list[str]:
        values: list[str] = []
        for key, value in self.pairs:
            if key in ("include", "include[]"):
                values.extend(v for v in value.split(",") if v)
        for value in values:
            if value not in INCLUDABLE:
                allowed = ", ".join(f"'{a}'" for a in INCLUDABLE)
                raise _bad(
                    f"Invalid value: '{value}'. Supported values are: {allowed}.", "include", "invalid_value"
                )
        return values

    def flag(self, name: str) -> bool:
        value = self.get(name)
        if value is None:
            return False
        if value.lower() in ("true", "1"):
            return True
        if value.lower() in ("false", "0", ""):
            return False
        raise _bad(
            f"Invalid value for '{name}': expected a boolean, but got '{value}' instead.",
            name,
            "invalid_type",
        )

    def integer(self, name: str, default: int, lo: int, hi: int = MAX_QUERY_INT) -> int:
        """An integer query parameter within [lo, hi]; every integer has an upper bound (a value past
        the store's 64-bit integers overflowed the database bind after the headers were sent)."""
        value = self.get(name)
        if value is None or value == "":
            return default
        try:
            if not value.isascii():
                raise ValueError(value)
            number = int(value)
        except ValueError:
            raise _bad(
                f"Invalid type for '{name}': expected an integer, but got '{value[:40]}' instead.",
                name,
                "invalid_type",
            ) from None
        if number < lo or number > hi:
            bound = f"between {lo} and {hi}"
            raise _bad(
                f"Invalid '{name}': expected a value {bound}, but got {number}.", name, "invalid_value"
            )
        return number

    def order(self) -> str:
        value = self.get("order") or "desc"
        if value not in ("asc", "desc"):
            raise _bad(
                f"Invalid value: '{value}'. Supported values are: 'asc' and 'desc'.", "order", "invalid_value"
            )
        return value


# ---------------------------------------------------------------------------------------- the API
@dataclass(slots=True)
class Prepared:
    """A create request made ready (:meth:`ResponsesAPI.prepare`): the back end chosen, the state
    resolved, every refusal already raised."""

    request: ResponseRequest
    provider: Provider
    owner: str
    turn: list[JSON]
    client_tools: tuple[list[JSON], Any]
    flattening: Flattening
    # The whole conversation the model reads (context resolved and expanded), for a front end that
    # keeps it (a WebSocket connection's previous responses).
    history: list[JSON]


class ResponsesAPI:
    """``/v1/responses`` and ``/v1/responses/{id}…`` for one :class:`Host`."""

    def __init__(self, app: Host) -> None:
        self.app = app
        self._workers: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------ routing
    def register(self, router: Router) -> None:
        """The routes under ``/v1/responses/{response_id}``."""
        router.add("/v1/responses/input_tokens", POST=self.input_tokens)
        router.add("/v1/responses/compact", POST=self.compact)
        router.add("/v1/responses/{rid}", GET=self._retrieve, DELETE=self._delete)
        router.add("/v1/responses/{rid}/input_items", GET=self._input_items)
        router.add("/v1/responses/{rid}/cancel", POST=self._cancel)

    def _store(self) -> Store:
        store = self.app.store
        if store is None:
            raise HTTPError(
                404,
                "This gateway keeps no responses (it runs without a store: serve --store none).",
                code="not_found",
            )
        return store

    # ------------------------------------------------------------------------------ create
    async def create(self, scope: Scope, receive: Receive, send: Send) -> None:
        line = RequestLog(self.app.observer)
        with line.answering():
            await self._create(scope, receive, send, line)

    async def _prepare(self, scope: Scope, receive: Receive, line: RequestLog | None = None) -> Prepared:
        body = parse_json_body(await self.app.read_body(scope, receive))
        return await self.prepare(self.app.owner_for(scope), body, line)

    async def prepare(
        self,
        owner: str,
        body: Any,
        line: RequestLog | None = None,
        *,
        local: LocalHistory | None = None,
        stop: tuple[str, ...] = (),
        seed: int | None = None,
    ) -> Prepared:
        """Everything up to the first event, shared by every way a Response is asked for (SSE, JSON,
        input_tokens, compact and the other front ends): the create body parsed, the state resolved
        (previous response, conversation, item references), the back end chosen and given hosted
        tools it cannot run as functions (the engine), and every refusal an :class:`HTTPError`.

        ``local`` resolves a ``previous_response_id`` before the store (a WebSocket connection's own
        recent responses, kept even with ``store: false``): the context the model saw, or None; with
        it, an id found in neither place is a 400 ``previous_response_not_found``.

        ``stop`` and ``seed`` are engine options the Responses API has no field for (the other front
        ends' stop sequences and seed, validated by them): the back end gets them where it takes them,
        and stop sequences are enforced by the engine for every back end (engine/stop.py)."""
        app = self.app
        try:
            request = parse_request(body)
        except RequestError as exc:
            raise HTTPError.from_request_error(exc) from None
        request.stop, request.seed = stop, seed
        if line is not None:
            line.model, line.stream = request.model, request.stream
            if line.observer.log_content:
                line.request = body
        store = app.store
        conversation_id = _conversation_id(request)
        local_context: list[JSON] | None = None
        if local is not None and request.previous_response_id is not None:
            local_context = local(request.previous_response_id)
            if local_context is None and store is None:
                raise previous_not_found(request.previous_response_id)
        if not request.input and request.previous_response_id is None and conversation_id is None:
            # Nothing to answer: an empty conversation sent upstream makes a model ramble until its
            # output limit (or its context) runs out.
            raise HTTPError(
                400,
                "Nothing to respond to: send 'input', or continue with 'previous_response_id' or "
                "'conversation'.",
                param="input",
                code="missing_required_parameter",
            )
        self._check_state(request, store, conversation_id, chained=local_context is not None)
        self._unseal_input(request, owner)
        provider = await app.provider_for(request.model)
        if line is not None:
            line.backend = provider.name
            if isinstance(provider, FallbackProvider):
                line.primary = provider.chain[0][0]
                line.backends = {name: member.name for name, member in provider.chain}
        # A final ``compaction_trigger`` item: the answer is the compaction (a back end that compacts
        # itself is given the item).
        compact_now = (
            bool(request.input)
            and request.input[-1]["type"] == "compaction_trigger"
            and not provider.compacts
        )
        if compact_now:
            request.input = request.input[:-1]
        turn = request.input
        previous = request.previous_response_id if local_context is None else None
        if store is not None and (
            previous is not None
            or conversation_id is not None
            or any(_needs_lookup(item) for item in request.input)
        ):
            try:
                context, turn = await store.responses.resolve_input(
                    owner,
                    request.input,
                    previous_response_id=previous,
                    conversation_id=conversation_id,
                )
            except NotFound as exc:
                if local is not None and isinstance(exc, PreviousResponseNotFound):
                    raise previous_not_found(exc.object_id) from None
                raise not_found(exc) from None
            request.input = [*context, *turn]
        if local_context is not None:
            request.input = [*local_context, *request.input]
        # Compaction items this gateway sealed become context again; another server's stay for a back
        # end that compacts itself (the OpenAI passthrough), and are a 400 for any other.
        try:
            expanded = expand(request.input, app.sealer, owner)
        except RequestError as exc:
            raise HTTPError.from_request_error(exc) from None
        if expanded is not None:
            request.input = expanded
            foreign = next((i for i, it in enumerate(expanded) if it.get("type") == "compaction"), None)
            if foreign is not None and not provider.compacts:
                raise _bad(
                    "This compaction item was made by another server; this model cannot read it.",
                    f"input[{foreign}]",
                    "invalid_encrypted_content",
                )
        # What the model is given as its conversation, before hosted tools rewrite it for the back end.
        history = list(request.input)
        # input_file parts in the form the back end reads (file ids resolved for the owner, text
        # extracted for text-only back ends); the stored input keeps what the client sent.
        try:
            with_files = await resolve_input_files(
                request.input,
                form=provider.capabilities.file_inputs,
                owner=owner,
                read=app.read_file if store is not None else None,
            )
        except RequestError as exc:
            raise HTTPError.from_request_error(exc) from None
        if with_files is not None:
            request.input = with_files
        # The Response echoes the tools as the client sent them, whatever the back end is given.
        client_tools = (request.tools, request.tool_choice)
        # Hosted tools the back end cannot run itself are offered as functions and run by the engine.
        tool_ctx = RunContext(
            owner=owner, include=frozenset(request.include), timeline=None if line is None else line.timeline
        )
        try:
            plan = await plan_hosted(
                request,
                native=provider.capabilities.tool_types,
                tools=app.hosted_tools,
                ctx=tool_ctx,
                drop=app.config.drop_unsupported_tools,
            )
        except RequestError as exc:
            raise HTTPError.from_request_error(exc) from None
        if plan is not None:
            provider = Engine(provider, plan, tool_ctx)
        flattening = adapt_tools(
            request, supported=provider.capabilities.tool_types, drop=app.config.drop_unsupported_tools
        )
        while True:
            try:
                check_capabilities(request, provider.capabilities)
                provider.check_request(request)
                break
            except RequestError as exc:
                if not flattening.drop_refused(request, exc):
                    raise HTTPError.from_request_error(flattening.client_error(exc)) from None
            except ProviderError as exc:
                if not flattening.drop_refused(request, exc):
                    raise HTTPError.from_provider_error(flattening.client_error(exc)) from None
        if compact_now:
            provider = ContextCompaction(provider, 0, app.sealer, owner, answer=False)
        elif request.compact_threshold is not None and not provider.compacts:
            # Server-side compaction (context_management); a back end that compacts does it itself.
            provider = ContextCompaction(provider, request.compact_threshold, app.sealer, owner)
        if request.stop:
            # The outermost: a stop sequence ends the Response, whatever drives the turns.
            provider = StopSequences(provider)
        if line is not None:
            line.prepared = True
        return Prepared(request, provider, owner, turn, client_tools, flattening, history)

    async def compact(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/responses/compact``: the conversation's user messages and one sealed compaction
        item standing for the rest (the back end's own compaction where it has one)."""
        ready = await self._prepare(scope, receive)
        try:
            result = await ready.provider.compact(ready.request)
            if result is None:
                result = await compact(ready.provider, ready.request, self.app.sealer, ready.owner)
        except ProviderError as exc:
            raise HTTPError.from_provider_error(exc) from None
        await send_json(send, 200, orjson.dumps(result))

    async def input_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/responses/input_tokens``: what the model would read for this request, counted by
        the back end's own tokenizer or counting endpoint (a 400 saying so where it has none)."""
        ready = await self._prepare(scope, receive)
        try:
            count = await ready.provider.count_input_tokens(ready.request)
        except ProviderError as exc:
            raise HTTPError.from_provider_error(exc) from None
        await send_json(send, 200, orjson.dumps({"object": "response.input_tokens", "input_tokens": count}))

    async def _create(self, scope: Scope, receive: Receive, send: Send, line: RequestLog) -> None:
        ready = await self._prepare(scope, receive, line)
        await self.run(ready, _HTTPClient(self, send, receive, body_writer(scope), client_gone(scope)), line)

    async def run(self, ready: Prepared, client: Client, line: RequestLog) -> None:
        """Drive a prepared Response to its end: stored (and recorded) or not, in the background or
        not, its events going to ``client``'s sink. Every front end answers through here."""
        app = self.app
        request, provider, owner, turn = ready.request, ready.provider, ready.owner, ready.turn
        client_tools, flattening, store = ready.client_tools, ready.flattening, app.store
        seal = presenter(app.sealer, owner) if ENCRYPTED in request.include else unsealed
        echo = request.echo()
        echo["tools"], echo["tool_choice"] = public_tools(client_tools[0]), client_tools[1]
        if flattening.dropped:
            # The Response says which tools the model had: the dropped ones are not among them.
            echo["tools"] = public_tools(
                [t for i, t in enumerate(client_tools[0]) if i not in flattening.dropped]
            )
        echo["tools"] = [echo_tool(tool) for tool in echo["tools"]]
        if store is None:
            # Nothing is kept without a store: the response must not claim it was stored.
            echo["store"] = False
        config = app.config
        builder = StreamBuilder(new_response(request.model, **echo), raw_reasoning=config.raw_reasoning)
        builder.tool_namespaces = flattening.names
        builder.redact = REDACTOR.scrub
        line.builder = builder
        line.activate("background" if request.background and store is not None else line.mode)
        if store is None or not request.store:
            builder.start()
            await drive(provider, request, builder, client.sink(request, seal))
            return

        builder.start(queued=request.background)
        rid = builder.response["id"]
        snapshot = builder.snapshot()
        recorder = store.recorder(rid)
        stop = store.cancel_event(rid)
        unstored: list[BaseException] = []
        if request.stream and not request.background and snapshot.get("conversation") is None:
            # Written behind the first events: the row is written while the stream starts, and
            # nothing of the response reaches the database before it (docs/store.md, "Write-behind
            # create"). A create that fails stops the run (server_error) rather than leaving it
            # unstored.
            created = store.responses.create_behind(
                owner, snapshot, request=_stored_request(request.raw), input_items=turn
            )
            recorder.behind(created)

            def check_created(done: asyncio.Future[None]) -> None:
                error = None if done.cancelled() else done.exception()
                if error is not None:
                    log.error("storing response %s failed: %s", rid, type(error).__name__)
                    unstored.append(error)
                    stop.set()

            created.add_done_callback(check_created)
        else:
            try:
                creating = store.responses.create_response(
                    owner, snapshot, request=_stored_request(request.raw), input_items=turn
                )
                metrics = app.observer.metrics
                await (creating if metrics is None else metrics.timed("create_response", creating))
            except NotFound as exc:  # the conversation was deleted meanwhile
                raise not_found(exc) from None
        recording = Recording(
            add=recorder.add_nowait,
            commit=recorder.drain
            if app.observer.metrics is None
            else app.observer.metrics.timer("commit_events", recorder.drain),
            stop=stop,
            cause=partial(self._cause, store, owner, rid, unstored),
        )
        if request.background:
            recorder.add_nowait(builder.take())
            detached = DetachedSink(keepalive=config.keepalive, keepalive_interval=config.keepalive_interval)
            task = asyncio.get_running_loop().create_task(
                drive(provider, request, builder, detached, recording),
                name=f"rg-background-{rid}",
            )
            # The line is written when the run ends, not when the queued snapshot goes out.
            line.background = True
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)
            task.add_done_callback(lambda _: line.write())
            await client.background(request, store, owner, rid, snapshot, seal)
            return
        try:
            await drive(provider, request, builder, client.sink(request, seal), recording)
        except BaseException:
            # A request refused before its first event (upstream 4xx/429...) leaves nothing stored.
            if recorder.recorded == 0:
                with contextlib.suppress(Exception):
                    await asyncio.shield(store.responses.discard_response(rid))
            raise

    def _check_state(
        self,
        request: ResponseRequest,
        store: Store | None,
        conversation_id: str | None,
        *,
        chained: bool = False,
    ) -> None:
        """Refuse what needs state the gateway cannot give."""
        if request.background and not request.store:
            raise _bad(
                "Background responses must be stored: 'background': true needs 'store': true.", "background"
            )
        if request.previous_response_id is not None and conversation_id is not None:
            raise _bad(
                "Mutually exclusive parameters: Ensure you are only providing one of: 'previous_response_id' "
                "or 'conversation'.",
                "conversation",
                "mutually_exclusive_parameters",
            )
        if store is not None:
            return
        needs = [
            (name, f"'{name}'")
            for name, used in (
                ("background", request.background),
                ("previous_response_id", request.previous_response_id is not None and not chained),
                ("conversation", conversation_id is not None),
            )
            if used
        ]
        needs += [
            (f"input[{index}]", f"'input[{index}]' (item_reference)")
            for index, item in enumerate(request.input)
            if item.get("type") == "item_reference"
        ]
        if needs:
            param, what = needs[0]
            raise _bad(
                f"Unsupported parameter: {what} needs stored state, and this gateway runs without a store "
                "(serve --store none). Send the whole conversation in 'input' instead.",
                param,
            )

    def _unseal_input(self, request: ResponseRequest, owner: str) -> None:
        """Open the reasoning state this gateway sealed; anything altered (or another owner's) is a 400."""
        sealer: Sealer | None = None
        for index, item in enumerate(request.input):
            state = reasoning_state(item)
            if state is None:
                continue
            sealer = sealer or self.app.sealer
            if not sealer.is_sealed(state):
                continue  # an upstream's own encrypted_content: passed on as it came
            param = f"input[{index}].encrypted_content"
            try:
                value = sealer.unseal(state, context=owner)
            except SealError as exc:
                raise _bad(
                    f"Invalid 'encrypted_content': {exc}.", param, "invalid_encrypted_content"
                ) from None
            if not isinstance(value, str):
                raise _bad("Invalid 'encrypted_content'.", param, "invalid_encrypted_content")
            request.input[index] = {**item, "encrypted_content": value}

    async def _cause(self, store: Store, owner: str, rid: str, unstored: list[BaseException]) -> str:
        if unstored:
            return "unstored"
        try:
            await store.responses.get_response(owner, rid)
        except ResponseNotFound:
            return "deleted"
        return "cancelled"

    async def follow(
        self,
        send: Send,
        receive: Receive,
        store: Store,
        owner: str,
        rid: str,
        after: int,
        seal: Seal,
        direct: Direct | None = None,
        gone: ClientGone | None = None,
    ) -> None:
        """A stored response's events as SSE from ``after`` + 1, then live until it ends."""
        config = self.app.config
        await follow_stream(
            send,
            receive,
            store.stream_events(owner, rid, starting_after=after),
            seal=seal,
            keepalive=config.keepalive != "off",
            keepalive_interval=config.keepalive_interval,
            direct=direct,
            gone=gone,
        )

    # ------------------------------------------------------------------------------ reads and writes
    async def _retrieve(self, scope: Scope, receive: Receive, send: Send, *, rid: str) -> None:
        store = self._store()
        owner = self.app.owner_for(scope)
        query = _Query(scope)
        include = query.include()
        stream = query.flag("stream")
        try:
            read = store.responses.get_response(owner, rid, include=include)
            metrics = self.app.observer.metrics
            response = await (read if metrics is None else metrics.timed("get_response", read))
        except NotFound as exc:
            raise not_found(exc) from None
        sealer = self.app.sealer if ENCRYPTED in include else None
        if stream:
            after = query.integer("starting_after", -1, -1)
            await self.follow(
                send,
                receive,
                store,
                owner,
                rid,
                after,
                presenter(sealer, owner),
                body_writer(scope),
                client_gone(scope),
            )
            return
        if sealer is not None:
            response = _present_response(response, sealer, owner)
        await send_json(send, 200, orjson.dumps(response))

    async def _delete(self, scope: Scope, receive: Receive, send: Send, *, rid: str) -> None:
        store = self._store()
        owner = self.app.owner_for(scope)
        try:
            result = await store.responses.delete_response(owner, rid)
        except NotFound as exc:
            raise not_found(exc) from None
        await send_json(send, 200, orjson.dumps(result))

    async def _input_items(self, scope: Scope, receive: Receive, send: Send, *, rid: str) -> None:
        store = self._store()
        owner = self.app.owner_for(scope)
        query = _Query(scope)
        include = query.include()
        limit = query.integer("limit", 20, 1, 100)
        order = query.order()
        try:
            page = await store.responses.list_input_items(
                owner,
                rid,
                after=query.get("after") or None,
                before=query.get("before") or None,
                limit=limit,
                order=order,
                include=include,
            )
        except NotFound as exc:
            raise not_found(exc) from None
        if ENCRYPTED in include:
            sealer = self.app.sealer
            page["data"] = [present_item(item, sealer, owner) for item in page["data"]]
        await send_json(send, 200, orjson.dumps(page))

    async def _cancel(self, scope: Scope, receive: Receive, send: Send, *, rid: str) -> None:
        store = self._store()
        owner = self.app.owner_for(scope)
        await self.app.read_body(scope, receive)  # whatever came with it is ignored, as OpenAI does
        try:
            response = await store.responses.get_response(owner, rid)
            if not response.get("background"):
                raise _bad("Only responses created with 'background': true can be cancelled.")
            status = response.get("status")
            if status in RUNNING:
                response = await store.responses.cancel_response(owner, rid, wait=self.app.config.cancel_wait)
            elif status in TERMINAL and status != "cancelled":
                raise _bad(f"Cannot cancel a response with status '{status}'.")
        except NotFound as exc:
            raise not_found(exc) from None
        await send_json(send, 200, orjson.dumps(response))

    # ------------------------------------------------------------------------------ shutdown
    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the background responses still running here: each ends ``failed``, written as such."""
        workers = list(self._workers)
        for task in workers:
            task.cancel()
        if workers:
            await asyncio.wait(workers, timeout=timeout)


class _HTTPClient:
    """``POST /v1/responses``' own front end: SSE frames or one JSON body."""

    def __init__(
        self, api: ResponsesAPI, send: Send, receive: Receive, direct: Direct | None, gone: ClientGone | None
    ) -> None:
        self.api, self.send, self.receive, self.direct, self.gone = api, send, receive, direct, gone

    def sink(self, request: ResponseRequest, seal: Seal) -> Sink:
        if not request.stream:
            return JSONSink(self.send, self.receive, seal=seal, gone=self.gone)
        config = self.api.app.config
        return SSESink(
            self.send,
            self.receive,
            keepalive=config.keepalive,
            keepalive_interval=config.keepalive_interval,
            seal=seal,
            direct=self.direct,
            gone=self.gone,
        )

    async def background(
        self, request: ResponseRequest, store: Store, owner: str, rid: str, snapshot: JSON, seal: Seal
    ) -> None:
        if request.stream:
            await self.api.follow(
                self.send, self.receive, store, owner, rid, -1, seal, self.direct, self.gone
            )
        else:
            await send_json(self.send, 200, orjson.dumps(seal([{"response": snapshot}])[0]["response"]))


def _conversation_id(request: ResponseRequest) -> str | None:
    conversation = request.conversation
    if isinstance(conversation, str):
        return conversation
    if isinstance(conversation, dict) and isinstance(conversation.get("id"), str):
        return str(conversation["id"])
    return None


def _needs_lookup(item: JSON) -> bool:
    """An input item the store completes: an ``item_reference``, or a reasoning item sent back with
    only its id (its thinking and signature are taken from the stored item of that id, if any)."""
    kind = item.get("type")
    if kind == "item_reference":
        return True
    return kind == "reasoning" and not item.get("encrypted_content") and isinstance(item.get("id"), str)


def _stored_request(raw: JSON) -> JSON:
    """The request as stored: without the credentials a tool carries (headers, authorization)."""
    tools = raw.get("tools")
    if not isinstance(tools, list):
        return raw
    return {**raw, "tools": public_tools(tools)}
