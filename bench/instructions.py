"""Instructions per relayed event, counted by callgrind: a before/after that the machine's load cannot move.

On a shared 2-core machine the same gateway's CPU per event varied by more than most changes to the hot
path remove (docs/performance.md). callgrind counts the instructions the gateway process executes in
user space, which do not depend on what else runs. This runs each contender — the gateway of this tree
and, with ``--baseline-src``, the same gateway from another tree — under ``valgrind --tool=callgrind``
with instrumentation off during start-up, sends one warm-up stream, turns instrumentation on, streams
``--streams`` responses of ``--deltas`` deltas from ``bench/mock_upstream.py`` (``--concurrency`` at a
time), dumps, and reports instructions per SSE event the client received (per-request work included,
spread over the stream's events), alternating the contenders for ``--rounds`` rounds.

It does not count the kernel (the socket system calls every proxy makes, the bare relay included), so it
says nothing about the ratio to the relay; it says whether a change made the gateway's own work smaller.

    .venv/bin/python bench/instructions.py --baseline-src /tmp/base   # /tmp/base/src: the tree before
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gateway_overhead import Server, free_port, gateway_config, log

HERE = Path(__file__).resolve().parent
PY = sys.executable
GATEWAY = [PY, "-m", "responses_gateway.cli"]
# model name in gateway_config's models file -> what it exercises
ROUTES = {
    "chat": ("bench", "/v1/responses, translated from a Chat Completions upstream"),
    "responses": ("bench-resp", "/v1/responses, passed through from a Responses upstream"),
}


def stream(port: int, model: str) -> int:
    """One streamed response; the number of SSE events received."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = f'{{"model": "{model}", "input": "hi", "stream": true}}'
    conn.request("POST", "/v1/responses", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {resp.read()[:300]!r}")
    events = 0
    while line := resp.readline():
        if line.startswith(b"event: "):
            events += 1
    conn.close()
    return events


def measure(src: Path | None, route: str, args: argparse.Namespace, mock_port: int, tmp: Path) -> float:
    """Instructions per received event for one run of one contender."""
    port = free_port()
    out = tmp / f"cg-{port}.out"
    env = {"RG_BENCH_UPSTREAM_KEY": "sk-bench"}
    if src is not None:
        env["PYTHONPATH"] = str(src / "src")
    argv = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
        *GATEWAY, "serve", "--config", str(tmp / "models.yaml"), "--no-local", "--store", args.store,
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--no-request-log",
    ]  # fmt: skip
    gw = Server(f"gateway-{port}", argv, f"http://127.0.0.1:{port}/v1/models", None, tmp, env=env)
    reason = gw.start(timeout=300)
    if reason:
        raise RuntimeError(f"gateway did not start: {reason}")
    model = ROUTES[route][0]
    try:
        stream(port, model)  # warm-up: imports, first-use caches, the upstream connection
        subprocess.run(["callgrind_control", "-i", "on", str(gw.pid)], check=True, capture_output=True)
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            events = sum(pool.map(lambda _: stream(port, model), range(args.streams)))
        subprocess.run(["callgrind_control", "-d", str(gw.pid)], check=True, capture_output=True)
        dump = out.with_name(out.name + ".1")
        for _ in range(100):
            if dump.exists() and "totals:" in dump.read_text(errors="replace")[-4096:]:
                break
            time.sleep(0.1)
        totals = [line for line in dump.read_text().splitlines() if line.startswith("totals:")]
        return int(totals[-1].split()[1]) / events
    finally:
        gw.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", type=Path, help="a tree whose src/ is the 'before' gateway")
    parser.add_argument("--routes", default="chat,responses", help=f"of {', '.join(ROUTES)}")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--deltas", type=int, default=100)
    parser.add_argument("--interval-ms", type=float, default=10.0, help="between the mock's deltas")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--store", default="none", help="the gateway's --store (none, or a sqlite:// URL)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    contenders: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.baseline_src:
        contenders.append(("baseline", args.baseline_src.resolve()))
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="rg-instr-") as tmpdir:
        tmp = Path(tmpdir)
        mock_port = free_port()
        mock = Server(
            "mock",
            [PY, str(HERE / "mock_upstream.py"), "--port", str(mock_port), "--deltas", str(args.deltas),
             "--interval-ms", str(args.interval_ms)],
            f"http://127.0.0.1:{mock_port}/stats", None, tmp,
        )  # fmt: skip
        reason = mock.start(timeout=30)
        if reason:
            print(f"mock did not start: {reason}", file=sys.stderr)
            return 1
        gateway_config(tmp / "models.yaml", mock_port)
        try:
            for r in range(args.rounds):
                order = contenders if r % 2 == 0 else contenders[::-1]
                for route in args.routes.split(","):
                    for name, src in order:
                        value = measure(src, route, args, mock_port, tmp)
                        results.setdefault((route, name), []).append(value)
                        log(f"round {r + 1} {route:9} {name:9} {value:10,.0f} instructions/event")
        finally:
            mock.stop()
    print(
        f"\nInstructions per received SSE event in the gateway process (callgrind, user space), "
        f"{args.streams} streams x {args.deltas} deltas, {args.concurrency} at a time, --store "
        f"{args.store}, median of {args.rounds} rounds [min-max]; load average {os.getloadavg()[0]:.1f}:"
    )
    for route in args.routes.split(","):
        row = f"  {route:9} ({ROUTES[route][1]})"
        base = statistics.median(results[(route, "baseline")]) if args.baseline_src else None
        for name, _ in contenders:
            values = results[(route, name)]
            median = statistics.median(values)
            row += f"\n    {name:9} {median:10,.0f} [{min(values):,.0f}-{max(values):,.0f}]"
            if base and name != "baseline":
                row += f"  ({median / base:.3f}x the baseline)"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
