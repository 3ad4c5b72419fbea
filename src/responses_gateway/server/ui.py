"""The web playground and stream inspector: ``GET /`` and ``GET /ui/<asset>`` (docs/ui.md).

The assets are plain HTML, CSS and ES modules shipped in the package (``responses_gateway/ui/``),
read once at start-up and served from memory: no build step, nothing from a CDN. Every page carries
a strict Content-Security-Policy (scripts and styles from this origin only, no inline script, no
``eval``; the page talks to this gateway only). The pages need no API key to load — they hold no
data — and the key a user enters is sent by the page's own ``fetch`` calls to the API, which checks it
as usual.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import HTTPError
from .router import Router
from .types import Receive, Scope, Send

__all__ = ["ASSETS_DIR", "CSP", "UI", "is_ui_path"]

ASSETS_DIR = Path(__file__).resolve().parent.parent / "ui"

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".svg": b"image/svg+xml",
    ".json": b"application/json",
}


def is_ui_path(path: str) -> bool:
    """Whether ``path`` is one of the UI's pages or assets (served without an API key)."""
    return path == "/" or path.startswith("/ui/")


class UI:
    """The UI's files, by URL path, with their content type and ETag."""

    def __init__(self, directory: Path = ASSETS_DIR) -> None:
        self._files: dict[str, tuple[bytes, bytes, bytes]] = {}
        if directory.is_dir():
            for path in sorted(directory.rglob("*")):
                kind = _TYPES.get(path.suffix)
                if path.is_file() and kind is not None:
                    data = path.read_bytes()
                    etag = b'"' + hashlib.sha256(data).hexdigest()[:32].encode() + b'"'
                    name = path.relative_to(directory).as_posix()
                    self._files[name] = (data, kind, etag)

    @property
    def available(self) -> bool:
        return "index.html" in self._files

    def register(self, router: Router) -> None:
        router.add("/", GET=self._index)
        router.add("/ui/{name:path}", GET=self._asset)

    async def _index(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._send(scope, send, "index.html")

    async def _asset(self, scope: Scope, receive: Receive, send: Send, *, name: str) -> None:
        await self._send(scope, send, name)

    async def _send(self, scope: Scope, send: Send, name: str) -> None:
        found = self._files.get(name)
        if found is None:
            raise HTTPError(404, f"Invalid URL (GET {scope['path']})", code="not_found")
        data, kind, etag = found
        headers = [
            (b"content-type", kind),
            # Revalidated on every load (one cheap 304), so a new version of the gateway is never
            # served stale assets.
            (b"cache-control", b"no-cache"),
            (b"etag", etag),
            (b"content-security-policy", CSP.encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
            (b"x-frame-options", b"DENY"),
        ]
        for key, value in scope["headers"]:
            if key == b"if-none-match" and etag in [v.strip() for v in value.split(b",")]:
                await send({"type": "http.response.start", "status": 304, "headers": headers[1:]})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data, "more_body": False})
