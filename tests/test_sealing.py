"""Sealing: round trip, tamper detection, owner binding, key rotation, persisted key file."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from responses_gateway.sealing import SEAL_KEY_ENV, Sealer, SealError, load_sealer

PAYLOAD = {
    "provider": "anthropic",
    "blocks": [{"type": "thinking", "thinking": "Let me think… ünïcode", "signature": "EqQBCkYIARgCIkA="}],
}


def test_round_trip_and_nonce_freshness() -> None:
    sealer = Sealer([os.urandom(32)])
    a = sealer.seal(PAYLOAD, context="owner-1")
    b = sealer.seal(PAYLOAD, context="owner-1")
    assert a != b  # a fresh nonce every time
    assert sealer.is_sealed(a)
    assert "thinking" not in a and "Let me" not in a
    assert sealer.unseal(a, context="owner-1") == PAYLOAD
    assert sealer.unseal(b, context="owner-1") == PAYLOAD


def test_every_flipped_byte_is_detected() -> None:
    sealer = Sealer([os.urandom(32)])
    sealed = sealer.seal(PAYLOAD)
    raw = bytearray(base64.urlsafe_b64decode(sealed[5:] + "=" * (-len(sealed[5:]) % 4)))
    for index in range(len(raw)):
        tampered = bytearray(raw)
        tampered[index] ^= 0x01
        text = "rgs1." + base64.urlsafe_b64encode(bytes(tampered)).rstrip(b"=").decode()
        with pytest.raises(SealError):
            sealer.unseal(text)


@pytest.mark.parametrize("bad", ["", "rgs1.", "rgs1.!!!", "gAAAAABxyz", "rgs1.AAAA", 42])
def test_malformed_blobs(bad: object) -> None:
    with pytest.raises(SealError):
        Sealer([os.urandom(32)]).unseal(bad)  # type: ignore[arg-type]


def test_context_binds_owner_and_keys_differ() -> None:
    sealer = Sealer([os.urandom(32)])
    sealed = sealer.seal(PAYLOAD, context="owner-1")
    with pytest.raises(SealError, match="authentication"):
        sealer.unseal(sealed, context="owner-2")
    with pytest.raises(SealError, match="key"):
        Sealer([os.urandom(32)]).unseal(sealed, context="owner-1")


def test_rotation_opens_old_blobs_and_seals_with_new_key() -> None:
    old, new = os.urandom(32), os.urandom(32)
    sealed_old = Sealer([old]).seal(PAYLOAD)
    rotated = Sealer([new, old])
    assert rotated.unseal(sealed_old) == PAYLOAD
    assert Sealer([new]).unseal(rotated.seal(PAYLOAD)) == PAYLOAD


def test_key_from_env_hex_and_base64(tmp_path: Path) -> None:
    key = os.urandom(32)
    by_hex = load_sealer(tmp_path, env={SEAL_KEY_ENV: key.hex()})
    by_b64 = load_sealer(None, env={SEAL_KEY_ENV: base64.b64encode(key).decode()})
    assert by_b64.unseal(by_hex.seal(PAYLOAD)) == PAYLOAD
    assert not (tmp_path / "seal.key").exists()
    with pytest.raises(ValueError, match="32 bytes"):
        load_sealer(None, env={SEAL_KEY_ENV: "abcd"})


def test_key_file_created_once_private_and_reused(tmp_path: Path) -> None:
    first = load_sealer(tmp_path / "data", env={})
    path = tmp_path / "data" / "seal.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    second = load_sealer(tmp_path / "data", env={})
    assert second.unseal(first.seal(PAYLOAD)) == PAYLOAD
    with pytest.raises(ValueError, match=SEAL_KEY_ENV):
        load_sealer(None, env={})
