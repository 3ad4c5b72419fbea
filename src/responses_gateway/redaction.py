"""The one place that knows the gateway's secrets, and scrubs them from anything a client or log sees.

Every upstream API key a provider holds and every API key clients use to reach the gateway is
registered here (the model registry registers a provider's ``secrets()`` when it is built, the app
registers its own keys). What leaves the gateway as an error passes through :data:`REDACTOR`:

- ``StreamBuilder.fail`` (the ``error`` and ``response.failed`` events, the failed Response a
  non-streamed client gets and the store keeps): the server sets ``builder.redact``;
- ``HTTPError.body`` (every plain HTTP error);
- log records (:func:`install_log_scrubbing`: a record factory, so every handler and caplog sees the
  scrubbed text).

A secret is replaced in its raw form and in the forms it takes inside JSON strings and URLs, so an
upstream that echoes the key inside an escaped error body is caught too. Shapes of well-known keys are
still replaced by pattern (``providers.upstream_errors.scrub``) for keys the gateway does not hold.

It is process-wide on purpose: secrets are a property of the process (its environment and options),
and a process-wide scrubber cannot be forgotten by a new error path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from urllib.parse import quote

import orjson

__all__ = ["REDACTED", "REDACTOR", "Redactor", "credentials", "install_log_scrubbing"]

REDACTED = "[redacted]"

# Shorter values are not treated as secrets: replacing them would garble ordinary text.
_MIN_SECRET = 8


class Redactor:
    """A set of secret strings and the scrubbing of them from text."""

    def __init__(self) -> None:
        self._forms: tuple[str, ...] = ()
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def add(self, *secrets: str | None) -> None:
        """Register ``secrets`` (None and short values are ignored)."""
        new = [s for s in secrets if s and len(s) >= _MIN_SECRET and s not in self._secrets]
        if not new:
            return
        with self._lock:
            self._secrets.update(new)
            forms: set[str] = set()
            for secret in self._secrets:
                forms.add(secret)
                forms.add(orjson.dumps(secret).decode()[1:-1])  # as it appears inside a JSON string
                forms.add(quote(secret, safe=""))  # in a URL or form body
            # Longest first, so a form that contains another is replaced whole.
            self._forms = tuple(sorted(forms, key=len, reverse=True))

    def __bool__(self) -> bool:
        return bool(self._forms)

    def scrub(self, text: str) -> str:
        """``text`` with every registered secret, in any of its forms, replaced by ``[redacted]``."""
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        return text

    def contains_secret(self, text: str) -> bool:
        return any(form in text for form in self._forms)


REDACTOR = Redactor()

_installed = False


def install_log_scrubbing(redactor: Redactor = REDACTOR) -> None:
    """Scrub secrets from every log record this process creates (idempotent).

    A record factory rather than a handler filter: it covers records of every logger, whatever
    handlers are attached later (uvicorn's, pytest's caplog). It costs nothing while no secret is
    registered, and one ``in`` test per secret form otherwise.
    """
    global _installed
    if _installed:
        return
    _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if redactor:
            try:
                message = record.getMessage()
            except Exception:  # a bad format string: leave it to the handler to report
                return record
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            exc_text = record.exc_text
            if redactor.contains_secret(message) or (exc_text and redactor.contains_secret(exc_text)):
                record.msg = redactor.scrub(message)
                record.args = None
                if exc_text:
                    record.exc_text = redactor.scrub(exc_text)
        return record

    logging.setLogRecordFactory(factory)


def credentials(api_key: str | None, headers: Mapping[str, str]) -> tuple[str, ...]:
    """What an upstream client holds that must stay secret: its API key and the values of its
    credential-like headers (authorization, anything naming a key, token or secret)."""
    out = [api_key] if api_key else []
    for name, value in headers.items():
        lowered = name.lower()
        if lowered == "authorization":
            out.append(value.split(" ", 1)[-1])
        elif any(word in lowered for word in ("key", "token", "secret")):
            out.append(value)
    return tuple(out)
