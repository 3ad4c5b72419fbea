"""``serve --workers N``: a pre-fork parent supervising N gateway processes on one listening socket.

The parent binds the socket and builds the app once, then forks the workers; each runs uvicorn on the
inherited socket (the kernel hands each new connection to one of them) and is a full gateway with its
own store connection and instance lease. The parent serves nothing: it restarts a worker that dies,
on SIGTERM/SIGINT stops them all gracefully (each ends its open streams within the grace time) and on
SIGHUP replaces them one by one (the new worker is accepting before the old one is told to stop, so
no connection is refused). Workers are in their own process group (a Ctrl-C reaches them once,
through the parent) and die with the parent (``PR_SET_PDEATHSIG``), so a SIGKILLed parent leaves no
orphan serving the port.

Why one shared socket rather than ``SO_REUSEPORT`` (one socket per worker): with a shared accept
queue a worker that exits or restarts loses no queued connection, and an idle worker takes new
connections first; ``SO_REUSEPORT`` hashes connections to sockets regardless of load, and a socket
closed with connections in its queue resets them.

With an embedded model the parent first starts one *model process* (``server/model_process.py``)
that every worker sends that model's requests to: it is started and ready before the workers, replaced
like a worker if it dies, left alone by SIGHUP, and stopped after the workers on SIGTERM/SIGINT.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MODEL_PROCESS", "Supervisor", "default_workers"]

log = logging.getLogger("responses_gateway.server")

_SIGNALS = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
# A worker that exits this soon after it was started, before it was ready, failed to start.
_QUICK_EXIT = 10.0
_READY_TIMEOUT = 120.0
_PR_SET_PDEATHSIG = 1

# ``start(index, ready_fd)`` runs worker ``index`` in the child and returns its exit status; it
# writes one byte to ``ready_fd`` once it accepts connections.
StartWorker = Callable[[int, int], int]
# The index the model process is started with (workers are 0…N-1).
MODEL_PROCESS = -1


def default_workers() -> int:
    """The number of cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(slots=True)
class _Worker:
    index: int
    pid: int
    ready_fd: int
    started: float
    ready: bool = False
    retiring: bool = False

    def __str__(self) -> str:
        what = "the model process" if self.index == MODEL_PROCESS else f"worker {self.index}"
        return f"{what} (pid {self.pid})"


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the parent dies (Linux): a parent killed hard takes its workers with it,
    as one process would go (their running responses are then recovered as a crash's are)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


class Supervisor:
    """Fork ``count`` workers and keep them running until SIGTERM/SIGINT (see the module's docstring)."""

    def __init__(
        self, count: int, start: StartWorker, *, grace: float, model: StartWorker | None = None
    ) -> None:
        if count < 1:
            raise ValueError("at least one worker")
        self.count = count
        self.start = start
        self.model = model  # starts the model process (started first, stopped last), if any
        self.grace = grace
        self.workers: dict[int, _Worker] = {}
        self.stopping = False

    # ------------------------------------------------------------------------------ run
    def run(self) -> int:
        """Serve until stopped; the exit status (1 if the workers could not start)."""
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            if self.model is not None and not self._wait_ready([self._spawn(MODEL_PROCESS)]):
                log.error("the model process did not start")
                self._stop_all()
                return 1
            for index in range(self.count):
                self._spawn(index)
            return self._supervise()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)

    def _supervise(self) -> int:
        failures = 0
        announced = False
        while True:
            info = signal.sigtimedwait(_SIGNALS, 0.2 if not announced else 1.0)
            self._poll_ready()
            if not announced and all(w.ready for w in self.workers.values()):
                announced = True
                log.info("%d workers serving (pids %s)", self.count, " ".join(str(p) for p in self.workers))
            if info is None:
                continue
            if info.si_signo in (signal.SIGTERM, signal.SIGINT):
                log.info("stopping %d workers", len(self.workers))
                self._stop_all()
                return 0
            if info.si_signo == signal.SIGHUP:
                self._rolling_restart()
                continue
            for worker, status in self._reap():
                if worker.retiring:
                    continue
                # One that exits before it was ready, soon after it started, failed to start (a worker
                # killed then is counted too; three such in a row and the gateway gives up).
                quick = not worker.ready and time.monotonic() - worker.started < _QUICK_EXIT
                failures = failures + 1 if quick else 0
                log.warning(
                    "%s exited (%s)%s; starting another",
                    worker,
                    status,
                    "" if worker.ready else " before it was ready",
                )
                if failures >= 3:
                    log.error("workers keep failing at start-up; stopping")
                    self._stop_all()
                    return 1
                self._spawn(worker.index)

    # ------------------------------------------------------------------------------ workers
    def _spawn(self, index: int) -> _Worker:
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            status = 1
            try:
                os.close(read_fd)
                os.setpgid(0, 0)
                _die_with_parent(parent)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
                start = self.model if index == MODEL_PROCESS else self.start
                assert start is not None
                status = start(index, write_fd)
            except BaseException:
                traceback.print_exc()
            finally:
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        os.close(write_fd)
        worker = _Worker(index, pid, read_fd, time.monotonic())
        self.workers[pid] = worker
        return worker

    def _poll_ready(self) -> None:
        waiting = {w.ready_fd: w for w in self.workers.values() if not w.ready and w.ready_fd >= 0}
        if not waiting:
            return
        readable, _, _ = select.select(list(waiting), [], [], 0)
        for fd in readable:
            self._mark_ready(waiting[fd])

    def _mark_ready(self, worker: _Worker) -> bool:
        data = os.read(worker.ready_fd, 1)
        os.close(worker.ready_fd)
        worker.ready_fd = -1
        worker.ready = bool(data)  # EOF: it exited before it was ready
        return worker.ready

    def _wait_ready(self, workers: list[_Worker]) -> bool:
        """Wait until each of ``workers`` accepts connections; False if one exits or times out first."""
        deadline = time.monotonic() + _READY_TIMEOUT
        for worker in workers:
            if worker.ready:
                continue
            left = deadline - time.monotonic()
            readable, _, _ = select.select([worker.ready_fd], [], [], max(0.0, left))
            if not readable or not self._mark_ready(worker):
                return False
        return True

    def _reap(self) -> list[tuple[_Worker, str]]:
        gone: list[tuple[_Worker, str]] = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            worker = self.workers.pop(pid, None)
            if worker is None:
                continue
            if worker.ready_fd >= 0:
                os.close(worker.ready_fd)
                worker.ready_fd = -1
            code = os.waitstatus_to_exitcode(status)
            gone.append((worker, f"signal {-code}" if code < 0 else f"status {code}"))
        return gone

    def _rolling_restart(self) -> None:
        """SIGHUP: each worker in turn is replaced by a new one, which is ready before the old stops."""
        log.info("SIGHUP: restarting %d workers one by one", len(self.workers))
        for old in list(self.workers.values()):
            if old.retiring or old.pid not in self.workers or old.index == MODEL_PROCESS:
                continue
            new = self._spawn(old.index)
            if not self._wait_ready([new]):
                log.error("a new worker did not start; keeping the old ones")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(new.pid, signal.SIGKILL)
                new.retiring = True
                self._reap()
                return
            old.retiring = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(old.pid, signal.SIGTERM)
        self._reap()

    def _stop_all(self) -> None:
        """SIGTERM every worker and wait for them (each ends its streams within the grace time); then
        the model process, which their streams used."""
        self.stopping = True
        self._stop([pid for pid, w in self.workers.items() if w.index != MODEL_PROCESS])
        self._stop(list(self.workers))
        self.workers.clear()

    def _stop(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace + 10
        while any(pid in self.workers for pid in pids) and time.monotonic() < deadline:
            info = signal.sigtimedwait(_SIGNALS, 0.2)
            if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
                # A second request to stop: uvicorn then stops at once.
                for pid in pids:
                    if pid in self.workers:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGTERM)
            self._reap()
        for pid in pids:
            if self.workers.pop(pid, None) is None:
                continue
            log.warning("pid %d did not stop; killing it", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
