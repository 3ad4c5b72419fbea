"""``input_file`` parts made readable for the back end that gets them, once, before anything is sent.

A client names a file three ways: ``file_id`` (uploaded through ``/v1/files``, read here for the
request's owner: another key's file is a 400 naming it, like a missing one), ``file_data`` (a base64
data URL, or bare base64, with ``filename``) or ``file_url``. Each back end reads files in its own
form, declared as ``Capabilities.file_inputs``:

``native`` (the OpenAI passthrough)
    parts go as they came, except ``file_id``, which the upstream does not know: it becomes the
    file's bytes as ``file_data`` (a data URL) with its ``filename``.
``documents`` (Anthropic), ``media`` (Gemini)
    a PDF as ``file_data`` (``application/pdf``: Anthropic's base64 ``document``, Gemini's
    ``inline_data``); any other document as its extracted text (``text/plain`` data: Anthropic's
    text ``document``, Gemini's ``inline_data``); ``file_url`` as it came (both fetch URLs). ``media``
    also passes images, audio and video as data (Gemini reads them; a document parser does not).
``text`` (Chat Completions, the embedded model, the scripted back end: the default)
    the document's extracted text (``documents.extract_text``) as an ``input_text`` part, wrapped in
    ``<file name="…">…</file>`` so the model knows where it starts, ends and what it is called.
    ``file_url`` stays (the provider refuses it with its own 400: the gateway fetches no URLs).

Every failure is a ``RequestError`` naming the part (``input[i].content[j].file_id``…): a file not
found, undecodable base64, a document that yields no text (``documents.DocumentError``'s reason), and
the limits (each file, and all of one request's files together).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import mimetypes
import re
from collections.abc import Awaitable, Callable
from typing import Any

from ..documents import DocumentError, document_kind, extract_text
from ..protocol.request import RequestError

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_REQUEST_FILE_BYTES",
    "FileReader",
    "resolve_input_files",
]

JSON = dict[str, Any]
# (owner, file_id) -> (filename, bytes), or None when the owner has no such file.
FileReader = Callable[[str | None, str], Awaitable[tuple[str, bytes] | None]]

MAX_FILE_BYTES = 32 << 20  # one input file, as OpenAI bounds it
MAX_REQUEST_FILE_BYTES = 64 << 20  # all the files of one request (the history's included)
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)?((?:;[\w-]+=[^;,]*)*)(;base64)?,", re.ASCII)
FORMS = ("native", "documents", "media", "text")
_MEDIA = ("image/", "audio/", "video/")


def _has_files(items: list[JSON]) -> bool:
    for item in items:
        for parts in _part_lists(item):
            if any(isinstance(p, dict) and p.get("type") == "input_file" for p in parts):
                return True
    return False


def _part_lists(item: JSON) -> list[list[Any]]:
    out = []
    content = item.get("content")
    if isinstance(content, list):
        out.append(content)
    output = item.get("output")
    if item.get("type", "message") != "message" and isinstance(output, list):
        out.append(output)
    return out


async def resolve_input_files(
    items: list[JSON], *, form: str, owner: str | None, read: FileReader | None
) -> list[JSON] | None:
    """``items`` with every ``input_file`` part in ``form`` (module docstring); None when there is none.

    The items themselves are not changed (the stored input keeps what the client sent): changed ones
    are copies. Raises RequestError (400) naming the part for anything that cannot be read.
    """
    if form not in FORMS:
        raise ValueError(f"unknown file input form {form!r}")
    if not _has_files(items):
        return None
    budget = _Budget()
    out: list[JSON] = []
    for i, item in enumerate(items):
        copy = item
        for key in ("content", "output"):
            parts = item.get(key)
            if not isinstance(parts, list) or (key == "output" and item.get("type", "message") == "message"):
                continue
            if not any(isinstance(p, dict) and p.get("type") == "input_file" for p in parts):
                continue
            field = "content" if key == "content" else "output"
            new_parts = [
                await _resolve(p, f"input[{i}].{field}[{j}]", form, owner, read, budget)
                if isinstance(p, dict) and p.get("type") == "input_file"
                else p
                for j, p in enumerate(parts)
            ]
            copy = {**copy, key: new_parts}
        out.append(copy)
    return out


class _Budget:
    def __init__(self) -> None:
        self.left = MAX_REQUEST_FILE_BYTES

    def take(self, size: int, param: str) -> None:
        if size > MAX_FILE_BYTES:
            raise RequestError(
                f"The file is {size} bytes; input files may be at most {MAX_FILE_BYTES} bytes.",
                param=param,
                code="file_too_large",
            )
        self.left -= size
        if self.left < 0:
            raise RequestError(
                f"The input files of this request add up to more than {MAX_REQUEST_FILE_BYTES} bytes.",
                param=param,
                code="file_too_large",
            )


async def _resolve(
    part: JSON, param: str, form: str, owner: str | None, read: FileReader | None, budget: _Budget
) -> JSON:
    file_id, file_data, file_url = part.get("file_id"), part.get("file_data"), part.get("file_url")
    filename = part.get("filename") if isinstance(part.get("filename"), str) else None
    content_type: str | None = None
    if isinstance(file_id, str) and file_data is None:
        if read is None:
            raise RequestError(
                "input_file.file_id needs the Files API, which this gateway serves only with a store; "
                "send file_data instead.",
                param=f"{param}.file_id",
            )
        found = await read(owner, file_id)
        if found is None:
            raise RequestError(
                f"No file found with id '{file_id}'.", param=f"{param}.file_id", code="not_found"
            )
        name, data = found
        filename = filename or name
        budget.take(len(data), f"{param}.file_id")
        where = f"{param}.file_id"
    elif isinstance(file_data, str):
        content_type, data = _decode_data(file_data, f"{param}.file_data", budget)
        where = f"{param}.file_data"
        if form == "native":
            return part  # the upstream reads file_data itself
    elif isinstance(file_url, str):
        return part  # native and documents back ends fetch it; text ones refuse it (no fetching here)
    else:
        return part  # parse_request has refused it already
    name = filename or "file"
    if form == "native":
        kind = content_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
        return _data_part(part, data, kind, name)
    if form == "media":
        kind = content_type or mimetypes.guess_type(name)[0] or ""
        if kind.startswith(_MEDIA):
            return _data_part(part, data, kind, name)
    try:
        if form in ("documents", "media") and document_kind(data, name, content_type) == "pdf":
            return _data_part(part, data, "application/pdf", name)
        text = await asyncio.to_thread(extract_text, data, name, content_type)
    except DocumentError as exc:
        raise RequestError(f"{exc}", param=where, code=f"file_{exc.reason}") from None
    if form in ("documents", "media"):
        return _data_part(part, text.encode(), "text/plain", name)
    return {"type": "input_text", "text": f'<file name="{_attr(name)}">\n{text}\n</file>'}


def _data_part(part: JSON, data: bytes, kind: str, name: str) -> JSON:
    encoded = base64.b64encode(data).decode("ascii")
    out = {k: v for k, v in part.items() if k not in ("file_id", "file_data", "file_url")}
    return {**out, "file_data": f"data:{kind};base64,{encoded}", "filename": name}


def _decode_data(value: str, param: str, budget: _Budget) -> tuple[str | None, bytes]:
    """A data URL's (or bare base64's) type and bytes."""
    kind: str | None = None
    body = value
    match = _DATA_URL.match(value)
    if match is not None:
        kind = match.group(1)
        body = value[match.end() :]
        if match.group(3) is None:  # a percent-encoded data URL (not base64)
            from urllib.parse import unquote_to_bytes

            data = unquote_to_bytes(body)
            budget.take(len(data), param)
            return kind, data
    elif value.startswith("data:"):
        raise RequestError("input_file.file_data is not a valid data URL.", param=param, code="invalid_value")
    budget.take(len(body) * 3 // 4, param)
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        try:  # URL-safe base64, or missing padding
            data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise RequestError(
                "input_file.file_data is not valid base64 (send a data URL: data:<type>;base64,<data>).",
                param=param,
                code="invalid_value",
            ) from None
    return kind, data


def _attr(name: str) -> str:
    return name.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace("\n", " ")
