"""Summaries, the terminal table, target verdicts and the PNG plot for ``gateway_overhead.py``.

Standard library only (``json``, no orjson), so ``python bench/report.py plot RESULT.json`` runs in the
bench tools virtualenv that carries matplotlib, and ``table`` re-prints a saved result anywhere.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

# A stream "keeps pace" when its events are not falling ever further behind the model: p99 transit (and
# p99 added time to first event) under this bound. Beyond it the proxy is saturated and queueing, even if
# it eventually delivers every frame.
PACE_BOUND_MS = 250.0


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: every reported value was actually observed)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def summarize(streams: list[dict[str, Any]], planned: int) -> dict[str, Any]:
    """Pool the streams of every round of one (contender, concurrency) into latency and integrity figures."""
    ttfe = [s["ttfe_ns"] / 1e6 for s in streams if s["ttfe_ns"] >= 0]
    gaps = [g / 1e6 for s in streams for g in s["gaps_ns"]]
    transit = [t / 1e6 for s in streams for t in s["transit_ns"]]
    durations = [s["duration_ns"] / 1e6 for s in streams]
    errors: dict[str, int] = {}
    for s in streams:
        if s["error"]:
            key = s["error"][:160]
            errors[key] = errors.get(key, 0) + 1
    ok = sum(1 for s in streams if s["ok"])
    # A stream that failed (HTTP error, timeout, connection lost) is counted as failed, not as dropped
    # frames; drops and reordering are judged on the streams that were delivered to their end.
    delivered = [s for s in streams if not s["error"]]
    out = {
        "streams_planned": planned,
        "streams_run": len(streams),
        "streams_ok": ok,
        "streams_failed": planned - len(delivered),
        "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5]),
        "dropped": sum(max(0, s["dropped"]) for s in delivered),
        "out_of_order": sum(s["out_of_order"] for s in streams),
        "duplicated": sum(s["duplicated"] for s in streams),
        "final_text_mismatch": sum(1 for s in delivered if s["final_text_ok"] is False),
        "deltas": sum(s["deltas"] for s in streams),
        "events": sum(s["events"] for s in streams),
        "ttfe_ms": {"p50": pct(ttfe, 50), "p99": pct(ttfe, 99), "max": max(ttfe) if ttfe else None},
        "gap_ms": {"p50": pct(gaps, 50), "p99": pct(gaps, 99)},
        "transit_ms": {"p50": pct(transit, 50), "p99": pct(transit, 99), "max": max(transit or [0])},
        "duration_ms_p50": pct(durations, 50),
    }
    out["integrity_ok"] = (
        out["streams_ok"] == planned
        and out["dropped"] == 0
        and out["out_of_order"] == 0
        and out["duplicated"] == 0
        and out["final_text_mismatch"] == 0
    )
    p99 = out["transit_ms"]["p99"]
    out["sustained"] = bool(out["integrity_ok"] and p99 is not None and p99 <= PACE_BOUND_MS)
    return out


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def add_deltas(results: dict[str, Any]) -> None:
    """Added latency = contender minus the direct run on the same mock format at the same concurrency."""
    contenders = results["contenders"]
    for name, info in contenders.items():
        base_name = info.get("baseline")
        if not base_name or base_name == name:
            continue
        base_runs = contenders.get(base_name, {}).get("runs", {})
        for c, run in info.get("runs", {}).items():
            base = base_runs.get(c)
            if base is None:
                continue
            run["added_ms"] = {
                f"{metric}_{q}": _sub(run[f"{metric}_ms"][q], base[f"{metric}_ms"][q])
                for metric in ("ttfe", "gap", "transit")
                for q in ("p50", "p99")
            }
            # Streams that wait in a queue before they start (a connection-pool limit, a saturated accept
            # loop) are not sustained concurrency either, even if their events then flow on time.
            added_ttfe = run["added_ms"]["ttfe_p99"]
            if added_ttfe is not None and added_ttfe > PACE_BOUND_MS:
                run["sustained"] = False


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    cond = results.get("conditions", {})
    lines.append("Conditions: " + ", ".join(f"{k}={v}" for k, v in cond.items()))
    if results.get("gateway_launcher"):
        lines.append(f"Gateway launched by: {results['gateway_launcher']}")
    built = results.get("compiled_build")
    if built:
        stale = " (OLDER than src/: rebuild it)" if built.get("stale") else ""
        where = f"Compiled hot path (compiled-*): {results.get('compiled_src')}"
        if built.get("reason"):
            lines.append(f"{where}: unavailable")
        else:
            lines.append(f"{where}, {built.get('modules')} modules compiled{stale}")
    mock = results.get("mock", {})
    lines.append(
        "Mock: "
        + ", ".join(f"{k}={v}" for k, v in mock.items())
        + f"; 'sustained' = every stream intact, p99 transit and p99 added TTFE <= {PACE_BOUND_MS:.0f} ms"
        + "; 'fail' = streams refused/timed out/cut, 'drop'/'ooo' = frames missing/out of order in the rest"
    )
    for name, info in results["contenders"].items():
        if not info.get("available", False):
            lines.append(f"- {name}: UNAVAILABLE: {info.get('reason')}")
    header = (
        f"{'conc':>5} {'contender':<18} {'ok/plan':>11} {'fail':>5} {'drop':>4} {'ooo':>4} "
        f"{'TTFE p50':>8} {'p99':>7} {'+TTFE p50':>9} {'+p99':>7} {'+gap p50':>8} {'+p99':>7} "
        f"{'+trans p50':>10} {'+p99':>7} {'CPU s/1k':>8} {'peakRSS MB':>10} {'sust':>4}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    concs = sorted({int(c) for info in results["contenders"].values() for c in info.get("runs", {})})
    for c in concs:
        for name, info in results["contenders"].items():
            run = info.get("runs", {}).get(str(c))
            if run is None:
                continue
            added = run.get("added_ms", {})
            lines.append(
                f"{c:>5} {name:<18} {run['streams_ok']:>5}/{run['streams_planned']:<5} "
                f"{run['streams_failed']:>5} {run['dropped']:>4} "
                f"{run['out_of_order']:>4} {_f(run['ttfe_ms']['p50']):>8} {_f(run['ttfe_ms']['p99']):>7} "
                f"{_f(added.get('ttfe_p50')):>9} {_f(added.get('ttfe_p99')):>7} "
                f"{_f(added.get('gap_p50')):>8} {_f(added.get('gap_p99')):>7} "
                f"{_f(added.get('transit_p50')):>10} {_f(added.get('transit_p99')):>7} "
                f"{_f(run.get('cpu_s_per_1k_events'), 3):>8} {_f(run.get('peak_rss_mb'), 1):>10} "
                f"{'yes' if run['sustained'] else 'NO':>4}"
            )
            if run["errors"]:
                for msg, n in list(run["errors"].items())[:2]:
                    lines.append(f"{'':>7}{n} x {msg}")
    lines.append("")
    lines.append("Idle streams (RSS per open stream waiting for its first token):")
    for name, info in results["contenders"].items():
        idle = info.get("idle")
        if idle:
            lines.append(
                f"  {name:<18} {idle.get('opened', 0):>5} open, {idle.get('reached_upstream')} at the mock: "
                f"{_f(idle.get('kb_per_stream'), 1)} KB/stream"
                f" (RSS {_f(idle.get('rss_before_mb'), 1)} -> {_f(idle.get('rss_open_mb'), 1)} MB);"
                f" upstream streams left open 2 s after the clients closed: {idle.get('upstream_left_open')}"
            )
    lines.append("")
    lines.append("Max concurrency sustained (all lower levels sustained too):")
    for name, info in results["contenders"].items():
        if info.get("available"):
            lines.append(f"  {name:<18} {info.get('max_sustained')}")
    if results.get("loadgen_check"):
        lines.append("")
        lines.append("Load generator check (direct runs; its own CPU and event-loop lag):")
        for row in results["loadgen_check"]:
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    if results.get("headline"):
        lines.append("")
        lines.append("Headline:")
        for row in results["headline"]:
            lines.append("  " + row)
    if results.get("targets"):
        lines.append("")
        lines.append("Targets:")
        for t in results["targets"]:
            lines.append(
                f"  [{'PASS' if t['pass'] else 'MISS' if t['pass'] is False else 'n/a '}] {t['text']}"
            )
    return "\n".join(lines)


def _added(results: dict[str, Any], name: str, c: int, key: str) -> float | None:
    run = results["contenders"].get(name, {}).get("runs", {}).get(str(c))
    if not run:
        return None
    value: float | None = run.get("added_ms", {}).get(key)
    return value


def headline_and_targets(results: dict[str, Any]) -> None:
    """Ratios against the bare relay and LiteLLM, and a verdict on each target of the issue."""
    con = results["contenders"]
    concs = sorted({int(c) for info in con.values() for c in info.get("runs", {})})
    head: list[str] = []
    targets: list[dict[str, Any]] = []
    names = ("gateway-chat", "gateway-responses", "compiled-chat", "compiled-responses")
    gateways = [n for n in names if con.get(n, {}).get("available")]
    lite = {
        "gateway-chat": "litellm",
        "gateway-responses": "litellm-responses",
        "compiled-chat": "litellm",
        "compiled-responses": "litellm-responses",
    }
    floor = 0.05  # ms; below this an added latency is clock noise, so ratios use it as the denominator floor
    for gw in gateways:
        for c in concs:
            g = con[gw]["runs"].get(str(c))
            if not g:
                continue
            parts = [f"{gw} @ {c}:"]
            r = con.get("relay", {}).get("runs", {}).get(str(c))
            if r and g.get("cpu_s_per_1k_events") and r.get("cpu_s_per_1k_events"):
                parts.append(f"CPU/event {g['cpu_s_per_1k_events'] / r['cpu_s_per_1k_events']:.2f}x relay")
            for key in ("ttfe_p99", "transit_p50", "transit_p99"):
                ga, ra = _added(results, gw, c, key), _added(results, "relay", c, key)
                if ga is not None and ra is not None:
                    parts.append(f"+{key} {ga:.2f} ms vs relay {ra:.2f} ms")
            ll = lite[gw]
            lrun = con.get(ll, {}).get("runs", {}).get(str(c))
            if lrun:
                for key in ("ttfe_p99", "transit_p50", "transit_p99"):
                    ga, la = _added(results, gw, c, key), _added(results, ll, c, key)
                    if ga is not None and la is not None:
                        parts.append(f"{ll} +{key} {la:.2f} ms = {la / max(ga, floor):.1f}x")
            head.append("  ".join(parts))

    def target(text: str, ok: bool | None) -> None:
        targets.append({"text": text, "pass": ok})

    for gw in gateways:
        runs = con[gw]["runs"]
        for c, bound in ((1, 1.0), (1000, 5.0)):
            v = _added(results, gw, c, "ttfe_p99")
            target(
                f"{gw}: added TTFE p99 <= {bound} ms at {c} stream(s): {_f(v)} ms",
                None if v is None else v <= bound,
            )
        ll = lite[gw]
        both = [
            c
            for c in concs
            if runs.get(str(c), {}).get("sustained")
            and con.get(ll, {}).get("runs", {}).get(str(c), {}).get("sustained")
        ]
        worst: float | None = None
        for c in both:
            for key in ("ttfe_p50", "ttfe_p99", "transit_p50", "transit_p99"):
                ga, la = _added(results, gw, c, key), _added(results, ll, c, key)
                if ga is None or la is None:
                    continue
                ratio = la / max(ga, floor)
                worst = ratio if worst is None else min(worst, ratio)
        target(
            f"{gw}: >= 5x lower added latency than {ll} at every concurrency both sustain {both}: "
            f"worst ratio {_f(worst, 1)}x",
            None if worst is None else worst >= 5,
        )
        ratios = []
        for c in concs:
            g, r = runs.get(str(c)), con.get("relay", {}).get("runs", {}).get(str(c))
            if g and r and g.get("cpu_s_per_1k_events") and r.get("cpu_s_per_1k_events"):
                ratios.append(g["cpu_s_per_1k_events"] / r["cpu_s_per_1k_events"])
        worst_cpu = max(ratios) if ratios else None
        target(
            f"{gw}: CPU per relayed event <= 1.5x the bare relay's: worst {_f(worst_cpu)}x",
            None if worst_cpu is None else worst_cpu <= 1.5,
        )
        ms = con[gw].get("max_sustained")
        target(f"{gw}: >= 2,000 concurrent streams sustained, zero drops: {ms}", (ms or 0) >= 2000)
        idle = con[gw].get("idle") or {}
        kb = idle.get("kb_per_stream")
        target(f"{gw}: <= 50 KB RSS per idle stream: {_f(kb, 1)} KB", None if kb is None else kb <= 50)
    # The floor for translating (relay-translate: the relay plus one JSON parse and one serialization
    # per event), and how far above it each gateway is.
    rt = con.get("relay-translate", {})
    if rt.get("available"):
        for c in concs:
            t, r = rt["runs"].get(str(c)), con.get("relay", {}).get("runs", {}).get(str(c))
            if not (t and r and t.get("cpu_s_per_1k_events") and r.get("cpu_s_per_1k_events")):
                continue
            cpu_t = t["cpu_s_per_1k_events"]
            parts = [f"relay-translate @ {c}: CPU/event {cpu_t / r['cpu_s_per_1k_events']:.2f}x relay"]
            for gw in gateways:
                g = con[gw]["runs"].get(str(c))
                if g and g.get("cpu_s_per_1k_events"):
                    parts.append(f"{gw} {g['cpu_s_per_1k_events'] / cpu_t:.2f}x it")
            head.append("  ".join(parts))
    # The hot path compiled against the same source interpreted: CPU per relayed event, side by side.
    for pure, built in (("gateway-chat", "compiled-chat"), ("gateway-responses", "compiled-responses")):
        if pure not in gateways or built not in gateways:
            continue
        for c in concs:
            p, b = con[pure]["runs"].get(str(c)), con[built]["runs"].get(str(c))
            if p and b and p.get("cpu_s_per_1k_events") and b.get("cpu_s_per_1k_events"):
                change = b["cpu_s_per_1k_events"] / p["cpu_s_per_1k_events"] - 1
                head.append(
                    f"{built} @ {c}: CPU s per 1k events {b['cpu_s_per_1k_events']:.4f} against "
                    f"{pure}'s {p['cpu_s_per_1k_events']:.4f} ({change:+.0%})"
                )
    one, many = con.get("gateway-chat", {}), con.get("gateway-chat-workers", {})
    if one.get("available") and many.get("available"):
        for c in concs:
            a, b = one["runs"].get(str(c)), many["runs"].get(str(c))
            if a and b:
                w1, wn = "gateway-chat", "gateway-chat-workers"
                head.append(
                    f"workers @ {c}: 1 worker +TTFE p99 {_f(_added(results, w1, c, 'ttfe_p99'))} ms, "
                    f"transit p99 {_f(_added(results, w1, c, 'transit_p99'))} ms, "
                    f"ok {a['streams_ok']}/{a['streams_planned']}; N workers "
                    f"+TTFE p99 {_f(_added(results, wn, c, 'ttfe_p99'))} ms, "
                    f"transit p99 {_f(_added(results, wn, c, 'transit_p99'))} ms, "
                    f"ok {b['streams_ok']}/{b['streams_planned']}, "
                    f"drop {b['dropped']}, ooo {b['out_of_order']}"
                )
        ms1, msn = one.get("max_sustained"), many.get("max_sustained")
        target(
            f"gateway-chat-workers sustains >= 1.8x the streams one worker sustains: {msn} vs {ms1} "
            "(levels tried are discrete; capped by the highest level run)",
            None if not ms1 or msn is None else msn >= 1.8 * ms1,
        )
    results["headline"] = head
    results["targets"] = targets


def plot(results: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    panels = (
        ("ttfe_p99", "added TTFE p99"),
        ("transit_p50", "added per-event latency p50"),
        ("transit_p99", "added per-event latency p99"),
    )
    for ax, (key, title) in zip(axes, panels, strict=True):
        for name, info in results["contenders"].items():
            if not info.get("baseline") or info.get("baseline") == name or not info.get("runs"):
                continue
            xs, ys = [], []
            for c, run in sorted(info["runs"].items(), key=lambda kv: int(kv[0])):
                v = run.get("added_ms", {}).get(key)
                if v is not None:
                    xs.append(int(c))
                    ys.append(max(v, 0.01))  # log axis: clamp noise-level (<= 0) values to 0.01 ms
            if xs:
                ax.plot(xs, ys, marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("ms (contender minus direct)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    cond = results.get("conditions", {})
    fig.suptitle(
        f"Added latency vs concurrency — {cond.get('cpu', '')}, {cond.get('cores', '')} cores, "
        f"mock {results.get('mock', {})}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "table":
        with open(argv[1]) as f:
            print(table(json.load(f)))
        return 0
    if len(argv) >= 3 and argv[0] == "plot":
        with open(argv[1]) as f:
            plot(json.load(f), argv[2])
        return 0
    sys.stderr.write("usage: report.py table RESULT.json | report.py plot RESULT.json OUT.png\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
