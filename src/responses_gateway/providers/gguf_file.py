"""A GGUF model file's metadata, read without loading the model (and without llama_cpp).

``serve`` checks every local model file with :func:`read_gguf` before it announces anything: a
missing, unreadable, non-GGUF or damaged file is a start-up error naming the file, not a 500 on the
first request. The metadata also gives the chat template (``local_template``) and the context the
model was trained for (listed in ``GET /v1/models``).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import Capabilities

__all__ = [
    "BUNDLED_TRAINED_CONTEXT",
    "DEFAULT_N_CTX",
    "LOCAL_CAPABILITIES",
    "PROMPT_FORMATS",
    "GGUFInfo",
    "ModelFileError",
    "read_gguf",
]

# How a local model may be prompted (``local_template.select_format``; a models file's ``prompt_format``).
PROMPT_FORMATS = ("auto", "template", "transcript", "gemma", "chatml")

# What the embedded model (providers/local.py) can honour; here, without llama.cpp, because the workers
# of ``serve --workers N`` claim it for the model process they send to (server/model_process.py).
LOCAL_CAPABILITIES = Capabilities(
    streaming=True,
    tools=True,
    parallel_tool_calls=True,
    reasoning=False,
    structured_output=True,
    images=False,
    tool_types=frozenset({"function", "custom"}),
)

# The context the embedded model runs with unless a model sets n_ctx: Codex's first request alone (its
# instructions and tools) is ~8,500 tokens; 16k of KV cache costs ~300 MB for Gemma 3 270M.
DEFAULT_N_CTX = 16384
# What the bundled Gemma 3 270M was trained for (its metadata's gemma3.context_length).
BUNDLED_TRAINED_CONTEXT = 32768


class ModelFileError(ValueError):
    """The model file cannot be used (missing, unreadable, not a GGUF)."""


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    """What the gateway needs from a GGUF's metadata."""

    path: Path
    architecture: str
    chat_template: str | None
    context_length: int | None  # the context the model was trained for
    name: str | None = None


# GGUF value types (llama.cpp's gguf.h): fixed sizes, or 8 (string) / 9 (array).
_FIXED = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 64 * 1024 * 1024


class _Damaged(Exception):
    pass


class _Cursor:
    """Reads GGUF values from a mapped file, every read checked against its end."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: Any, end: int) -> None:
        self.buf = buf
        self.end = end
        self.pos = 0

    def take(self, n: int) -> int:
        at = self.pos
        if n < 0 or at + n > self.end:
            raise _Damaged("the file ends in the middle of its metadata")
        self.pos = at + n
        return at

    def unpack(self, fmt: str) -> Any:
        at = self.take(struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buf, at)[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > _MAX_STRING:
            raise _Damaged("a metadata string is implausibly long")
        at = self.take(n)
        return bytes(self.buf[at : at + n]).decode("utf-8", "replace")

    def skip_string(self) -> None:
        self.take(self.unpack("<Q"))

    def value(self, vtype: int, *, keep: bool) -> Any:
        """The value (or None when ``keep`` is false: skipped without decoding)."""
        if vtype in _FIXED:
            fmt = _FIXED[vtype]
            if keep:
                return self.unpack(fmt)
            self.take(struct.calcsize(fmt))
            return None
        if vtype == _STRING:
            if keep:
                return self.string()
            self.skip_string()
            return None
        if vtype == _ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype in _FIXED:
                self.take(struct.calcsize(_FIXED[etype]) * count)
            else:
                for _ in range(count):  # strings (the vocabulary) or nested arrays: walked, not kept
                    self.value(etype, keep=False)
            return None
        raise _Damaged(f"unknown metadata value type {vtype}")


def read_gguf(path: str | Path) -> GGUFInfo:
    """The metadata of the GGUF at ``path``; ModelFileError (saying what is wrong) if it is not one.

    Written by hand rather than with the ``gguf`` package's reader: that one decodes every field,
    the 262k-token vocabulary included, which took 8 s for the bundled model; this walks past arrays
    and keeps only scalars (~0.1 s). The tests write their files with ``gguf``'s writer.
    """
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"{p}: no such file")
    if not p.is_file():
        raise ModelFileError(f"{p}: not a file")
    try:
        with p.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise ModelFileError(f"{p}: not a GGUF model file (too short)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                if buf[:4] != b"GGUF":
                    raise ModelFileError(
                        f"{p}: not a GGUF model file (it does not start with the GGUF magic)"
                    )
                scalars = _scalars(buf, size)
    except OSError as exc:
        raise ModelFileError(f"{p}: cannot be read ({exc.strerror or exc})") from None
    except _Damaged as exc:
        raise ModelFileError(f"{p}: damaged GGUF file ({exc})") from None
    arch = scalars.get("general.architecture")
    architecture = arch if isinstance(arch, str) else ""
    template = scalars.get("tokenizer.chat_template")
    context = scalars.get(f"{architecture}.context_length") if architecture else None
    name = scalars.get("general.name")
    return GGUFInfo(
        path=p,
        architecture=architecture,
        chat_template=template if isinstance(template, str) and template.strip() else None,
        context_length=context if isinstance(context, int) and context > 0 else None,
        name=name if isinstance(name, str) else None,
    )


def _scalars(buf: Any, size: int) -> dict[str, Any]:
    cur = _Cursor(buf, size)
    cur.take(4)
    version = cur.unpack("<I")
    if version < 2:
        raise _Damaged(f"GGUF version {version} is too old (2 or later is needed)")
    cur.unpack("<Q")  # tensor count
    n_kv = cur.unpack("<Q")
    out: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.unpack("<I")
        out[key] = cur.value(vtype, keep=vtype != _ARRAY)
    return out
