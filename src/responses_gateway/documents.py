"""Plain text out of an uploaded document, for the consumers that read text only.

``extract_text(data, filename, content_type)`` is what a Chat Completions server, the embedded model
and the vector stores' chunker see of an ``input_file``: text, Markdown, JSON, source code and other
UTF-8 (or BOM-marked UTF-16) text as they are; HTML as its visible text (scripts, styles and other
non-content elements dropped, block elements on lines of their own); JSON pretty-printed when it
parses, so minified JSON reads and chunks by line; PDF through ``pypdf``, page by page.

Anything else is a ``DocumentError`` with a ``reason`` a caller can map to a 400: ``empty``,
``too_large``, ``too_many_pages``, ``unsupported_type`` (images, archives, office files, any binary),
``undecodable`` (text that is not UTF-8/UTF-16), ``corrupt_pdf``, ``encrypted_pdf`` and ``no_text``
(a PDF without a text layer, e.g. a scan). Everything is bounded: the input size, the pages of a
PDF read and the characters returned. Package root, like ``sealing.py``: the server, the engine and
the retrieval service all use it, and it depends on none of them.
"""

from __future__ import annotations

import codecs
import io
import json
import logging
import mimetypes
import re
from html.parser import HTMLParser
from typing import Final

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_PDF_PAGES",
    "MAX_TEXT_CHARS",
    "DocumentError",
    "document_kind",
    "extract_text",
]

MAX_DOCUMENT_BYTES: Final = 64 << 20
MAX_PDF_PAGES: Final = 2000
MAX_TEXT_CHARS: Final = 8_000_000

# Leading bytes of binary formats that may otherwise pass as text (or that say clearly what they are).
_BINARY_MAGIC: Final = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"RIFF", "a RIFF (WebP/WAV/AVI) file"),
    (b"PK\x03\x04", "a ZIP archive (or an Office document)"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"BZh", "a bzip2 archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7z archive"),
    (b"\x7fELF", "an executable"),
    (b"MZ", "an executable"),
    (b"\xd0\xcf\x11\xe0", "an Office document"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"OggS", "an Ogg file"),
    (b"ID3", "an MP3 file"),
    (b"%!PS", "a PostScript file"),
)
# Content types that are text whatever their prefix says (plus every ``text/*``).
_TEXT_TYPES: Final = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/x-ndjson",
        "application/xml",
        "application/xhtml+xml",
        "application/javascript",
        "application/x-javascript",
        "application/typescript",
        "application/x-sh",
        "application/x-python",
        "application/x-python-code",
        "application/sql",
        "application/toml",
        "application/yaml",
        "application/x-yaml",
        "application/x-tex",
        "application/rtf",
    }
)
_HTML_SUFFIXES: Final = (".html", ".htm", ".xhtml")
_JSON_SUFFIXES: Final = (".json",)
# Control characters that do not occur in text (tab, newlines, form feed and escape do).
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f]")


class DocumentError(ValueError):
    """A document that yields no text; ``reason`` is one word (module docstring), the message says why."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def extract_text(
    data: bytes,
    filename: str,
    content_type: str | None = None,
    *,
    max_bytes: int = MAX_DOCUMENT_BYTES,
    max_pages: int = MAX_PDF_PAGES,
    max_chars: int = MAX_TEXT_CHARS,
) -> str:
    """The text of ``data`` (named ``filename``, sent as ``content_type`` if known) or a ``DocumentError``."""
    name = filename or "file"
    if not data:
        raise DocumentError(f"The file '{name}' is empty.", reason="empty")
    if len(data) > max_bytes:
        raise DocumentError(
            f"The file '{name}' is {len(data)} bytes; documents are read up to {max_bytes} bytes.",
            reason="too_large",
        )
    kind = document_kind(data, filename, content_type)
    if kind == "pdf":
        text = _pdf_text(data, name, max_pages)
    else:
        text = _decode(data, name)
        if kind == "html":
            text = html_to_text(text)
        elif kind == "json":
            text = _json_text(text)
    if len(text) > max_chars:
        raise DocumentError(
            f"The text of '{name}' is {len(text)} characters; documents are read up to {max_chars}.",
            reason="too_large",
        )
    return text


def document_kind(data: bytes, filename: str, content_type: str | None = None) -> str:
    """``pdf``, ``html``, ``json`` or ``text`` (a ``DocumentError`` for anything known not to be text).

    The bytes decide first (a PDF or an image sent as ``text/plain`` is what its bytes are), then the
    content type, then the file name's suffix; an unknown name whose bytes decode is text.
    """
    name = filename or "file"
    if data.lstrip(b"\x00\t\n\r ")[:5] == b"%PDF-" or data[:1024].find(b"%PDF-") >= 0:
        return "pdf"
    for magic, what in _BINARY_MAGIC:
        if data.startswith(magic):
            raise DocumentError(
                f"The file '{name}' is {what}, not a document with text; supported: text, Markdown, "
                "HTML, JSON, source code and PDF.",
                reason="unsupported_type",
            )
    lower = name.lower()
    ctype = (content_type or "").split(";", 1)[0].strip().lower()
    if not ctype or ctype == "application/octet-stream":
        ctype = mimetypes.guess_type(lower)[0] or ""
    if ctype == "application/pdf":
        raise DocumentError(f"The file '{name}' is not a PDF (no PDF header).", reason="corrupt_pdf")
    if ctype in ("text/html", "application/xhtml+xml") or lower.endswith(_HTML_SUFFIXES):
        return "html"
    if ctype == "application/json" or lower.endswith(_JSON_SUFFIXES):
        return "json"
    if ctype.startswith(("image/", "audio/", "video/", "font/")) or (
        ctype.startswith("application/")
        and ctype not in _TEXT_TYPES
        and not ctype.endswith(("+xml", "+json"))
        # mimetypes knows some source suffixes as application/x-… (.sh, .tcl, .csh …): bytes decide.
        and not ctype.startswith("application/x-")
    ):
        raise DocumentError(
            f"The file '{name}' ({ctype}) is not a supported document type; supported: text, Markdown, "
            "HTML, JSON, source code and PDF.",
            reason="unsupported_type",
        )
    head = data[:4096].lower()
    if b"<!doctype html" in head or b"<html" in head:
        return "html"
    return "text"


def _decode(data: bytes, name: str) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding = "utf-16"
    elif data.startswith(codecs.BOM_UTF8):
        encoding = "utf-8-sig"
    else:
        encoding = "utf-8"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"The file '{name}' is not UTF-8 text (undecodable byte at offset {exc.start}); "
            "send text as UTF-8.",
            reason="undecodable",
        ) from None
    if "\x00" in text or len(_CONTROL.findall(text[:65536])) > 8:
        raise DocumentError(
            f"The file '{name}' is binary, not text; supported: text, Markdown, HTML, JSON, "
            "source code and PDF.",
            reason="unsupported_type",
        )
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _json_text(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        return text  # JSON Lines, or broken JSON: still text worth reading as it is
    return json.dumps(value, indent=2, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- HTML
_SKIPPED = frozenset({"script", "style", "noscript", "template", "head", "svg", "canvas", "iframe", "object"})
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
)
_BLOCK = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "br", "caption", "dd", "details", "div",
        "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5",
        "h6", "header", "hr", "html", "li", "main", "nav", "ol", "p", "pre", "section", "summary",
        "table", "tbody", "td", "tfoot", "th", "thead", "title", "tr", "ul",
    }
)  # fmt: skip


class _TextOfHTML(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0
        self.pre = 0
        self.title: str | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _SKIPPED and tag not in _VOID:
            self.skip += 1
        elif tag == "pre":
            self.pre += 1
        if tag in _BLOCK:
            self.parts.append("\n")
        if tag == "li" and not self.skip:
            self.parts.append("- ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _SKIPPED and self.skip:
            self.skip -= 1
        elif tag == "pre" and self.pre:
            self.pre -= 1
        if tag in _BLOCK:
            self.parts.append("\n")
        elif tag in ("td", "th"):
            self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        if self._in_title and self.title is None:
            self.title = " ".join(data.split())
        if self.skip:
            return
        if self.pre:  # kept as written: marked so that the line clean-up below leaves it alone
            self.parts.append(data.replace(" ", "\x02").replace("\t", "\x03").replace("\n", "\x01"))
        else:
            self.parts.append(re.sub(r"\s+", " ", data))


def html_to_text(html: str) -> str:
    """The visible text of an HTML page (its title first when the body does not repeat it)."""
    parser = _TextOfHTML()
    parser.feed(html)
    parser.close()
    lines = [line.strip() for line in "".join(parser.parts).split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    text = text.replace("\x02", " ").replace("\x03", "\t").replace("\x01", "\n")
    if parser.title and parser.title not in text:
        text = f"{parser.title}\n\n{text}" if text else parser.title
    return text


# ----------------------------------------------------------------------------------------------- PDF
def _pdf_text(data: bytes, name: str, max_pages: int) -> str:
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError, PdfStreamError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a malformed file's warnings are its error
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            # An owner password alone (printing/copying restrictions) opens with the empty user password.
            try:
                opened = reader.decrypt("")
            except (NotImplementedError, DependencyError) as exc:
                raise DocumentError(
                    f"The PDF '{name}' is encrypted with a method that cannot be opened: {exc}.",
                    reason="encrypted_pdf",
                ) from None
            if not opened:
                raise DocumentError(
                    f"The PDF '{name}' is encrypted (password protected); send it without a password.",
                    reason="encrypted_pdf",
                )
        count = len(reader.pages)
        if count > max_pages:
            raise DocumentError(
                f"The PDF '{name}' has {count} pages; documents are read up to {max_pages} pages.",
                reason="too_many_pages",
            )
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except DocumentError:
        raise
    except FileNotDecryptedError:
        raise DocumentError(
            f"The PDF '{name}' is encrypted (password protected); send it without a password.",
            reason="encrypted_pdf",
        ) from None
    except (PdfReadError, PdfStreamError, ValueError, KeyError, TypeError, AttributeError, IndexError,
            RecursionError, AssertionError, OSError, ZeroDivisionError) as exc:  # fmt: skip
        raise DocumentError(
            f"The PDF '{name}' could not be read (corrupt or truncated): {type(exc).__name__}.",
            reason="corrupt_pdf",
        ) from None
    text = "\n\n".join(page for page in pages if page)
    if not text:
        raise DocumentError(
            f"The PDF '{name}' has no text layer (a scanned or image-only PDF); send its text instead.",
            reason="no_text",
        )
    return text
