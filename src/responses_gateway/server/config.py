"""Server settings, one frozen object built by run.py (or by tests) and handed to the app."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

KeepaliveMode = Literal["in_progress", "ping", "comment", "off"]

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How the gateway serves: keepalive policy, API keys, request size limit."""

    keepalive: KeepaliveMode = "in_progress"
    keepalive_interval: float = 10.0
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if self.keepalive not in ("in_progress", "ping", "comment", "off"):
            raise ValueError(f"keepalive must be in_progress, ping, comment or off, not {self.keepalive!r}")
        if self.keepalive_interval <= 0:
            raise ValueError("keepalive_interval must be positive")
        if self.max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
