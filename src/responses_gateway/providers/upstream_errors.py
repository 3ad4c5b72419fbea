"""Upstream failures as :class:`ProviderError`: the status and OpenAI error code a client acts on.

Every vendor's error shape is recognised by its form, so one function serves all providers:

- Anthropic: ``{"type": "error", "error": {"type": "overloaded_error", "message": ...}}``
- OpenAI and Chat Completions servers: ``{"error": {"message", "type", "param", "code"}}``
- Gemini: ``{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message", "details": [...]}}``
  (the stream endpoint may wrap it in a one-element list)

Decisions a client can see:

========================================  ======  ===========================  =======================
upstream                                  status  code                         type
========================================  ======  ===========================  =======================
429 rate limit / RESOURCE_EXHAUSTED       429     rate_limit_exceeded          rate_limit_error
quota or credit exhausted, billing_error  429     insufficient_quota           insufficient_quota
529 / 503 / overloaded_error/UNAVAILABLE  503     server_is_overloaded         server_error
prompt too long for the context window    400     context_length_exceeded      invalid_request_error
model does not exist                      404     model_not_found              invalid_request_error
other 404 (a wrong upstream URL)          502     server_error                 server_error
401/403, API_KEY_INVALID, invalid key     502     upstream_authentication_...  server_error
other 4xx                                 same    upstream code or             invalid_request_error
                                                  invalid_request_error
408, 504, DEADLINE_EXCEEDED               504     server_error                 server_error
other 5xx                                 502     server_error                 server_error
connect error                             502     server_error                 server_error
connect/read timeout                      504     server_error                 server_error
========================================  ======  ===========================  =======================

An upstream authentication failure is reported as 502 ``upstream_authentication_error``, not 401: the
key the upstream rejected is the gateway's own, not the client's, so a 401 would send the client (Codex,
the SDKs) to re-authenticate for nothing. 502 says "the gateway is misconfigured" and lets a fallback
chain move on to a back end whose key works.

``retry_after`` (seconds) comes from ``retry-after-ms``, ``retry-after`` (seconds or an HTTP date) or
Gemini's ``RetryInfo.retryDelay``. A ``rate_limit_exceeded`` error that has one says so in its message
as OpenAI does, "Please try again in 1.898s." / "Please try again in 20ms.": Codex takes the delay of a
failed response from exactly that phrase (there is no header mid-stream). Messages are scrubbed of
anything that looks like a credential.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from .base import ProviderError
from .http1 import UpstreamProtocolError

log = logging.getLogger("responses_gateway.upstream")

JSON = dict[str, Any]

__all__ = [
    "from_error_payload",
    "from_http",
    "malformed_event",
    "parse_retry_after",
    "redact_url",
    "retry_hint",
    "scrub",
    "tidy",
    "translate",
    "transport_error",
    "with_retry_hint",
]

# Credential shapes of the vendors we talk to, plus generic "key=..." and bearer forms. Matched text is
# replaced by a fixed marker so the message stays readable.
_SECRET_PATTERNS = tuple(
    re.compile(p)
    for p in (
        r"(?P<keep>)\bsk-[A-Za-z0-9_\-*]{6,}",
        r"(?P<keep>)\bAIza[0-9A-Za-z_\-]{16,}",
        r"(?P<keep>)\b(?:gsk|xai|hf|pplx|nvapi|ghp|github_pat)[_-][A-Za-z0-9_\-]{12,}",
        r"(?i)(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/\-]+=*",
        r"(?i)(?P<keep>[?&](?:key|api_key|apikey|access_token|token)=)[^&\s\"'<>]+",
        r"(?i)(?P<keep>api key provided:\s*)[^\s]+?(?=\.?(?:\s|$))",
        r"(?i)(?P<keep>\bx-api-key:\s*)\S+",
    )
)
_REDACTED = "[redacted]"


def redact_url(url: str) -> str:
    """``url`` without its query string or userinfo, safe to show in errors and logs."""
    base = url.split("?", 1)[0].split("#", 1)[0]
    scheme, sep, rest = base.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with known ``secrets`` and anything shaped like an API key replaced."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, _REDACTED)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group("keep") + _REDACTED, text)
    return text


def parse_retry_after(headers: Mapping[str, str], body: Any = None) -> float | None:
    """Seconds the upstream asks us to wait, from headers or a Gemini ``RetryInfo`` detail."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(0.0, when.timestamp() - time.time())
    return _gemini_retry_delay(body)


def _gemini_retry_delay(body: Any) -> float | None:
    if isinstance(body, list) and body:
        body = body[0]  # the stream endpoint's one-element list
    error = body.get("error") if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    if not isinstance(details, list):
        return None
    for detail in details:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.RetryInfo"):
            delay = detail.get("retryDelay")
            # A protobuf Duration in JSON: decimal seconds with an "s" suffix ("34.4s").
            if isinstance(delay, str) and delay.endswith("s"):
                try:
                    return max(0.0, float(delay[:-1]))
                except ValueError:
                    return None
    return None


# What Codex parses out of a rate_limit_exceeded message (codex-rs/codex-api/src/sse/responses.rs,
# ``rate_limit_regex``): case-sensitive, the unit right after the number.
_RETRY_HINT = re.compile(r"Please try again in \d+(?:\.\d+)?(?:s|ms)")


def retry_hint(seconds: float) -> str:
    """``Please try again in 1.898s.``; under a second in milliseconds (``... in 20ms.``); rounded up."""
    # Whole milliseconds, rounded up (after dropping float noise: 0.035 s is 35 ms, not 36).
    ms = math.ceil(round(max(0.0, seconds) * 1000, 6))
    if 0 < seconds < 1:
        return f"Please try again in {max(1, ms)}ms."
    return f"Please try again in {f'{ms / 1000:.3f}'.rstrip('0').rstrip('.')}s."


def with_retry_hint(message: str, code: str | None, retry_after: float | None) -> str:
    """``message`` ending with :func:`retry_hint` for a rate limit with a known delay (unless it has one)."""
    if code != "rate_limit_exceeded" or retry_after is None or _RETRY_HINT.search(message):
        return message
    text = message.rstrip()
    if not text:
        return retry_hint(retry_after)
    return f"{text}{'' if text.endswith(('.', '!', '?')) else '.'} {retry_hint(retry_after)}"


class _Parsed:
    """The vendor-neutral content of an error body."""

    __slots__ = ("kind", "message", "param", "reason", "upstream_code")

    def __init__(self) -> None:
        self.kind = ""  # Anthropic error.type, OpenAI error.type, or Gemini status
        self.message = ""
        self.param: str | None = None
        self.upstream_code: str | None = None  # OpenAI's error.code
        self.reason = ""  # Gemini ErrorInfo.reason


def _parse(body: Any) -> _Parsed:
    out = _Parsed()
    if isinstance(body, list) and body and isinstance(body[0], dict):
        body = body[0]
    if not isinstance(body, dict):
        return out
    error = body.get("error")
    if isinstance(error, str):
        out.message = error
        return out
    if not isinstance(error, dict):
        if isinstance(body.get("message"), str):
            out.message = body["message"]
        elif isinstance(body.get("detail"), str):
            out.message = body["detail"]
        elif isinstance(body.get("detail"), list):
            # FastAPI's validation errors (llama-cpp-python's server, vLLM): [{"loc": [...], "msg"}].
            out.message = "; ".join(_fastapi_detail(d) for d in body["detail"][:5] if isinstance(d, dict))
        return out
    if isinstance(error.get("message"), str):
        out.message = error["message"]
    if isinstance(error.get("status"), str):
        out.kind = error["status"]
    elif isinstance(error.get("type"), str):
        out.kind = error["type"]
    code = error.get("code")
    if isinstance(code, str):
        out.upstream_code = code
    if isinstance(error.get("param"), str):
        out.param = error["param"]
    details = error.get("details")
    if isinstance(details, list):
        for detail in details:
            if isinstance(detail, dict) and isinstance(detail.get("reason"), str):
                out.reason = detail["reason"]
                break
    return out


def _fastapi_detail(detail: JSON) -> str:
    loc = ".".join(str(p) for p in detail.get("loc") or [] if p != "body")
    msg = str(detail.get("msg") or "invalid")
    return f"{loc}: {msg}" if loc else msg


_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s+File \"", re.M)
MAX_DETAIL = 1000


def tidy(detail: str) -> str:
    """An upstream's error text fit to show a client: on one line, bounded, and without the Python
    traceback some servers put in their 500s (the message before it is kept, or else the exception)."""
    found = _TRACEBACK.search(detail)
    if found:
        before = detail[: found.start()].strip()
        if before:  # the message, then where it was raised: keep the message
            detail = before
        else:  # a bare traceback: its last line is the exception
            lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
            detail = lines[-1] if lines else ""
    detail = " ".join(detail.split())
    if len(detail) > MAX_DETAIL:
        detail = detail[: MAX_DETAIL - 1] + "…"
    return detail


def _decode(body: bytes | Any) -> Any:
    if not isinstance(body, bytes | bytearray):
        return body
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


_CONTEXT = re.compile(
    r"prompt is too long|context (?:length|window)|maximum context|exceeds? (?:the )?(?:context|maximum "
    r"number of tokens)|input token count|too many (?:input )?tokens|input length and `max_tokens` exceed",
    re.I,
)
_QUOTA = re.compile(
    r"credit balance|billing|insufficient[_ ]quota|quota exceeded|exceeded your current quota", re.I
)
_AUTH_KINDS = frozenset({"authentication_error", "permission_error", "UNAUTHENTICATED", "PERMISSION_DENIED"})
_AUTH_CODES = frozenset({"invalid_api_key", "API_KEY_INVALID", "invalid_authentication"})
_OVERLOADED = frozenset({"overloaded_error", "UNAVAILABLE", "server_is_overloaded", "slow_down"})
_RATE = frozenset({"rate_limit_error", "rate_limit_exceeded", "RESOURCE_EXHAUSTED", "requests", "tokens"})


def _classify(status: int, p: _Parsed) -> tuple[int, str, str]:
    """(status, code, type) for a parsed upstream error; ``status`` 0 means "came mid-stream"."""
    kind, code = p.kind, p.upstream_code or ""
    if kind in _AUTH_KINDS or code in _AUTH_CODES or p.reason in _AUTH_CODES or status in (401, 403):
        return 502, "upstream_authentication_error", "server_error"
    if kind == "billing_error" or code == "insufficient_quota" or kind == "insufficient_quota":
        return 429, "insufficient_quota", "insufficient_quota"
    if status == 402 or (status in (400, 429) and _QUOTA.search(p.message) and kind != "RESOURCE_EXHAUSTED"):
        return 429, "insufficient_quota", "insufficient_quota"
    if status == 429 or kind in _RATE or code in _RATE:
        return 429, "rate_limit_exceeded", "rate_limit_error"
    if status in (503, 529) or kind in _OVERLOADED or code in _OVERLOADED:
        return 503, "server_is_overloaded", "server_error"
    if code == "context_length_exceeded" or (
        (status in (0, 400, 413) or kind == "invalid_request_error") and _CONTEXT.search(p.message)
    ):
        return 400, "context_length_exceeded", "invalid_request_error"
    if code == "model_not_found" or (
        (kind in ("not_found_error", "NOT_FOUND") or status == 404) and "model" in p.message.lower()
    ):
        return 404, "model_not_found", "invalid_request_error"
    if status == 404 or kind in ("not_found_error", "NOT_FOUND"):
        # Not the model: the gateway's upstream URL is wrong, which the client cannot fix.
        return 502, "server_error", "server_error"
    if status in (408, 504) or kind == "DEADLINE_EXCEEDED" or kind == "timeout_error":
        return 504, "server_error", "server_error"
    if status == 0 and kind in ("api_error", "server_error", "INTERNAL", ""):
        return 500, "server_error", "server_error"
    if status >= 500 or kind in ("api_error", "INTERNAL", "server_error"):
        return 502, "server_error", "server_error"
    return (status or 400), code or "invalid_request_error", "invalid_request_error"


def from_http(
    status: int,
    headers: Mapping[str, str],
    body: bytes | Any,
    *,
    upstream: str = "upstream",
    secrets: Iterable[str] = (),
) -> ProviderError:
    """The ProviderError for an upstream HTTP error response (``body`` raw bytes or already decoded)."""
    decoded = _decode(body)
    parsed = _parse(decoded)
    out_status, code, etype = _classify(status, parsed)
    detail = parsed.message
    if not detail and isinstance(body, bytes | bytearray):
        detail = bytes(body[:300]).decode("utf-8", "replace").strip()
    detail = scrub(tidy(detail) or f"HTTP {status}", secrets)
    if code == "upstream_authentication_error":
        message = (
            f"{upstream} rejected the gateway's credentials (HTTP {status}): {detail}. "
            "Check the API key configured for this model."
        )
    elif out_status >= 500 and code == "server_error":
        message = f"{upstream} failed (HTTP {status}): {detail}"
    else:
        message = detail
    retry_after = parse_retry_after(headers, decoded) if out_status in (429, 503) else None
    message = with_retry_hint(message, code, retry_after)
    param = parsed.param if out_status < 500 else None
    if code == "model_not_found" and param is None:
        param = "model"
    return ProviderError(
        message, status=out_status, code=code, type=etype, param=param, retry_after=retry_after
    )


def from_error_payload(payload: Any, *, secrets: Iterable[str] = ()) -> ProviderError:
    """The ProviderError for an error that arrived inside a 200 stream (e.g. Anthropic ``event: error``)."""
    parsed = _parse(payload)
    status, code, etype = _classify(0, parsed)
    message = scrub(tidy(parsed.message) or "The upstream stream reported an error.", secrets)
    # No headers inside a stream; Gemini's error body still says how long to wait.
    retry_after = _gemini_retry_delay(payload) if status in (429, 503) else None
    message = with_retry_hint(message, code, retry_after)
    return ProviderError(
        message, status=status, code=code, type=etype, param=parsed.param, retry_after=retry_after
    )


def transport_error(exc: BaseException, url: str, timeout: float | None, *, reading: bool) -> ProviderError:
    """502 for a failed connection, 504 for a timeout; the message names the host, never the query."""
    where = redact_url(url)
    # (aiohttp's ServerTimeoutError is a TimeoutError; this module does not import aiohttp, which only
    # the proxy-aware client loads.)
    if isinstance(exc, asyncio.TimeoutError):
        what = "sent nothing" if reading else "did not accept the connection"
        limit = f" for {timeout:g}s" if timeout is not None else ""
        return ProviderError(f"Upstream {where} {what}{limit} (timeout).", status=504, code="server_error")
    if isinstance(exc, UpstreamProtocolError):
        reason = f"sent a malformed HTTP response ({exc})"
    elif reading:
        reason = "closed the connection mid-response"
    elif isinstance(os_error := getattr(exc, "os_error", None), OSError):
        # aiohttp's ClientConnectorError, which carries the socket's own error.
        reason = f"could not be reached ({type(os_error).__name__}: {os_error.strerror or exc})"
    elif isinstance(exc, OSError) and exc.strerror:
        reason = f"could not be reached ({type(exc).__name__}: {exc.strerror})"
    else:
        reason = f"could not be reached ({type(exc).__name__})"
    return ProviderError(scrub(f"Upstream {where} {reason}."), status=502, code="server_error")


def malformed_event(exc: Exception) -> ProviderError:
    """The ProviderError for an upstream event a translator could not make sense of (a field of the
    wrong type, a block that was never opened...): the stream fails cleanly (502) instead of the
    exception escaping. The event itself is not quoted (it may be large, or carry anything)."""
    log.warning("malformed upstream event: %s: %s", type(exc).__name__, exc)
    return ProviderError(
        f"The upstream sent an event the gateway could not read ({type(exc).__name__}).",
        status=502,
        code="server_error",
    )


def translate(
    step: Callable[[Any], None], payload: Any, *, let_through: tuple[type[Exception], ...] = ()
) -> None:
    """``step(payload)`` (a translator taking one upstream payload); any exception but a
    ProviderError (or one of ``let_through``, which the caller handles) becomes
    :func:`malformed_event`. A try block costs nothing until it raises."""
    try:
        step(payload)
    except ProviderError:
        raise
    except Exception as exc:
        if isinstance(exc, let_through):
            raise
        raise malformed_event(exc) from None
