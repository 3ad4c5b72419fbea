"""Containers: a directory and a sandboxed Python kernel each, where code_interpreter calls run.

A container belongs to the owner (API key) whose request made it; its files live under
``<data dir>/containers/<id>/`` (``/mnt/data`` inside the sandbox) and its kernel (``sandbox.Kernel``)
starts on the first call, so variables survive from call to call and from response to response. A
container unused for ``idle_minutes`` (OpenAI's ``expires_after``: 20 minutes after last activity) is
expired: its kernel stopped, its files deleted. Containers live in the gateway process that made them
(docs/hosted-tools.md says what that means with several instances).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import stat
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...paths import LazyDirectory
from ...protocol.response import new_id
from ...sandbox import Kernel, Limits, SandboxError, probe

__all__ = [
    "Container",
    "ContainerFile",
    "ContainerPool",
    "check_path",
    "file_size",
    "open_file",
    "remove_file",
    "write_file",
]

JSON = dict[str, Any]

log = logging.getLogger("responses_gateway.tools")

# The model-facing result of a call, kept for the next turns' history whatever ``include`` asked for.
_RESULTS_KEPT = 10_000
# Live containers per owner and in all; past either, the least recently used idle one is expired.
MAX_PER_OWNER = 16
MAX_CONTAINERS = 256
_SWEEP_SECONDS = 60.0


@dataclass(slots=True)
class ContainerFile:
    """A file of a container, by the id the Containers API and ``container_file_citation`` use."""

    id: str
    path: str  # relative to the container's directory (``/mnt/data/<path>`` in the sandbox)
    source: str  # "user" (uploaded) or "assistant" (written by code)
    created_at: int

    def describe(self, container: Container, size: int) -> JSON:
        return {
            "id": self.id,
            "object": "container.file",
            "created_at": self.created_at,
            "bytes": size,
            "container_id": container.id,
            "path": f"/mnt/data/{self.path}",
            "source": self.source,
        }


@dataclass(slots=True, eq=False)
class Container:
    id: str
    owner: str | None
    directory: Path
    created_at: int
    last_active: float
    idle_minutes: float
    name: str = ""
    kernel: Kernel | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Requests holding it (a container in use is never expired), and whether it was expired.
    users: int = 0
    disposed: bool = False
    last_active_at: int = 0  # wall clock, for the API
    files: dict[str, ContainerFile] = field(default_factory=dict)  # by id
    paths: dict[str, str] = field(default_factory=dict)  # path -> id

    def expired(self, now: float) -> bool:
        return self.users == 0 and now - self.last_active > self.idle_minutes * 60

    def describe(self) -> JSON:
        """The container as the Containers API shows it."""
        return {
            "id": self.id,
            "object": "container",
            "created_at": self.created_at,
            "status": "running",
            "expires_after": {"anchor": "last_active_at", "minutes": int(self.idle_minutes)},
            "last_active_at": self.last_active_at,
            "memory_limit": "1g",
            "name": self.name,
        }

    def file_for(self, path: str, source: str) -> ContainerFile:
        """The file at ``path``, registered under a new id if it has none yet."""
        fid = self.paths.get(path)
        if fid is not None:
            return self.files[fid]
        entry = ContainerFile(new_id("cfile"), path, source, int(time.time()))
        self.files[entry.id] = entry
        self.paths[path] = entry.id
        return entry

    def forget(self, fid: str) -> None:
        entry = self.files.pop(fid, None)
        if entry is not None:
            self.paths.pop(entry.path, None)


class ContainerPool:
    """The containers of one gateway process. ``root`` gives the directory they live under (called
    when the first one is made; None: a temporary directory removed at close)."""

    def __init__(
        self,
        root: Callable[[], Path | None],
        *,
        limits: Limits | None = None,
        idle_minutes: float = 20.0,
        python: str | None = None,
    ) -> None:
        self._root = LazyDirectory(root, prefix="rg-containers-")
        self.limits = limits or Limits()
        self.idle_minutes = idle_minutes
        self.python = python
        self._containers: dict[str, Container] = {}
        self._results: OrderedDict[tuple[str | None, str], tuple[str, str]] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._why: str | None = None
        self._probed = False
        # Set by the app: (owner, file id) -> (file name, bytes) of an uploaded file, None if the owner
        # has no such file (the Files API; None here: no file_ids accepted).
        self.files: Callable[[str | None, str], Awaitable[tuple[str, bytes] | None]] | None = None

    # ------------------------------------------------------------------ availability
    def unavailable(self) -> str | None:
        """Why no sandbox can start on this machine (None: it can). Probed once."""
        if not self._probed:
            self._why = probe(self.python)
            self._probed = True
        return self._why

    # ------------------------------------------------------------------ containers
    def new(self, owner: str | None, *, name: str = "", idle_minutes: float | None = None) -> Container:
        self._expire()
        self._make_room(owner)
        cid = new_id("cntr")
        container = Container(
            id=cid,
            owner=owner,
            directory=self._root.path / cid,
            created_at=int(time.time()),
            last_active=time.monotonic(),
            last_active_at=int(time.time()),
            idle_minutes=idle_minutes or self.idle_minutes,
            name=name,
        )
        container.directory.mkdir(mode=0o755)
        self._containers[cid] = container
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="rg-containers")
        return container

    def _make_room(self, owner: str | None) -> None:
        """Past a cap, expire the least recently used idle container (of this owner first)."""
        mine = [c for c in self._containers.values() if c.owner == owner]
        for group, cap in ((mine, MAX_PER_OWNER), (list(self._containers.values()), MAX_CONTAINERS)):
            idle = sorted((c for c in group if c.users == 0), key=lambda c: c.last_active)
            for container in idle[: max(0, len(group) - cap + 1)]:
                self._dispose_later(self._containers.pop(container.id))

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_SECONDS)
            self._expire()

    def get(self, cid: str, owner: str | None) -> Container | None:
        """The live container ``cid`` if ``owner`` owns it."""
        self._expire()
        container = self._containers.get(cid)
        if container is None or container.owner != owner:
            return None
        self.touch(container)
        return container

    async def add_files(
        self, container: Container, owner: str | None, file_ids: list[str]
    ) -> list[ContainerFile]:
        """Copy uploaded files (by id) into the container's /mnt/data. Raises ``LookupError(file_id)``
        for the first id the owner has no file for (or that cannot be written)."""
        added: list[ContainerFile] = []
        for file_id in file_ids:
            found = await self.files(owner, file_id) if self.files is not None else None
            if found is None:
                raise LookupError(file_id)
            name, data = found
            name = name.replace("\\", "/").rsplit("/", 1)[-1]
            if check_path(name) is not None:
                name = file_id
            try:
                await asyncio.to_thread(write_file, container, name, data)
            except OSError:
                raise LookupError(file_id) from None
            added.append(container.file_for(name, "user"))
        self.touch(container)
        return added

    def owned(self, owner: str | None) -> list[Container]:
        """``owner``'s live containers, oldest first."""
        self._expire()
        return sorted((c for c in self._containers.values() if c.owner == owner), key=lambda c: c.created_at)

    def delete(self, container: Container) -> None:
        """Expire ``container`` now (the Containers API's delete)."""
        if self._containers.pop(container.id, None) is not None:
            self._dispose_later(container)

    async def kernel(self, container: Container) -> Kernel:
        """The container's kernel, started on first use. Raises sandbox.SandboxError."""
        self.touch(container)
        if container.disposed:
            raise SandboxError(f"the container {container.id} has expired")
        if container.kernel is None:
            container.kernel = await Kernel.start(container.directory, self.limits, python=self.python)
        return container.kernel

    def touch(self, container: Container) -> None:
        container.last_active = time.monotonic()
        container.last_active_at = int(time.time())

    def _expire(self) -> None:
        now = time.monotonic()
        for cid in [c.id for c in self._containers.values() if c.expired(now) and not c.lock.locked()]:
            container = self._containers.pop(cid)
            log.info("container %s expired after %.0f idle minutes", cid, container.idle_minutes)
            self._dispose_later(container)

    def _dispose_later(self, container: Container) -> None:
        container.disposed = True
        task = asyncio.get_running_loop().create_task(_dispose(container))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ results for history
    def keep_result(self, owner: str | None, item_id: str, call_id: str, text: str) -> None:
        """What the model is told of call ``item_id`` (the model's own ``call_id`` with it), for the
        history of later turns and responses, whatever the client's ``include`` kept on the item."""
        self._results[(owner, item_id)] = (call_id, text)
        while len(self._results) > _RESULTS_KEPT:
            self._results.popitem(last=False)

    def result(self, owner: str | None, item_id: str) -> tuple[str, str] | None:
        """(call_id, text) of a call made for ``owner``; None if unknown (another owner's, forgotten)."""
        return self._results.get((owner, item_id))

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        containers = list(self._containers.values())
        self._containers.clear()
        for container in containers:
            container.disposed = True
            await _dispose(container)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._root.close()


async def _dispose(container: Container) -> None:
    if container.kernel is not None:
        try:
            await container.kernel.close()
        except Exception:  # a kernel that will not stop is the sandbox's to kill; the files still go
            log.exception("closing container %s", container.id)
        container.kernel = None
    await asyncio.to_thread(_remove_tree, container.directory)


def _remove_tree(path: Path) -> None:
    """Delete a container's files, even those the sandbox made unreadable (mode 000 directories)."""

    def retry(function: Callable[..., object], name: str, _exc: object) -> None:
        try:
            os.chmod(os.path.dirname(name), 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
            function(name)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


# ------------------------------------------------------------------------------ files on the host
# A container's directory is written by sandboxed code, which may plant symbolic links to anywhere on
# the host: the host opens every path in it component by component, never following a link.
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def check_path(path: str) -> str | None:
    """Why ``path`` (relative to the container) is not acceptable, or None."""
    parts = path.split("/")
    if not path or len(path) > 1024 or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return "must be a relative path without '.', '..' or empty parts"
    if "\x00" in path:
        return "must not contain NUL"
    return None


def _open_dir(root: Path, parts: list[str], *, create: bool) -> int:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_file(container: Container, path: str, data: bytes) -> None:
    """Write ``data`` at ``path`` in the container (replacing a regular file; never through a link)."""
    *dirs, name = path.split("/")
    fd = _open_dir(container.directory, dirs, create=True)
    try:
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(path)
            os.unlink(name, dir_fd=fd)  # a file, or a link (the link goes, never its target)
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644, dir_fd=fd)
        with os.fdopen(out, "wb") as file:
            file.write(data)
    finally:
        os.close(fd)


def open_file(container: Container, path: str, limit: int) -> tuple[int, bytes] | None:
    """(size, up to ``limit`` bytes) of the regular file at ``path``; None if there is none."""
    *dirs, name = path.split("/")
    try:
        fd = _open_dir(container.directory, dirs, create=False)
    except OSError:
        return None
    try:
        f = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    with os.fdopen(f, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        return info.st_size, file.read(limit)


def file_size(container: Container, path: str) -> int | None:
    found = open_file(container, path, 0)
    return None if found is None else found[0]


def remove_file(container: Container, path: str) -> None:
    *dirs, name = path.split("/")
    try:
        fd = _open_dir(container.directory, dirs, create=False)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)
