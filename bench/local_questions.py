"""How sane the embedded model's answers are: a small question set, scored, through the gateway over HTTP.

    .venv/bin/python bench/local_questions.py [--runs 3] [--temperature 1.0] [--model-path PATH]

Starts ``responses-gateway serve`` (this checkout) with the embedded model, asks every question of
``bench/local_questions.json`` as a client would (no ``max_output_tokens``: the gateway's default
applies), and prints, per category and over ``--runs`` runs with fresh sampling seeds:

- factual: exact match (the answer contains an expected word), answers that ended by themselves
  (``completed``, not cut at the output limit), short answers (at most 30 words), echoes (the answer
  repeats the question), mean output tokens;
- json: valid JSON that validates against the schema, and completed;
- tools, ``required``: exactly one call, with a declared name and arguments valid for its schema;
  duplicate calls (the same call twice in one answer);
- tools, ``auto``: text that carries call markup (``<tool_call>``).

A benchmark, not a test: it prints numbers (docs/local-model.md records them before and after a
change); nothing fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema

HERE = Path(__file__).parent
MODEL = "gemma-3-270m"
JSON = dict[str, Any]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_gateway(model_path: str | None, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    exe = Path(sys.executable).parent / "responses-gateway"
    args = [str(exe), "serve", "--port", str(port), "--store", "none", "--preload", "--log-level", "warning"]
    args += ["--data-dir", str(workdir)]
    if model_path:
        args += ["--model-path", model_path]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RG_")}
    proc = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the gateway did not start")


def ask(client: httpx.Client, base: str, body: JSON) -> JSON:
    got = client.post(f"{base}/responses", json={"model": MODEL, **body}, timeout=300)
    got.raise_for_status()
    result: JSON = got.json()
    return result


def texts(response: JSON) -> str:
    return "".join(
        part.get("text", "")
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def calls(response: JSON) -> list[JSON]:
    return [item for item in response["output"] if item["type"] == "function_call"]


def _word_match(answer: str, expected: list[str]) -> bool:
    return any(re.search(rf"(?<![\w]){re.escape(e)}(?![\w])", answer, re.I) for e in expected)


def run_once(client: httpx.Client, base: str, data: JSON, temperature: float | None) -> dict[str, float]:
    extra: JSON = {} if temperature is None else {"temperature": temperature}
    scores: dict[str, list[float]] = {}

    def score(name: str, value: float) -> None:
        scores.setdefault(name, []).append(value)

    for case in data["factual"]:
        r = ask(client, base, {"input": case["q"], **extra})
        answer = texts(r)
        score("factual: exact match", _word_match(answer, case["expect"]))
        score("factual: ended by itself", r["status"] == "completed")
        score("factual: short (<= 30 words)", len(answer.split()) <= 30)
        score("factual: echoes the question", case["q"].lower().rstrip("?.") in answer.lower())
        score("factual: output tokens (mean)", r["usage"]["output_tokens"])
    for case in data["json"]:
        fmt = {"type": "json_schema", "name": "answer", "schema": case["schema"], "strict": True}
        r = ask(client, base, {"input": case["q"], "text": {"format": fmt}, **extra})
        ok = False
        try:
            jsonschema.validate(json.loads(texts(r)), case["schema"])
            ok = r["status"] == "completed"
        except (ValueError, jsonschema.ValidationError):
            pass
        score("json: valid and complete", ok)
    tools = data["tool_definitions"]
    by_name = {t["name"]: t for t in tools}
    for case in data["tools"]:
        r = ask(client, base, {"input": case["q"], "tools": tools, "tool_choice": case["choice"], **extra})
        made = calls(r)
        if case["choice"] == "required":
            valid = len(made) == 1 and made[0]["name"] in by_name
            if valid:
                try:
                    jsonschema.validate(
                        json.loads(made[0]["arguments"]), by_name[made[0]["name"]]["parameters"]
                    )
                except (ValueError, jsonschema.ValidationError):
                    valid = False
            score("tools required: exactly one valid call", valid)
            keys = [(c["name"], c["arguments"]) for c in made]
            score("tools required: duplicate calls", len(keys) != len(set(keys)))
        else:
            score("tools auto: call markup in text", "<tool_call>" in texts(r) or "</tool_call>" in texts(r))
    return {name: statistics.fmean(values) for name, values in scores.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--temperature", type=float, default=None, help="sent with every request (default: unset)"
    )
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--workdir", default=str(HERE / "results" / "local-questions"))
    args = parser.parse_args()
    data = json.loads((HERE / "local_questions.json").read_text())
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model_path = args.model_path
    if model_path is None:
        from responses_gateway.providers.local import ensure_default_model

        model_path = str(ensure_default_model())
    proc, base = start_gateway(model_path, workdir)
    runs: list[dict[str, float]] = []
    try:
        with httpx.Client() as client:
            for i in range(args.runs):
                started = time.monotonic()
                runs.append(run_once(client, base, data, args.temperature))
                print(f"run {i + 1}/{args.runs}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(10)
    temperature = "unset (the gateway's default)" if args.temperature is None else args.temperature
    print(
        f"{len(data['factual'])} factual, {len(data['json'])} json, {len(data['tools'])} tool questions; "
        f"{args.runs} runs; temperature {temperature}"
    )
    for name in runs[0]:
        values = [r[name] for r in runs]
        mean = statistics.fmean(values)
        shown = f"{mean:6.1f}" if "mean" in name else f"{100 * mean:5.0f} %"
        spread = f"(runs: {', '.join(f'{v:.2f}' for v in values)})"
        print(f"  {name:40s} {shown}  {spread}")


if __name__ == "__main__":
    main()
