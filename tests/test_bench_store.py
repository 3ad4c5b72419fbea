"""bench/store.py runs at tiny scale on SQLite and PostgreSQL, directly and through a gateway process,
and prints every figure it promises.

Not a timing assertion: only that both stores were measured (no skip), the table has a row per store
with numbers in every column, and the JSON result carries the fields docs/performance.md quotes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_store_services import require

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = 12
SERVER_COLUMNS = 11


def test_store_bench_prints_the_figures(tmp_path: Path) -> None:
    postgres = require("postgres")
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "store.py"),
            "--responses",
            "4",
            "--warmup",
            "1",
            "--deltas",
            "8",
            "--postgres",
            postgres,
            "--sqlite-dir",
            str(tmp_path),
            "--server",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("conditions: python=") for line in lines), proc.stdout
    for name in ("sqlite", "postgresql"):
        direct, server = [line for line in lines if line.startswith(name + " ")]
        cells = direct.split()
        assert len(cells) == COLUMNS, direct
        assert len(server.split()) == SERVER_COLUMNS and server.split()[1] == "16", server
        row = direct
        # 8 deltas: created, in_progress, item added, part added, 8 deltas, text done, part done,
        # item done, completed.
        assert cells[1] == "16", row
        assert all(float(c) == float(c) for c in cells[2:]), row
    result = json.loads(out.read_text())
    assert result["conditions"]["deltas"] == 8
    assert "version" in result["conditions"]["postgresql"]
    for name in ("sqlite", "postgresql"):
        figures = result["stores"][name]
        assert figures["events_per_response"] == 16
        assert figures["store_true_ms"]["p50"] > 0 and figures["store_false_ms"]["p50"] > 0
        assert figures["recorder_add_us"]["p99"] >= figures["recorder_add_us"]["p50"] > 0
        assert figures["terminal_commit_ms"]["p50"] > 0
        assert {"added_ms_per_response", "added_us_per_event", "ratio_p50", "create_ms"} <= figures.keys()
        served = result["server"][name]
        assert served["events_per_response"] == 16
        assert served["store_true_ms"]["p50"] > served["store_true_ms"]["ttfb_p50"] > 0
        assert {"added_ttfb_ms", "added_ms_per_response", "added_us_per_event", "ratio_p50"} <= served.keys()
