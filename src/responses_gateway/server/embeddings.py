"""``POST /v1/embeddings`` with the gateway's embedders (the local all-MiniLM-L6-v2), in OpenAI's shape:
``input`` a string or an array of strings, ``encoding_format`` ``float`` or ``base64``, ``dimensions``
only the model's own, ``usage`` in the model's tokens."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from ..retrieval.embedder import Embedder, EmbedderUnavailable, RemoteEmbedder
from ..retrieval.service import RetrievalError, VectorStores
from .bodies import parse_json_body
from .errors import HTTPError, send_json
from .query import invalid
from .registry import ModelRegistry
from .router import Router
from .types import Receive, Scope, Send

__all__ = ["EmbeddingsAPI", "models_file_embedders"]

# Back ends whose upstream speaks OpenAI's POST /embeddings.
EMBEDDING_PROVIDERS = {"openai": "https://api.openai.com/v1", "openai-chat": None}


def models_file_embedders(registry: ModelRegistry) -> Callable[[str], Embedder | None]:
    """An embedder for a models-file model whose provider is ``openai`` or ``openai-chat`` (its
    ``base_url``, ``upstream_model`` and ``api_key_env``), else None."""

    def remote(name: str) -> Embedder | None:
        config = registry.model_configs.get(name)
        if config is None or config.provider not in EMBEDDING_PROVIDERS:
            return None
        base_url = config.base_url or EMBEDDING_PROVIDERS[config.provider]
        if base_url is None:
            return None
        return RemoteEmbedder(
            name,
            base_url,
            config.upstream_model or name,
            config.api_key,
            timeout=config.timeouts.total or 60.0,
        )

    return remote


BodyReader = Callable[[Scope, Receive], Awaitable[bytes]]
OwnerOf = Callable[[Scope], str]

MAX_INPUTS = 2048
MAX_INPUT_CHARS = 100_000


class EmbeddingsAPI:
    def __init__(self, service: VectorStores, owner: OwnerOf, read_body: BodyReader) -> None:
        self.service = service
        self._owner = owner
        self._read_body = read_body

    def register(self, router: Router) -> None:
        router.add("/v1/embeddings", POST=self._create)

    @staticmethod
    async def _probe(embedder: Embedder) -> int:
        try:
            return await asyncio.to_thread(embedder.probe)
        except EmbedderUnavailable as exc:
            raise HTTPError(502, str(exc), type="server_error", code="upstream_error") from None

    async def _create(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._owner(scope)
        body = parse_json_body(await self._read_body(scope, receive))
        if not isinstance(body, dict):
            raise HTTPError(400, "The request body must be a JSON object.")
        for key in body:
            if key not in ("input", "model", "encoding_format", "dimensions", "user"):
                raise invalid(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise invalid("You must provide a model parameter.", "model", "missing_required_parameter")
        try:
            embedder = self.service.embedder(model)
        except RetrievalError as exc:
            raise HTTPError(exc.status, str(exc), param="model", code=exc.code) from None
        texts = _inputs(body.get("input"))
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise invalid(
                "'encoding_format' must be 'float' or 'base64'.", "encoding_format", "invalid_value"
            )
        dimensions = body.get("dimensions")
        if dimensions is not None and dimensions != await self._probe(embedder):
            raise invalid(
                f"'{embedder.name}' gives {embedder.dimensions}-dimension embeddings; "
                "'dimensions' cannot change that.",
                "dimensions",
                "unsupported_value",
            )
        try:
            result = await asyncio.to_thread(embedder.embed, texts)
        except EmbedderUnavailable as exc:
            if isinstance(embedder, RemoteEmbedder):
                raise HTTPError(502, str(exc), type="server_error", code="upstream_error") from None
            raise HTTPError(503, str(exc), type="server_error", code="model_unavailable") from None
        data: list[dict[str, Any]] = []
        for index, vector in enumerate(result.vectors):
            value: Any = (
                base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                if encoding == "base64"
                else [float(x) for x in vector]
            )
            data.append({"object": "embedding", "index": index, "embedding": value})
        await send_json(
            send,
            200,
            orjson.dumps(
                {
                    "object": "list",
                    "data": data,
                    "model": embedder.name,
                    "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
                }
            ),
        )


def _inputs(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if isinstance(texts, list) and texts and all(isinstance(t, (int, list)) for t in texts):
        raise invalid(
            "Token arrays are not supported as 'input' here: send the text (the tokens of another model's "
            "tokenizer mean nothing to this one).",
            "input",
            "unsupported_value",
        )
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise invalid("'input' must be a string or a non-empty array of strings.", "input", "invalid_value")
    if len(texts) > MAX_INPUTS:
        raise invalid(f"'input' may hold at most {MAX_INPUTS} strings.", "input", "array_above_max_length")
    for i, text in enumerate(texts):
        if not text:
            raise invalid(f"'input[{i}]' must not be empty.", "input", "invalid_value")
        if len(text) > MAX_INPUT_CHARS:
            raise invalid(
                f"'input[{i}]' is longer than {MAX_INPUT_CHARS} characters.", "input", "invalid_value"
            )
    return texts
