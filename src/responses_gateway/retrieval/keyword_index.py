"""Each vector store's BM25 index in memory: postings in numpy arrays, scored per query term.

The keyword side of hybrid search. A store's chunk texts are read from the database on its first
search and again whenever the store's ``version`` has moved (any instance's write or delete of its
chunks bumps it), exactly as the vector index (``vector_index.py``) does, so several gateway instances
on one database stay consistent, and SQLite and PostgreSQL rank identically: the same code reads the
same texts.

Why not FTS5's ``bm25()`` / PostgreSQL's ``ts_rank``: both compute the rank of every matching row in
the database, which for a common word at 100k chunks took 50-150 ms here (docs/file-search.md,
Measured); here a query term costs one numpy gather-and-add over its postings (a whole query 3-4 ms
p50 at 100k chunks in the benchmark). And the two back ends weighed matches differently.

Memory: the postings (an int32 chunk position and a float32 BM25 term weight per distinct term of
a chunk), the chunk ids and files, and the vocabulary; about 0.5 kB per chunk of 250 tokens
(``KeywordIndex.stats``). The least recently searched stores are dropped past ``max_bytes``.

Tokens: lowercase ``\\w`` runs of 2 to 64 characters, stemmed by the Snowball English stemmer
(PyStemmer, C), the same function at build and at query time. No stop word list: IDF weighs
common words down, and keeping them measured better (docs/file-search.md).
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
import Stemmer

__all__ = ["BM25_B", "BM25_K1", "KeywordIndex", "build", "query_terms", "tokenize"]

BM25_K1 = 1.2
BM25_B = 0.75
MAX_QUERY_TERMS = 64
# Above this many chunks a query is scored in a worker thread (the build always runs in one).
_INLINE_ROWS = 20_000
_WORD = re.compile(r"\w\w+", re.UNICODE)
# PyStemmer's stemmers are not thread-safe: one per thread (builds run in worker threads).
_STEMMERS = threading.local()
_STEMS: dict[str, str] = {}


def _stem(word: str) -> str:
    stem = _STEMS.get(word)
    if stem is None:
        stemmer = getattr(_STEMMERS, "english", None)
        if stemmer is None:
            stemmer = _STEMMERS.english = Stemmer.Stemmer("english")
        stem = sys.intern(stemmer.stemWord(word))
        if len(_STEMS) < 200_000:  # a cache of distinct words (~30 MB at most)
            _STEMS[word] = stem
    return stem


def tokenize(text: str) -> list[str]:
    """The text's terms in order (repeats kept): lowercased words of two to 64 characters, stemmed.
    No stop words are dropped: IDF weighs common words down, and a question's keyword may be one
    (``The "with" statement``)."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if len(w) <= 64]


def query_terms(text: str) -> list[str]:
    """A query's distinct terms, in order, at most ``MAX_QUERY_TERMS``."""
    return list(dict.fromkeys(tokenize(text)))[:MAX_QUERY_TERMS]


class TextSource(Protocol):
    async def version(self, store_id: str) -> int: ...

    async def load_texts(self, store_id: str) -> tuple[int, list[tuple[int, str, str]]]: ...


@dataclass
class _Postings:
    version: int
    ids: npt.NDArray[np.int64]  # chunk id per position
    files: npt.NDArray[np.int32]  # file code per position
    file_codes: dict[str, int]
    vocabulary: dict[str, int]  # term -> its row in offsets
    offsets: npt.NDArray[np.int64]  # term t's postings are [offsets[t], offsets[t + 1])
    docs: npt.NDArray[np.int32]  # chunk position per posting, ascending within a term
    # BM25's term-frequency part per posting: tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / mean len))
    weights: npt.NDArray[np.float32]

    @property
    def nbytes(self) -> int:
        arrays = (self.ids, self.files, self.offsets, self.docs, self.weights)
        # A dict entry and its short str: about 100 bytes per term.
        return int(sum(a.nbytes for a in arrays) + 100 * len(self.vocabulary))


class KeywordIndex:
    """Chunks of a vector store best first by BM25 for a query (Okapi BM25, k1 1.2, b 0.75)."""

    def __init__(self, source: TextSource, *, max_bytes: int = 1 << 30) -> None:
        self._source = source
        self._max = max_bytes
        self._postings: OrderedDict[str, _Postings] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def _load(self, store_id: str, version: int | None) -> _Postings:
        if version is None:
            version = await self._source.version(store_id)
        found = self._postings.get(store_id)
        if found is not None and found.version == version:
            self._postings.move_to_end(store_id)
            return found
        lock = self._locks.setdefault(store_id, asyncio.Lock())
        async with lock:
            found = self._postings.get(store_id)
            if found is not None and found.version == await self._source.version(store_id):
                return found
            version, rows = await self._source.load_texts(store_id)
            postings = await asyncio.to_thread(build, version, rows)
            self._postings[store_id] = postings
            self._postings.move_to_end(store_id)
            total = sum(p.nbytes for p in self._postings.values())
            while total > self._max and len(self._postings) > 1:
                _, dropped = self._postings.popitem(last=False)
                total -= dropped.nbytes
            return postings

    async def search(
        self,
        store_id: str,
        terms: Sequence[str],
        *,
        limit: int,
        file_ids: Sequence[str] | None,
        version: int | None = None,
    ) -> list[int]:
        """Chunk ids best first (ties by id), chunks matching no term left out; only chunks of
        ``file_ids`` when given. ``terms``: ``query_terms(query)``. ``version``: as for
        ``VectorIndex.search``, the store's version read at the start of the search."""
        if not terms:
            return []
        postings = await self._load(store_id, version)
        if len(postings.ids) > _INLINE_ROWS:
            return await asyncio.to_thread(_best, postings, terms, limit, file_ids)
        return _best(postings, terms, limit, file_ids)

    def stats(self, store_id: str) -> tuple[int, int] | None:
        """(chunks, bytes) of a store's loaded index, or None when it is not loaded."""
        found = self._postings.get(store_id)
        return None if found is None else (len(found.ids), found.nbytes)

    def forget(self, store_id: str) -> None:
        self._postings.pop(store_id, None)
        self._locks.pop(store_id, None)


def build(version: int, rows: Iterable[tuple[int, str, str]]) -> _Postings:
    """The postings of ``rows`` (chunk id, file id, text), in the order given."""
    vocabulary: dict[str, int] = {}
    word_terms: dict[str, int] = {}  # a raw word -> its term's number, -1 if left out
    file_codes: dict[str, int] = {}
    ids: list[int] = []
    files: list[int] = []
    lengths: list[int] = []
    pairs: list[int] = []  # (term, count) pairs per chunk
    terms: list[int] = []
    counts: list[int] = []
    for chunk_id, file_id, text in rows:
        length = 0
        before = len(terms)
        for word, count in Counter(_WORD.findall(text.lower())).items():
            term = word_terms.get(word)
            if term is None:
                term = word_terms[word] = _term_number(word, vocabulary)
            if term >= 0:
                terms.append(term)
                counts.append(count)
                length += count
        ids.append(chunk_id)
        files.append(file_codes.setdefault(file_id, len(file_codes)))
        lengths.append(length)
        pairs.append(len(terms) - before)
    n = max(len(ids), 1)
    lengths_a = np.array(lengths, dtype=np.float64)
    mean = float(lengths_a.mean()) if len(ids) and lengths_a.sum() else 1.0
    norms = BM25_K1 * (1 - BM25_B + BM25_B * lengths_a / mean)
    docs = np.repeat(np.arange(len(ids), dtype=np.int64), np.array(pairs, dtype=np.int64))
    keys = np.array(terms, dtype=np.int64) * n + docs
    counts_a = np.array(counts, dtype=np.float64)
    order = np.argsort(keys, kind="stable")
    keys, counts_a = keys[order], counts_a[order]
    # Two words of a chunk may share a stem: equal (term, chunk) keys are summed.
    if len(keys):
        first = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        counts_a = np.add.reduceat(counts_a, first)
        keys = keys[first]
    posting_docs = (keys % n).astype(np.int32)
    offsets = np.searchsorted(keys // n, np.arange(len(vocabulary) + 1)).astype(np.int64)
    weights = (counts_a * (BM25_K1 + 1) / (counts_a + norms[posting_docs])).astype(np.float32)
    return _Postings(
        version,
        np.array(ids, dtype=np.int64),
        np.array(files, dtype=np.int32),
        file_codes,
        vocabulary,
        offsets,
        posting_docs,
        weights,
    )


def _term_number(word: str, vocabulary: dict[str, int]) -> int:
    if len(word) > 64:
        return -1
    return vocabulary.setdefault(_stem(word), len(vocabulary))


def _best(postings: _Postings, terms: Sequence[str], limit: int, file_ids: Sequence[str] | None) -> list[int]:
    n = len(postings.ids)
    scores = np.zeros(n, dtype=np.float64)
    for term in terms:
        row = postings.vocabulary.get(term)
        if row is None:
            continue
        start, end = int(postings.offsets[row]), int(postings.offsets[row + 1])
        df = end - start
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        # A term's postings name each chunk once, so this fancy-indexed add is exact.
        scores[postings.docs[start:end]] += idf * postings.weights[start:end]
    if file_ids is not None:
        wanted = np.array(
            [postings.file_codes[f] for f in file_ids if f in postings.file_codes], dtype=np.int32
        )
        scores[~np.isin(postings.files, wanted)] = 0.0
    matched = int(np.count_nonzero(scores))
    count = min(limit, matched)
    if count <= 0:
        return []
    top = np.argpartition(-scores, count - 1)[:count] if count < n else np.arange(n)
    # Best first, ties by chunk id (the same order on every back end).
    order = sorted(top.tolist(), key=lambda i: (-float(scores[i]), int(postings.ids[i])))
    return [int(postings.ids[i]) for i in order[:count] if scores[i] > 0]
