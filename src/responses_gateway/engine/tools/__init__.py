"""The hosted tools the engine runs: code_interpreter (containers and a sandboxed kernel)."""

from .code_interpreter import CodeInterpreter
from .containers import Container, ContainerPool

__all__ = ["CodeInterpreter", "Container", "ContainerPool"]
