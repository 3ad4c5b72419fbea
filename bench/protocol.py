"""Protocol micro-benchmark: µs per event for the builder, the decoder + accumulator and the checker.

Run: ``.venv/bin/python bench/protocol.py``. Targets: builder text_delta + take + encode_event <= 5 µs per
delta; decode + accumulate <= 8 µs per event. ``orjson.dumps`` of the same payloads is the floor.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from responses_gateway.protocol import (
    EventStreamDecoder,
    StreamBuilder,
    StreamChecker,
    encode_event,
    new_response,
)
from responses_gateway.protocol.accumulator import Accumulator

FIXTURE = "openai-responses__reasoning-summary-4-parts-then-text__pydantic-pydantic-ai.sse"
DELTAS = 20_000


def timed(fn: Callable[[], int], repeat: int = 5) -> float:
    """Best-of-``repeat`` µs per unit, ``fn`` returning how many units it processed."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        units = fn()
        best = min(best, (time.perf_counter() - start) / units * 1e6)
    return best


def bench_builder() -> int:
    b = StreamBuilder(new_response("m"))
    b.start()
    b.take()
    m = b.open_message()
    b.take()
    encode = encode_event
    for _ in range(DELTAS):
        b.text_delta(m, "token ")
        for event in b.take():
            encode(event)
    return DELTAS


def delta_payloads() -> list[dict[str, Any]]:
    b = StreamBuilder(new_response("m"))
    b.start()
    m = b.open_message()
    b.take()
    for _ in range(DELTAS):
        b.text_delta(m, "token ")
    return b.take()


def main() -> int:
    fixture_dir = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "recordings"
    wire = (fixture_dir / FIXTURE).read_bytes()
    decoder = EventStreamDecoder()
    events = decoder.feed(wire) + decoder.flush()
    copies = 20  # the fixture decoded this many times, one accumulator per response
    stream = wire

    def decode_accumulate() -> int:
        n = 0
        for _ in range(copies):
            dec = EventStreamDecoder()
            acc = Accumulator()
            for chunk_start in range(0, len(stream), 4096):
                for event in dec.feed(stream[chunk_start : chunk_start + 4096]):
                    acc.feed(event)
                    n += 1
            for event in dec.flush():
                acc.feed(event)
                n += 1
            acc.end()
        return n

    def run_checker() -> int:
        for _ in range(copies):
            checker = StreamChecker()
            for event in events:
                checker.feed(event)
            checker.finish()
        return copies * len(events)

    payloads = delta_payloads()

    def orjson_baseline() -> int:
        dumps = orjson.dumps
        for event in payloads:
            dumps(event)
        return len(payloads)

    builder_us = timed(bench_builder)
    decode_us = timed(decode_accumulate)
    checker_us = timed(run_checker)
    floor_us = timed(orjson_baseline)
    print(f"fixture: {FIXTURE} ({len(events)} events, {len(wire)} bytes)")
    print(f"(a) builder text_delta + take + encode_event : {builder_us:6.2f} µs/delta  (target <= 5)")
    print(f"(b) SSE decode + accumulate                  : {decode_us:6.2f} µs/event  (target <= 8)")
    print(f"(c) checker feed                             : {checker_us:6.2f} µs/event")
    print(f"(d) orjson.dumps of a delta event (floor)    : {floor_us:6.2f} µs/event")
    ratios = (builder_us / floor_us, decode_us / floor_us, checker_us / floor_us)
    print("ratios to (d): builder {:.1f}x, decode+accumulate {:.1f}x, checker {:.1f}x".format(*ratios))
    missed = builder_us > 5 or decode_us > 8
    if missed:
        print("TARGET MISSED")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
