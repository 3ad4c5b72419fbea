"""Tokens per second of the local model: streamed through the gateway over HTTP vs llama-cpp-python directly.

Both sides decode the same prompt greedily with the same context, threads and batch size; the direct
side is llama-cpp-python's own token generator plus per-token detokenization (its leanest streaming
loop). Rates are measured from the first generated token to the last, so prompt evaluation and
model loading are excluded on both sides. The gateway runs in a child process, as in production,
and the two are never measured at the same time (two cores).

    .venv/bin/python bench/local_model.py [--tokens 256] [--runs 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

PROMPT = "Write a detailed essay about the history of the printing press."
MODEL = "gemma-3-270m"


def direct(path: str, tokens: int, runs: int, n_ctx: int, n_threads: int) -> list[float]:
    """llama-cpp-python alone: tokens/s over ``runs`` generations."""
    import llama_cpp

    from responses_gateway.providers.local import _model_params
    from responses_gateway.providers.local_prompt import render_prompt

    with _model_params(extra_buffers=False):
        llm = llama_cpp.Llama(
            path,
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_batch=256,
            n_ubatch=256,
            verbose=False,
        )
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}]
    prompt = llm.tokenize(render_prompt(items).encode(), add_bos=True, special=True)
    rates = []
    for _ in range(runs):
        llm.reset()
        n = 0
        first = last = 0.0
        for token in llm.generate(prompt, top_k=64, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            if llm_is_eog(llm, token):
                break
            llm.detokenize([token])
            last = time.perf_counter()
            if n == 0:
                first = last
            n += 1
            if n >= tokens:
                break
        rates.append((n - 1) / (last - first))
    llm.close()
    return rates


def llm_is_eog(llm: Any, token: int) -> bool:
    from llama_cpp import llama_cpp as capi

    return bool(capi.llama_vocab_is_eog(llm._model.vocab, token))


def gateway(base: str, tokens: int, runs: int) -> list[float]:
    """The gateway: tokens/s of ``response.output_text.delta`` events as a client receives them."""
    body = {"model": MODEL, "input": PROMPT, "stream": True, "temperature": 0, "max_output_tokens": tokens}
    rates = []
    with httpx.Client(timeout=300) as client:
        for _ in range(runs + 1):  # the first run warms the model up and is not counted
            first = last = 0.0
            with client.stream("POST", f"{base}/responses", json=body) as response:
                response.raise_for_status()
                # The client shares the two cores with the model: it only counts delta frames as
                # they arrive and decodes the final event, keeping its own cost out of the measurement.
                received = []
                for chunk in response.iter_raw():
                    if b"event: response.output_text.delta\n" in chunk:
                        last = time.perf_counter()
                        if not first:
                            first = last
                    received.append(chunk)
                raw = b"".join(received)
                terminal = raw[raw.rindex(b"event: response.") :]
                data = terminal.split(b"data: ", 1)[1].split(b"\n", 1)[0]
                output_tokens = json.loads(data)["response"]["usage"]["output_tokens"]
            rates.append((output_tokens - 1) / (last - first))
    return rates[1:]


def serve(port: int, path: str, n_ctx: int, n_threads: int) -> None:
    """Child process: the gateway serving only the local model."""
    import uvicorn

    from responses_gateway.providers.local import LocalProvider
    from responses_gateway.server.app import GatewayApp
    from responses_gateway.server.config import ServerConfig
    from responses_gateway.server.registry import ModelRegistry

    registry = ModelRegistry()
    # Gemma's turn format, as on the direct side: the transcript format (the default for this model)
    # ends answers at a blank line, and this measures the rate over a long answer.
    provider = LocalProvider(path, n_ctx=n_ctx, n_threads=n_threads, prompt_format="gemma")
    registry.add(provider, MODEL, owned_by="local")
    app = GatewayApp(registry, ServerConfig(), preload=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", help="GGUF path (default: the bundled Gemma 3 270M)")
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from responses_gateway.providers.local import ensure_default_model

    path = args.model or str(ensure_default_model())
    if args.serve:
        serve(args.serve, path, args.n_ctx, args.threads)
        return 0

    direct_rates = direct(path, args.tokens, args.runs, args.n_ctx, args.threads)
    port = _free_port()
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(port),
            "--model",
            path,
            "--n-ctx",
            str(args.n_ctx),
            "--threads",
            str(args.threads),
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
    )
    try:
        base = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/models", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise SystemExit("the gateway did not start") from None
                time.sleep(0.2)
        gateway_rates = gateway(base, args.tokens, args.runs)
    finally:
        child.terminate()
        child.wait(10)

    d, g = statistics.median(direct_rates), statistics.median(gateway_rates)
    print(
        f"prompt: {PROMPT!r}, up to {args.tokens} tokens, greedy, {args.threads} threads, "
        f"median of {args.runs}"
    )
    print(f"llama-cpp-python directly : {d:7.1f} tokens/s  {[round(r, 1) for r in direct_rates]}")
    print(f"gateway over HTTP (SSE)   : {g:7.1f} tokens/s  {[round(r, 1) for r in gateway_rates]}")
    print(f"ratio gateway/direct      : {g / d:7.3f}  (target >= 0.95)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
