"""``serve --workers N`` with an embedded model: one model process that every worker uses.

The embedded model (``providers/local.py``) generates one answer at a time in the process that loaded
it, from a bounded FIFO queue. Loaded in each of N workers it would take N times the memory and the
generations would fight over the same cores, so the supervisor starts one *model process* first: a
gateway serving only the embedded model(s) (the default ``gemma-3-270m`` and the models file's
``provider: local`` entries), with no store, no UI and no metrics, on a loopback port bound by the
parent and guarded by a random key only the workers know. Each worker serves the same model names
through :func:`local_model_client`, the Responses passthrough pointed at that process: the relay
replays its events exactly, an HTTP error (the model's 400 for what it cannot do, its 429 when the
queue is full) reaches the client as the model process gave it, and ``/responses/input_tokens`` is
counted there by the model's own tokenizer.

What stays in the worker: the store, ``previous_response_id``/conversations (expanded before the
request leaves), hosted tools (the client claims only the embedded model's own tool types, so the
worker's engine runs code_interpreter, file_search, mcp… between turns as it does for the model in
one process), compaction (the worker's summarising turn over the client) and the capability checks
(the embedded model's :class:`Capabilities`).

The parent keeps the model's listening socket open while the process is replaced (after a crash),
so requests sent meanwhile wait in the kernel's accept queue instead of being refused; a request the
dying process was answering fails, saying so (:class:`ModelProcessRelay`).
"""

from __future__ import annotations

import dataclasses
import secrets
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..providers.base import Provider, ProviderError
from ..providers.gguf_file import LOCAL_CAPABILITIES
from ..providers.openai_responses import OpenAIResponsesProvider, ResponsesRelay
from ..providers.transport import Timeouts, Transport
from ..redaction import REDACTOR

if TYPE_CHECKING:
    from ..config import GatewayConfig
    from .registry import ModelRegistry

__all__ = ["LOCAL_OWNER", "ModelProcessRelay", "SharedModel", "local_model_client", "model_process_config"]

# What the registry records as the owner of an embedded model (``owned_by`` in GET /v1/models).
LOCAL_OWNER = "local"
MODEL_HOST = "127.0.0.1"


class ModelProcessRelay(ResponsesRelay):
    """The passthrough's relay, saying what a lost connection to the model process means (rather than
    naming its private loopback address)."""

    def fail(self, exc: ProviderError) -> None:
        # Only the transport calls ``fail`` (the model's own failures arrive as events): a 5xx here is
        # the model process gone mid-response (killed, out of memory), which the supervisor replaces.
        if exc.status >= 500:
            exc = ProviderError(
                "The embedded model's process stopped before the response was finished (it is being "
                "restarted); please try again.",
                status=502,
                code="server_error",
            )
        super().fail(exc)


def local_model_client(
    *, base_url: str, api_key: str, model: str, transport: Transport | None = None
) -> OpenAIResponsesProvider:
    """A worker's way to the model process: the Responses passthrough, claiming no more than the
    embedded model can do (so the worker's engine runs hosted tools and compaction itself). An
    instance configured, not a subclass: the passthrough may be compiled (docs/architecture.md, "The
    compiled hot path"), and a compiled class's methods refuse an interpreted subclass's instances."""
    client = OpenAIResponsesProvider(
        base_url=base_url,
        api_key=api_key,
        upstream_model=model,
        transport=transport,
        # No idle limit: a request waits silently in the model's queue for as long as the
        # generations ahead of it take, as it would in one process.
        timeouts=Timeouts(connect=10.0, read=None),
        upstream_name="the embedded model's process",
        relay=ModelProcessRelay,
    )
    client.name = "local"
    client.compacts = False
    client.capabilities = LOCAL_CAPABILITIES
    return client


@dataclass(slots=True)
class SharedModel:
    """The model process's address and key, made by the parent before anything forks."""

    listener: socket.socket  # the model process's; workers close their copy
    key: str
    base_url: str

    @classmethod
    def bind(cls) -> SharedModel:
        listener = socket.create_server((MODEL_HOST, 0), backlog=2048)
        listener.set_inheritable(True)
        key = secrets.token_urlsafe(32)
        REDACTOR.add(key)
        return cls(listener, key, f"http://{MODEL_HOST}:{listener.getsockname()[1]}/v1")

    def share(self, registry: ModelRegistry) -> list[str]:
        """Serve the registry's embedded models through the model process instead of loading them
        here; their names (aliases, fallbacks and ``/v1/models`` details are kept)."""
        names = registry.served_by(LOCAL_OWNER)
        for name in names:

            def build(model: str = name) -> Provider:
                return local_model_client(base_url=self.base_url, api_key=self.key, model=model)

            registry.replace_factory(name, build)
        return names


def model_process_config(config: GatewayConfig) -> GatewayConfig:
    """A models file reduced to what the model process serves: its ``provider: local`` models (their
    fallbacks and retries stay with the workers, which see every model)."""
    return dataclasses.replace(
        config,
        models=tuple(
            dataclasses.replace(m, fallbacks=(), retries=0)
            for m in config.models
            if m.provider == LOCAL_OWNER
        ),
        mcp_servers=(),
        web_search=None,
    )
