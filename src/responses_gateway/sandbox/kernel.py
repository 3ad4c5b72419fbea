"""The host side of the code sandbox: start, talk to and stop one sandboxed Python kernel.

See the package docstring for the model (one persistent kernel per container, under bubblewrap) and
``_bootstrap.py`` for the other end of the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _seccomp
from .limits import Limits

BWRAP = "/usr/bin/bwrap"
#: Where the container's directory appears inside the sandbox (also the kernel's working directory).
SANDBOX_DATA_DIR = "/mnt/data"
_BOOTSTRAP = Path(__file__).with_name("_bootstrap.py")
_BOOTSTRAP_IN_SANDBOX = "/opt/sandbox/kernel.py"
_REPLY_LIMIT = 1 << 20  # a reply line longer than this is a broken (or hostile) kernel
_SNAPSHOT_LIMIT = 20_000  # files looked at under the data directory per snapshot
_PIPE_SIZE = 1 << 20
# Root mode: every kernel gets its own unprivileged uid from this range (see `_UidPool`).
_UID_BASE = 1_800_000_000
_UID_SLOTS = 1_000_000
# Bound read-only when they exist: what the dynamic linker, time zones and /usr/bin alternatives need.
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/fonts",
    "/etc/mime.types",
)
_TOP_LEVEL_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class SandboxError(Exception):
    """A kernel could not be started (the message says why)."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one `Kernel.run` call did.

    - ``logs``: the code's stdout and stderr, interleaved as written (tracebacks included), cut to
      ``Limits.max_output_bytes`` with a marker in the middle; preceded by a note when the call ran in a
      fresh kernel after the previous one ended.
    - ``error``: None if the code ran to the end; else one line: the exception's last traceback line
      (``ZeroDivisionError: division by zero``), ``timed out after 60 s``, ``CPU time limit exceeded (60 s)``,
      ``MemoryError … (memory limit: 1024 MiB)``, ``the sandbox process died (killed by SIGSEGV)``, …
    - ``files_written``: regular files under /mnt/data created or modified during the call (names relative
      to the data directory, ``/``-separated, sorted), figures excluded. Symbolic links are never listed.
    - ``images``: the PNGs saved from the matplotlib figures the code left open (names relative to the data
      directory).
    - ``duration``: the call's wall time in seconds, as the host saw it (a restart included).
    - ``run_seconds``: the time the code itself ran inside the kernel, or None if it did not finish.
    - ``restarted``: True if the call ran in a new kernel because the previous one ended (timed out, died):
      variables and imports from earlier calls are gone. ``logs`` says so too.
    - ``truncated``: True if ``logs`` was cut.
    """

    logs: str
    error: str | None
    files_written: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    duration: float = 0.0
    run_seconds: float | None = None
    restarted: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


# ------------------------------------------------------------------------------------------ set-up
@dataclass(frozen=True, slots=True)
class _PythonInstall:
    executable: str
    roots: tuple[str, ...]  # directories bound read-only at the same path


def _python_install(python: str | None) -> _PythonInstall:
    """The interpreter the kernel runs on and the directories it needs (its prefixes: a virtualenv's and
    the base installation's). Raises SandboxError if they cannot be bound safely."""
    # Not by real path: a virtualenv's python links to its base interpreter but has other packages.
    if python is None or os.path.abspath(python) == sys.executable:
        executable = sys.executable
        prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    else:
        query = "import sys, json; print(json.dumps([sys.executable, sys.prefix, sys.base_prefix, "
        query += "sys.exec_prefix, sys.base_exec_prefix]))"
        try:
            done = subprocess.run(
                [python, "-I", "-c", query], capture_output=True, text=True, timeout=30, check=True
            )
            executable, *prefixes = json.loads(done.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise SandboxError(f"cannot run the sandbox's Python {python}: {exc}") from exc
    if not executable:
        raise SandboxError("the Python interpreter's path is unknown (sys.executable is empty)")
    real_bin = os.path.dirname(os.path.realpath(executable))
    if os.path.basename(real_bin) == "bin":  # the installation the venv's python links to
        prefixes.append(os.path.dirname(real_bin))
    roots: list[str] = []
    for prefix in sorted({os.path.abspath(p) for p in prefixes if p}, key=len):
        if prefix == "/":
            raise SandboxError("the Python installation's prefix is /: refusing to expose the whole host")
        if _is_within(prefix, "/usr") or any(_is_within(prefix, root) for root in roots):
            continue
        roots.append(prefix)
    return _PythonInstall(executable=executable, roots=tuple(roots))


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _command(
    install: _PythonInstall,
    data_dir: Path,
    limits: Limits,
    *,
    uid: int | None,
    sock_fd: int,
    probe: bool = False,
) -> _Launch:
    """bubblewrap's command line for one kernel."""
    data = str(data_dir)
    for root in install.roots:
        if _is_within(data, root):
            raise SandboxError(f"the data directory {data} is inside the Python installation {root}")
    argv: list[str] = []
    if uid is None:
        # Not root: an unprivileged user namespace, as bubblewrap always does it; the kernel keeps the
        # gateway's uid, and RLIMIT_NPROC counts the processes of this namespace only.
        argv += ["--unshare-all", "--unshare-user", "--disable-userns"]
    else:
        # Root: every namespace but the user namespace (one created by root maps the sandbox to host uid
        # 0, which RLIMIT_NPROC exempts and which owns every root-owned file); the kernel sets its limits,
        # then drops to `uid` with the two capabilities kept for that.
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
    bin_dir = os.path.dirname(install.executable)
    path = "/usr/local/bin:/usr/bin:/bin"
    if any(_is_within(bin_dir, root) for root in install.roots):
        path = f"{bin_dir}:{path}"
    env = {
        "PATH": path,
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp/matplotlib",
        "PYTHONDONTWRITEBYTECODE": "1",
        # A BLAS thread per core would count against max_processes and memory_bytes on a big machine.
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
    }
    for name, value in env.items():
        argv += ["--setenv", name, value]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in _TOP_LEVEL_SYSTEM_DIRS:
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    # First the private file systems, so that a Python installation under /tmp is bound over them.
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    argv += ["--perms", "1777", "--size", str(max(limits.tmp_bytes // 4, 1 << 20)), "--tmpfs", "/dev/shm"]
    # bubblewrap creates a mount point's missing parents with mode 0700: make them 0755 first, so the
    # kernel can reach its Python, /etc and /mnt/data after it drops root (root mode).
    made: set[str] = {"/tmp", "/dev", "/proc"}
    for dest in (*_ETC_FILES, *install.roots, _BOOTSTRAP_IN_SANDBOX, SANDBOX_DATA_DIR):
        parents = [str(parent) for parent in reversed(Path(dest).parents) if str(parent) != "/"]
        for parent in parents:
            if parent not in made:
                made.add(parent)
                argv += ["--perms", "0755", "--dir", parent]
    for etc in _ETC_FILES:
        argv += ["--ro-bind-try", etc, etc]
    for root in install.roots:
        argv += ["--ro-bind", root, root]
    argv += ["--ro-bind", str(_BOOTSTRAP), _BOOTSTRAP_IN_SANDBOX]
    # The kernel changes to /mnt/data itself, once it has its own uid (the directory may be 0700).
    argv += ["--bind", data, SANDBOX_DATA_DIR, "--chdir", "/"]
    # The root and /dev are tmpfs without a size limit: read-only, so the code cannot fill memory there.
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    config = {
        "fd": sock_fd,
        "uid": uid,
        "cpu_seconds": limits.cpu_seconds,
        "kernel_cpu_seconds": limits.kernel_cpu_seconds,
        "memory_bytes": limits.memory_bytes,
        "max_processes": limits.max_processes,
        "max_file_bytes": limits.max_file_bytes,
        "max_open_files": limits.max_open_files,
        "probe": probe,
    }
    command = [install.executable, "-I", "-B", "-X", "utf8", _BOOTSTRAP_IN_SANDBOX, json.dumps(config)]
    # The options go through a pipe (--args): the sandbox can read bubblewrap's command line in
    # /proc/1/cmdline, and it need not learn the host's paths.
    launch = _Launch([BWRAP], [])
    try:
        program = _seccomp.build_filter()
        if program is not None:
            launch.fds.append(_pipe_holding(program))
            argv += ["--seccomp", str(launch.fds[-1])]
        launch.fds.append(_pipe_holding(b"".join(arg.encode() + b"\0" for arg in argv)))
    except BaseException:
        launch.close()
        raise
    launch.argv += ["--args", str(launch.fds[-1]), "--", *command]
    return launch


@dataclass(slots=True)
class _Launch:
    """bubblewrap's argv, and the pipes it reads its options and seccomp filter from (passed to it, then
    closed by the host)."""

    argv: list[str]
    fds: list[int]

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def _pipe_holding(data: bytes) -> int:
    """A pipe's read end with ``data`` in it and the write end closed."""
    if len(data) > 60_000:  # must fit in the pipe's buffer: nobody reads it before bubblewrap starts
        raise SandboxError("bubblewrap's options are too long (paths too long?)")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    return read_end


class _UidPool:
    """Root mode: one host uid per live kernel, so RLIMIT_NPROC (counted per uid) is per kernel.

    The range is far above any real account; a random starting point keeps two gateway processes on one
    host from handing out the same uids (a collision would only make two kernels share one budget).
    """

    def __init__(self) -> None:
        self._in_use: set[int] = set()
        self._next = random.randrange(_UID_SLOTS)

    def take(self) -> int:
        while True:
            uid = _UID_BASE + self._next
            self._next = (self._next + 1) % _UID_SLOTS
            if uid not in self._in_use:
                self._in_use.add(uid)
                return uid

    def give_back(self, uid: int) -> None:
        self._in_use.discard(uid)


_UIDS = _UidPool()


def _prepare_data_dir(data_dir: Path, uid: int | None) -> None:
    """Create the container's directory; in root mode hand it (and everything in it, links not followed) to
    the kernel's uid, so a restarted kernel with a new uid can still change the files of the last one."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if uid is None:
        return
    top = os.lstat(data_dir)
    if not stat.S_ISDIR(top.st_mode):
        raise SandboxError(f"{data_dir} is not a directory")
    os.lchown(data_dir, uid, uid)
    os.chmod(data_dir, stat.S_IMODE(top.st_mode) | stat.S_IRWXU)
    for dirpath, dirnames, filenames in os.walk(data_dir, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if os.lstat(path).st_uid != uid:
                    os.lchown(path, uid, uid)


def _snapshot(data_dir: Path) -> dict[str, tuple[int, int, int]]:
    """Regular files under the data directory: relative name -> (mtime_ns, size, inode)."""
    found: dict[str, tuple[int, int, int]] = {}
    todo = [""]
    while todo and len(found) < _SNAPSHOT_LIMIT:
        relative = todo.pop()
        try:
            entries = list(os.scandir(data_dir / relative if relative else data_dir))
        except OSError:
            continue
        for entry in entries:
            name = f"{relative}/{entry.name}" if relative else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    todo.append(name)
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    found[name] = (st.st_mtime_ns, st.st_size, st.st_ino)
            except OSError:
                continue
    return found


def _describe_exit(returncode: int | None) -> str:
    """bubblewrap exits with its child's status, or 128 + the signal that killed it."""
    if returncode is None:
        return "still running"
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if number:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"killed by {name}"
    return f"exit status {returncode}"


# ------------------------------------------------------------------------------------------ probe
def probe(python: str | None = None) -> str | None:
    """None if sandboxed kernels can start on this machine, else one line saying why not.

    It starts a real sandbox once (about 50 ms): bubblewrap, the namespaces, the limits, the uid switch,
    the Python installation and a write to the data directory. Without it the gateway must refuse the
    code tool; there is no unsandboxed fallback.
    """
    if not sys.platform.startswith("linux"):
        return f"the code sandbox needs Linux (bubblewrap); this is {sys.platform}"
    if not os.access(BWRAP, os.X_OK):
        return f"{BWRAP} is missing: install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap)"
    uid = _UIDS.take() if os.geteuid() == 0 else None
    data_dir = Path(tempfile.mkdtemp(prefix="sandbox-probe-"))
    parent, child = socket.socketpair()
    launch: _Launch | None = None
    try:
        install = _python_install(python)
        _prepare_data_dir(data_dir, uid)
        launch = _command(install, data_dir, Limits(), uid=uid, sock_fd=child.fileno(), probe=True)
        done = subprocess.run(
            launch.argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            pass_fds=(child.fileno(), *launch.fds),
            timeout=30,
            env={"PATH": "/usr/bin:/bin"},
        )
        child.close()
        parent.settimeout(1)
        reply = b""
        with contextlib.suppress(OSError):
            while chunk := parent.recv(4096):
                reply += chunk
        if done.returncode == 0 and reply.startswith(b'{"ready": true'):
            return None
        output = (done.stderr + done.stdout).decode(errors="replace").strip().splitlines()
        detail = output[0] if output else _describe_exit(done.returncode)
        return f"bubblewrap cannot start the code sandbox here: {detail}"
    except SandboxError as exc:
        return str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap cannot start the code sandbox here: {exc}"
    finally:
        parent.close()
        child.close()
        if launch is not None:
            launch.close()
        shutil.rmtree(data_dir, ignore_errors=True)
        if uid is not None:
            _UIDS.give_back(uid)


# ------------------------------------------------------------------------------------------ output
class _Output:
    """A call's stdout + stderr: the first 3/4 of the budget and the last 1/4; the middle is only counted."""

    def __init__(self, limit: int) -> None:
        self._head_limit = limit * 3 // 4
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0

    def feed(self, data: bytes) -> None:
        self._total += len(data)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        if len(data) >= self._tail_limit:
            self._tail = bytearray(data[-self._tail_limit :])
        else:
            self._tail += data
            if len(self._tail) > 2 * self._tail_limit:
                del self._tail[: -self._tail_limit]

    def take(self) -> tuple[str, bool]:
        """The text so far and whether it was cut; starts over."""
        tail = bytes(self._tail[-self._tail_limit :])
        dropped = self._total - len(self._head) - len(tail)
        head = self._head.decode(errors="replace")
        if dropped > 0:
            limit = self._head_limit + self._tail_limit
            text = (
                f"{head}\n[… output truncated: {dropped:,} of {self._total:,} bytes not shown "
                f"(the limit is {limit:,} bytes per call) …]\n{tail.decode(errors='replace')}"
            )
        else:
            text = head + tail.decode(errors="replace")
        self._head, self._tail, self._total = bytearray(), bytearray(), 0
        return text, dropped > 0


# ------------------------------------------------------------------------------------------ kernel
@dataclass(slots=True)
class _Process:
    proc: asyncio.subprocess.Process
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    out_fd: int
    uid: int | None
    exited: asyncio.Future[Any]
    closed: bool = False


class _Outcome:
    TIMEOUT = "timeout"
    DIED = "died"
    INVALID = "invalid"


async def _race(work: asyncio.Future[Any], process: _Process, timeout: float) -> str | None:
    """Wait for ``work`` until ``timeout`` or the kernel's death (then cancel it): None if it finished,
    else the `_Outcome` (``DIED`` or ``TIMEOUT``)."""
    try:
        done, _ = await asyncio.wait(
            {work, process.exited}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        work.cancel()
    if work in done:
        return None
    return _Outcome.DIED if process.exited.done() else _Outcome.TIMEOUT


class Kernel:
    """One persistent, sandboxed Python process for one container (``await Kernel.start(...)``).

    Calls are serialized. A kernel that times out or dies is replaced by a fresh one on the next call.
    """

    def __init__(self, data_dir: Path, limits: Limits, install: _PythonInstall) -> None:
        """Use `Kernel.start`."""
        self.data_dir = data_dir
        self.limits = limits
        self._install = install
        self._process: _Process | None = None
        self._output = _Output(limits.max_output_bytes)
        self._lock = asyncio.Lock()
        self._lost: str | None = None  # why the last process ended, told to the next call
        self._closed = False
        self._next_id = 0
        self.starts = 0  # processes started so far (1 + restarts)

    @classmethod
    async def start(
        cls, data_dir: str | os.PathLike[str], limits: Limits | None = None, *, python: str | None = None
    ) -> Kernel:
        """Start a kernel whose /mnt/data is ``data_dir`` (created if missing; in root mode its files are
        handed to the sandbox's uid). ``python`` defaults to the gateway's own interpreter (its packages,
        numpy or pandas for instance, are importable in the sandbox). Raises SandboxError."""
        if python is None:
            install = _python_install(None)
        else:
            install = await asyncio.to_thread(_python_install, python)
        kernel = cls(Path(os.path.abspath(data_dir)), limits or Limits(), install)
        await kernel._spawn()
        return kernel

    @property
    def running(self) -> bool:
        """True while a kernel process is up (False after a timeout or crash, until the next call)."""
        return self._process is not None and not self._process.exited.done()

    @property
    def pid(self) -> int | None:
        """The host pid of the bubblewrap process holding the kernel."""
        return None if self._process is None else self._process.proc.pid

    async def __aenter__(self) -> Kernel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def run(self, code: str) -> RunResult:
        """Run ``code`` as the next notebook cell. Never raises for anything the code does."""
        async with self._lock:
            if self._closed:
                raise RuntimeError("the kernel is closed")
            started = time.monotonic()
            notice = ""
            process = self._process
            if process is not None and process.exited.done():
                self._lost = f"died ({_describe_exit(process.proc.returncode)})"
                await self._discard()
                process = None
            if process is None:
                try:
                    process = await self._spawn()
                except SandboxError as exc:
                    return RunResult(
                        logs="", error=str(exc), duration=time.monotonic() - started, restarted=True
                    )
                notice = (
                    f"[The previous Python process {self._lost or 'ended'}; this code ran in a new one: "
                    "variables, imports and definitions from earlier calls are gone, files in /mnt/data "
                    "remain.]\n"
                )
                self._lost = None
            restarted = bool(notice)
            before = await asyncio.to_thread(_snapshot, self.data_dir)
            self._next_id += 1
            request_id = self._next_id
            try:
                reply = await self._exchange(
                    process, {"id": request_id, "code": code}, self.limits.wall_seconds
                )
            except asyncio.CancelledError:
                # The caller gave up mid-call: the kernel is still busy with the code, so it goes.
                self._lost = "was stopped: a call was cancelled"
                await self._discard()
                raise
            error: str | None
            images: list[str] = []
            run_seconds: float | None = None
            if isinstance(reply, dict) and reply.get("id") == request_id:
                self._drain(process)
                error = reply.get("error") if isinstance(reply.get("error"), str) else None
                raw_images = reply.get("images")
                if isinstance(raw_images, list):
                    images = [name for name in raw_images if isinstance(name, str)]
                seconds = reply.get("duration")
                run_seconds = float(seconds) if isinstance(seconds, int | float) else None
            else:
                error = await self._fail(process, reply)
            logs, truncated = self._output.take()
            after = await asyncio.to_thread(_snapshot, self.data_dir)
            images = [name for name in images if name in after]
            written = tuple(
                sorted(
                    name for name, seen in after.items() if before.get(name) != seen and name not in images
                )
            )
            return RunResult(
                logs=notice + logs,
                error=error,
                files_written=written,
                images=tuple(images),
                duration=time.monotonic() - started,
                run_seconds=run_seconds,
                restarted=restarted,
                truncated=truncated,
            )

    async def restart(self) -> None:
        """Replace the kernel with a fresh one now (variables are lost)."""
        async with self._lock:
            if self._closed:
                raise RuntimeError("the kernel is closed")
            await self._discard()
            self._lost = "was restarted"
            await self._spawn()
            self._lost = None

    async def close(self) -> None:
        """Kill the kernel and everything it started. Idempotent."""
        self._closed = True
        await self._discard()

    # -------------------------------------------------------------------------------------- internals
    async def _spawn(self) -> _Process:
        loop = asyncio.get_running_loop()
        uid = _UIDS.take() if os.geteuid() == 0 else None
        parent_sock, child_sock = socket.socketpair()
        out_read, out_write = os.pipe()
        launch: _Launch | None = None
        try:
            await asyncio.to_thread(_prepare_data_dir, self.data_dir, uid)
            launch = _command(self._install, self.data_dir, self.limits, uid=uid, sock_fd=child_sock.fileno())
            proc = await asyncio.create_subprocess_exec(
                *launch.argv,
                stdin=subprocess.DEVNULL,
                stdout=out_write,
                stderr=out_write,
                pass_fds=(child_sock.fileno(), *launch.fds),
                start_new_session=True,
                env={"PATH": "/usr/bin:/bin"},
            )
        except BaseException as exc:
            parent_sock.close()
            os.close(out_read)
            if uid is not None:
                _UIDS.give_back(uid)
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot run {BWRAP}: {exc}") from exc
            raise
        finally:
            child_sock.close()
            os.close(out_write)
            if launch is not None:
                launch.close()
        os.set_blocking(out_read, False)
        with contextlib.suppress(OSError, AttributeError):  # F_SETPIPE_SZ: Linux only
            fcntl.fcntl(out_read, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        reader, writer = await asyncio.open_connection(sock=parent_sock, limit=_REPLY_LIMIT)
        process = _Process(proc, reader, writer, out_read, uid, asyncio.ensure_future(proc.wait()))
        self._process = process
        loop.add_reader(out_read, self._on_output, process)
        self.starts += 1
        try:
            reply = await self._exchange(process, None, self.limits.start_seconds)
        except asyncio.CancelledError:
            await self._discard()
            raise
        if isinstance(reply, dict) and reply.get("ready") is True:
            return process
        if reply == _Outcome.DIED:
            self._drain(process)
        await self._discard()
        output = self._output.take()[0].strip()
        if reply == _Outcome.TIMEOUT:
            reason = f"not ready after {self.limits.start_seconds:g} s"
        elif reply == _Outcome.DIED:
            reason = _describe_exit(proc.returncode)
        else:
            reason = "invalid first message"
        detail = f": {output.splitlines()[-1]}" if output else ""
        raise SandboxError(f"the sandbox did not start ({reason}){detail}")

    def _on_output(self, process: _Process) -> None:
        if process.closed:
            return
        try:
            data = os.read(process.out_fd, _PIPE_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._output.feed(data)
        else:
            asyncio.get_running_loop().remove_reader(process.out_fd)

    def _drain(self, process: _Process) -> None:
        """Take the output already in the pipe: everything the kernel wrote before its reply or death."""
        if process.closed:
            return
        for _ in range(256):
            try:
                data = os.read(process.out_fd, _PIPE_SIZE)
            except OSError:
                return
            if not data:
                return
            self._output.feed(data)

    async def _exchange(self, process: _Process, request: dict[str, Any] | None, timeout: float) -> Any:
        """Send ``request`` (if any) and wait for one reply line: the parsed reply, or an `_Outcome`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if request is not None:
            process.writer.write(json.dumps(request).encode() + b"\n")
            drain: asyncio.Future[Any] = asyncio.ensure_future(process.writer.drain())
            lost = await _race(drain, process, timeout)
            if lost is not None:
                return lost
            if drain.exception() is not None:
                return _Outcome.DIED
        read: asyncio.Future[Any] = asyncio.ensure_future(process.reader.readline())
        lost = await _race(read, process, max(deadline - loop.time(), 0.0))
        if lost is not None:
            return lost
        try:
            line = read.result()
        except (ValueError, asyncio.LimitOverrunError, asyncio.IncompleteReadError, OSError):
            return _Outcome.INVALID
        if not line:
            return _Outcome.DIED
        try:
            return json.loads(line)
        except ValueError:
            return _Outcome.INVALID

    async def _fail(self, process: _Process, outcome: Any) -> str:
        """The call did not get its reply: stop the kernel (it is replaced on the next call), say why."""
        if outcome == _Outcome.TIMEOUT:
            error = f"timed out after {self.limits.wall_seconds:g} s"
            self._lost = f"was stopped: a call timed out after {self.limits.wall_seconds:g} s"
        elif outcome == _Outcome.DIED:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.exited), 1)
            if process.exited.done():
                how = _describe_exit(process.proc.returncode)
                error = f"the sandbox process died ({how})"
                self._lost = f"died ({how})"
            else:  # alive, but the code closed the kernel's end of the protocol
                error = "the sandbox process stopped answering (its connection to the host was closed)"
                self._lost = "was stopped: it stopped answering"
        else:
            error = "the sandbox process sent an invalid reply"
            self._lost = "was stopped: it sent an invalid reply"
        self._drain(process)
        await self._discard()
        return error

    async def _discard(self) -> None:
        """Kill the current process (bubblewrap's pid namespace takes everything in it along) and free its
        resources."""
        process, self._process = self._process, None
        if process is None:
            return
        if not process.exited.done():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.proc.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.exited), 5)
        process.closed = True
        asyncio.get_running_loop().remove_reader(process.out_fd)
        os.close(process.out_fd)
        process.writer.close()
        if process.uid is not None:
            _UIDS.give_back(process.uid)
