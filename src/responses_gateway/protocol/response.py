"""The Response object: every field present, nullable ones as null, as OpenAI returns it."""

from __future__ import annotations

import os
import time
from typing import Any

JSON = dict[str, Any]

# Prefixes OpenAI uses; clients key on some of them (Codex, the Vercel AI SDK), so keep them.
ID_PREFIXES = {
    "response": "resp",
    "message": "msg",
    "reasoning": "rs",
    "function_call": "fc",
    "custom_tool_call": "ctc",
    "web_search_call": "ws",
    "file_search_call": "fs",
    "code_interpreter_call": "ci",
    "image_generation_call": "ig",
    "mcp_call": "mcp",
    "mcp_list_tools": "mcpl",
    "mcp_approval_request": "mcpr",
    "call": "call",
    "conversation": "conv",
}


def new_id(prefix: str) -> str:
    """A short, unique, URL-safe id such as ``msg_6927f0c1…``: 24 hex digits, the creation time in
    seconds (8, as OpenAI's ids begin) then 64 random bits. Ids made together sort together, so a
    store's indexes keyed on them (responses, their events and items) take new rows in the same
    few pages instead of one page per row anywhere in the index."""
    return f"{prefix}_{int(time.time()) & 0xFFFFFFFF:08x}{os.urandom(8).hex()}"


def empty_usage() -> JSON:
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }


def make_usage(
    input_tokens: int,
    output_tokens: int,
    *,
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
    cache_write_tokens: int = 0,
) -> JSON:
    """Usage with integer counts and both detail objects, as Codex requires.

    ``cache_write_tokens`` is what OpenAI now sends and what the openai SDK's ``ResponseUsage`` requires.
    """
    return {
        "input_tokens": int(input_tokens),
        "input_tokens_details": {
            "cache_write_tokens": int(cache_write_tokens),
            "cached_tokens": int(cached_tokens),
        },
        "output_tokens": int(output_tokens),
        "output_tokens_details": {"reasoning_tokens": int(reasoning_tokens)},
        "total_tokens": int(input_tokens) + int(output_tokens),
    }


# Request fields echoed on the Response, with the value OpenAI reports when the request omits them.
ECHOED_DEFAULTS: dict[str, Any] = {
    "background": False,
    "conversation": None,
    "frequency_penalty": 0.0,
    "instructions": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "presence_penalty": 0.0,
    "previous_response_id": None,
    "prompt": None,
    "prompt_cache_key": None,
    "prompt_cache_retention": None,
    "reasoning": {"effort": None, "summary": None},
    "safety_identifier": None,
    "service_tier": "default",
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "tool_choice": "auto",
    "tools": [],
    "top_logprobs": 0,
    "top_p": 1.0,
    "truncation": "disabled",
    "user": None,
}


_ECHOED = frozenset(ECHOED_DEFAULTS)
# The echoed fields whose default is a container (a dict or list, copied into each Response).
_CONTAINER_DEFAULTS = tuple(k for k, v in ECHOED_DEFAULTS.items() if isinstance(v, dict | list))


def new_response(
    model: str,
    *,
    response_id: str | None = None,
    created_at: int | None = None,
    **echo: Any,
) -> JSON:
    """A fresh ``in_progress`` Response with every key present.

    ``echo`` holds request fields to report back (``instructions``, ``tools``, ``temperature``…);
    a value of ``None`` falls back to OpenAI's default for that field.
    """
    if not _ECHOED.issuperset(echo):
        unknown = set(echo) - _ECHOED
        raise TypeError(f"not a Response field: {', '.join(sorted(unknown))}")
    # Every key in its place (the fixed ones, then the echoed ones in ECHOED_DEFAULTS' order), the
    # defaults first; then the values given. Containers are copied: a Response shares none with the
    # defaults or the caller.
    response: JSON = {
        "id": response_id or new_id("resp"),
        "object": "response",
        "created_at": int(time.time()) if created_at is None else created_at,
        "status": "in_progress",
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "usage": None,
        **ECHOED_DEFAULTS,
    }
    for key in _CONTAINER_DEFAULTS:
        if echo.get(key) is None:
            default = response[key]
            response[key] = dict(default) if isinstance(default, dict) else list(default)
    for key, value in echo.items():
        if value is None:
            continue
        if isinstance(value, dict):
            value = dict(value)
        elif isinstance(value, list):
            value = list(value)
        response[key] = value
    return response
