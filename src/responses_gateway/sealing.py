"""Sealing of opaque reasoning state for ``store: false`` round trips.

A back end's reasoning state (Anthropic thinking text and signatures, Gemini thought signatures…) must
come back to the gateway on the next turn, yet with ``store: false`` the gateway keeps nothing. So the
state travels through the client inside the reasoning item's ``encrypted_content``, sealed with a
server key: AES-256-GCM, so the client can neither read nor alter it.

Format: ``rgs1.`` + base64url(key id (4 bytes) | nonce (12 bytes) | ciphertext+tag). The key id lets
several keys be accepted while sealing with the first (key rotation). ``context`` (e.g. the owner) is
bound as associated data: a blob sealed for one owner does not open for another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["SEAL_KEY_ENV", "SealError", "Sealer", "load_sealer"]

SEAL_KEY_ENV = "RG_SEAL_KEY"
_PREFIX = "rgs1."
_KEY_FILE = "seal.key"
_AAD_PREFIX = b"responses-gateway/seal/v1\x00"


class SealError(ValueError):
    """A sealed blob that is malformed, tampered with, or sealed with an unknown key (HTTP 400)."""


def _key_id(key: bytes) -> bytes:
    return hashlib.sha256(b"rg-seal-key-id" + key).digest()[:4]


def _decode_key(text: str) -> bytes:
    """A 32-byte key written as 64 hex digits or as (url-safe or standard) base64."""
    text = text.strip()
    try:
        key = bytes.fromhex(text) if len(text) == 64 else base64.urlsafe_b64decode(_pad(text))
    except (ValueError, binascii.Error):
        raise ValueError(f"{SEAL_KEY_ENV}: a key must be 32 bytes as hex or base64") from None
    if len(key) != 32:
        raise ValueError(f"{SEAL_KEY_ENV}: a key must be 32 bytes, got {len(key)}")
    return key


def _pad(text: str) -> str:
    return text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4)


class Sealer:
    """Seals and opens JSON payloads with the first key; opens with any of ``keys``."""

    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise ValueError("a Sealer needs at least one key")
        for key in keys:
            if len(key) != 32:
                raise ValueError("seal keys are 32 bytes")
        self._seal_id = _key_id(keys[0])
        self._seal_aead = AESGCM(keys[0])
        self._by_id = {_key_id(k): AESGCM(k) for k in keys}

    def seal(self, payload: Any, *, context: str = "") -> str:
        """Encrypt and authenticate ``payload`` (any JSON value) into an ``encrypted_content`` string."""
        nonce = os.urandom(12)
        body = self._seal_aead.encrypt(nonce, orjson.dumps(payload), _AAD_PREFIX + context.encode())
        return _PREFIX + base64.urlsafe_b64encode(self._seal_id + nonce + body).rstrip(b"=").decode()

    def unseal(self, sealed: str, *, context: str = "") -> Any:
        """The payload sealed into ``sealed``; :class:`SealError` if it is not exactly what was sealed."""
        if not isinstance(sealed, str) or not sealed.startswith(_PREFIX):
            raise SealError("encrypted_content was not produced by this gateway")
        try:
            raw = base64.urlsafe_b64decode(_pad(sealed[len(_PREFIX) :]))
        except (ValueError, binascii.Error):
            raise SealError("encrypted_content is not valid base64") from None
        if len(raw) < 4 + 12 + 16:
            raise SealError("encrypted_content is truncated")
        aead = self._by_id.get(raw[:4])
        if aead is None:
            raise SealError("encrypted_content was sealed with a key this gateway does not have")
        try:
            plain = aead.decrypt(raw[4:16], raw[16:], _AAD_PREFIX + context.encode())
        except InvalidTag:
            raise SealError("encrypted_content failed authentication (altered, or another owner's)") from None
        return orjson.loads(plain)

    def is_sealed(self, value: object) -> bool:
        """Whether ``value`` looks like one of our blobs (vs. an upstream's own encrypted_content)."""
        return isinstance(value, str) and value.startswith(_PREFIX)


def load_sealer(data_dir: str | Path | None = None, env: Mapping[str, str] | None = None) -> Sealer:
    """The gateway's Sealer: keys from ``RG_SEAL_KEY`` (comma-separated, first seals), else a key file.

    Without the variable, ``<data_dir>/seal.key`` is read, or created (mode 0600) on first run, so
    sealed state survives restarts of the same installation.
    """
    source: Mapping[str, str] = os.environ if env is None else env
    configured = source.get(SEAL_KEY_ENV, "").strip()
    if configured:
        return Sealer([_decode_key(part) for part in configured.split(",") if part.strip()])
    if data_dir is None:
        raise ValueError(f"set {SEAL_KEY_ENV} or give a data directory to keep the seal key in")
    path = Path(data_dir) / _KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return Sealer([_decode_key(path.read_text(encoding="ascii"))])
    # Written whole under a private name, then linked into place: of two racing processes (two
    # gateways, or ``serve --workers`` siblings) the first link wins and the other reads that key,
    # never a file still being written.
    private = path.with_name(f".{_KEY_FILE}.{os.getpid()}")
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(os.urandom(32).hex() + "\n")
    try:
        os.link(private, path)
    except FileExistsError:
        pass
    finally:
        private.unlink()
    return Sealer([_decode_key(path.read_text(encoding="ascii"))])
