"""bench/vector_backends.py runs end to end at tiny scale (``--quick``) and writes the figures the docs
quote. Not a timing or quality assertion: only that the latency table (each SQLite vector back end) is
produced and well formed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_vector_backends_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "vector_backends.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["corpus"]["documents"] == 6
    assert result["corpus"]["chunks"] > 6
    [size] = result["latency"].values()
    assert size["chunks"] == 1000
    # Every SQLite back end side by side (sqlite-vec falls back to memory only if it cannot load,
    # and then says so in its ``backend``).
    assert set(size["backends"]) == {"sqlite/memory", "sqlite/sqlite-vec", "sqlite/sqlite-vec-bit"}
    for name, row in size["backends"].items():
        assert row["backend"] == name.split("/")[1], row
        assert 0 < row["vector_ms_p50"] <= row["vector_ms_p99"]
        assert 0 < row["search_ms_p50"] <= row["search_ms_p99"]
        assert 0 <= row["recall_at_5"] <= 1
    assert size["backends"]["sqlite/memory"]["recall_at_5"] == 1.0
    assert (
        size["backends"]["sqlite/memory"]["process_mb"]
        > 1
        > size["backends"]["sqlite/sqlite-vec"]["process_mb"]
    )
