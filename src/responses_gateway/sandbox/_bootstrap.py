"""The kernel: the script the sandboxed interpreter runs (``python -I -B -X utf8 kernel.py CONFIG``).

It is data to the gateway, never imported by it: it runs inside bubblewrap, under the Python installation
the gateway runs on, with the standard library only. Its job, in order:

1. apply the resource limits (``setrlimit``) and, when the gateway runs as root, drop to the sandbox's own
   unprivileged uid (the limits and the uid come in CONFIG, a JSON argument);
2. say ``{"ready": true}`` on the protocol socket (file descriptor ``CONFIG["fd"]``);
3. for each request ``{"id": N, "code": "..."}`` (one JSON object per line), run the code like a notebook
   cell in one persistent namespace, save the matplotlib figures left open as PNGs, and answer
   ``{"id": N, "error": str | null, "images": [...], "duration": seconds}``.

The code's output is not on the protocol socket: fds 1 and 2 are a pipe the host reads (and truncates),
so ``print``, ``os.system('echo hi')`` and subprocesses all land there and none of it can corrupt the
protocol. Before each call fds 1 and 2 and ``sys.stdout``/``sys.stderr`` are restored, in case the previous
call redirected or closed them.

Nothing heavy is imported here (start-up time matters): matplotlib is touched only if the code imported
``matplotlib.pyplot`` itself.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import linecache
import os
import resource
import signal
import sys
import time
import traceback
import types
import warnings
from typing import Any

DATA_DIR = "/mnt/data"
_CO_COROUTINE = 0x0080
_MiB = 1 << 20


class CPULimitExceeded(BaseException):
    """Raised in the running cell when it has used its CPU seconds (``SIGXCPU``)."""


class _State:
    def __init__(self, config: dict[str, Any]) -> None:
        self.fd: int = int(config["fd"])
        self.pid = os.getpid()
        self.cpu_seconds: int = int(config["cpu_seconds"])
        self.cpu_hard: int = int(config["kernel_cpu_seconds"])
        self.memory_bytes: int = int(config["memory_bytes"])
        self.max_processes: int = int(config["max_processes"])
        self.buffer = b""
        self.cell = 0
        self.figure = 0
        self.out_fd = -1
        self.stdout: Any = sys.stdout
        self.stderr: Any = sys.stderr
        self.loop: Any = None
        self.in_cell = False
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        self.namespace: dict[str, Any] = main.__dict__


def _apply_limits(config: dict[str, Any]) -> None:
    limits = {
        resource.RLIMIT_AS: (config["memory_bytes"],) * 2,
        resource.RLIMIT_CPU: (config["cpu_seconds"], config["kernel_cpu_seconds"]),
        resource.RLIMIT_NPROC: (config["max_processes"],) * 2,
        resource.RLIMIT_FSIZE: (config["max_file_bytes"],) * 2,
        resource.RLIMIT_NOFILE: (config["max_open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, (soft, hard) in limits.items():
        _, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            hard = min(hard, current_hard)
            soft = min(soft, hard)
        resource.setrlimit(which, (soft, hard))
    uid = config.get("uid")
    if uid is not None:
        # Root mode: bubblewrap left this process root (no user namespace) with CAP_SETUID and
        # CAP_SETGID only; become the sandbox's own uid, which drops every capability for good.
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise SystemExit("could not drop privileges")


def _on_sigxcpu(signum: int, frame: types.FrameType | None) -> None:
    # Outside a cell (the kernel's own work after it) the limit is re-armed instead: an exception there
    # would break the protocol.
    if _STATE.in_cell:
        raise CPULimitExceeded(f"the code used more than its CPU time ({_STATE.cpu_seconds} s)")


def _arm_cpu_limit() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + _STATE.cpu_seconds
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _send(message: dict[str, Any]) -> None:
    data = (json.dumps(message, ensure_ascii=True) + "\n").encode()
    while data:
        written = os.write(_STATE.fd, data)
        data = data[written:]


def _receive() -> dict[str, Any] | None:
    while b"\n" not in _STATE.buffer:
        chunk = os.read(_STATE.fd, 1 << 16)
        if not chunk:
            return None
        _STATE.buffer += chunk
    line, _, _STATE.buffer = _STATE.buffer.partition(b"\n")
    message: dict[str, Any] = json.loads(line)
    return message


def _restore_output() -> None:
    """Undo whatever the previous cell did to fds 1 and 2 and to sys.stdout/sys.stderr."""
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.dup2(_STATE.out_fd, fd)
    sys.stdout, sys.stderr = _STATE.stdout, _STATE.stderr
    sys.displayhook = sys.__displayhook__


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, _STATE.stdout, _STATE.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def _user_traceback(exc: BaseException) -> str:
    """The traceback as the cell's author should see it: the kernel's own frames left out."""
    report = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    todo = [report]
    while todo:
        part = todo.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        frames = [frame for frame in part.stack if frame.filename != __file__]
        part.stack = traceback.StackSummary.from_list(frames)
        todo += [chained for chained in (part.__cause__, part.__context__) if chained is not None]
    return "".join(report.format())


def _error_line(exc: BaseException) -> str:
    if isinstance(exc, CPULimitExceeded):
        return f"CPU time limit exceeded ({_STATE.cpu_seconds} s)"
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    if isinstance(exc, MemoryError):
        return f"{line or 'MemoryError'} (memory limit: {_STATE.memory_bytes // _MiB} MiB)"
    return line


def _execute(code: types.CodeType) -> None:
    if code.co_flags & _CO_COROUTINE:
        # Top-level await, as in Jupyter: one event loop for the kernel's life.
        import asyncio

        if _STATE.loop is None:
            _STATE.loop = asyncio.new_event_loop()
        _STATE.loop.run_until_complete(eval(code, _STATE.namespace))
    else:
        exec(code, _STATE.namespace)


def _run_cell(source: str) -> str | None:
    """Run one cell; returns the error line (the traceback went to stderr) or None."""
    _STATE.cell += 1
    filename = f"<cell {_STATE.cell}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        tree = ast.parse(source, filename)
        last: ast.stmt | None = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = tree.body.pop()
        body = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
        display = None
        if last is not None:
            # "single" mode hands the value to sys.displayhook: the REPL's (and Jupyter's) last-line echo.
            display = compile(
                ast.Interactive(body=[last]), filename, "single", flags=flags, dont_inherit=True
            )
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        return _error_line(exc)
    try:
        _STATE.in_cell = True
        try:
            _execute(body)
            if display is not None:
                _execute(display)
        finally:
            _STATE.in_cell = False
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
        with contextlib.suppress(BaseException):
            sys.stderr.write(_user_traceback(exc))
        return _error_line(exc)
    return None


def _save_figures() -> list[str]:
    """Jupyter's inline backend: every figure still open after the cell becomes a PNG, then is closed."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    saved: list[str] = []
    try:
        numbers = list(pyplot.get_fignums())
    except Exception:
        return []
    for number in numbers:
        while True:
            _STATE.figure += 1
            name = f"figure_{_STATE.figure}.png"
            if not os.path.lexists(os.path.join(DATA_DIR, name)):
                break
        try:
            pyplot.figure(number).savefig(os.path.join(DATA_DIR, name), format="png")
            saved.append(name)
        except Exception as exc:
            sys.stderr.write(f"could not save figure {number}: {type(exc).__name__}: {exc}\n")
    with contextlib.suppress(Exception):
        pyplot.close("all")
    return saved


def _children() -> list[int]:
    pids: list[int] = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(pid) for pid in f.read().split()]
    except (OSError, ValueError):
        pass
    return pids


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _reap_zombies() -> None:
    """Reap the children that exited with no one waiting for them (``os.fork()`` without ``wait``, a
    fork bomb's leftovers): zombies count against RLIMIT_NPROC and would leave the kernel unable to start
    anything. The exit status a live ``subprocess.Popen`` or ``multiprocessing.Process`` will ask for is
    left alone."""
    zombies = [pid for pid in _children() if _is_zombie(pid)]
    if not zombies:
        return
    waited_for: set[int] = set()
    subprocess = sys.modules.get("subprocess")
    if subprocess is not None:
        import gc

        popen = subprocess.Popen
        waited_for |= {o.pid for o in gc.get_objects() if isinstance(o, popen) and o.returncode is None}
    process = sys.modules.get("multiprocessing.process")
    if process is not None:
        waited_for |= {child.pid for child in list(getattr(process, "_children", ()))}
    for pid in zombies:
        if pid not in waited_for:
            with contextlib.suppress(OSError):
                os.waitpid(pid, os.WNOHANG)


def _stop_process_storm() -> None:
    """If the sandbox is (nearly) at its process limit (a fork bomb still going in the background, or
    its leftovers), kill every process but this one, so the kernel can start processes again. Processes
    a cell leaves running are otherwise left alone, as in Jupyter."""
    try:
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, _STATE.pid)]
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return
    # A storm's size wavers just under the limit as its processes die and fork: 3/4 of it is enough.
    if len(others) + threads < _STATE.max_processes * 3 // 4:
        return
    # Until the killed processes are gone from /proc (reaped by bubblewrap's init: until then they count
    # against RLIMIT_NPROC). 1 s was too short on a loaded machine: the next call's own fork failed.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)  # every process this one may signal, itself excepted
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if not any(p.isdigit() and int(p) not in (1, _STATE.pid) for p in os.listdir("/proc")):
            break
        time.sleep(0.01)
    sys.stderr.write(
        f"[sandbox: {len(others)} processes were left running and the sandbox was near its limit of "
        f"{_STATE.max_processes} processes and threads: they were killed]\n"
    )


def _serve() -> None:
    while True:
        request = _receive()
        if request is None:
            return
        _restore_output()
        _reap_zombies()
        _stop_process_storm()
        _arm_cpu_limit()
        started = time.perf_counter()
        error = _run_cell(str(request.get("code", "")))
        duration = time.perf_counter() - started
        if os.getpid() != _STATE.pid:
            # A child the cell forked (os.fork(), a fork bomb) came back here: it must not answer.
            _flush()
            os._exit(0 if error is None else 1)
        _arm_cpu_limit()
        _reap_zombies()
        _stop_process_storm()
        try:
            images = _save_figures()
        except BaseException as exc:
            images = []
            error = error or _error_line(exc)
        _flush()
        _send({"id": request.get("id"), "error": error, "images": images, "duration": duration})


def main() -> None:
    config: dict[str, Any] = json.loads(sys.argv[1])
    _apply_limits(config)
    global _STATE
    _STATE = _State(config)
    os.chdir(DATA_DIR)
    os.environ["PWD"] = DATA_DIR
    os.set_inheritable(_STATE.fd, False)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past RLIMIT_FSIZE fail with EFBIG instead
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    warnings.filterwarnings("ignore", message=".*is non-interactive, and thus cannot be shown")
    _STATE.out_fd = os.dup(1)  # the output pipe, kept aside so a cell cannot lose it
    if config.get("probe"):
        probe_file = os.path.join(DATA_DIR, ".sandbox-probe")
        with open(probe_file, "w") as f:
            f.write("ok")
        os.unlink(probe_file)
        _send({"ready": True, "uid": os.getuid()})
        return
    _send({"ready": True})
    _serve()


_STATE: _State

if __name__ == "__main__":
    main()
