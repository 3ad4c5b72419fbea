"""documents.extract_text: what a text-only back end (and the vector stores' chunker) reads of a file."""

from __future__ import annotations

import io
import json

import pytest
from pypdf import PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from responses_gateway.documents import DocumentError, document_kind, extract_text


def make_pdf(*pages: str, password: str | None = None) -> bytes:
    """A real PDF whose pages carry ``pages`` as text (Helvetica), written with pypdf."""
    writer = PdfWriter()
    for text in pages:
        page = writer.add_blank_page(width=612, height=792)
        font = DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
        lines = []
        for n, line in enumerate(text.split("\n")):
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            lines.append(f"BT /F1 12 Tf 72 {720 - 16 * n} Td ({escaped}) Tj ET")
        stream = DecodedStreamObject()
        stream.set_data("\n".join(lines).encode("latin-1"))
        page.replace_contents(stream)
    if password is not None:
        writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_plain_text_markdown_and_source_code_come_back_as_written() -> None:
    assert extract_text(b"hello\r\nworld\n", "notes.txt", "text/plain") == "hello\nworld\n"
    md = "# Title\n\n* one\n* two\n\n```python\nprint('x')\n```\n"
    assert extract_text(md.encode(), "README.md", None) == md
    code = 'fn main() {\n    println!("héllo");\n}\n'
    assert extract_text(code.encode(), "main.rs", None) == code
    # A suffix mimetypes calls application/x-…: the bytes decide, and they are text.
    assert extract_text(b"#!/bin/sh\necho hi\n", "run.sh", None) == "#!/bin/sh\necho hi\n"
    # No name, no type: text that decodes is text.
    assert extract_text("päivää".encode(), "", None) == "päivää"


def test_utf8_bom_and_utf16_are_decoded() -> None:
    assert extract_text(b"\xef\xbb\xbfbom text", "a.txt", None) == "bom text"
    assert extract_text("grüße".encode("utf-16"), "a.txt", None) == "grüße"


def test_html_keeps_the_visible_text_only() -> None:
    page = b"""<!DOCTYPE html><html><head><title>Quarterly report</title>
    <style>body { color: red }</style><script>var secret = "do not show";</script></head>
    <body><h1>Results</h1><p>Revenue grew   by <b>12%</b>&nbsp;in Q3 &amp; Q4.</p>
    <ul><li>alpha</li><li>beta</li></ul><noscript>enable js</noscript>
    <pre>  keep
    spacing</pre></body></html>"""
    text = extract_text(page, "report.html", "text/html; charset=utf-8")
    assert "do not show" not in text and "color: red" not in text and "enable js" not in text
    assert text.startswith("Quarterly report\n")
    assert "Results\n" in text
    assert "Revenue grew by 12% in Q3 & Q4." in text
    assert "- alpha\n" in text and "- beta" in text
    assert "  keep\n    spacing" in text
    # Sniffed without a name or type.
    assert document_kind(b"<html><body>x</body></html>", "", None) == "html"


def test_json_is_pretty_printed_when_it_parses() -> None:
    text = extract_text(b'{"a":[1,2],"b":{"c":"d\xc3\xa9"}}', "data.json", "application/json")
    assert json.loads(text) == {"a": [1, 2], "b": {"c": "dé"}}
    assert text.count("\n") >= 6 and "dé" in text
    lines = b'{"a": 1}\n{"a": 2}\n'  # JSON Lines: not one value, kept as written
    assert extract_text(lines, "rows.json", None) == lines.decode()


def test_pdf_text_page_by_page() -> None:
    data = make_pdf("The capital of Freedonia is Fredville.", "Second page (with parens)\nand a line")
    text = extract_text(data, "facts.pdf", "application/pdf")
    assert "The capital of Freedonia is Fredville." in text
    assert "Second page (with parens)" in text and "and a line" in text
    assert text.index("Fredville") < text.index("Second page")
    # The bytes decide: a PDF sent as text/plain under another name is still a PDF.
    assert extract_text(data, "facts.txt", "text/plain") == text


def test_pdf_page_limit() -> None:
    data = make_pdf("one", "two", "three")
    assert "three" in extract_text(data, "p.pdf", None, max_pages=3)
    with pytest.raises(DocumentError) as info:
        extract_text(data, "p.pdf", None, max_pages=2)
    assert info.value.reason == "too_many_pages" and "3 pages" in str(info.value)


def test_corrupt_and_truncated_pdfs_are_clear_errors() -> None:
    data = make_pdf("some text here")
    for broken in (b"%PDF-1.7\n" + b"\x00garbage" * 50, data[: len(data) // 3]):
        with pytest.raises(DocumentError) as info:
            extract_text(broken, "broken.pdf", "application/pdf")
        assert info.value.reason in ("corrupt_pdf", "no_text"), info.value
        assert "broken.pdf" in str(info.value)
    with pytest.raises(DocumentError) as info:
        extract_text(b"this is not a pdf at all", "fake.pdf", "application/pdf")
    assert info.value.reason == "corrupt_pdf"


def test_encrypted_pdf() -> None:
    with pytest.raises(DocumentError) as info:
        extract_text(make_pdf("secret plans", password="hunter2"), "locked.pdf", None)
    assert info.value.reason == "encrypted_pdf" and "locked.pdf" in str(info.value)
    assert "hunter2" not in str(info.value)
    # Restrictions only (empty user password): it opens.
    assert "open plans" in extract_text(make_pdf("open plans", password=""), "open.pdf", None)


def test_pdf_without_a_text_layer() -> None:
    writer = PdfWriter()
    writer.add_blank_page(width=100, height=100)
    out = io.BytesIO()
    writer.write(out)
    with pytest.raises(DocumentError) as info:
        extract_text(out.getvalue(), "scan.pdf", None)
    assert info.value.reason == "no_text"


@pytest.mark.parametrize(
    ("data", "name", "ctype"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 20, "image.png", "image/png"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 20, "looks.txt", "text/plain"),
        (b"PK\x03\x04" + b"\x00" * 20, "report.docx", None),
        (b"just bytes", "clip.mp4", "video/mp4"),
        (b"abc\x00\x01\x02def", "blob.bin", None),
        (bytes(range(256)) * 4, "random", None),
    ],
)
def test_binary_and_unknown_types_are_refused(data: bytes, name: str, ctype: str | None) -> None:
    with pytest.raises(DocumentError) as info:
        extract_text(data, name, ctype)
    assert info.value.reason in ("unsupported_type", "undecodable")
    assert name in str(info.value)


def test_empty_undecodable_and_too_large() -> None:
    with pytest.raises(DocumentError) as info:
        extract_text(b"", "empty.txt", "text/plain")
    assert info.value.reason == "empty" and "empty.txt" in str(info.value)
    with pytest.raises(DocumentError) as info:
        extract_text("caf\xe9 latin-1".encode("latin-1"), "old.txt", None)
    assert info.value.reason == "undecodable" and "UTF-8" in str(info.value)
    with pytest.raises(DocumentError) as info:
        extract_text(b"x" * 101, "big.txt", None, max_bytes=100)
    assert info.value.reason == "too_large"
    with pytest.raises(DocumentError) as info:
        extract_text(b"x" * 50, "big.txt", None, max_chars=10)
    assert info.value.reason == "too_large"
    assert isinstance(info.value, ValueError)
