"""What ``store: true`` adds to a response: the store driven directly, store:true vs store:false.

Each response is the event stream of a real streamed answer (``response.created``, ``in_progress``,
one message with ``--deltas`` text deltas, ``completed``: 72 events for 64 deltas) built by the
StreamBuilder and SSE-encoded the way the server loop does. ``store:false`` does only that;
``store:true`` also does what the server does for a stored response: ``resolve_input``,
``create_response``, then ``recorder.add_nowait`` after every provider step, and before the terminal
event is sent ``recorder.drain()``: the terminal commit (status, output items, usage in one
transaction). The two run alternately, one response
each, on the same event loop, so drift in machine load hits both sides equally.

Printed per store (SQLite file, PostgreSQL): median and p90 time per response for each side, the
added time per response and per event, the ratio, what one ``recorder.add_nowait`` costs on the hot path
(p50/p99), and the conditions of the run.

    .venv/bin/python bench/store.py [--responses 200] [--deltas 64] [--stores sqlite,postgresql]
        [--interval-ms 0] [--postgres URL] [--server] [--json FILE]

``--server`` also measures through a real gateway process (``responses-gateway serve --script``, a
scripted model sending the same 64 deltas, on the same store) over HTTP with keep-alive: streamed
requests with ``"store": true`` and ``"store": false`` alternate, and the table gives the time to the
first byte and to the end of the stream for each, and the added time per response and per event.

``--interval-ms`` sleeps between deltas, as an upstream does, so background flushes happen mid-stream
(the default 0 measures pure overhead). PostgreSQL comes from ``--postgres``, ``RG_TEST_POSTGRES_URL``
or ``scripts/test-services.sh``; the benchmark creates its own database there and drops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from responses_gateway.protocol.builder import StreamBuilder  # noqa: E402
from responses_gateway.protocol.response import new_response  # noqa: E402
from responses_gateway.protocol.sse import encode_event  # noqa: E402
from responses_gateway.store import Store, open_store  # noqa: E402

JSON = dict[str, Any]
OWNER = "bench-owner"
INPUT: list[JSON] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}
]
REQUEST: JSON = {"model": "bench", "input": INPUT, "stream": True, "store": True}
# A realistic delta: a few tokens of text.
DELTA = "once upon "


class Sample:
    """One response's timings."""

    __slots__ = ("adds", "create", "events", "response_id", "seconds")

    def __init__(
        self, response_id: str, seconds: float, events: int, adds: list[float], create: float
    ) -> None:
        self.response_id = response_id
        self.create = create
        self.seconds = seconds
        self.events = events
        self.adds = adds


async def one_response(store: Store | None, deltas: int, interval: float) -> Sample:
    """Build, encode and (with a store) record one streamed response; the time to its last event."""
    adds: list[float] = []
    perf = time.perf_counter
    t0 = perf()
    builder = StreamBuilder(new_response("bench"))
    recorder = None
    create = 0.0
    if store is not None:
        c0 = perf()
        _context, turn = await store.responses.resolve_input(OWNER, INPUT)
        builder.start()
        await store.responses.create_response(OWNER, builder.snapshot(), request=REQUEST, input_items=turn)
        recorder = store.recorder(builder.response["id"])
        create = perf() - c0
    else:
        builder.start()
    sent = 0

    async def step() -> None:
        nonlocal sent
        events = builder.take()
        b"".join([encode_event(e) for e in events])  # what the relay sends
        await asyncio.sleep(0)  # the relay's send yields to the event loop (the recorder's pump runs)
        sent += len(events)
        if recorder is not None:
            # As the server loop: queue every step's events; before the terminal event goes out,
            # wait until it is written, so a client reading the response next finds it finished.
            a = perf()
            recorder.add_nowait(events)
            if builder.finished:
                await recorder.drain()
            adds.append(perf() - a)

    await step()
    item = builder.open_message()
    await step()
    for _ in range(deltas):
        if interval:
            await asyncio.sleep(interval)
        builder.text_delta(item, DELTA)
        await step()
    builder.close_message(item)
    await step()
    builder.set_usage(5, deltas)
    builder.complete()
    await step()
    return Sample(builder.response["id"], perf() - t0, sent, adds, create)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(url: str, args: argparse.Namespace) -> JSON:
    """Alternate store:false and store:true responses on one store; the summary."""
    store = await open_store(url, flush_interval=args.flush_interval)
    interval = args.interval_ms / 1000
    try:
        for _ in range(args.warmup):
            await one_response(None, args.deltas, interval)
            await one_response(store, args.deltas, interval)
        off: list[Sample] = []
        on: list[Sample] = []
        for i in range(args.responses):
            # Alternate which side goes first so neither always follows the other's background work.
            if i % 2 == 0:
                off.append(await one_response(None, args.deltas, interval))
                on.append(await one_response(store, args.deltas, interval))
            else:
                on.append(await one_response(store, args.deltas, interval))
                off.append(await one_response(None, args.deltas, interval))
        # Every terminal commit was awaited inside its sample: each stored response is complete.
        for sample in (on[0], on[-1]):
            stored = await store.responses.get_response(OWNER, sample.response_id)
            assert stored["status"] == "completed" and stored["output"], stored["status"]
    finally:
        await store.close()
    events = on[0].events
    off_s = [s.seconds for s in off]
    on_s = [s.seconds for s in on]
    adds = [a for s in on for a in s.adds[:-1]]  # every add but the terminal one
    terminal = [s.adds[-1] for s in on]
    added_p50 = statistics.median(on_s) - statistics.median(off_s)
    # Per pair difference, so slow moments of the machine cancel out.
    pair = [b - a for a, b in zip(off_s, on_s, strict=True)]
    return {
        "events_per_response": events,
        "store_false_ms": {"p50": statistics.median(off_s) * 1e3, "p90": _pct(off_s, 0.9) * 1e3},
        "store_true_ms": {"p50": statistics.median(on_s) * 1e3, "p90": _pct(on_s, 0.9) * 1e3},
        "added_ms_per_response": {
            "p50_diff": added_p50 * 1e3,
            "paired_median": statistics.median(pair) * 1e3,
        },
        "added_us_per_event": statistics.median(pair) / events * 1e6,
        "ratio_p50": statistics.median(on_s) / statistics.median(off_s),
        "recorder_add_us": {"p50": statistics.median(adds) * 1e6, "p99": _pct(adds, 0.99) * 1e6},
        "create_ms": {"p50": statistics.median(s.create for s in on) * 1e3},
        "terminal_commit_ms": {"p50": statistics.median(terminal) * 1e3, "p90": _pct(terminal, 0.9) * 1e3},
    }


# ------------------------------------------------------------------------------------ through the server
GATEWAY = Path(sys.executable).parent / "responses-gateway"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def measure_server(url: str, args: argparse.Namespace, tmp: Path) -> JSON:
    """Alternate stored and unstored streamed requests through a gateway process on ``url``."""
    import httpx

    script = tmp / "bench.yaml"
    script.write_text(json.dumps({"model": "bench", "steps": [{"message": [DELTA] * args.deltas}]}))
    port = _free_port()
    log = (tmp / "gateway.log").open("wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RG_")}
    proc = subprocess.Popen(
        [
            str(GATEWAY),
            "serve",
            "--no-local",
            "--script",
            str(script),
            "--store",
            url,
            "--data-dir",
            str(tmp / "data"),
            "--port",
            str(port),
            "--keepalive",
            "off",
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited: {(tmp / 'gateway.log').read_text()[-2000:]}")
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.05)
        perf = time.perf_counter
        with httpx.Client(base_url=base, timeout=30) as http:

            def one(store: bool) -> tuple[float, float, int]:
                body = {"model": "bench", "input": "Tell me a story.", "stream": True, "store": store}
                t0 = perf()
                first = 0.0
                events = 0
                with http.stream("POST", "/v1/responses", json=body) as resp:
                    if resp.status_code != 200:
                        raise RuntimeError(f"HTTP {resp.status_code}: {resp.read()[:500]!r}")
                    for chunk in resp.iter_bytes():
                        if not first:
                            first = perf() - t0
                        events += chunk.count(b"\n\n")
                return first, perf() - t0, events

            for _ in range(args.warmup):
                one(False)
                one(True)
            off: list[tuple[float, float, int]] = []
            on: list[tuple[float, float, int]] = []
            for i in range(args.responses):
                if i % 2 == 0:
                    off.append(one(False))
                    on.append(one(True))
                else:
                    on.append(one(True))
                    off.append(one(False))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    events = on[0][2]
    pair = [b[1] - a[1] for a, b in zip(off, on, strict=True)]
    first_pair = [b[0] - a[0] for a, b in zip(off, on, strict=True)]
    return {
        "events_per_response": events,
        "store_false_ms": {
            "ttfb_p50": statistics.median(x[0] for x in off) * 1e3,
            "p50": statistics.median(x[1] for x in off) * 1e3,
        },
        "store_true_ms": {
            "ttfb_p50": statistics.median(x[0] for x in on) * 1e3,
            "p50": statistics.median(x[1] for x in on) * 1e3,
            "p90": _pct([x[1] for x in on], 0.9) * 1e3,
        },
        "added_ttfb_ms": statistics.median(first_pair) * 1e3,
        "added_ms_per_response": statistics.median(pair) * 1e3,
        "added_us_per_event": statistics.median(pair) / events * 1e6,
        "ratio_p50": statistics.median(x[1] for x in on) / statistics.median(x[1] for x in off),
    }


def print_server_row(name: str, r: JSON) -> None:
    f, t = r["store_false_ms"], r["store_true_ms"]
    print(
        f"{name:<11} {r['events_per_response']:>6} {f['ttfb_p50']:>9.3f} {t['ttfb_p50']:>9.3f} "
        f"{f['p50']:>9.3f} {t['p50']:>9.3f} {t['p90']:>9.3f} {r['added_ttfb_ms']:>+10.3f} "
        f"{r['added_ms_per_response']:>+10.3f} {r['added_us_per_event']:>+9.1f} {r['ratio_p50']:>6.2f}"
    )


# ------------------------------------------------------------------------------------ databases
def _postgres_base(args: argparse.Namespace) -> str | None:
    url = args.postgres or os.environ.get("RG_TEST_POSTGRES_URL")
    if url:
        return str(url)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test-services.sh")],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    for line in done.stdout.splitlines():
        if line.startswith("export RG_TEST_POSTGRES_URL="):
            return line.split("=", 1)[1]
    sys.stderr.write(f"bench/store.py: no PostgreSQL ({done.stderr.strip()[-300:]})\n")
    return None


async def _pg_admin(base: str, sql: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(base)
    try:
        await conn.execute(sql)
        version = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    return str(version)


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _fs_type(path: Path) -> str:
    try:
        out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, timeout=5).stdout
        return out.splitlines()[-1].split()[1]
    except Exception:
        return "unknown"


def conditions(args: argparse.Namespace) -> JSON:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "responses": args.responses,
        "warmup": args.warmup,
        "deltas": args.deltas,
        "interval_ms": args.interval_ms,
        "flush_interval_s": args.flush_interval,
        "server": args.server,
    }


def print_row(name: str, r: JSON) -> None:
    print(
        f"{name:<11} {r['events_per_response']:>6} "
        f"{r['store_false_ms']['p50']:>9.3f} {r['store_true_ms']['p50']:>9.3f} "
        f"{r['store_true_ms']['p90']:>9.3f} {r['create_ms']['p50']:>9.3f} "
        f"{r['added_ms_per_response']['paired_median']:>+10.3f} {r['added_us_per_event']:>+9.1f} "
        f"{r['ratio_p50']:>6.2f} {r['recorder_add_us']['p50']:>8.1f} {r['recorder_add_us']['p99']:>8.1f} "
        f"{r['terminal_commit_ms']['p50']:>9.3f}"
    )


async def main_async(args: argparse.Namespace) -> JSON:
    result: JSON = {"conditions": conditions(args), "stores": {}, "server": {}}
    wanted = [s.strip() for s in args.stores.split(",") if s.strip()]
    cond = result["conditions"]
    print("store:true vs store:false, the store driven directly (bench/store.py)")
    for name in wanted:
        if name == "sqlite":
            with tempfile.TemporaryDirectory(prefix="rg-bench-store-", dir=args.sqlite_dir) as tmp:
                cond["sqlite"] = {"dir": tmp, "fs": _fs_type(Path(tmp)), "journal": "WAL, synchronous=NORMAL"}
                result["stores"]["sqlite"] = await measure(f"sqlite://{tmp}/gateway.db", args)
                if args.server:
                    url = f"sqlite://{tmp}/server.db"
                    result["server"]["sqlite"] = await asyncio.to_thread(measure_server, url, args, Path(tmp))
        elif name == "postgresql":
            base = _postgres_base(args)
            if base is None:
                result["stores"]["postgresql"] = {"skipped": "no PostgreSQL server"}
                continue
            db = f"rg_bench_{os.getpid()}"
            version = await _pg_admin(base, f"CREATE DATABASE {db}")
            host = urlsplit(base).hostname
            cond["postgresql"] = {"version": version, "host": host, "pool": "asyncpg, max 10"}
            try:
                result["stores"]["postgresql"] = await measure(_with_db(base, db), args)
                if args.server:
                    with tempfile.TemporaryDirectory(prefix="rg-bench-store-") as tmp:
                        result["server"]["postgresql"] = await asyncio.to_thread(
                            measure_server, _with_db(base, db), args, Path(tmp)
                        )
            finally:
                await _pg_admin(base, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        else:
            raise SystemExit(f"bench/store.py: unknown store {name!r} (sqlite, postgresql)")
    print("conditions: " + ", ".join(f"{k}={v}" for k, v in cond.items()))
    print(
        f"{'store':<11} {'events':>6} {'false p50':>9} {'true p50':>9} {'true p90':>9} "
        f"{'create ms':>9} {'added ms':>10} {'µs/event':>9} {'ratio':>6} {'add p50':>8} {'add p99':>8} "
        f"{'commit ms':>9}"
    )
    for name, r in result["stores"].items():
        if "skipped" in r:
            print(f"{name:<11} skipped: {r['skipped']}")
        else:
            print_row(name, r)
    print(
        "times per response in ms (time to the last event); added = median of paired differences "
        "(true - false);\ncreate = resolve_input + create_response; µs/event = added / events; "
        "add = one recorder.add_nowait on the hot path (µs);\n"
        "commit = the terminal add_nowait + drain (status, output items, usage in one transaction)"
    )
    if result["server"]:
        print("\nthrough a gateway process (responses-gateway serve --script, HTTP keep-alive, streamed)")
        print(
            f"{'store':<11} {'events':>6} {'ttfb off':>9} {'ttfb on':>9} {'false p50':>9} {'true p50':>9} "
            f"{'true p90':>9} {'added ttfb':>10} {'added ms':>10} {'µs/event':>9} {'ratio':>6}"
        )
        for name, r in result["server"].items():
            print_server_row(name, r)
        print("ms per response: time to the first byte (ttfb) and to the end of the stream; added = median")
        print("of paired differences (store:true - store:false); µs/event = added / events")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--responses", type=int, default=200, help="responses per side (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured responses per side first")
    parser.add_argument("--deltas", type=int, default=64, help="text deltas per response (default 64)")
    parser.add_argument("--interval-ms", type=float, default=0.0, help="sleep between deltas (default 0)")
    parser.add_argument("--flush-interval", type=float, default=0.05, help="store flush interval (s)")
    parser.add_argument("--stores", default="sqlite,postgresql", help="comma-separated: sqlite,postgresql")
    parser.add_argument("--postgres", default=None, help="PostgreSQL URL (a database is created there)")
    parser.add_argument("--sqlite-dir", default=None, help="where the SQLite file goes (default: $TMPDIR)")
    parser.add_argument("--server", action="store_true", help="also measure through a gateway process")
    parser.add_argument("--json", default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    if args.responses < 1 or args.deltas < 1:
        parser.error("--responses and --deltas must be at least 1")
    result = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
