"""The HTTP layer: a raw ASGI app in front of the providers (see docs/architecture.md)."""

from .app import GatewayApp
from .config import ServerConfig
from .registry import ModelRegistry, default_registry

__all__ = ["GatewayApp", "ModelRegistry", "ServerConfig", "default_registry"]
