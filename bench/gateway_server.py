"""Stand-in for ``responses-gateway serve --config FILE`` while that option is not wired.

It builds the same objects the CLI will (``GatewayApp`` over a ``ModelRegistry`` of ``OpenAIChatProvider``
/ ``OpenAIResponsesProvider`` from the models file, loaded by ``responses_gateway.config``) and runs them
on uvicorn with the CLI's settings (uvloop, httptools, one worker, no access log). The harness uses
``serve --config`` whenever the installed CLI accepts it, and records which launcher ran in the result.
"""

from __future__ import annotations

import argparse
import resource

import uvicorn

from responses_gateway.config import load_config
from responses_gateway.providers.openai_chat import OpenAIChatProvider
from responses_gateway.providers.openai_responses import OpenAIResponsesProvider
from responses_gateway.providers.transport import Transport
from responses_gateway.server.app import GatewayApp
from responses_gateway.server.config import ServerConfig
from responses_gateway.server.registry import ModelRegistry


def build(path: str, pool_limit: int | None) -> GatewayApp:
    registry = ModelRegistry()
    for model in load_config(path).models:
        base_url = model.base_url or "https://api.openai.com/v1"
        # Default: each provider makes its own Transport, exactly as without this script. --pool-limit is
        # a what-if experiment: the connection pool's size is the first limit on concurrent streams.
        transport = Transport(limit=pool_limit, limit_per_host=pool_limit) if pool_limit else None
        common = {"base_url": base_url, "api_key": model.api_key(), "upstream_model": model.upstream_model}
        if model.provider == "openai-chat":
            registry.add(OpenAIChatProvider(**common, transport=transport), model.name)
        elif model.provider == "openai":
            registry.add(OpenAIResponsesProvider(**common, transport=transport), model.name)
        else:
            raise SystemExit(
                f"gateway_server.py only builds openai-chat and openai models, not {model.provider}"
            )
    return GatewayApp(registry, ServerConfig())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--log-level", default="warning")
    p.add_argument(
        "--pool-limit", type=int, help="what-if: upstream connection pool size (total and per host)"
    )
    a = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvicorn.run(
        build(a.config, a.pool_limit),
        host=a.host,
        port=a.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=a.log_level,
    )


if __name__ == "__main__":
    main()
