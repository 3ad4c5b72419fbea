"""Each vector store's BM25 index in memory: postings in numpy arrays, scored per query term.

The keyword side of hybrid search. A store's index is a few **segments**, each the postings of
some attachments (a file's chunks as one ingestion wrote them, named by the file id and the store
``version`` that ingestion set: ``VectorStoreTables.keyword_changes``). On a search, when the store's
``version`` has moved (any instance's write or delete of its chunks bumps it), the index asks the
database which attachments exist now and reads the new ones only: a detached one marks its chunks
dead in its segment. So several gateway instances on one database stay consistent, and SQLite and
PostgreSQL rank identically: the same code reads the same data.

**Stored postings.** Ingestion tokenizes a file's chunks once (``postings``: a compact blob of the
chunks' lengths, terms, and per term the chunk positions and counts) and the store keeps the blob
beside the chunks, written and deleted with them (``rg_vs_bm25``). A new attachment, and so the
first search of a store in a process (a restart, each ``--workers`` worker, after eviction), is
loaded from those blobs (numpy only, no tokenizing: ``loaded``); an attachment without one (written
by an older gateway) or with one made by another ``TOKENIZER`` version has its texts read and
tokenized instead. A segment loaded from blobs holds exactly the numbers one built from the texts
holds (tests/test_keyword_index.py). ``KeywordIndex.reads`` counts the chunks taken each way.

Scores are exactly the BM25 of the whole store: the number of chunks, each term's document
frequency and the mean chunk length are summed over the segments' live chunks at query time, and a
posting's term-frequency weight depends on the mean length, so a segment keeps its raw term counts
and its chunk lengths; its weights are precomputed for one mean and computed per query term while
the mean differs (the first searches after a write). Segments and weights are the same numbers a
single build gives, so an index built in pieces ranks and scores exactly as one built at once
(tests/test_keyword_index.py). In the background, after a write: small segments (past two
segments: the large one stays unless the others hold half as many chunks), and segments with
many dead chunks, are merged (numpy only, no tokenizing), and the weights are brought to the new mean.

Why not FTS5's ``bm25()`` / PostgreSQL's ``ts_rank``: both compute the rank of every matching row in
the database, which for a common word at 100k chunks took 50-150 ms here (docs/file-search.md,
Measured); here a query term costs one numpy gather-and-add over its postings (a whole query 3-4 ms
p50 at 100k chunks in the benchmark). And the two back ends weighed matches differently.

Memory: the postings (an int32 chunk position, a uint16 term count and a float32 BM25 term weight
per distinct term of a chunk), the chunk ids, files and lengths, and the vocabulary per segment
(``KeywordIndex.stats``). The least recently searched stores are dropped past ``max_bytes``.

Tokens: lowercase ``\\w`` runs of 2 to 64 characters, stemmed by the Snowball English stemmer
(PyStemmer, C), the same function at build and at query time. No stop word list: IDF weighs
common words down, and keeping them measured better (docs/file-search.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import re
import struct
import sys
import threading
import time
import zlib
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt
import Stemmer

from .topk import STRIDE, kth_largest

__all__ = [
    "BM25_B",
    "BM25_K1",
    "MAX_SEGMENTS",
    "TOKENIZER",
    "KeywordIndex",
    "Segment",
    "SegmentKey",
    "build",
    "intact",
    "loaded",
    "postings",
    "query_terms",
    "tokenize",
]

log = logging.getLogger(__name__)

BM25_K1 = 1.2
BM25_B = 0.75
MAX_QUERY_TERMS = 64
# Above this many chunks a query is scored in a worker thread (the build always runs in one).
_INLINE_ROWS = 20_000
# Past this many segments the small ones are merged in the background; a segment whose dead chunks
# pass this share is rewritten without them.
MAX_SEGMENTS = 2
# A new segment's weights are computed on the search path up to this many postings (~8k chunks).
_INLINE_WEIGHTS = 1_000_000
_DEAD_SHARE = 0.2
SegmentKey = tuple[str, int]  # file id, the store version its ingestion set
# The version of ``tokenize`` and of the ``postings`` encoding, stored with each blob: change it with
# either, and stored postings of the old one are ignored (the texts are tokenized again). 2: the
# blob ends with its CRC-32.
TOKENIZER = 2
# A blob: magic, chunks, terms, postings, the byte widths of a posting's chunk position and count;
# then each chunk's length (uint32), the terms' offsets (uint32), the positions, the counts, and the
# terms themselves (UTF-8, newline-separated: a term is a run of word characters), and the CRC-32
# of all that (uint32), so a damaged row is noticed (``intact``) rather than read as other terms.
_BLOB = struct.Struct("<4sIIIBB")
_MAGIC = b"BM25"
_WIDTHS: dict[int, str] = {1: "<u1", 2: "<u2", 4: "<u4"}
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


Stored = tuple[SegmentKey, bytes, bytes]  # an attachment's key, chunk ids (int64 LE), blob
Row = tuple[SegmentKey, int, str]  # an attachment's key, a chunk's id, its text


class TextSource(Protocol):
    async def version(self, store_id: str) -> int: ...

    async def keyword_changes(
        self, store_id: str, known: Set[SegmentKey], tokenizer: int
    ) -> tuple[int, list[SegmentKey], list[Stored], list[Row]]: ...

    async def store_postings(self, store_id: str, part: Stored, tokenizer: int) -> bool: ...

    async def drop_postings(self, store_id: str, keys: Sequence[SegmentKey]) -> None: ...


@dataclass(frozen=True)
class Segment:
    """The postings of some attachments' chunks. Vocabulary rows and file codes are numbered in
    insertion order (a dict's order is its rows' order)."""

    keys: frozenset[SegmentKey]  # the live attachments it holds
    ids: npt.NDArray[np.int64]  # chunk id per position
    files: npt.NDArray[np.int32]  # file code per position
    file_codes: dict[str, int]
    lengths: npt.NDArray[np.float64]  # tokens per chunk
    vocabulary: dict[str, int]  # term -> its row in offsets
    offsets: npt.NDArray[np.int64]  # term t's postings are [offsets[t], offsets[t + 1])
    docs: npt.NDArray[np.int32]  # chunk position per posting, ascending within a term
    counts: npt.NDArray[np.uint16]  # the term's count in the chunk per posting (capped at 65535)
    alive: npt.NDArray[np.bool_] | None  # None: no chunk of it was detached
    live: int  # live chunks
    live_length: int  # their tokens
    # BM25's term-frequency part per posting for weights_mean (the store's mean chunk length):
    # tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / mean len))
    weights: npt.NDArray[np.float32] | None = None
    weights_mean: float = 0.0

    @property
    def nbytes(self) -> int:
        arrays: list[npt.NDArray[np.generic]] = [self.ids, self.files, self.lengths, self.offsets, self.docs]
        arrays += [a for a in (self.counts, self.alive, self.weights) if a is not None]
        # A dict entry and its short str: about 100 bytes per term.
        return int(sum(a.nbytes for a in arrays) + 100 * len(self.vocabulary))

    def with_weights(self, mean: float) -> Segment:
        if self.weights is not None and self.weights_mean == mean:
            return self
        return replace(self, weights=_weights(self.counts, self.lengths[self.docs], mean), weights_mean=mean)


@dataclass(frozen=True)
class _State:
    version: int
    keys: frozenset[SegmentKey]  # every attachment read (some may have no chunk)
    segments: tuple[Segment, ...]
    live: int
    mean: float
    ids: npt.NDArray[np.int64]  # the segments' chunk ids end to end

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments) + int(self.ids.nbytes)


def _state(version: int, keys: frozenset[SegmentKey], segments: Sequence[Segment]) -> _State:
    live = sum(s.live for s in segments)
    length = sum(s.live_length for s in segments)
    mean = length / live if live and length else 1.0
    ids = np.concatenate([s.ids for s in segments]) if segments else np.zeros(0, dtype=np.int64)
    return _State(version, keys, tuple(segments), live, mean, ids)


def _weights(
    counts: npt.NDArray[np.uint16], lengths: npt.NDArray[np.float64], mean: float
) -> npt.NDArray[np.float32]:
    """The one formula of a posting's weight, used whole (a segment's) and per term slice (a query
    while the mean moved): elementwise, so both give the same float32s."""
    tf = counts.astype(np.float64)
    return (tf * (BM25_K1 + 1) / (tf + BM25_K1 * (1 - BM25_B + BM25_B * lengths / mean))).astype(np.float32)


class KeywordIndex:
    """Chunks of a vector store best first by BM25 for a query (Okapi BM25, k1 1.2, b 0.75)."""

    def __init__(self, source: TextSource, *, max_bytes: int = 1 << 30) -> None:
        self._source = source
        self._max = max_bytes
        self._states: OrderedDict[str, _State] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._reads = {"postings": 0, "texts": 0}
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def reads(self) -> dict[str, int]:
        """Chunks taken into this index so far, by where from: ``postings`` (stored at ingestion) and
        ``texts`` (tokenized here: attachments without stored postings of this ``TOKENIZER``)."""
        return dict(self._reads)

    async def _load(self, store_id: str, version: int | None, *, warm: bool = False) -> _State:
        if version is None:
            version = await self._source.version(store_id)
        found = self._states.get(store_id)
        if found is not None and found.version == version:
            self._states.move_to_end(store_id)
            return found
        lock = self._locks.setdefault(store_id, asyncio.Lock())
        async with lock:
            found = self._states.get(store_id)
            if found is not None and found.version == await self._source.version(store_id):
                return found
            known = frozenset() if found is None else found.keys
            started = time.monotonic()
            for attempt in range(2):
                version, listed, stored, rows = await self._source.keyword_changes(store_id, known, TOKENIZER)
                damaged = [part[0] for part in stored if not intact(part)]
                if not damaged:
                    break
                if attempt:
                    raise ValueError(f"the stored postings of {store_id} were damaged again")
                # A stored blob that does not read back (a damaged row): dropped, so its texts are
                # read instead and its postings made and stored again.
                log.warning(
                    "BM25 index of %s: the stored postings of %d attachment(s) do not read back; "
                    "dropped, their texts are tokenized again",
                    store_id,
                    len(damaged),
                )
                await self._source.drop_postings(store_id, damaged)
            state, made = await asyncio.to_thread(_caught_up, found, version, listed, stored, rows)
            if made:  # tokenized here: stored, so no process tokenizes them again
                self._store(store_id, made)
            loaded_chunks = sum(len(ids) // 8 for _, ids, _ in stored)
            self._reads["postings"] += loaded_chunks
            self._reads["texts"] += len(rows)
            if rows:
                log.info(
                    "BM25 index of %s: %d chunks tokenized from their texts (no stored postings of "
                    "tokenizer %d), %d loaded from stored postings, in %.2f s",
                    store_id,
                    len(rows),
                    TOKENIZER,
                    loaded_chunks,
                    time.monotonic() - started,
                )
            self._states[store_id] = state
            # A store loaded by the warm-up, not searched yet, goes behind the searched ones: the
            # first dropped past max_bytes (the warm-up then stops, keeping the most active stores).
            self._states.move_to_end(store_id, last=not (warm and found is None))
            total = sum(s.nbytes for s in self._states.values())
            while total > self._max and len(self._states) > 1:
                gone, dropped = self._states.popitem(last=False)
                total -= dropped.nbytes
                self._cancel(gone)
            self._maintain(store_id)
            return state

    async def warm(self, store_id: str, version: int) -> bool:
        """Load the store's index now, as its first search would (the start-up warm-up); a search
        arriving meanwhile waits for this load, not for another. ``version``: as for ``search``.
        False when it was not kept: the indexes held are past ``max_bytes``."""
        await self._load(store_id, version, warm=True)
        return store_id in self._states

    def _maintain(self, store_id: str) -> None:
        running = self._tasks.get(store_id)
        if running is None or running.done():
            self._tasks[store_id] = asyncio.get_running_loop().create_task(self._maintenance(store_id))

    async def _maintenance(self, store_id: str) -> None:
        """Merge small segments and rewrite those with many dead chunks, then bring every segment's
        weights to the store's mean, off the search path; a result is used only when the segments it
        came from are all still there (a write in between is caught up by the next round)."""
        while True:
            state = self._states.get(store_id)
            if state is None:
                return
            group = _merge_plan(state.segments)
            stale = [s for s in state.segments if s.weights is None or s.weights_mean != state.mean]
            if not group and not stale:
                return
            sources = group or stale
            if group:
                made = [await asyncio.to_thread(_merged, group, state.mean)]
            else:
                made = await asyncio.to_thread(_weighed, stale, state.mean)
            async with self._locks.setdefault(store_id, asyncio.Lock()):
                current = self._states.get(store_id)
                if current is None or not all(any(s is c for c in current.segments) for s in sources):
                    continue  # a write replaced them meanwhile: plan again from what is there now
                kept = [c for c in current.segments if not any(s is c for s in sources)]
                self._states[store_id] = _state(
                    current.version, current.keys, [m for m in made if m is not None] + kept
                )

    def _store(self, store_id: str, made: list[Stored]) -> None:
        async def write() -> None:
            kept = 0
            for part in made:  # one transaction each: the store's connection is not held long
                try:
                    kept += await self._source.store_postings(store_id, part, TOKENIZER)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("storing the BM25 postings of %s in %s failed", part[0], store_id)
                    return
            log.info("BM25 postings of %d of %d attachments of %s stored", kept, len(made), store_id)

        task = asyncio.get_running_loop().create_task(write())
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def idle(self) -> None:
        """Wait for the background merges, weight updates and postings being stored to end (tests,
        the benchmark)."""
        while tasks := [t for t in [*self._tasks.values(), *self._writes] if not t.done()]:
            await asyncio.gather(*tasks, return_exceptions=True)

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
        return [
            chunk
            for chunk, _ in await self.scored(
                store_id, terms, limit=limit, file_ids=file_ids, version=version
            )
        ]

    async def scored(
        self,
        store_id: str,
        terms: Sequence[str],
        *,
        limit: int,
        file_ids: Sequence[str] | None = None,
        version: int | None = None,
    ) -> list[tuple[int, float]]:
        """``search``'s chunk ids with their BM25 scores."""
        if not terms:
            return []
        state = await self._load(store_id, version)
        if len(state.ids) > _INLINE_ROWS:
            return await asyncio.to_thread(_best, state, terms, limit, file_ids)
        return _best(state, terms, limit, file_ids)

    def stats(self, store_id: str) -> tuple[int, int] | None:
        """(chunks, bytes) of a store's loaded index, or None when it is not loaded."""
        found = self._states.get(store_id)
        return None if found is None else (found.live, found.nbytes)

    def segments(self, store_id: str) -> int:
        found = self._states.get(store_id)
        return 0 if found is None else len(found.segments)

    def forget(self, store_id: str) -> None:
        self._states.pop(store_id, None)
        self._locks.pop(store_id, None)
        self._cancel(store_id)

    def _cancel(self, store_id: str) -> None:
        task = self._tasks.pop(store_id, None)
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        tasks = [*self._tasks.values(), *self._writes]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()


def _caught_up(
    found: _State | None, version: int, listed: list[SegmentKey], stored: list[Stored], rows: list[Row]
) -> tuple[_State, list[Stored]]:
    """``found`` with the attachments no longer listed dead, and the new attachments in a new
    segment loaded from their ``stored`` postings and those made here of the ``rows`` of the others
    (by attachment, as ingestion makes them); and those made here."""
    now = frozenset(listed)
    known = frozenset() if found is None else found.keys
    removed = known - now
    segments: list[Segment] = []
    for segment in () if found is None else found.segments:
        gone = segment.keys & removed
        kept = _without(segment, gone) if gone else segment
        if kept is not None:
            segments.append(kept)
    stored = [part for part in stored if part[0] not in known]
    by_key: dict[SegmentKey, list[tuple[int, str]]] = {}
    for key, chunk_id, text in rows:
        if key not in known:
            by_key.setdefault(key, []).append((chunk_id, text))
    made = [
        (key, np.array([c for c, _ in chunks], dtype="<i8").tobytes(), postings([t for _, t in chunks]))
        for key, chunks in by_key.items()
    ]
    new = loaded(stored + made) if stored or made else None
    if new is not None and len(new.ids):
        segments.append(new)
    state = _state(version, (known - removed) | (now - known) | {part[0] for part in stored + made}, segments)
    if new is not None and 0 < len(new.docs) <= _INLINE_WEIGHTS:
        # A small new segment's weights now; a large one's (a whole store: the first search) and the
        # others' in the background, the query's terms' computed meanwhile.
        segments[-1] = new.with_weights(state.mean)
        state = replace(state, segments=tuple(segments))
    return state, made


def _weighed(segments: Sequence[Segment], mean: float) -> list[Segment | None]:
    return [s.with_weights(mean) for s in segments]


def _without(segment: Segment, gone: Set[SegmentKey]) -> Segment | None:
    """``segment`` with the chunks of the attachments ``gone`` dead; None when none is left."""
    codes = [segment.file_codes[file_id] for file_id, _ in gone if file_id in segment.file_codes]
    alive = ~np.isin(segment.files, np.array(codes, dtype=np.int32))
    if segment.alive is not None:
        alive &= segment.alive
    live = int(np.count_nonzero(alive))
    if not live:
        return None
    length = int(segment.lengths[alive].sum())
    return replace(segment, keys=segment.keys - gone, alive=alive, live=live, live_length=length)


def _merge_plan(segments: Sequence[Segment]) -> list[Segment]:
    """The segments to merge into one: all but the largest past ``MAX_SEGMENTS`` (all when the
    others hold half as many chunks), and any with many dead chunks; none for nothing to do."""
    group: list[Segment] = []
    if len(segments) > MAX_SEGMENTS:
        largest = max(segments, key=lambda s: s.live)
        rest = [s for s in segments if s is not largest]
        group = list(segments) if 2 * sum(s.live for s in rest) >= largest.live else rest
    for segment in segments:
        dead = len(segment.ids) - segment.live
        if dead > _DEAD_SHARE * len(segment.ids) and not any(s is segment for s in group):
            group.append(segment)
    return group


def build(rows: Iterable[tuple[SegmentKey, int, str]]) -> Segment:
    """The segment of ``rows`` (attachment, chunk id, text), in the order given."""
    vocabulary: dict[str, int] = {}
    word_terms: dict[str, int] = {}  # a raw word -> its term's number, -1 if left out
    file_codes: dict[str, int] = {}
    keys: set[SegmentKey] = set()
    ids: list[int] = []
    files: list[int] = []
    lengths: list[int] = []
    pairs: list[int] = []  # (term, count) pairs per chunk
    terms: list[int] = []
    counts: list[int] = []
    for key, chunk_id, text in rows:
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
        keys.add(key)
        ids.append(chunk_id)
        files.append(file_codes.setdefault(key[0], len(file_codes)))
        lengths.append(length)
        pairs.append(len(terms) - before)
    docs = np.repeat(np.arange(len(ids), dtype=np.int64), np.array(pairs, dtype=np.int64))
    return _assemble(
        frozenset(keys),
        np.array(ids, dtype=np.int64),
        np.array(files, dtype=np.int32),
        file_codes,
        np.array(lengths, dtype=np.float64),
        vocabulary,
        np.array(terms, dtype=np.int64),
        docs,
        np.array(counts, dtype=np.float64),
    )


def postings(texts: Sequence[str]) -> bytes:
    """The postings of a file's chunks (``texts`` in file order) as stored at ingestion: what
    ``build`` makes of them, with chunk positions in the file for ids. ``loaded`` reads them back."""
    segment = build((("", 0), n, text) for n, text in enumerate(texts))
    n = len(segment.ids)
    position = 2 if n <= 1 << 16 else 4
    count = 1 if int(segment.counts.max(initial=0)) < 256 else 2
    terms = "\n".join(segment.vocabulary).encode("utf-8")
    body = b"".join(
        [
            _BLOB.pack(_MAGIC, n, len(segment.vocabulary), len(segment.docs), position, count),
            segment.lengths.astype("<u4").tobytes(),
            segment.offsets.astype("<u4").tobytes(),
            segment.docs.astype(_WIDTHS[position]).tobytes(),
            segment.counts.astype(_WIDTHS[count]).tobytes(),
            terms,
        ]
    )
    return body + zlib.crc32(body).to_bytes(4, "little")


def intact(part: Stored) -> bool:
    """Whether a stored blob reads back whole: its header, sizes, chunk positions and terms agree
    with each other and with its chunk ids (what ``loaded`` relies on)."""
    _, chunk_ids, blob = part
    if len(blob) < _BLOB.size + 4 or len(chunk_ids) % 8:
        return False
    if zlib.crc32(memoryview(blob)[:-4]) != int.from_bytes(blob[-4:], "little"):
        return False
    blob = blob[:-4]
    magic, n, n_terms, n_postings, position, count = _BLOB.unpack_from(blob)
    if magic != _MAGIC or n != len(chunk_ids) // 8 or position not in _WIDTHS or count not in _WIDTHS:
        return False
    at = _BLOB.size + 4 * n
    terms_at = at + 4 * (n_terms + 1) + (position + count) * n_postings
    if terms_at > len(blob):
        return False
    offsets = np.frombuffer(blob, "<u4", n_terms + 1, at).astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != n_postings or bool(np.any(np.diff(offsets) < 0)):
        return False
    positions = np.frombuffer(blob, _WIDTHS[position], n_postings, at + 4 * (n_terms + 1))
    if n_postings and int(positions.max()) >= n:
        return False
    try:
        words = blob[terms_at:].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return len(words.split("\n")) == n_terms if n_terms else not words


def loaded(parts: Sequence[Stored]) -> Segment:
    """One segment of the stored postings of ``parts`` (key, chunk ids, blob), as ``build`` would
    make it of the same chunks' texts: numpy and one dict lookup per term of each part, no
    tokenizing. The parts' postings are laid out term by term without a sort over them: each
    part's term blocks are put in their global term's place (a sort over the blocks only)."""
    vocabulary: dict[str, int] = {}
    file_codes: dict[str, int] = {}
    ids, files, lengths, docs, counts = [], [], [], [], []
    block_terms, block_sizes, block_starts = [], [], []
    chunks = postings_seen = 0
    for key, chunk_ids, blob in parts:
        magic, n, n_terms, n_postings, position, count = _BLOB.unpack_from(blob)
        ids_a = np.frombuffer(chunk_ids, dtype="<i8")
        if magic != _MAGIC or len(ids_a) != n:
            raise ValueError(f"stored postings of {key} do not match their chunks")
        at = _BLOB.size
        lengths.append(np.frombuffer(blob, "<u4", n, at))
        at += 4 * n
        offsets = np.frombuffer(blob, "<u4", n_terms + 1, at).astype(np.int64)
        at += 4 * (n_terms + 1)
        docs.append(np.frombuffer(blob, _WIDTHS[position], n_postings, at).astype(np.int32) + chunks)
        at += position * n_postings
        counts.append(np.frombuffer(blob, _WIDTHS[count], n_postings, at))
        at += count * n_postings
        words = blob[at:-4].decode("utf-8").split("\n") if n_terms else []
        vocabulary.update(zip([w for w in words if w not in vocabulary], itertools.count(len(vocabulary))))
        block_terms.append(np.fromiter(map(vocabulary.__getitem__, words), np.int64, n_terms))
        block_sizes.append(np.diff(offsets))
        block_starts.append(offsets[:-1] + postings_seen)
        ids.append(ids_a.astype(np.int64))
        files.append(np.full(n, file_codes.setdefault(key[0], len(file_codes)), dtype=np.int32))
        chunks += n
        postings_seen += n_postings
    terms = np.concatenate(block_terms) if block_terms else np.zeros(0, dtype=np.int64)
    sizes = np.concatenate(block_sizes) if block_sizes else np.zeros(0, dtype=np.int64)
    starts = np.concatenate(block_starts) if block_starts else np.zeros(0, dtype=np.int64)
    # Blocks by term, parts in order within a term: chunk positions stay ascending within a term.
    order = np.argsort(terms, kind="stable")
    sizes, starts = sizes[order], starts[order]
    placed = np.cumsum(sizes) - sizes  # where each block goes
    index = np.int32 if postings_seen < 1 << 31 else np.int64  # half the memory traffic
    take = np.repeat((starts - placed).astype(index), sizes) + np.arange(postings_seen, dtype=index)
    per_term = np.zeros(len(vocabulary), dtype=np.int64)
    np.add.at(per_term, terms[order], sizes)
    offsets = np.zeros(len(vocabulary) + 1, dtype=np.int64)
    np.cumsum(per_term, out=offsets[1:])
    lengths_a = np.concatenate(lengths).astype(np.float64) if lengths else np.zeros(0, dtype=np.float64)
    return Segment(
        keys=frozenset(key for key, _, _ in parts),
        ids=np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64),
        files=np.concatenate(files) if files else np.zeros(0, dtype=np.int32),
        file_codes=file_codes,
        lengths=lengths_a,
        vocabulary=vocabulary,
        offsets=offsets,
        docs=np.concatenate(docs)[take] if docs else np.zeros(0, dtype=np.int32),
        counts=np.concatenate(counts)[take].astype(np.uint16) if counts else np.zeros(0, dtype=np.uint16),
        alive=None,
        live=chunks,
        live_length=int(lengths_a.sum()),
    )


def _assemble(
    keys: frozenset[SegmentKey],
    ids: npt.NDArray[np.int64],
    files: npt.NDArray[np.int32],
    file_codes: dict[str, int],
    lengths: npt.NDArray[np.float64],
    vocabulary: dict[str, int],
    terms: npt.NDArray[np.int64],
    docs: npt.NDArray[np.int64],
    counts: npt.NDArray[np.float64],
) -> Segment:
    """A segment from its (term, chunk position, count) triples in any order."""
    n = max(len(ids), 1)
    keys_a = terms * n + docs
    order = np.argsort(keys_a, kind="stable")
    keys_a, counts = keys_a[order], counts[order]
    # Two words of a chunk may share a stem: equal (term, chunk) keys are summed.
    if len(keys_a):
        first = np.flatnonzero(np.r_[True, keys_a[1:] != keys_a[:-1]])
        counts = np.add.reduceat(counts, first)
        keys_a = keys_a[first]
    offsets = np.searchsorted(keys_a // n, np.arange(len(vocabulary) + 1)).astype(np.int64)
    return Segment(
        keys=keys,
        ids=ids,
        files=files,
        file_codes=file_codes,
        lengths=lengths,
        vocabulary=vocabulary,
        offsets=offsets,
        docs=(keys_a % n).astype(np.int32),
        counts=np.minimum(counts, 65535).astype(np.uint16),
        alive=None,
        live=len(ids),
        live_length=int(lengths.sum()),
    )


def _merged(segments: Sequence[Segment], mean: float) -> Segment | None:
    """One segment of the live chunks of ``segments``, weighed for ``mean`` (no text is read)."""
    vocabulary: dict[str, int] = {}
    file_codes: dict[str, int] = {}
    keys: set[SegmentKey] = set()
    ids, files, lengths, terms, docs, counts = [], [], [], [], [], []
    base = 0
    for segment in segments:
        alive = np.ones(len(segment.ids), dtype=bool) if segment.alive is None else segment.alive
        position = np.cumsum(alive) - 1 + base
        term_map = np.array(
            [vocabulary.setdefault(t, len(vocabulary)) for t in segment.vocabulary], dtype=np.int64
        )
        file_map = np.array(
            [file_codes.setdefault(f, len(file_codes)) for f in segment.file_codes], dtype=np.int32
        )
        keep = alive[segment.docs]
        posting_terms = np.repeat(term_map, np.diff(segment.offsets))
        terms.append(posting_terms[keep])
        docs.append(position[segment.docs[keep]])
        counts.append(segment.counts[keep].astype(np.float64))
        ids.append(segment.ids[alive])
        files.append(file_map[segment.files[alive]] if len(file_map) else segment.files[alive])
        lengths.append(segment.lengths[alive])
        keys |= segment.keys
        base += int(np.count_nonzero(alive))
    if not base:
        return None
    merged = _assemble(
        frozenset(keys),
        np.concatenate(ids),
        np.concatenate(files).astype(np.int32),
        file_codes,
        np.concatenate(lengths),
        vocabulary,
        np.concatenate(terms),
        np.concatenate(docs).astype(np.int64),
        np.concatenate(counts),
    )
    return merged.with_weights(mean)


def _term_number(word: str, vocabulary: dict[str, int]) -> int:
    if len(word) > 64:
        return -1
    return vocabulary.setdefault(_stem(word), len(vocabulary))


def _best(
    state: _State, terms: Sequence[str], limit: int, file_ids: Sequence[str] | None
) -> list[tuple[int, float]]:
    n = state.live
    if not n:
        return []
    scores = np.zeros(len(state.ids), dtype=np.float64)
    bases = np.cumsum([0] + [len(s.ids) for s in state.segments]).tolist()
    for term in terms:
        parts: list[tuple[Segment, int, int, int]] = []
        df = 0
        for segment, base in zip(state.segments, bases, strict=False):
            row = segment.vocabulary.get(term)
            if row is None:
                continue
            start, end = int(segment.offsets[row]), int(segment.offsets[row + 1])
            if start == end:
                continue
            if segment.alive is None:
                df += end - start
            else:
                df += int(np.count_nonzero(segment.alive[segment.docs[start:end]]))
            parts.append((segment, base, start, end))
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for segment, base, start, end in parts:
            docs = segment.docs[start:end]
            if segment.weights is not None and segment.weights_mean == state.mean:
                weights = segment.weights[start:end]
            else:
                weights = _weights(segment.counts[start:end], segment.lengths[docs], state.mean)
            # A term's postings name each chunk once, so this fancy-indexed add is exact.
            scores[base : base + len(segment.ids)][docs] += idf * weights
    for segment, base in zip(state.segments, bases, strict=False):
        view = scores[base : base + len(segment.ids)]
        if segment.alive is not None:
            view[~segment.alive] = 0.0
        if file_ids is not None:
            wanted = np.array(
                [segment.file_codes[f] for f in file_ids if f in segment.file_codes], dtype=np.int32
            )
            view[~np.isin(segment.files, wanted)] = 0.0
    matched = int(np.count_nonzero(scores))
    count = min(limit, matched)
    if count <= 0:
        return []
    if count < len(scores):
        # Every chunk scoring at least the count-th best, so ties at the cut go by chunk id too. Few
        # matches (a sample of the array would be all zeros): the cut among the matches alone.
        if matched * STRIDE < len(scores):
            hits = np.flatnonzero(scores)
            top = hits[scores[hits] >= kth_largest(scores[hits], count)]
        else:
            top = np.flatnonzero(scores >= kth_largest(scores, count))
    else:
        top = np.arange(len(scores))
    # Best first, ties by chunk id (the same order on every back end).
    best = top[np.lexsort((state.ids[top], -scores[top]))][:count]
    return [(int(state.ids[i]), float(scores[i])) for i in best.tolist() if scores[i] > 0]
