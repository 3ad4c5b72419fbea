"""The code sandbox behind the ``code_interpreter`` tool: untrusted Python in a persistent, jailed process.

Standalone: standard library only, nothing else from ``responses_gateway``; the one system requirement
is bubblewrap (``/usr/bin/bwrap``, Debian/Ubuntu package ``bubblewrap``). There is no unsandboxed
fallback: where `probe` fails, the tool must be refused.

API
---

- ``probe(python=None) -> str | None``: None if kernels can start here, else one line saying why not
  (print it at start-up; refuse the tool with a 400). It starts one real sandbox (~40 ms).
- ``await Kernel.start(data_dir, limits=Limits(), *, python=None) -> Kernel``: one kernel, a persistent
  Python process whose variables survive between calls, like a notebook's. ``data_dir`` (the container's
  directory on the host, created if missing) is its read-write ``/mnt/data`` and working directory.
  ``python`` defaults to the gateway's own interpreter (``sys.executable``): whatever is installed in its
  environment (numpy, pandas, matplotlib) is importable in the sandbox. Raises `SandboxError`.
- ``await kernel.run(code) -> RunResult``: runs ``code`` as the next cell; never raises for what the code
  does. ``RunResult``: ``logs`` (stdout + stderr, truncated with a marker), ``error`` (None, or one line:
  ``ZeroDivisionError: division by zero``, ``timed out after 60 s``, ``CPU time limit exceeded (60 s)``,
  ``the sandbox process died (killed by SIGSEGV)``, …), ``files_written`` (files under /mnt/data created or
  modified by the call), ``images`` (PNGs of the matplotlib figures the cell left open), ``duration``,
  ``run_seconds``, ``restarted``, ``truncated``; ``.ok``. Calls on one kernel are serialized.
- ``await kernel.restart()``, ``await kernel.close()`` (idempotent; also ``async with``),
  ``kernel.running``, ``kernel.pid``, ``kernel.starts``.
- `Limits`: see below. `SandboxError`: a kernel could not start.

A cell is run like Jupyter runs one: ``exec`` in the kernel's ``__main__`` namespace; a final expression
statement is echoed through ``sys.displayhook`` (and sets ``_``); top-level ``await`` works; a traceback
shows the cell's lines and none of the kernel's; figures still open at the end are saved as
``/mnt/data/figure_<n>.png`` and closed (``plt.show()`` is a silent no-op under Agg). matplotlib is
never imported by the kernel itself: figures are looked for only if the cell imported ``matplotlib.pyplot``.

A call that times out kills the kernel; so does a crash (``os._exit``, a segfault, a signal). The call
reports it and the next call starts a fresh kernel, with ``restarted=True`` and a note at the top of its
``logs`` saying variables were lost (files in /mnt/data stay).

The jail
--------

bubblewrap, with ``--die-with-parent`` (killing the gateway kills every sandbox) and ``--new-session``:

- namespaces: a new network namespace (only a loopback of its own: no network at all), PID (the
  sandbox sees its own processes only; when the kernel dies, everything it started dies), IPC, UTS,
  cgroup, mount;
- file system: a read-only empty root; ``/usr`` (and ``/bin``, ``/lib*`` as the host lays them out) and a
  few ``/etc`` files (``ld.so.cache``, ``localtime``, ``alternatives``, ``fonts``, ``mime.types``)
  read-only; the Python installation read-only at its own paths (``sys.prefix`` and ``sys.base_prefix``:
  a virtualenv and the interpreter it links to); a new ``/proc``; a minimal, read-only ``/dev``; private
  size-limited tmpfs ``/tmp`` and ``/dev/shm``; the container's directory read-write at ``/mnt/data``.
  Nothing else of the host exists in it (no ``/home``, ``/root``, ``/work``, ``/var``, no other ``/etc``);
- environment: cleared, then ``HOME=/tmp``, ``MPLBACKEND=Agg``, ``MPLCONFIGDIR=/tmp/matplotlib``, one
  BLAS/OpenMP thread, ``PATH`` with the interpreter's ``bin`` first; bubblewrap's own options reach it
  through a pipe (``--args``), so ``/proc/1/cmdline`` does not show host paths;
- a seccomp filter (``_seccomp.py``, x86-64 and AArch64): no new user namespaces, no keyrings, bpf,
  perf_event_open, userfaultfd, io_uring, ptrace, mount API, setns, open_by_handle_at; no x32 or i386
  system calls;
- identity, two modes:

  - the gateway runs as **root**: no user namespace (one made by root maps the sandbox to host uid 0,
    which RLIMIT_NPROC exempts and which owns every root-owned file). bubblewrap keeps only CAP_SETUID and
    CAP_SETGID; the kernel sets its limits and drops to a uid of its own (``1_800_000_000 + n``, one per
    kernel process), which leaves it no capability; ``no_new_privs`` is set. The data directory is
    handed to that uid (``lchown``, links not followed) each time a kernel starts;
  - **not root**: an unprivileged user namespace (``--unshare-user --disable-userns``); the kernel keeps
    the gateway's uid, and its files in /mnt/data belong to the gateway's user.

Limits (`Limits`) and how each is enforced
------------------------------------------

- ``wall_seconds`` (60): the host waits that long for a call's reply, then SIGKILLs bubblewrap's process
  group; the kernel and everything in its PID namespace die with it. The next call starts a new kernel.
- ``cpu_seconds`` (60): ``RLIMIT_CPU`` soft limit, re-armed before every call to the kernel's CPU time so
  far + ``cpu_seconds``; the kernel's ``SIGXCPU`` handler raises ``CPULimitExceeded`` in the cell (the
  kernel and its variables live on); a child process exceeding it is killed by ``SIGXCPU``.
- ``kernel_cpu_seconds`` (3600): ``RLIMIT_CPU`` hard limit (hard limits only go down): over its whole life
  a kernel process gets that much CPU, then ``SIGKILL`` (reported as a death; restarted on the next call).
- ``memory_bytes`` (1 GiB): ``RLIMIT_AS`` on every process: allocations beyond fail (``MemoryError``).
  numpy, pandas and matplotlib import and plot well under 1 GiB.
- ``max_processes`` (64): ``RLIMIT_NPROC``, processes and threads. It counts per user: in root mode the
  uid is the kernel's own, in the other mode the kernel (>= 5.14) counts per user namespace, so it is
  per sandbox either way. The kernel reaps the zombies of children nobody waited for (those a live
  ``subprocess.Popen``/``multiprocessing.Process`` will wait for excepted), and when the sandbox is at the
  limit at the start or end of a call (a fork bomb still running) it kills every other process in it.
- ``max_file_bytes`` (256 MiB): ``RLIMIT_FSIZE``; ``SIGXFSZ`` is ignored, so an oversized write fails with
  ``EFBIG`` instead of killing the kernel. ``max_open_files`` (1024): ``RLIMIT_NOFILE``. Core dumps off.
- ``max_output_bytes`` (64 KiB): the host reads the kernel's stdout/stderr pipe as it comes and keeps the
  first 3/4 and the last 1/4 of the budget, with a marker in between; the rest is counted and dropped,
  so a flood costs the host no memory.
- ``tmp_bytes`` (256 MiB): the size of ``/tmp``; ``/dev/shm`` gets a quarter.
- ``start_seconds`` (15): how long a new kernel may take to say it is ready.

Not enforced, and why:

- total memory: ``RLIMIT_AS`` is per process, so a sandbox may hold up to ``max_processes`` x
  ``memory_bytes``, plus the tmpfs sizes and pipe buffers. Only a memory cgroup bounds the whole; none is
  used (cgroup v2 delegation is not something a gateway can count on);
- disk: /mnt/data's total size (only each file's size is limited); that needs a quota or a file system
  of its own for the container directory;
- a cell that ignores ``SIGXCPU`` (it can change the handler) is only stopped by ``wall_seconds`` and
  ``kernel_cpu_seconds``;
- processes a cell leaves running in the background keep running between calls (as in Jupyter), each
  within its own ``RLIMIT_CPU``, until the kernel is closed or restarted;
- the Python installation is readable in the sandbox (the gateway's virtualenv included).

Protocol
--------

``python -I -B -X utf8 /opt/sandbox/kernel.py CONFIG`` runs ``_bootstrap.py`` (``-I`` without ``-S``: the
virtualenv's site-packages are needed). Requests and replies are one JSON object per line on a socket
pair; the code's output goes to fds 1 and 2, a pipe the host reads, so nothing the code prints (or a
subprocess writes) can corrupt the protocol. See ``_bootstrap.py``.

Using it from the gateway: call `probe` once at start-up; one `Kernel` per container, closed when the
container expires. ``files_written`` never lists symbolic links, but the code can create them: open files
of the data directory with ``O_NOFOLLOW`` (or check ``os.path.islink``) before serving them.
"""

from .kernel import SANDBOX_DATA_DIR, Kernel, RunResult, SandboxError, probe
from .limits import Limits

__all__ = ["SANDBOX_DATA_DIR", "Kernel", "Limits", "RunResult", "SandboxError", "probe"]
