"""Chunking by tokens with overlap, and the ``chunking_strategy`` parameter as OpenAI checks it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["AUTO", "ChunkingError", "chunk_text", "chunking_strategy"]

# OpenAI's "auto": 800-token chunks overlapping by 400.
AUTO: dict[str, Any] = {
    "type": "static",
    "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400},
}


class ChunkingError(ValueError):
    """An invalid ``chunking_strategy``; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def chunking_strategy(value: Any, param: str = "chunking_strategy") -> dict[str, Any]:
    """The stored strategy for a request's ``chunking_strategy`` (None or ``auto``: :data:`AUTO`)."""
    if value is None:
        return AUTO
    if not isinstance(value, dict) or value.get("type") not in ("auto", "static"):
        raise ChunkingError('\'chunking_strategy\' must be {"type": "auto"} or {"type": "static", …}.', param)
    if value["type"] == "auto":
        return AUTO
    static = value.get("static")
    if not isinstance(static, dict):
        raise ChunkingError("A static chunking strategy needs 'static'.", f"{param}.static")
    size = static.get("max_chunk_size_tokens")
    overlap = static.get("chunk_overlap_tokens")
    if not isinstance(size, int) or isinstance(size, bool) or not 100 <= size <= 4096:
        raise ChunkingError(
            "'max_chunk_size_tokens' must be an integer from 100 to 4096.",
            f"{param}.static.max_chunk_size_tokens",
        )
    if not isinstance(overlap, int) or isinstance(overlap, bool) or not 0 <= overlap <= size // 2:
        raise ChunkingError(
            "'chunk_overlap_tokens' must be an integer from 0 to half of 'max_chunk_size_tokens'.",
            f"{param}.static.chunk_overlap_tokens",
        )
    return {"type": "static", "static": {"max_chunk_size_tokens": size, "chunk_overlap_tokens": overlap}}


def chunk_text(
    text: str, spans: Callable[[str], list[tuple[int, int]]], *, size: int, overlap: int
) -> list[str]:
    """``text`` cut into windows of ``size`` tokens, each starting ``size - overlap`` tokens after the
    last; a chunk is the exact text from its first token's start to its last token's end."""
    tokens = spans(text)
    if not tokens:
        return [text.strip()] if text.strip() else []
    step = max(size - overlap, 1)
    chunks: list[str] = []
    for start in range(0, len(tokens), step):
        window = tokens[start : start + size]
        chunks.append(text[window[0][0] : window[-1][1]])
        if start + size >= len(tokens):
            break
    return chunks
