"""What a back end cannot honour is refused at the edge (400 naming the param), never silently dropped."""

from __future__ import annotations

from ..protocol.request import RequestError, ResponseRequest
from ..providers.base import Capabilities

__all__ = ["check_capabilities"]


def _unsupported(param: str, what: str | None = None) -> RequestError:
    subject = f"'{param}'" if what is None else f"'{param}' ({what})"
    return RequestError(f"Unsupported parameter: {subject} is not supported with this model.", param=param)


def check_capabilities(request: ResponseRequest, caps: Capabilities) -> None:
    """Raise RequestError for the first request feature ``caps`` does not cover."""
    if request.stream and not caps.streaming:
        raise _unsupported("stream")
    if request.tools and not caps.tools:
        raise _unsupported("tools")
    for i, tool in enumerate(request.tools):
        if tool["type"] not in caps.tool_types:
            raise _unsupported(f"tools[{i}].type", tool["type"])
    choice = request.tool_choice
    if (isinstance(choice, dict) or choice == "required") and not caps.tools:
        raise _unsupported("tool_choice")
    # A hosted tool forced by type (``{"type": "web_search"}``) needs that tool type.
    forced = choice["type"] if isinstance(choice, dict) else None
    if forced not in (None, "function", "custom", "allowed_tools") and forced not in caps.tool_types:
        raise _unsupported("tool_choice.type", forced)
    reasoning = request.reasoning or {}
    if not caps.reasoning and reasoning.get("effort") not in (None, "none"):
        # An effort asks the model to think, which it cannot. ``summary`` only says how to present
        # reasoning: a model that produces none owes no summary (Codex sends ``{"summary": "auto"}``
        # to every model it has no metadata for), like ``include: ["reasoning.encrypted_content"]``.
        raise _unsupported("reasoning.effort")
    fmt = request.text.get("format", {}).get("type", "text")
    if fmt != "text" and not caps.structured_output:
        raise _unsupported("text.format", fmt)
    if not caps.images:
        for i, item in enumerate(request.input):
            content = item.get("content") if item.get("type") == "message" else item.get("output")
            if not isinstance(content, list):
                continue
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") in ("input_image", "input_file"):
                    field = "content" if item.get("type") == "message" else "output"
                    raise _unsupported(f"input[{i}].{field}[{j}]", part["type"])
