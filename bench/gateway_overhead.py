"""Gateway overhead benchmark: what a proxy adds to a streamed model answer, against the same mock.

Contenders, run in one session, alternating, against one loopback mock (``mock_upstream.py``):

- ``direct-chat`` / ``direct-responses``: the load generator straight to the mock (the baselines);
- ``relay``: a bare TCP byte relay in front of the Chat Completions mock (the floor for any proxy);
- ``relay-translate``: the same relay writing each text chunk as a Responses delta (``relay.py
  --translate``: one ``orjson.loads`` and one ``orjson.dumps`` per event in one callback per read, no
  HTTP parser, builder or checks): the floor for any proxy that translates events in Python;
- ``gateway-chat``: responses-gateway translating Chat Completions -> Responses;
- ``gateway-responses``: responses-gateway passing a Responses upstream through;
- ``gateway-chat-store``: ``gateway-chat`` with the default SQLite store on (``--store-contender-url``),
  pinned like ``gateway-chat``: what storing adds, side by side;
- ``gateway-chat-workers``: ``gateway-chat`` as ``serve --workers N`` (``--gateway-workers``, default 2),
  not pinned: its workers may use every core, the one the load generator and the mock run on included;
- ``compiled-chat`` / ``compiled-responses``: ``gateway-chat`` / ``gateway-responses`` with the hot
  path compiled by mypyc (``--compiled-src``, default ``build/compiled``: the build ``make run`` serves),
  side by side with the interpreted source the ``gateway-*`` contenders run;
- ``baseline-chat`` / ``baseline-responses``: ``gateway-chat`` / ``gateway-responses`` run from another
  source tree (``--baseline-src DIR``, e.g. ``git archive main src | tar -x -C DIR``): a before/after A/B
  of a code change in one alternating session;
- ``baseline-chat-store``: ``gateway-chat-store`` run from ``--baseline-src``'s tree (its own SQLite file):
  the store's before/after, side by side with ``gateway-chat`` (no store) in the same session;
- ``litellm``: LiteLLM proxy's ``/v1/responses`` bridged to the same Chat Completions mock;
- ``litellm-responses``: LiteLLM's ``/v1/responses`` passing the Responses mock through.

Each server and the mock run as their own processes; by default every proxy is pinned to CPU 1 and the mock
plus the load generator to CPU 0, so a contender has one core, like one gateway worker in production.
"Added" latency is contender minus the direct run on the same mock format at the same concurrency.

    .venv/bin/python bench/gateway_overhead.py --quick     # ~2 minutes
    .venv/bin/python bench/gateway_overhead.py             # the full run, 1..2,000 streams

Results: ``bench/results/gateway-overhead-<time>.json`` (+ ``.png``, + ``.txt``: the printed table).
LiteLLM is installed into ``bench/.venv-litellm`` and matplotlib into ``bench/.venv-tools`` on first use.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import platform
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import report  # noqa: E402  (a sibling script, not a package)

PY = sys.executable
LITELLM_VENV = HERE / ".venv-litellm"
TOOLS_VENV = HERE / ".venv-tools"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def raise_nofile() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def preexec(cpus: set[int] | None) -> Callable[[], None]:
    def run() -> None:
        raise_nofile()
        if cpus:
            os.sched_setaffinity(0, cpus)

    return run


# ------------------------------------------------------------------------------------------ /proc
def process_tree(pid: int) -> list[int]:
    """The process and all its descendants (LiteLLM's CLI may hand off to a child)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(x) for x in f.read().split())
        except OSError:
            continue
    return out


def cpu_seconds(pid: int) -> float:
    """On-CPU time of the process tree, every thread, from schedstat (ns; /proc/PID/stat has 10 ms ticks)."""
    total = 0
    for p in process_tree(pid):
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def reset_peak_rss(pid: int) -> None:
    """Writing 5 to clear_refs resets VmHWM, so each run reports its own peak (needs root or owner)."""
    for p in process_tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/clear_refs", "w") as f:
            f.write("5")


def http_get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # loopback only
        body: bytes = r.read()
        return body


# ------------------------------------------------------------------------------------------ servers
class Server:
    def __init__(
        self,
        name: str,
        argv: list[str],
        ready_url: str,
        cpus: set[int] | None,
        logdir: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.ready_url = ready_url
        self.log_path = logdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpus = cpus
        self.env = env
        self.cwd = cwd

    def start(self, timeout: float) -> str | None:
        """Start and wait for the ready URL; the reason it failed, or None."""
        logf = open(self.log_path, "wb")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec(self.cpus),
            env={**os.environ, **(self.env or {})},
            cwd=self.cwd,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"exited with status {self.proc.returncode}: {self.tail()}"
            try:
                http_get(self.ready_url, 1.0)
                return None
            except OSError:
                time.sleep(0.2)
        return f"not ready after {timeout:.0f} s: {self.tail()}"

    def tail(self, n: int = 600) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " ".join(text[-n:].split())

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def mock_server(
    port: int, deltas: int, interval_ms: float, cpus: set[int] | None, logdir: Path, first_delay_ms: float = 0
) -> Server:
    """``mock_upstream.py`` on ``port`` (not started): ``deltas`` deltas ``interval_ms`` apart."""
    argv = [PY, str(HERE / "mock_upstream.py"), "--port", str(port), "--deltas", str(deltas)]
    argv += ["--interval-ms", str(interval_ms), "--first-delay-ms", str(first_delay_ms)]
    return Server("mock", argv, f"http://127.0.0.1:{port}/health", cpus, logdir)


def relay_server(
    port: int, mock_port: int, cpus: set[int] | None, logdir: Path, translate: bool = False
) -> Server:
    """``relay.py`` on ``port`` (not started), relaying to the mock on ``mock_port`` (``--translate``:
    Chat Completions text chunks written as Responses deltas)."""
    argv = [PY, str(HERE / "relay.py"), "--port", str(port), "--upstream", f"127.0.0.1:{mock_port}"]
    if translate:
        argv.append("--translate")
    name = "relay-translate" if translate else "relay"
    return Server(name, argv, f"http://127.0.0.1:{port}/health", cpus, logdir)


def ensure_venv(venv: Path, packages: list[str], probe: str, install: bool) -> str | None:
    """Create ``venv`` with ``packages`` unless ``probe`` imports there; the failure reason, or None."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0:
        return None
    if not install:
        return f"{venv} is missing and --no-install was given"
    log(f"installing {' '.join(packages)} into {venv} (once)…")
    try:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        r = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", *packages], capture_output=True, text=True, timeout=1200
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return f"install failed: {exc}"
    if r.returncode != 0:
        return f"pip install failed: {' '.join((r.stderr or r.stdout)[-400:].split())}"
    if subprocess.run([str(py), "-c", probe], capture_output=True).returncode != 0:
        return f"installed, but `{probe}` fails in {venv}"
    return None


def gateway_config(
    path: Path, mock: int, pool_limit: int | None = None, *, check_upstream: bool = True
) -> None:
    """The models file ``responses-gateway serve --config`` runs with (``pool_limit``: a what-if cap on
    the upstream connection pool, total and per host; default unlimited; ``check_upstream``: the
    passthrough's upstream stream checker, on by default as in serve)."""
    base = f"http://127.0.0.1:{mock}/v1"
    rows = []
    for name, provider, upstream in (
        ("bench", "openai-chat", "bench"),
        ("bench-idle", "openai-chat", "bench-idle"),
        ("bench-resp", "openai", "bench"),
        ("bench-resp-idle", "openai", "bench-idle"),
    ):
        rows.append(
            f"  - name: {name}\n    provider: {provider}\n    upstream_model: {upstream}\n"
            f"    base_url: {base}\n    api_key_env: RG_BENCH_UPSTREAM_KEY\n    retries: 0\n"
        )
        if provider == "openai" and not check_upstream:
            rows[-1] += "    options: {check_upstream: false}\n"
    upstream = ""
    if pool_limit:
        upstream = f"upstream:\n  pool_limit: {pool_limit}\n  pool_limit_per_host: {pool_limit}\n"
    path.write_text("local: false\n" + upstream + "models:\n" + "".join(rows))


def source_tree(tree: str | None) -> Path:
    """The ``src`` directory of ``--baseline-src``'s tree, checked."""
    if not tree:
        raise SystemExit("the baseline contenders need --baseline-src DIR")
    src = Path(tree).resolve() / "src"
    if not (src / "responses_gateway").is_dir():
        raise SystemExit(f"--baseline-src: no responses_gateway package under {src}")
    return src


COMPILED_PROBE = (
    "from responses_gateway.protocol.native import COMPILED_MODULES, compiled_modules;"
    "print(len(compiled_modules()), len(COMPILED_MODULES))"
)


def compiled_build(tree: Path) -> dict[str, Any]:
    """Whether ``tree`` (``make``'s ``build/compiled``) is a compiled hot path the ``compiled-*``
    contenders can run: built (its stamp), every module of ``COMPILED_MODULES`` imported compiled, and
    not older than this checkout's sources. ``reason`` says why not, else None."""
    out: dict[str, Any] = {"reason": None, "modules": None, "stale": None}
    src = tree.resolve() / "src"
    stamp = tree / ".built"
    if not stamp.is_file() or not (src / "responses_gateway").is_dir():
        out["reason"] = f"no compiled build in {tree}: `make bench` builds it (scripts/compile_hot_path.py)"
        return out
    probe = subprocess.run(
        [PY, "-c", COMPILED_PROBE],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src)},
        cwd=tree,
        timeout=60,
    )
    got, _, want = probe.stdout.strip().partition(" ")
    out["modules"] = f"{got} of {want}" if probe.returncode == 0 else None
    if probe.returncode != 0 or got != want:
        out["reason"] = f"{tree} does not import compiled: {probe.stdout.strip() or probe.stderr[-300:]}"
        return out
    newest = max(f.stat().st_mtime for f in (ROOT / "src" / "responses_gateway").rglob("*.py"))
    out["stale"] = newest > stamp.stat().st_mtime
    if out["stale"]:
        log(f"warning: {tree} is older than src/ (a source changed since it was built)")
    return out


def litellm_config(path: Path, mock: int, master_key: str) -> None:
    base = f"http://127.0.0.1:{mock}/v1"
    rows = []
    for name, upstream, chat in (
        ("bench", "bench", True),
        ("bench-idle", "bench-idle", True),
        ("bench-resp", "bench", False),
        ("bench-resp-idle", "bench-idle", False),
    ):
        # use_chat_completions_api makes LiteLLM bridge /v1/responses onto the upstream's Chat Completions;
        # without it an openai/ model is passed through to the upstream's own /v1/responses.
        rows.append(
            f"  - model_name: {name}\n    litellm_params:\n      model: openai/{upstream}\n"
            f"      api_base: {base}\n      api_key: sk-bench\n"
            + ("      use_chat_completions_api: true\n" if chat else "")
        )
    path.write_text(
        "model_list:\n"
        + "".join(rows)
        + f"general_settings:\n  master_key: {master_key}\nlitellm_settings:\n  telemetry: false\n"
    )


# ------------------------------------------------------------------------------------------ load
def run_loadgen(spec: dict[str, Any], cpus: set[int] | None, timeout: float, tmp: Path) -> dict[str, Any]:
    out = tmp / f"lg-{secrets.token_hex(4)}.json"
    proc = subprocess.run(
        [PY, str(HERE / "loadgen.py"), orjson.dumps(spec).decode(), "--out", str(out)],
        preexec_fn=preexec(cpus),
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"load generator failed ({proc.returncode}): {proc.stderr[-800:]}")
    result: dict[str, Any] = orjson.loads(out.read_bytes())
    out.unlink()
    return result


def idle_test(
    spec: dict[str, Any], server_pid: int, mock_port: int, cpus: set[int] | None, k: int
) -> dict[str, Any]:
    def mock_open() -> int:
        return int(orjson.loads(http_get(f"http://127.0.0.1:{mock_port}/stats"))["open_streams"])

    open_before = mock_open()
    time.sleep(0.3)
    before = rss_kb(server_pid)
    proc = subprocess.Popen(
        [PY, str(HERE / "loadgen.py"), orjson.dumps(spec).decode(), "--out", os.devnull],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec(cpus),
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline().split()
    opened = int(line[1]) if len(line) >= 2 and line[0] == "OPEN" else 0
    # Wait until every stream reached the mock, or until the count stops growing for 2 s (a proxy that
    # queues requests behind a connection-pool limit never forwards them all).
    deadline = time.monotonic() + 30
    reached, last_change, last = 0, time.monotonic(), -1
    while time.monotonic() < deadline:
        reached = mock_open() - open_before
        if reached >= opened:
            break
        if reached != last:
            last, last_change = reached, time.monotonic()
        elif time.monotonic() - last_change > 2.0:
            break
        time.sleep(0.2)
    time.sleep(1.0)  # let buffers and per-request state settle
    during = rss_kb(server_pid)
    proc.stdin.write("close\n")
    proc.stdin.flush()
    proc.wait(60)
    time.sleep(2.0)
    left = mock_open() - open_before
    return {
        "opened": opened,
        "reached_upstream": reached,
        "rss_before_mb": before / 1024,
        "rss_open_mb": during / 1024,
        "kb_per_stream": (during - before) / opened if opened else None,
        "upstream_left_open": left,
    }


# ------------------------------------------------------------------------------------------ main
def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    from importlib import metadata

    for pkg in ("uvloop", "uvicorn", "aiohttp", "orjson", "responses-gateway"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[pkg] = metadata.version(pkg)
    lpy = LITELLM_VENV / "bin" / "python"
    if lpy.exists():
        r = subprocess.run(
            [str(lpy), "-c", "from importlib.metadata import version as v; print(v('litellm'))"],
            capture_output=True,
            text=True,
        )
        if r.returncode == 0:
            out["litellm"] = r.stdout.strip()
    r = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if r.returncode == 0:
        out["git"] = r.stdout.strip()
    return out


def conditions(pinned: bool) -> dict[str, Any]:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": round(mem_gb, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "pinning": "proxy=CPU1, mock+loadgen=CPU0" if pinned else "none",
        **versions(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="concurrency 1,10,100; 16 deltas; 100 idle streams")
    p.add_argument("--concurrency", help="comma-separated levels (default 1,10,100,1000,2000)")
    p.add_argument("--deltas", type=int, help="deltas per stream (default 64; --quick 16)")
    p.add_argument("--interval-ms", type=float, default=20.0, help="gap between the mock's deltas")
    p.add_argument("--first-delay-ms", type=float, default=0.0, help="mock's delay before the first delta")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds per concurrency level")
    p.add_argument(
        "--samples", type=int, default=100, help="aim for this many streams per run at low concurrency"
    )
    p.add_argument(
        "--idle-streams", type=int, help="idle streams for the RSS test (default 1000; --quick 100)"
    )
    p.add_argument(
        "--contenders",
        default="direct-chat,direct-responses,relay,relay-translate,gateway-chat,gateway-responses,compiled-chat,"
        "compiled-responses,gateway-chat-workers,litellm,litellm-responses",
    )
    p.add_argument(
        "--store-contender-url",
        default=None,
        metavar="URL",
        help="the gateway-chat-store contender's store (default: a SQLite file in the run's temporary "
        "directory, as serve's default)",
    )
    p.add_argument(
        "--gateway-workers",
        type=int,
        default=2,
        metavar="N",
        help="serve --workers N for the gateway-chat-workers contender (default 2); the other gateway "
        "contenders run --workers 1",
    )
    p.add_argument(
        "--gateway-pool-limit",
        type=int,
        help="what-if: cap the gateway's upstream connection pool (total and per host) at this size "
        "(default: unlimited, as serve runs)",
    )
    p.add_argument(
        "--gateway-store",
        default="none",
        metavar="URL",
        help="the gateway's response store (default none: this measures the relay; bench/store.py measures "
        "what storing adds); e.g. sqlite:///tmp/bench.db",
    )
    p.add_argument(
        "--gateway-no-upstream-check",
        action="store_true",
        help="what-if: run the passthrough without its upstream stream checker (check_upstream: false)",
    )
    p.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="the baseline-chat/baseline-responses/baseline-chat-store contenders run the gateway with "
        "PYTHONPATH=DIR/src "
        "(another checkout's code) for a before/after comparison in the same run",
    )
    p.add_argument(
        "--compiled-src",
        default=str(ROOT / "build" / "compiled"),
        metavar="DIR",
        help="the compiled hot path the compiled-chat/compiled-responses contenders run (default "
        "build/compiled, what `make run` serves; `make bench` builds it); unavailable if not built",
    )
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--no-install", action="store_true", help="never pip install (LiteLLM, matplotlib)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--out", help="result JSON path (default bench/results/gateway-overhead-<time>.json)")
    a = p.parse_args()

    raise_nofile()
    concs = [int(c) for c in (a.concurrency or ("1,10,100" if a.quick else "1,10,100,1000,2000")).split(",")]
    deltas = a.deltas or (16 if a.quick else 64)
    idle_k = a.idle_streams if a.idle_streams is not None else (100 if a.quick else 1000)
    wanted = [c.strip() for c in a.contenders.split(",") if c.strip()]
    pinned = not a.no_pin and (os.cpu_count() or 1) >= 2
    proxy_cpus = {1} if pinned else None
    load_cpus = {0} if pinned else None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_json = Path(a.out) if a.out else HERE / "results" / f"gateway-overhead-{stamp}.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="rg-bench-"))
    servers: list[Server] = []
    nominal_s = a.first_delay_ms / 1000 + deltas * a.interval_ms / 1000

    results: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "conditions": conditions(pinned),
        "mock": {"deltas": deltas, "interval_ms": a.interval_ms, "first_delay_ms": a.first_delay_ms},
        "contenders": {},
        "loadgen_check": [],
    }
    con: dict[str, Any] = results["contenders"]
    try:
        mock_port = free_port()
        mock = mock_server(mock_port, deltas, a.interval_ms, load_cpus, tmp, a.first_delay_ms)
        servers.append(mock)
        reason = mock.start(15)
        if reason:
            raise SystemExit(f"the mock upstream did not start: {reason}")

        chat = ("/v1/chat/completions", "chat")
        resp = ("/v1/responses", "responses")
        unavailable: dict[str, str] = {}  # server name -> why it is not started
        plan: dict[str, dict[str, Any]] = {
            "direct-chat": {
                "port": mock_port,
                "route": chat,
                "model": "bench",
                "baseline": "direct-chat",
                "server": mock,
            },
            "direct-responses": {
                "port": mock_port,
                "route": resp,
                "model": "bench",
                "baseline": "direct-responses",
                "server": mock,
            },
        }
        for name in ("relay", "relay-translate"):
            if name in wanted:
                port = free_port()
                plan[name] = {
                    "port": port,
                    "route": chat,
                    "model": "bench",
                    "baseline": "direct-chat",
                    "server": relay_server(port, mock_port, proxy_cpus, tmp, translate=name != "relay"),
                }

        def gateway(
            server_name: str,
            *,
            src: Path | None = None,
            workers: int = 1,
            cpus: set[int] | None = proxy_cpus,
            store: str = a.gateway_store,
        ) -> tuple[Server, int]:
            """``responses-gateway serve`` on the bench's models file, from ``src`` (a tree holding the
            ``responses_gateway`` package: another checkout, or the compiled build) or this one."""
            port = free_port()
            cfg = tmp / f"{server_name}.yaml"
            gateway_config(
                cfg, mock_port, a.gateway_pool_limit, check_upstream=not a.gateway_no_upstream_check
            )
            exe = Path(PY).parent / "responses-gateway"
            argv = [str(exe), "serve", "--host", "127.0.0.1", "--port", str(port), "--config", str(cfg)]
            argv += ["--no-local", "--log-level", "warning", "--workers", str(workers)]
            env = {
                "RG_BENCH_UPSTREAM_KEY": "sk-bench",
                # Anything the gateway persists stays in the run's temporary directory.
                "RG_DATA_DIR": str(tmp / f"{server_name}-data"),
                "RG_STORE_URL": store,
            }
            if src is not None:
                env["PYTHONPATH"] = str(src)
            return Server(server_name, argv, f"http://127.0.0.1:{port}/health", cpus, tmp, env=env), port

        def side(name: str, chat: str) -> tuple[str, str]:
            """The model and the direct run a gateway contender is measured against."""
            return ("bench", "direct-chat") if name == chat else ("bench-resp", "direct-responses")

        gw_wanted = [n for n in ("gateway-chat", "gateway-responses") if n in wanted]
        if gw_wanted:
            results["gateway_launcher"] = "responses-gateway serve --config"
            if a.gateway_store != "none":
                results["gateway_launcher"] += f" (store {a.gateway_store})"
            if a.gateway_no_upstream_check:
                results["gateway_launcher"] += " (what-if: check_upstream false)"
            if a.gateway_pool_limit:
                results["gateway_launcher"] += (
                    f" (what-if: upstream pool_limit {a.gateway_pool_limit}, as --gateway-pool-limit asked)"
                )
            log(f"gateway launcher: {results['gateway_launcher']}")
            gw, port = gateway("gateway")
            for n in gw_wanted:
                model, direct = side(n, "gateway-chat")
                plan[n] = {"port": port, "route": resp, "model": model, "baseline": direct, "server": gw}
        compiled_wanted = [n for n in ("compiled-chat", "compiled-responses") if n in wanted]
        if compiled_wanted:
            compiled = Path(a.compiled_src).resolve()
            built = compiled_build(compiled)
            results["compiled_src"] = str(compiled)
            results["compiled_build"] = built
            gwc, port = gateway("gateway-compiled", src=compiled / "src")
            if built["reason"]:
                unavailable[gwc.name] = built["reason"]
            for n in compiled_wanted:
                model, direct = side(n, "compiled-chat")
                plan[n] = {"port": port, "route": resp, "model": model, "baseline": direct, "server": gwc}
        base_wanted = [n for n in ("baseline-chat", "baseline-responses") if n in wanted]
        if base_wanted:
            src = source_tree(a.baseline_src)
            results["baseline_src"] = str(src)
            gwb, port = gateway("gateway-baseline", src=src)
            for n in base_wanted:
                model, direct = side(n, "baseline-chat")
                plan[n] = {"port": port, "route": resp, "model": model, "baseline": direct, "server": gwb}
        # The default SQLite store on: this tree's code, and (baseline-chat-store) --baseline-src's.
        for store_name, store_src in (("gateway-chat-store", None), ("baseline-chat-store", a.baseline_src)):
            if store_name not in wanted:
                continue
            src = None
            if store_name == "baseline-chat-store":
                src = source_tree(store_src)
                results["baseline_src"] = str(src)
            # Each its own file (an explicit --store-contender-url is for this tree's contender only).
            db = tmp / f"{store_name}-data" / "gw.db"
            url = (store_src is None and a.store_contender_url) or f"sqlite://{db}"
            gws, port = gateway(store_name, src=src, store=url)
            plan[store_name] = {
                "port": port,
                "route": resp,
                "model": "bench",
                "baseline": "direct-chat",
                "server": gws,
            }
        if "gateway-chat-workers" in wanted:
            # Every core (cpus None): the workers' point.
            gww, port = gateway("gateway-workers", workers=a.gateway_workers, cpus=None)
            plan["gateway-chat-workers"] = {
                "port": port,
                "route": resp,
                "model": "bench",
                "baseline": "direct-chat",
                "server": gww,
            }
        ll_wanted = [n for n in ("litellm", "litellm-responses") if n in wanted]
        ll_reason: str | None = None
        if ll_wanted:
            ll_reason = ensure_venv(
                LITELLM_VENV, ["litellm[proxy]"], "import litellm.proxy.proxy_server", not a.no_install
            )
            port = free_port()
            key = "sk-" + secrets.token_hex(32)
            lcfg = tmp / "litellm.yaml"
            litellm_config(lcfg, mock_port, key)
            ll = Server(
                "litellm",
                [
                    str(LITELLM_VENV / "bin" / "litellm"),
                    "--config",
                    str(lcfg),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--num_workers",
                    "1",
                ],
                f"http://127.0.0.1:{port}/health/liveliness",
                proxy_cpus,
                tmp,
                env={"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"},
                cwd=tmp,
            )
            for n in ll_wanted:
                plan[n] = {
                    "port": port,
                    "route": resp,
                    "model": "bench" if n == "litellm" else "bench-resp",
                    "baseline": "direct-chat" if n == "litellm" else "direct-responses",
                    "server": ll,
                    "api_key": key,
                }

        started: dict[str, str | None] = {}
        for name in list(plan):
            if name not in wanted and not name.startswith("direct-"):
                continue
            srv: Server = plan[name]["server"]
            if srv.name not in started:
                if srv.name == "litellm" and ll_reason:
                    started[srv.name] = ll_reason
                elif srv.name in unavailable:
                    started[srv.name] = unavailable[srv.name]
                else:
                    if srv is not mock:
                        log(f"starting {srv.name}…")
                    if srv is not mock:
                        servers.append(srv)
                    started[srv.name] = None if srv is mock else srv.start(90)
            info = {
                "baseline": plan[name]["baseline"],
                "available": started[srv.name] is None,
                "reason": started[srv.name],
                "runs": {},
            }
            con[name] = info
        # Validate every available contender with one small stream; a broken one is reported, not measured.
        for name, info in con.items():
            if not info["available"]:
                log(f"{name}: unavailable: {info['reason']}")
                continue
            spec = make_spec(plan[name], 1, 1, deltas, 0.0, nominal_s + 20)
            try:
                r = run_loadgen(spec, load_cpus, nominal_s + 20, tmp)
                s = report.summarize(r["streams"], 1)
                if not s["integrity_ok"]:
                    raise RuntimeError(f"validation stream failed: {s['errors'] or s}")
                # A short warm-up at 10 streams so first-request costs (imports, pools) are not measured.
                run_loadgen(
                    make_spec(plan[name], 10, 1, deltas, 0.05, nominal_s + 20), load_cpus, nominal_s + 20, tmp
                )
                log(f"{name}: ok ({s['events']} events for {deltas} deltas per stream)")
            except (RuntimeError, subprocess.SubprocessError) as exc:
                info["available"] = False
                info["reason"] = f"{exc} | server log: {plan[name]['server'].tail(400)}"
                log(f"{name}: unavailable: {info['reason']}")

        active = [n for n, i in con.items() if i["available"]]
        # Idle RSS first, while each proxy is near its start-up footprint: freed memory from a load run
        # stays in the allocator and would hide the cost of the idle streams.
        for name in active:
            skip = ("litellm-responses", "gateway-responses", "compiled-responses", "gateway-chat-workers")
            if name.startswith("direct-") or name in skip:
                continue
            srv = plan[name]["server"]
            idle_model = "bench-idle"
            spec = {
                "mode": "idle",
                "host": "127.0.0.1",
                "port": plan[name]["port"],
                "path": plan[name]["route"][0],
                "api": plan[name]["route"][1],
                "model": idle_model,
                "streams": idle_k,
                "ramp_s": 0.5 * idle_k / 1000,
                "api_key": plan[name].get("api_key", "sk-bench"),
            }
            log(f"idle RSS: {idle_k} open streams through {name}…")
            try:
                con[name]["idle"] = idle_test(spec, srv.pid, mock_port, load_cpus, idle_k)
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                con[name]["idle"] = {"error": str(exc)}
        stopped: set[str] = set()
        for c in concs:
            per_worker = max(2, min(12, math.ceil(a.samples / c)))
            # Spread first connects over up to one stream's length (1 ms per stream) so connection set-up is
            # measured as steady load, not as one accept-backlog burst.
            ramp = min(nominal_s, 0.001 * c)
            timeout = ramp + per_worker * nominal_s * 4 + 30
            pooled: dict[str, list[dict[str, Any]]] = {n: [] for n in active}
            meters: dict[str, dict[str, float]] = {
                n: {"cpu": 0.0, "hwm": 0.0, "lgcpu": 0.0, "mockcpu": 0.0, "wall": 0.0, "load": 0.0}
                for n in active
            }
            lags: dict[str, list[int]] = {n: [] for n in active}
            for rnd in range(a.rounds):
                order = active[rnd % len(active) :] + active[: rnd % len(active)] if active else []
                if rnd % 2:
                    order.reverse()
                for name in order:
                    if name in stopped:
                        continue
                    srv = plan[name]["server"]
                    spec = make_spec(plan[name], c, per_worker, deltas, ramp, timeout)
                    reset_peak_rss(srv.pid)
                    cpu0, mcpu0 = cpu_seconds(srv.pid), cpu_seconds(mock.pid)
                    try:
                        r = run_loadgen(spec, load_cpus, timeout, tmp)
                    except (RuntimeError, subprocess.SubprocessError) as exc:
                        log(f"  {name} @ {c}: load generator failed: {exc}")
                        r = {"streams": [], "wall_s": 0, "loadgen_cpu_s": 0, "loop_lag_ns": []}
                    m = meters[name]
                    m["cpu"] += cpu_seconds(srv.pid) - cpu0
                    m["mockcpu"] += cpu_seconds(mock.pid) - mcpu0
                    m["hwm"] = max(m["hwm"], rss_kb(srv.pid, "VmHWM") / 1024)
                    m["lgcpu"] += r["loadgen_cpu_s"]
                    m["wall"] += r["wall_s"]
                    lags[name].extend(r["loop_lag_ns"])
                    pooled[name].extend(r["streams"])
                    ok = sum(1 for s in r["streams"] if s["ok"])
                    load1 = os.getloadavg()[0]
                    m["load"] = max(m["load"], load1)
                    log(
                        f"  c={c:<5} round {rnd + 1}/{a.rounds} {name:<18} {ok}/{c * per_worker} ok "
                        f"in {r['wall_s']:.1f} s, load average {load1:.2f}"
                    )
            for name in active:
                if name in stopped:
                    continue
                s = report.summarize(pooled[name], c * per_worker * a.rounds)
                m = meters[name]
                direct = name.startswith("direct-")
                s["server_cpu_s"] = None if direct else m["cpu"]
                s["cpu_s_per_1k_events"] = (
                    None if direct or not s["deltas"] else m["cpu"] / s["deltas"] * 1000
                )
                s["peak_rss_mb"] = None if direct else m["hwm"]
                s["mock_cpu_s"] = m["mockcpu"]
                # The machine's 1-minute load average, the highest seen after this contender's runs.
                s["load_average_max"] = m["load"]
                s["loadgen_cpu_s"] = m["lgcpu"]
                s["loadgen_cpu_share"] = m["lgcpu"] / m["wall"] if m["wall"] else None
                s["loadgen_loop_lag_ms_p99"] = (report.pct(lags[name], 99) or 0) / 1e6
                s["streams_per_worker"] = per_worker
                con[name]["runs"][str(c)] = s
                if direct:
                    results["loadgen_check"].append(
                        {
                            "contender": name,
                            "concurrency": c,
                            "loadgen_cpu_share_of_one_core": round(s["loadgen_cpu_share"] or 0, 3),
                            "mock_cpu_share": round(m["mockcpu"] / m["wall"], 3) if m["wall"] else None,
                            "loop_lag_p99_ms": round(s["loadgen_loop_lag_ms_p99"], 2),
                            "transit_p99_ms": round(s["transit_ms"]["p99"] or 0, 2),
                        }
                    )
                failed = s["streams_planned"] - s["streams_ok"]
                if failed > 0.05 * s["streams_planned"] and not direct:
                    stopped.add(name)
                    log(
                        f"  {name}: {failed} of {s['streams_planned']} streams failed at {c}; "
                        "not tried at higher concurrency"
                    )
            report.add_deltas(results)
        for name in active:
            runs = con[name]["runs"]
            best = None
            for c in concs:
                run = runs.get(str(c))
                if run is None or not run["sustained"]:
                    break
                best = c
            con[name]["max_sustained"] = best

        report.add_deltas(results)
        report.headline_and_targets(results)
    finally:
        for srv in reversed(servers):
            srv.stop()

    out_json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    text = report.table(results)
    print()
    print(text)
    out_json.with_suffix(".txt").write_text(text + "\n")
    log(f"wrote {out_json} and {out_json.with_suffix('.txt')}")
    if not a.no_plot:
        plot_png(out_json, not a.no_install)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def make_spec(
    entry: dict[str, Any], c: int, per_worker: int, deltas: int, ramp: float, timeout: float
) -> dict[str, Any]:
    path, api = entry["route"]
    return {
        "mode": "streams",
        "host": "127.0.0.1",
        "port": entry["port"],
        "path": path,
        "api": api,
        "model": entry["model"],
        "concurrency": c,
        "streams_per_worker": per_worker,
        "deltas": deltas,
        "ramp_s": ramp,
        "timeout_s": timeout,
        "api_key": entry.get("api_key", "sk-bench"),
    }


def plot_png(out_json: Path, install: bool) -> None:
    png = out_json.with_suffix(".png")
    reason = ensure_venv(TOOLS_VENV, ["matplotlib"], "import matplotlib", install)
    py = str(TOOLS_VENV / "bin" / "python") if reason is None else PY
    r = subprocess.run(
        [py, str(HERE / "report.py"), "plot", str(out_json), str(png)], capture_output=True, text=True
    )
    if r.returncode == 0:
        log(f"wrote {png} (matplotlib from {TOOLS_VENV if reason is None else 'the main venv'})")
    else:
        log(f"no plot: {reason or ''} {r.stderr[-300:]}")


if __name__ == "__main__":
    sys.exit(main())
