"""What one sandboxed kernel may use: `Limits` (see the package docstring for how each is enforced)."""

from __future__ import annotations

from dataclasses import dataclass, fields

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-kernel resource limits. The defaults suit a notebook-style code interpreter.

    - ``wall_seconds``: one call's wall time; past it the kernel is killed (the call's error says it timed
      out) and the next call starts a fresh one (its result says the variables were lost).
    - ``cpu_seconds``: CPU time per call and per process (``RLIMIT_CPU`` soft limit, re-armed before every
      call); the call gets ``CPULimitExceeded`` and the kernel lives on. A child process that exceeds it
      is killed by ``SIGXCPU``.
    - ``kernel_cpu_seconds``: CPU time over the kernel process's whole life (``RLIMIT_CPU`` hard limit,
      which can only go down); past it the kernel is killed by ``SIGKILL`` and restarted on the next call.
    - ``memory_bytes``: address space per process (``RLIMIT_AS``); allocations past it fail (``MemoryError``).
    - ``max_processes``: processes *and threads* in the sandbox (``RLIMIT_NPROC``, counted per sandbox).
    - ``max_file_bytes``: the size of any one file written (``RLIMIT_FSIZE``; writes past it fail with
      ``EFBIG``, ``SIGXFSZ`` is ignored).
    - ``max_open_files``: file descriptors per process (``RLIMIT_NOFILE``).
    - ``max_output_bytes``: stdout + stderr kept per call (the head and the tail; the middle is replaced by a
      marker saying how much was dropped). The rest is read and discarded, so the host's memory is bounded.
    - ``tmp_bytes``: the size of the private ``/tmp`` tmpfs (``/dev/shm`` gets a quarter of it).
    - ``start_seconds``: how long a new kernel may take to report ready.
    """

    wall_seconds: float = 60.0
    cpu_seconds: int = 60
    kernel_cpu_seconds: int = 3600
    memory_bytes: int = 1024 * MiB
    max_processes: int = 64
    max_file_bytes: int = 256 * MiB
    max_open_files: int = 1024
    max_output_bytes: int = 64 * 1024
    tmp_bytes: int = 256 * MiB
    start_seconds: float = 15.0

    def __post_init__(self) -> None:
        for spec in fields(self):
            name, value = spec.name, getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")
        if self.kernel_cpu_seconds < self.cpu_seconds:
            raise ValueError("Limits.kernel_cpu_seconds must be at least Limits.cpu_seconds")
        if self.max_processes < 4:
            raise ValueError("Limits.max_processes must be at least 4 (the kernel itself needs a few)")
        if self.max_output_bytes < 256:
            raise ValueError("Limits.max_output_bytes must be at least 256")
