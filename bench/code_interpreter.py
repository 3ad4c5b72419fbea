"""Code sandbox benchmark: a new kernel's start-up time and what the sandbox adds to every call.

- **cold start**: ``await Kernel.start(...)`` until the kernel says it is ready (bubblewrap, namespaces,
  the interpreter's start-up, the bootstrap, the limits, the uid switch), median of ``--starts``; also
  the first call on a fresh kernel (start + ``pass``). Target <= 300 ms.
- **warm call overhead**: ``await kernel.run("pass")`` on a running kernel, median of ``--calls``: the
  host's wall time per call, the code's own run time inside the kernel, and the difference (the
  protocol, the output capture, the /mnt/data snapshots, figure and zombie checks). The same for a call
  that does a few ms of work, to show the overhead does not grow with it. Target <= 20 ms.

    .venv/bin/python bench/code_interpreter.py                 # ~5 s
    .venv/bin/python bench/code_interpreter.py --starts 50 --calls 1000

Exit status 1 if a target is missed (or the sandbox cannot start here: the reason is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from responses_gateway.sandbox import Kernel, Limits, probe

COLD_TARGET_MS = 300.0
WARM_TARGET_MS = 20.0
WORK = "total = 0\nfor i in range(150_000):\n    total += i"


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def p90_ms(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] * 1000 if len(values) >= 2 else values[0] * 1000


async def cold_starts(data_dir: Path, starts: int) -> tuple[list[float], list[float]]:
    ready: list[float] = []
    first_call: list[float] = []
    for _ in range(starts):
        started = time.perf_counter()
        kernel = await Kernel.start(data_dir, Limits())
        ready.append(time.perf_counter() - started)
        result = await kernel.run("pass")
        first_call.append(time.perf_counter() - started)
        assert result.error is None, result
        await kernel.close()
    return ready, first_call


async def warm_calls(data_dir: Path, code: str, calls: int) -> tuple[list[float], list[float]]:
    """Host wall time and in-kernel run time per call."""
    walls: list[float] = []
    inside: list[float] = []
    async with await Kernel.start(data_dir, Limits()) as kernel:
        for _ in range(max(calls // 10, 10)):  # warm-up
            await kernel.run(code)
        for _ in range(calls):
            started = time.perf_counter()
            result = await kernel.run(code)
            walls.append(time.perf_counter() - started)
            assert result.error is None and result.run_seconds is not None, result
            inside.append(result.run_seconds)
    return walls, inside


def conditions() -> str:
    try:
        bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        bwrap = "bwrap ?"
    mode = "root: own uid per kernel, no user namespace" if os.geteuid() == 0 else "user namespace"
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}, {bwrap}, sandbox mode: {mode}"
    )


async def run(args: argparse.Namespace, data_dir: Path) -> int:
    ready, first = await cold_starts(data_dir, args.starts)
    pass_walls, pass_inside = await warm_calls(data_dir, "pass", args.calls)
    work_walls, work_inside = await warm_calls(data_dir, WORK, max(args.calls // 4, 20))
    pass_overhead = [w - i for w, i in zip(pass_walls, pass_inside, strict=True)]
    work_overhead = [w - i for w, i in zip(work_walls, work_inside, strict=True)]

    cold = median_ms(ready)
    warm = median_ms(pass_overhead)
    print(conditions())
    print(f"cold start, {args.starts} kernels:")
    print(
        f"  ready                      median {cold:7.1f} ms   p90 {p90_ms(ready):7.1f} ms   "
        f"target {COLD_TARGET_MS:.0f} ms: {cold / COLD_TARGET_MS:.2f}x of it"
    )
    print(f"  ready + first call (pass)  median {median_ms(first):7.1f} ms   p90 {p90_ms(first):7.1f} ms")
    print(f"warm calls, one kernel ({args.calls} x pass, {len(work_walls)} x a few ms of work):")
    print(
        f"  pass: wall                 median {median_ms(pass_walls):7.2f} ms   p90 "
        f"{p90_ms(pass_walls):7.2f} ms   (in the kernel: {median_ms(pass_inside):.3f} ms)"
    )
    print(
        f"  pass: overhead             median {warm:7.2f} ms   p90 {p90_ms(pass_overhead):7.2f} ms   "
        f"target {WARM_TARGET_MS:.0f} ms: {warm / WARM_TARGET_MS:.2f}x of it"
    )
    print(
        f"  work: wall                 median {median_ms(work_walls):7.2f} ms   "
        f"(in the kernel: {median_ms(work_inside):.2f} ms)"
    )
    print(f"  work: overhead             median {median_ms(work_overhead):7.2f} ms")
    missed = cold > COLD_TARGET_MS or warm > WARM_TARGET_MS
    if missed:
        print("TARGET MISSED")
    return 1 if missed else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--starts", type=int, default=20, help="kernels started for the cold figures (20)")
    parser.add_argument("--calls", type=int, default=300, help="warm calls of `pass` (300)")
    args = parser.parse_args()
    started = time.perf_counter()
    reason = probe()
    if reason is not None:
        print(f"the sandbox cannot start here: {reason}")
        return 1
    print(f"probe(): {1000 * (time.perf_counter() - started):.0f} ms")
    data_dir = Path(tempfile.mkdtemp(prefix="bench-code-interpreter-"))
    try:
        return asyncio.run(run(args, data_dir))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
