"""Stop sequences enforced by the gateway, for every back end.

:class:`StopSequences` wraps the request's back end (the outermost wrapper, set by
``ResponsesAPI.prepare`` when the request has ``stop``). It puts a
:class:`~responses_gateway.protocol.stop.StopScanner` on the builder, which then cuts ``output_text``
before the first stop sequence, across deltas, holding back only the characters that could still begin
one. When the scanner finds one, the back end's turn is cancelled at once (its generator closed: the
upstream request is closed, the embedded model stops sampling) and the Response completes with the
text before the sequence; ``builder.stopped_by`` names it for the front ends (Messages'
``stop_sequence``).

Back ends that take stop sequences natively (Chat Completions upstreams, Anthropic, Gemini) get them
in their own request too and stop there; on their output the scanner finds nothing and costs a
``str.find`` per delta. The others (the embedded model, the OpenAI Responses passthrough, scripted)
rely on this wrapper alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ..protocol.builder import StreamBuilder
from ..protocol.request import ResponseRequest
from ..protocol.stop import StopScanner
from ..providers.base import Wrapper

__all__ = ["StopSequences"]


class StopSequences(Wrapper):
    """``inner`` with the request's stop sequences enforced on its output text."""

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        scanner = builder.stop = StopScanner(request.stop)
        agen = self.inner.stream(request, builder)
        try:
            async for _ in agen:
                if scanner.matched is not None and not builder.finished:
                    break
                yield
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                await aclose()
        if scanner.matched is not None and not builder.finished:
            # The back end's turn was cancelled: the Response ends here, whoever was driving turns.
            builder.defer_finish = False
            builder.complete()
            yield
