"""Locate and load the recorded upstream streams the tests replay.

The recordings live in the repository (``tests/fixtures/recordings``, with their provenance and
licences in its MANIFEST.md), and only there: a clone from anywhere runs the suite. File formats are
described in MANIFEST.md: ``.sse`` raw SSE bodies, ``.chunks.jsonl`` one SSE data payload per line,
``.json`` one body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "FIXTURE_SUFFIXES",
    "RECORDINGS",
    "fixture_path",
    "fixtures_dir",
    "list_fixtures",
    "load_chunks",
    "load_fixture",
    "load_json",
    "load_sse",
    "reconstructed_sse_path",
]

FIXTURE_SUFFIXES = (".sse", ".chunks.jsonl", ".json")
RECORDINGS = Path(__file__).resolve().parent / "fixtures" / "recordings"


def fixtures_dir() -> Path:
    """The fixtures directory: the repository's ``tests/fixtures/recordings``."""
    return RECORDINGS


def fixture_path(name: str) -> Path:
    """Absolute path of the fixture file ``name`` (a bare file name)."""
    return fixtures_dir() / name


def _suffix_of(name: str) -> str | None:
    for suffix in FIXTURE_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return None


def list_fixtures(prefix: str = "", suffixes: tuple[str, ...] = FIXTURE_SUFFIXES) -> list[str]:
    """Sorted file names of top-level recordings whose name starts with ``prefix`` (e.g. ``openai-chat__``).

    Only the recorded files are listed; the derived ``sse-reconstructed/`` copies are reached through
    :func:`reconstructed_sse_path`.
    """
    root = fixtures_dir()
    if not root.is_dir():
        # Loud, not an empty parametrization: a test over no recordings would pass having checked nothing.
        raise FileNotFoundError(f"the recorded fixtures are not at {root} (the repository's copy is missing)")
    names = []
    for path in root.iterdir():
        name = path.name
        if path.is_file() and name.startswith(prefix) and _suffix_of(name) in suffixes:
            names.append(name)
    return sorted(names)


def load_sse(name: str) -> bytes:
    """The raw bytes of an ``.sse`` recording (or of any file, by name)."""
    return fixture_path(name).read_bytes()


def load_chunks(name: str) -> list[dict[str, Any]]:
    """The payloads of a ``.chunks.jsonl`` recording, one parsed dict per non-blank line."""
    out: list[dict[str, Any]] = []
    for line in fixture_path(name).read_bytes().splitlines():
        if line.strip():
            out.append(orjson.loads(line))
    return out


def load_json(name: str) -> dict[str, Any]:
    """A ``.json`` body (non-streaming response or HTTP error body)."""
    value = orjson.loads(fixture_path(name).read_bytes())
    if not isinstance(value, dict):
        raise ValueError(f"{name}: expected a JSON object, got {type(value).__name__}")
    return value


def load_fixture(name: str) -> bytes | list[dict[str, Any]] | dict[str, Any]:
    """Load any recording according to its suffix."""
    suffix = _suffix_of(name)
    if suffix == ".sse":
        return load_sse(name)
    if suffix == ".chunks.jsonl":
        return load_chunks(name)
    if suffix == ".json":
        return load_json(name)
    raise ValueError(f"{name}: not a fixture file (expected one of {FIXTURE_SUFFIXES})")


def reconstructed_sse_path(name: str) -> Path:
    """Path of the SSE-framed copy derived from a ``.chunks.jsonl`` recording (may not exist)."""
    stem = name.removesuffix(".chunks.jsonl")
    return fixtures_dir() / "sse-reconstructed" / f"{stem}.sse"
