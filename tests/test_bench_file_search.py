"""bench/file_search.py runs end to end at tiny scale (``--quick``) and writes the figures the docs quote.

Not a timing or quality assertion: only that ingestion, the three recall@5 measurements (every question and
the held-out half, and the other two labelled sets) and the latency table (whole search and each side) are
produced and well formed; and that bench/file_search_fusion.py computes the shipped fusion exactly as search
does (it asserts so for every question) and picks its candidate on the even half.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_file_search_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "file_search.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["corpus"]["documents"] == 6
    assert result["ingestion"]["chunks"] > 6 and result["ingestion"]["chunks_per_s"] > 0
    assert set(result["recall_at_5"]) == {"bm25", "vectors", "hybrid"}
    assert all(0 <= v <= 1 for side in result["recall_at_5"].values() for v in side.values())
    for other in ("stdlib", "identifiers"):
        assert set(result[f"recall_at_5_{other}"]) == {"bm25", "vectors", "hybrid"}
        assert all(0 <= v <= 1 for v in result[f"recall_at_5_{other}"].values())
    [row] = result["latency"].values()
    assert row["chunks"] == 1000 and row["first_search_s"] > 0 and row["bm25_bytes_per_chunk"] > 0
    for part in ("search", "embed", "bm25", "fts", "vectors"):
        assert 0 < row[f"{part}_ms_p50"] <= row[f"{part}_ms_p99"], part


def test_fusion_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "fusion.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "file_search_fusion.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["candidates"] > 100 and result["chosen"]["name"]
    for name in ("vectors", "bm25", "shipped rrf k=60 depth=40"):
        r = result[name]
        assert r["even"][1] + r["odd"][1] == r["all"][1] == 6
        assert r["identifiers"][1] > 0 and r["stdlib"][1] == 6
        assert all(0 <= right <= total for right, total in r.values())
