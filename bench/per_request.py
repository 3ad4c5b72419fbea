"""Per-request cost of the gateway: many short streams, this tree against a baseline tree, alternating.

What a streamed request costs the gateway apart from its events: the connection, the request's
parsing and validation, the upstream request, the response object, the request log and metrics.
Each stream carries few deltas (``--deltas``, 2) sent ``--interval-ms`` apart (1), so the fixed
cost dominates. Contenders: ``gateway-chat`` / ``gateway-responses`` (this tree: ``/v1/responses``
translating the Chat Completions mock, or passing the Responses mock through) and, with
``--baseline-src DIR`` (``DIR/src`` holds the baseline's ``responses_gateway``), ``baseline-chat`` /
``baseline-responses``; ``relay`` (``relay.py``) as the floor. Every proxy is pinned to CPU 1, the mock
and the load generator to CPU 0; each round visits every contender in a rotated order.

Reported per contender: CPU µs per stream (the proxy's whole process, from schedstat), median and
range over the rounds, and the ratio to the relay's.

``--callgrind N``: instead, each gateway tree runs under ``valgrind --tool=callgrind`` with
instrumentation off; after ``--warmup`` streams it is switched on for N streams (one at a time), and
the instructions executed per stream (and per delta) are reported: deterministic, whatever else the
machine runs (the same tree twice agreed within 1–2 %). It counts user space only (not the socket
system calls every proxy makes, the bare relay included), so it gives no ratio to the relay: it says
whether the gateway's own work shrank. With many deltas (``--deltas 200 --interval-ms 10``) it
measures the per-event path; valgrind comes from ``scripts/bench-deps.sh``.

``--store``: every gateway with the default SQLite store (each its own file) instead of none, so
``--callgrind`` counts what storing adds (the database thread's instructions included).

    PYTHONPATH=$PWD/src .venv/bin/python bench/per_request.py --baseline-src /tmp/base
    PYTHONPATH=$PWD/src .venv/bin/python bench/per_request.py --baseline-src /tmp/base --callgrind 200
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gateway_overhead import (  # noqa: E402  (a sibling script, not a package)
    PY,
    Server,
    cpu_seconds,
    free_port,
    gateway_config,
    log,
    make_spec,
    mock_server,
    process_tree,
    relay_server,
    run_loadgen,
)

CHAT = ("/v1/responses", "responses")
SERVE = "from responses_gateway.cli import main; main()"
# serve with cProfile switched on by SIGUSR1 and its statistics written (to RG_PROFILE_OUT) by SIGUSR2.
PROFILED = """
import cProfile, os, signal
from responses_gateway.cli import main
prof = cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
def dump(*_):
    prof.disable()
    prof.dump_stats(os.environ["RG_PROFILE_OUT"])
signal.signal(signal.SIGUSR2, dump)
main()
"""


def gateway_argv(port: int, cfg: Path, wrap: list[str], code: str = SERVE) -> list[str]:
    return [
        *wrap,
        PY,
        "-c",
        code,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--config",
        str(cfg),
        "--no-local",
        "--log-level",
        "warning",
        "--workers",
        "1",
    ]


def start_gateway(
    name: str,
    src: Path | None,
    mock_port: int,
    tmp: Path,
    cpus: set[int] | None,
    wrap: list[str],
    profile: Path | None = None,
    store: bool = False,
) -> tuple[Server, int]:
    port = free_port()
    cfg = tmp / f"{name}.yaml"
    gateway_config(cfg, mock_port)
    env = {
        "RG_BENCH_UPSTREAM_KEY": "sk-bench",
        "RG_DATA_DIR": str(tmp / f"{name}-data"),
        "RG_STORE_URL": f"sqlite://{tmp / f'{name}-data' / 'gw.db'}" if store else "none",
    }
    if src is not None:
        env["PYTHONPATH"] = str(src)
    code = SERVE
    if profile is not None:
        env["RG_PROFILE_OUT"], code = str(profile), PROFILED
    argv = gateway_argv(port, cfg, wrap, code)
    server = Server(name, argv, f"http://127.0.0.1:{port}/health", cpus, tmp, env=env)
    why = server.start(300 if wrap else 60)
    if why is not None:
        raise SystemExit(f"{name} did not start: {why}")
    return server, port


def check(result: dict[str, Any], deltas: int) -> int:
    bad = [s for s in result["streams"] if not s["ok"] or s["deltas"] != deltas]
    if bad:
        raise SystemExit(f"{len(bad)} streams failed: {bad[0]['error']}")
    return len(result["streams"])


def cpu_rounds(a: argparse.Namespace, tmp: Path, mock_port: int, baseline: Path | None) -> None:
    proxy, load = ({1}, {0}) if not a.no_pin else (None, None)
    servers: dict[str, Server] = {}
    plan: dict[str, dict[str, Any]] = {}
    try:
        relay_port = free_port()
        relay = relay_server(relay_port, mock_port, proxy, tmp)
        if (why := relay.start(30)) is not None:
            raise SystemExit(f"relay did not start: {why}")
        servers["relay"] = relay
        plan["relay"] = {"port": relay_port, "route": ("/v1/chat/completions", "chat"), "model": "bench"}
        trees: list[tuple[str, Path | None]] = [("gateway", None)]
        if baseline is not None:
            trees.append(("baseline", baseline))
        for prefix, src in trees:
            server, port = start_gateway(prefix, src, mock_port, tmp, proxy, [], store=a.store)
            servers[prefix] = server
            plan[f"{prefix}-chat"] = {"port": port, "route": CHAT, "model": "bench", "server": prefix}
            plan[f"{prefix}-responses"] = {
                "port": port,
                "route": CHAT,
                "model": "bench-resp",
                "server": prefix,
            }
        names = list(plan)
        per_worker = max(1, a.streams // a.concurrency)
        samples: dict[str, list[float]] = {n: [] for n in names}
        for name in names:  # warm-up, not counted
            spec = make_spec(plan[name], a.concurrency, max(1, per_worker // 4), a.deltas, 0.0, 120)
            check(run_loadgen(spec, load, 120, tmp), a.deltas)
        for r in range(a.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            if r % 2:
                order.reverse()
            for name in order:
                server = servers[plan[name].get("server", name)]
                spec = make_spec(plan[name], a.concurrency, per_worker, a.deltas, 0.0, 120)
                before = cpu_seconds(server.pid)
                result = run_loadgen(spec, load, 120, tmp)
                used = cpu_seconds(server.pid) - before
                n = check(result, a.deltas)
                samples[name].append(used / n * 1e6)
            log(f"round {r + 1}: " + ", ".join(f"{n} {samples[n][-1]:.0f}" for n in names))
        relay_median = statistics.median(samples["relay"])
        print(
            f"\nCPU µs per stream ({a.deltas} deltas, {a.interval_ms:g} ms apart; "
            f"{a.concurrency} concurrent, "
            f"{per_worker * a.concurrency} streams per run, {a.rounds} rounds)"
        )
        print(f"{'contender':<22} {'median':>8} {'min':>8} {'max':>8} {'× relay':>8}")
        for name in names:
            s = samples[name]
            med = statistics.median(s)
            print(f"{name:<22} {med:8.0f} {min(s):8.0f} {max(s):8.0f} {med / relay_median:8.2f}")
    finally:
        for server in servers.values():
            server.stop()


def instructions(out: Path) -> int:
    total = 0
    for dump in out.parent.glob(out.name + "*"):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith("totals:"):
                total = max(total, int(line.split()[1]))
    return total


def callgrind(a: argparse.Namespace, tmp: Path, mock_port: int, baseline: Path | None) -> None:
    trees: list[tuple[str, Path | None]] = [("gateway", None)]
    if baseline is not None:
        trees.append(("baseline", baseline))
    results: dict[str, float] = {}
    for prefix, src in trees:
        for model in ("bench", "bench-resp"):
            out = tmp / f"cg-{prefix}-{model}.out"
            wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
            if a.keep_callgrind:
                out = Path(a.keep_callgrind) / out.name
                wrap[-1] = f"--callgrind-out-file={out}"
            server, port = start_gateway(
                f"cg-{prefix}-{model}", src, mock_port, tmp, None, wrap, store=a.store
            )
            try:
                entry = {"port": port, "route": CHAT, "model": model}
                check(
                    run_loadgen(make_spec(entry, 1, a.warmup, a.deltas, 0.0, 600), None, 600, tmp), a.deltas
                )
                # (Debian's valgrind is a shell wrapper: the instrumented process is its child.)
                pid = str(process_tree(server.pid)[-1])
                subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
                result = run_loadgen(make_spec(entry, 1, a.callgrind, a.deltas, 0.0, 1200), None, 1200, tmp)
                subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)
                n = check(result, a.deltas)
                subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
                time.sleep(1)
                name = f"{prefix}-{'chat' if model == 'bench' else 'responses'}"
                results[name] = instructions(out) / n
                log(f"{name}: {results[name] / 1e6:.2f} M instructions per stream")
            finally:
                server.stop()
    print(
        f"\nInstructions per stream under callgrind ({a.deltas} deltas, {a.callgrind} streams, one at a time)"
        f", and per delta (the stream's fixed cost spread over its deltas)"
    )
    for name, value in results.items():
        line = f"{name:<22} {value / 1e6:8.3f} M  {value / a.deltas:10,.0f} per delta"
        base = results.get(name.replace("gateway", "baseline"))
        if base and name.startswith("gateway"):
            line += f"   ({(value - base) / base * 100:+.1f} % against the baseline)"
        print(line)


def profile(a: argparse.Namespace, tmp: Path, mock_port: int) -> None:
    """cProfile statistics of this tree's gateway over N streams per model, after a warm-up."""
    outdir = Path(a.profile)
    outdir.mkdir(parents=True, exist_ok=True)
    for model in ("bench", "bench-resp"):
        out = outdir / f"{model}.prof"
        server, port = start_gateway(f"prof-{model}", None, mock_port, tmp, {1}, [], out, a.store)
        try:
            entry = {"port": port, "route": CHAT, "model": model}
            check(
                run_loadgen(make_spec(entry, a.concurrency, 10, a.deltas, 0.0, 120), {0}, 120, tmp), a.deltas
            )
            os.kill(server.pid, signal.SIGUSR1)
            per_worker = max(1, a.streams // a.concurrency)
            n = check(
                run_loadgen(make_spec(entry, a.concurrency, per_worker, a.deltas, 0.0, 600), {0}, 600, tmp),
                a.deltas,
            )
            os.kill(server.pid, signal.SIGUSR2)
            time.sleep(1)
            log(f"{model}: {n} streams profiled into {out}")
        finally:
            server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline-src", help="a directory whose src/ holds the baseline's responses_gateway")
    p.add_argument("--deltas", type=int, default=2)
    p.add_argument("--interval-ms", type=float, default=1.0)
    p.add_argument("--streams", type=int, default=400, help="streams per contender per round")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--callgrind", type=int, default=0, help="instruction counts over N streams instead")
    p.add_argument("--profile", help="cProfile this tree's gateway instead, into this directory")
    p.add_argument("--keep-callgrind", help="write the callgrind dumps into this directory")
    p.add_argument(
        "--store",
        action="store_true",
        help="every gateway with the default SQLite store (each its own file) instead of none",
    )
    p.add_argument("--warmup", type=int, default=30, help="streams before counting (--callgrind)")
    a = p.parse_args()
    baseline = None
    if a.baseline_src:
        baseline = Path(a.baseline_src).resolve() / "src"
        if not (baseline / "responses_gateway").is_dir():
            raise SystemExit(f"--baseline-src: no responses_gateway package under {baseline}")
    with tempfile.TemporaryDirectory(prefix="rg-perreq-") as tmpdir:
        tmp = Path(tmpdir)
        mock_port = free_port()
        mock = mock_server(mock_port, a.deltas, a.interval_ms, None if a.no_pin else {0}, tmp)
        if (why := mock.start(30)) is not None:
            raise SystemExit(f"mock did not start: {why}")
        try:
            if a.profile:
                profile(a, tmp, mock_port)
            elif a.callgrind:
                callgrind(a, tmp, mock_port, baseline)
            else:
                cpu_rounds(a, tmp, mock_port, baseline)
        finally:
            mock.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
