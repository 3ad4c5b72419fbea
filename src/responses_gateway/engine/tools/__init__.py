"""The hosted tools the engine runs: code_interpreter (containers and a sandboxed kernel), file_search."""

from .code_interpreter import CodeInterpreter
from .containers import Container, ContainerPool
from .file_search import FileSearch, Searcher

__all__ = ["CodeInterpreter", "Container", "ContainerPool", "FileSearch", "Searcher"]
