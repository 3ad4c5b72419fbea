"""Optional bearer-key check. Keys are compared in constant time and never logged."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from .errors import HTTPError

__all__ = ["SHARED_OWNER", "APIKeyAuth"]

_CHALLENGE = [(b"www-authenticate", b"Bearer")]

# The owner of everything stored when no API keys are configured.
SHARED_OWNER = "shared"
_OWNER_SALT = b"responses-gateway/owner/v1\x00"


class APIKeyAuth:
    """Accepts a request when no keys are configured or its ``Authorization: Bearer`` key matches one."""

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str]) -> None:
        # Compare fixed-length digests so neither the key length nor its prefix leaks through timing.
        self._digests = tuple(hashlib.sha256(k.encode()).digest() for k in keys if k)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, headers: Iterable[tuple[bytes, bytes]], *, x_api_key: bool = False) -> None:
        """Raise HTTPError(401) unless the request carries a configured key."""
        self.owner(headers, x_api_key=x_api_key)

    def owner(self, headers: Iterable[tuple[bytes, bytes]], *, x_api_key: bool = False) -> str:
        """Who owns what this request stores: a salted hash of its key (never the key), or the shared owner.

        ``x_api_key``: an ``x-api-key`` header is accepted too (Anthropic's clients send their key there);
        the same key owns the same things whichever header carries it. Raises HTTPError(401) as
        :meth:`check` does.
        """
        if not self._digests:
            return SHARED_OWNER
        value = b""
        alternate = b""
        for name, header in headers:
            lowered = name.lower()
            if lowered == b"authorization":
                value = header
                break
            if x_api_key and lowered == b"x-api-key":
                alternate = header
        if not value and alternate.strip():
            value = b"Bearer " + alternate.strip()
        scheme, _, token = value.strip().partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            raise HTTPError(
                401,
                "You didn't provide an API key. Provide it in an Authorization header using Bearer auth "
                "(i.e. Authorization: Bearer YOUR_KEY).",
                code="invalid_api_key",
                headers=_CHALLENGE,
            )
        digest = hashlib.sha256(token).digest()
        matched = False
        for known in self._digests:
            # No early exit: every configured key is compared.
            matched |= hmac.compare_digest(digest, known)
        if not matched:
            raise HTTPError(401, "Incorrect API key provided.", code="invalid_api_key", headers=_CHALLENGE)
        return "key_" + hashlib.sha256(_OWNER_SALT + token).hexdigest()[:40]
