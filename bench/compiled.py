"""The hot path's Python compiled with mypyc against the same source run by the interpreter, side by side.

Run: ``.venv/bin/python bench/compiled.py`` (``make bench`` runs it). It builds the compiled tree as
``make run`` serves it (``scripts/compile_hot_path.py``: a copy of ``src/`` with the modules of
``protocol/native.py``'s ``COMPILED_MODULES`` compiled by mypyc) in a temporary directory, then runs
``bench/protocol.py`` and an SSE decode / encode loop under both trees, alternating, best of
``--rounds``; and, when valgrind is installed, ``bench/per_request.py --callgrind`` with the compiled
tree as its ``--baseline-src``: instructions per stream and per delta of the whole running gateway, pure
("gateway-…") against compiled ("baseline-…"). ``--keep DIR`` builds it in ``DIR/compiled`` and keeps it.
What was measured and decided is in docs/performance.md ("Compiled hot path", "The whole per-event
chain compiled", "The compiled hot path adopted").
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from compile_hot_path import build  # noqa: E402

FIXTURE = (
    ROOT
    / "tests/fixtures/recordings"
    / "openai-responses__reasoning-summary-4-parts-then-text__pydantic-pydantic-ai.sse"
)

SSE_LOOP = r"""
import time
from pathlib import Path
from responses_gateway.protocol.sse import EventStreamDecoder, encode_event
blob = Path(__import__("sys").argv[1]).read_bytes() * 50
chunks = [blob[i : i + 700] for i in range(0, len(blob), 700)]
best = float("inf")
for _ in range(5):
    start, n = time.perf_counter(), 0
    decoder = EventStreamDecoder()
    for chunk in chunks:
        n += len(decoder.feed(chunk))
    best = min(best, (time.perf_counter() - start) / n * 1e6)
event = {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
         "delta": "token ", "sequence_number": 5, "logprobs": []}
enc = float("inf")
for _ in range(5):
    start = time.perf_counter()
    for _ in range(100_000):
        encode_event(event)
    enc = min(enc, (time.perf_counter() - start) / 100_000 * 1e6)
print(f"(e) SSE decode (events from 700-byte reads)  : {best:6.2f} µs/event")
print(f"(f) encode_event of a delta                  : {enc:6.2f} µs/event")
"""


def measure(src: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "protocol.py")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    out += subprocess.run(
        [sys.executable, "-c", SSE_LOOP, str(FIXTURE)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: dict[str, float] = {}
    for line in out.splitlines():
        match = re.match(r"\((\w)\) (.+?)\s*:\s*([\d.]+) µs", line)
        if match:
            found[f"({match[1]}) {match[2]}"] = float(match[3])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each is kept")
    parser.add_argument("--keep", type=Path, help="build the compiled tree in DIR/compiled and keep it")
    parser.add_argument("--no-instructions", action="store_true", help="skip the instruction count")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rg-mypyc-") as tmp:
        workdir = args.keep.resolve() if args.keep else Path(tmp)
        compiled = build(workdir / "compiled")
        best: dict[str, dict[str, float]] = {"pure": {}, "compiled": {}}
        for _ in range(args.rounds):
            for name, src in (("pure", ROOT / "src"), ("compiled", compiled)):
                for key, value in measure(src).items():
                    best[name][key] = min(value, best[name].get(key, float("inf")))
        print(f"{'µs per unit, best of ' + str(args.rounds):46} {'pure':>8} {'mypyc':>8} {'ratio':>7}")
        for key, pure in best["pure"].items():
            fast = best["compiled"][key]
            print(f"{key:46} {pure:8.2f} {fast:8.2f} {pure / fast:6.2f}x")
        if args.no_instructions or shutil.which("valgrind") is None:
            print("instructions per relayed event: not measured (--no-instructions, or no valgrind)")
            return
        print("\nThe whole gateway, pure ('gateway-…') against compiled ('baseline-…'):", flush=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        command = [
            sys.executable,
            str(ROOT / "bench" / "per_request.py"),
            "--baseline-src",
            str(compiled.parent),
            "--callgrind",
            "20",
            "--deltas",
            "100",
            "--interval-ms",
            "10",
        ]
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    main()
