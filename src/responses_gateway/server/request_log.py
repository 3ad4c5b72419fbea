"""One log line per ``POST /v1/responses``: what was asked, how it ended, how long it took.

Logged at INFO on ``responses_gateway.requests`` when the request's work ends (for a background
response, when the run ends, not when the queued snapshot is sent). The line names the model asked
for and the one that answered, the HTTP status, the Response's status, token counts, the time to the
first output item and the whole duration. It never carries content, instructions, tool arguments or
keys: only the fields below. ``serve --no-request-log`` turns it off (the logger can also be
silenced through logging's own configuration).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from ..protocol.builder import StreamBuilder

__all__ = ["RequestLog", "log"]

log = logging.getLogger("responses_gateway.requests")

_UNSAFE = re.compile(r"[^\x21-\x7e]")


def _word(value: str) -> str:
    """A client-chosen name as one printable word (no spaces or line breaks to forge log lines)."""
    return _UNSAFE.sub("?", value[:200])


class RequestLog:
    """Collects one request's facts and writes its line once."""

    __slots__ = ("background", "builder", "enabled", "http_status", "model", "started", "stream")

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.started = time.monotonic()
        self.model: str | None = None
        self.stream = False
        self.background = False
        self.builder: StreamBuilder | None = None
        self.http_status = 200

    def write(self) -> None:
        if not self.enabled or not log.isEnabledFor(logging.INFO):
            return
        now = time.monotonic()
        builder = self.builder
        response: dict[str, Any] = builder.response if builder is not None else {}
        usage = response.get("usage") or {}
        fields: list[str] = []
        if response.get("id"):
            fields.append(f"id={response['id']}")
        fields.append(f"model={_word(self.model) if self.model else '-'}")
        if builder is not None and builder.served_by:
            fields.append(f"served_by={_word(builder.served_by)}")
        fields.append(f"http={self.http_status}")
        fields.append(f"status={response.get('status') or '-'}")
        error = response.get("error")
        if isinstance(error, dict) and error.get("code"):
            fields.append(f"error={_word(str(error['code']))}")
        fields.append(f"stream={'true' if self.stream else 'false'}")
        if self.background:
            fields.append("background=true")
        fields.append(f"input_tokens={usage.get('input_tokens', '-')}")
        fields.append(f"output_tokens={usage.get('output_tokens', '-')}")
        first = builder.first_output_at if builder is not None else None
        fields.append(f"ttft_ms={round((first - self.started) * 1000) if first else '-'}")
        fields.append(f"duration_ms={round((now - self.started) * 1000)}")
        log.info("response %s", " ".join(fields))
