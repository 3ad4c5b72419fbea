"""Containers: a directory and a sandboxed Python kernel each, where code_interpreter calls run.

A container belongs to the owner (API key) whose request made it; its files live under
``<data dir>/containers/<id>/`` (``/mnt/data`` inside the sandbox) and its kernel (``sandbox.Kernel``)
starts on the first call, so variables survive from call to call and from response to response. A
container unused for ``idle_minutes`` (OpenAI's ``expires_after``: 20 minutes after last activity) is
expired: its kernel stopped, its files deleted.

With a store, the pool keeps a :class:`Catalog` (store/containers.py) up to date: the record, the files'
bytes and what each call told the model. The kernel lives in one instance, the container's *holder*;
another instance asked for the container restores its files from the catalog and becomes the holder
(the variables do not move: the model is told so in its next result). Without a store, containers live
in this process only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...paths import LazyDirectory
from ...protocol.response import new_id
from ...sandbox import Kernel, Limits, SandboxError, probe

__all__ = [
    "MOVED_NOTE",
    "Catalog",
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

# Live containers per owner and in all; past either, the least recently used idle one is expired.
MAX_PER_OWNER = 16
MAX_CONTAINERS = 256
_SWEEP_SECONDS = 60.0
# The catalog's last_active_at is written at most this often per container (seconds).
_TOUCH_SECONDS = 15.0
# Files larger than this stay with the instance holding the container (the catalog keeps bytes in rows).
SHARED_FILE_BYTES = 32 * 1024 * 1024
# What the model reads after its container moved to this instance.
MOVED_NOTE = (
    "Note: this container was restored on another gateway instance: its files are all there, but "
    "Python variables and imports from earlier calls are gone."
)


class Catalog(Protocol):
    """Containers as the instances share them (``store.containers``; see store/containers.py)."""

    instance_id: str

    async def put(
        self,
        owner: str | None,
        cid: str,
        *,
        name: str,
        created_at: int,
        last_active_at: int,
        idle_minutes: int,
    ) -> None: ...

    async def get(self, owner: str | None, cid: str) -> JSON | None: ...

    async def owned(self, owner: str | None) -> list[JSON]: ...

    async def claim(self, cid: str, last_active_at: int) -> None: ...

    async def touch(self, cid: str, last_active_at: int) -> None: ...

    async def delete(self, cid: str) -> None: ...

    async def put_file(
        self, cid: str, fid: str, *, path: str, source: str, created_at: int, data: bytes
    ) -> None: ...

    async def delete_file(self, cid: str, fid: str) -> None: ...

    async def files(self, cid: str) -> list[JSON]: ...


def describe_record(record: JSON) -> JSON:
    """A catalog record as the Containers API shows a container."""
    return {
        "id": record["id"],
        "object": "container",
        "created_at": record["created_at"],
        "status": "running",
        "expires_after": {"anchor": "last_active_at", "minutes": int(record["idle_minutes"])},
        "last_active_at": record["last_active_at"],
        "memory_limit": "1g",
        "name": record["name"],
    }


def record_expired(record: JSON, now: float) -> bool:
    return bool(now - record["last_active_at"] > record["idle_minutes"] * 60)


@dataclass(slots=True)
class ContainerFile:
    """A file of a container, by the id the Containers API and ``container_file_citation`` use."""

    id: str
    path: str  # relative to the container's directory (``/mnt/data/<path>`` in the sandbox)
    source: str  # "user" (uploaded) or "assistant" (written by code)
    created_at: int
    synced: tuple[int, int] | None = None  # (size, mtime_ns) last written to the catalog

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
    moved: bool = False  # restored here from another instance; the model is not told yet
    touched_catalog: float = 0.0  # monotonic time of the last last_active_at written

    def expired(self, now: float) -> bool:
        return self.users == 0 and now - self.last_active > self.idle_minutes * 60

    def describe(self) -> JSON:
        """The container as the Containers API shows it."""
        return describe_record(self.record())

    def record(self) -> JSON:
        return {
            "id": self.id,
            "name": self.name,
            "created_at": self.created_at,
            "last_active_at": self.last_active_at,
            "idle_minutes": int(self.idle_minutes),
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
    when the first one is made; None: a temporary directory removed at close). ``catalog`` (set by the
    app once its store is open) shares them with the gateway's other instances."""

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
        self.catalog: Catalog | None = None
        self._containers: dict[str, Container] = {}
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
    async def new(self, owner: str | None, *, name: str = "", idle_minutes: float | None = None) -> Container:
        container = self._make(
            owner, new_id("cntr"), name, idle_minutes or self.idle_minutes, int(time.time())
        )
        if self.catalog is not None:
            try:
                await self.catalog.put(
                    owner,
                    container.id,
                    name=name,
                    created_at=container.created_at,
                    last_active_at=container.last_active_at,
                    idle_minutes=int(container.idle_minutes),
                )
            except BaseException:
                self.delete_here(container)
                raise
        return container

    def _make(
        self, owner: str | None, cid: str, name: str, idle_minutes: float, created_at: int
    ) -> Container:
        self._expire()
        self._make_room(owner)
        directory = self._root.path / cid
        if directory.exists():  # an earlier copy of it, still being removed: a directory of its own
            directory = self._root.path / f"{cid}.{secrets.token_hex(4)}"
        container = Container(
            id=cid,
            owner=owner,
            directory=directory,
            created_at=created_at,
            last_active=time.monotonic(),
            last_active_at=int(time.time()),
            idle_minutes=idle_minutes,
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

    async def get(self, cid: str, owner: str | None) -> Container | None:
        """The container ``cid`` if ``owner`` owns it and it has not expired: this process's copy, or
        (with a catalog) restored here from the catalog when another instance held it."""
        self._expire()
        container = self._containers.get(cid)
        if container is not None and container.owner != owner:
            return None
        if self.catalog is None:
            if container is not None:
                self.touch(container)
            return container
        record = await self.catalog.get(owner, cid)
        if record is None or (
            record_expired(record, time.time()) and (container is None or container.users == 0)
        ):
            if container is not None:  # deleted, or expired, by another instance
                self.delete_here(container)
            if record is not None:
                await self.catalog.delete(cid)
            return None
        if container is not None and record["holder"] == self.catalog.instance_id:
            self.touch(container)
            return container
        if container is not None:  # another instance took it over since: this copy is stale
            if container.users or container.lock.locked():
                self.touch(container)
                return container
            self.delete_here(container)
        return await self._restore(owner, record)

    async def _restore(self, owner: str | None, record: JSON) -> Container:
        assert self.catalog is not None
        container = self._make(
            owner, record["id"], record["name"], float(record["idle_minutes"]), int(record["created_at"])
        )
        try:
            for saved in await self.catalog.files(container.id):
                path = saved["path"]
                if check_path(path) is not None:
                    continue
                data = saved["data"]
                await asyncio.to_thread(write_file, container, path, data)
                entry = ContainerFile(saved["id"], path, saved["source"], saved["created_at"])
                entry.synced = await asyncio.to_thread(_signature, container, path)
                container.files[entry.id] = entry
                container.paths[path] = entry.id
            await self.catalog.claim(container.id, container.last_active_at)
        except BaseException:
            self.delete_here(container)
            raise
        container.moved = True
        container.touched_catalog = time.monotonic()
        log.info("container %s restored here from another instance", container.id)
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
        await self.sync(container)
        return added

    async def owned(self, owner: str | None) -> list[JSON]:
        """``owner``'s containers (on every instance, with a catalog) as the API shows them, oldest first."""
        self._expire()
        if self.catalog is None:
            mine = sorted(
                (c for c in self._containers.values() if c.owner == owner), key=lambda c: c.created_at
            )
            return [c.describe() for c in mine]
        now = time.time()
        out = []
        for record in await self.catalog.owned(owner):
            local = self._containers.get(record["id"])
            if local is not None and local.last_active_at > record["last_active_at"]:
                record["last_active_at"] = local.last_active_at
            if not record_expired(record, now):
                out.append(describe_record(record))
        return out

    async def delete(self, container: Container) -> None:
        """Expire ``container`` now, on every instance (the Containers API's delete)."""
        self.delete_here(container)
        if self.catalog is not None:
            await self.catalog.delete(container.id)

    def delete_here(self, container: Container) -> None:
        """Stop this process's copy of ``container`` (its kernel, its files here)."""
        if self._containers.get(container.id) is container:
            del self._containers[container.id]
            self._dispose_later(container)

    async def remove_file(self, container: Container, fid: str) -> None:
        """Delete one of the container's files (here and in the catalog)."""
        entry = container.files.get(fid)
        if entry is None:
            return
        await asyncio.to_thread(remove_file, container, entry.path)
        container.forget(fid)
        if self.catalog is not None:
            await self.catalog.delete_file(container.id, fid)

    async def sync(self, container: Container) -> None:
        """Write the container's new and changed files to the catalog (those past the file size limit
        stay here only, and say so in the log); forget files that are gone."""
        if self.catalog is None or container.disposed:
            return
        for entry in list(container.files.values()):
            limit = min(self.limits.max_file_bytes, SHARED_FILE_BYTES)
            change = await asyncio.to_thread(_read_changed, container, entry, limit)
            if change is None:
                continue
            if change.gone:
                container.forget(entry.id)
                await self.catalog.delete_file(container.id, entry.id)
                continue
            if change.data is not None:
                await self.catalog.put_file(
                    container.id,
                    entry.id,
                    path=entry.path,
                    source=entry.source,
                    created_at=entry.created_at,
                    data=change.data,
                )
            else:
                log.warning(
                    "container %s: %s is too large to share with other instances", container.id, entry.path
                )
            entry.synced = change.signature

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
        catalog = self.catalog
        if catalog is not None and container.last_active - container.touched_catalog > _TOUCH_SECONDS:
            container.touched_catalog = container.last_active
            self._later(catalog.touch(container.id, container.last_active_at))

    def _expire(self) -> None:
        now = time.monotonic()
        for cid in [c.id for c in self._containers.values() if c.expired(now) and not c.lock.locked()]:
            container = self._containers.pop(cid)
            log.info("container %s expired after %.0f idle minutes", cid, container.idle_minutes)
            self._dispose_later(container)
            if self.catalog is not None:
                self._later(self._forget_if_expired(container.owner, cid))

    async def _forget_if_expired(self, owner: str | None, cid: str) -> None:
        """Delete the catalog's record too, unless another instance used the container meanwhile."""
        assert self.catalog is not None
        record = await self.catalog.get(owner, cid)
        if record is not None and record_expired(record, time.time()):
            await self.catalog.delete(cid)

    def _dispose_later(self, container: Container) -> None:
        container.disposed = True
        self._later(_dispose(container))

    def _later(self, work: Awaitable[None]) -> None:
        task = asyncio.get_running_loop().create_task(_logged(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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


async def _logged(work: Awaitable[None]) -> None:
    try:
        await work
    except Exception:
        log.exception("container housekeeping failed")


def _signature(container: Container, path: str) -> tuple[int, int] | None:
    """(size, mtime_ns) of the regular file at ``path`` (never through a link); None if none."""
    *dirs, name = path.split("/")
    try:
        fd = _open_dir(container.directory, dirs, create=False)
    except OSError:
        return None
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        return None
    return info.st_size, info.st_mtime_ns


@dataclass(slots=True)
class _Change:
    gone: bool
    signature: tuple[int, int] = (0, 0)
    data: bytes | None = None  # None: past the size limit


def _read_changed(container: Container, entry: ContainerFile, limit: int) -> _Change | None:
    """How ``entry`` changed since its last sync (None: it did not)."""
    signature = _signature(container, entry.path)
    if signature is None:
        return _Change(gone=True)
    if signature == entry.synced:
        return None
    if signature[0] > limit:
        return _Change(gone=False, signature=signature)
    found = open_file(container, entry.path, limit)
    if found is None:
        return _Change(gone=True)
    return _Change(gone=False, signature=signature, data=found[1])


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
