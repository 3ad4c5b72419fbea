"""The gateway overhead harness runs end to end at tiny scale and yields a well-formed, intact result.

Not a timing assertion: only that every contender that could start relayed every frame, in order, and
that the JSON carries the fields the report and docs/performance.md rely on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from responses_gateway.protocol.native import COMPILED_MODULES

ROOT = Path(__file__).resolve().parent.parent


def test_gateway_overhead_smoke(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gateway_overhead.py"),
            "--contenders",
            "direct-chat,direct-responses,relay,relay-translate,gateway-chat,gateway-responses,"
            "gateway-chat-workers,gateway-chat-store,compiled-chat,compiled-responses",
            "--concurrency",
            "1,2",
            "--deltas",
            "6",
            "--interval-ms",
            "5",
            "--rounds",
            "1",
            "--samples",
            "2",
            "--idle-streams",
            "4",
            "--no-pin",
            "--no-install",
            "--no-plot",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert {"command", "conditions", "mock", "contenders", "targets", "loadgen_check"} <= result.keys()
    assert result["mock"]["deltas"] == 6
    contenders = result["contenders"]
    names = (
        "direct-chat",
        "direct-responses",
        "relay",
        "relay-translate",
        "gateway-chat",
        "gateway-responses",
    )
    for name in (*names, "gateway-chat-workers", "gateway-chat-store"):
        assert contenders[name]["available"], contenders[name]
    # The floor for translating, and each gateway's distance above it.
    assert any(
        line.startswith("relay-translate @ 2: CPU/event") and "gateway-chat " in line
        for line in result["headline"]
    ), result["headline"]
    # `make test` builds the compiled hot path first; the compiled contenders run it, or say why not.
    if (ROOT / "build" / "compiled" / ".built").is_file():
        for name in ("compiled-chat", "compiled-responses"):
            assert contenders[name]["available"], contenders[name]
        assert result["compiled_build"]["reason"] is None
        assert result["compiled_build"]["modules"] == f"{len(COMPILED_MODULES)} of {len(COMPILED_MODULES)}"
        assert "compiled-chat @ 2: CPU s per 1k events" in "\n".join(result["headline"])
    else:
        assert "make bench" in contenders["compiled-chat"]["reason"]
    assert result["gateway_launcher"] == "responses-gateway serve --config"
    for name, info in contenders.items():
        if not info["available"]:
            assert info["reason"], name  # an unavailable contender always says why
            continue
        assert set(info["runs"]) == {"1", "2"}, name
        for conc, run in info["runs"].items():
            where = f"{name} @ {conc}"
            assert run["streams_ok"] == run["streams_planned"] > 0, (where, run["errors"])
            assert run["dropped"] == 0 and run["out_of_order"] == 0 and run["duplicated"] == 0, where
            assert run["final_text_mismatch"] == 0, where
            assert run["deltas"] == 6 * run["streams_planned"], where
            assert run["ttfe_ms"]["p50"] is not None and run["transit_ms"]["p99"] is not None, where
            if not name.startswith("direct-"):
                assert "added_ms" in run and run["cpu_s_per_1k_events"] is not None, where
    relay_idle = contenders["relay"]["idle"]
    assert relay_idle["opened"] == 4 and relay_idle["kb_per_stream"] is not None
    assert (out.with_suffix(".txt")).read_text().startswith("Conditions:")


def test_per_request_callgrind_smoke(tmp_path: Path) -> None:
    """bench/per_request.py --callgrind counts a real gateway's instructions on both routes, against a
    baseline tree (this one), and prints the lines the docs quote (valgrind: scripts/bench-deps.sh)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "per_request.py"),
            "--baseline-src",
            str(ROOT),
            "--callgrind",
            "2",
            "--warmup",
            "1",
            "--deltas",
            "5",
            "--no-pin",
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if " per delta" in line}
    for route in ("chat", "responses"):
        this, base = rows[f"gateway-{route}"], rows[f"baseline-{route}"]
        # Same code both sides: a million instructions per stream at least, within a factor of two.
        a, b = float(this[1]), float(base[1])
        assert a > 0.1 and b > 0.1 and 0.5 < a / b < 2, (this, base)
