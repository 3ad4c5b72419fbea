"""The provider names a models file may use, without importing any provider.

``config.py`` checks a model's ``provider`` against them; ``providers/registry.py`` maps them to
factories (and imports ``config`` for ``ModelConfig``). Keeping the names here, importing nothing of
ours, is what keeps those two modules free of an import cycle.
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["BUILTIN_NAMES", "ENTRY_POINT_GROUP", "entry_points", "provider_names"]

ENTRY_POINT_GROUP = "responses_gateway.providers"
# The built-in back ends (``registry.BUILTIN_FACTORIES`` has a factory for each, and is checked to).
BUILTIN_NAMES = ("anthropic", "openai-chat", "openai", "gemini", "local", "scripted")


def entry_points() -> dict[str, metadata.EntryPoint]:
    """Installed providers by name (the first of a name wins)."""
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def provider_names() -> list[str]:
    """Every provider name a models file may use: the built-in ones and the installed entry points."""
    return sorted({*BUILTIN_NAMES, *entry_points()})
