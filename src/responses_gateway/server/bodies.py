"""Request bodies as every JSON endpoint reads them: one parse, one set of limits, one error wording."""

from __future__ import annotations

from typing import Any

import orjson

from ..protocol.request import RequestError, check_nesting
from .errors import HTTPError

__all__ = ["parse_json_body"]


def parse_json_body(raw: bytes) -> Any:
    """The decoded body; HTTP 400 in OpenAI's words if it is not JSON or nests too deep (the depth is
    checked here, before anything serializes it again: orjson refuses past 255 levels)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise HTTPError(
            400,
            "We could not parse the JSON body of your request. The API expects a JSON payload, but "
            "what was sent was not valid JSON.",
        ) from None
    try:
        check_nesting(body)
    except RequestError as exc:
        raise HTTPError.from_request_error(exc) from None
    return body
