"""``presence_penalty`` / ``frequency_penalty``: in the Open Responses spec's create body, sent by the Vercel
AI SDK's Open Responses provider (``presencePenalty`` / ``frequencyPenalty``). They were refused as
``unknown_parameter``; now they are validated, echoed on the Response, passed to the back ends that
have them (Chat Completions, Gemini, an OpenAI passthrough) and refused by name where a back end
cannot apply them (Anthropic, the local model) unless they are 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from responses_gateway.protocol.request import RequestError, parse_request
from responses_gateway.protocol.response import new_response
from responses_gateway.providers.anthropic import AnthropicProvider
from responses_gateway.providers.base import ProviderError
from responses_gateway.providers.gemini import build_gemini_body
from responses_gateway.providers.local import LocalProvider
from responses_gateway.providers.openai_chat import build_chat_body
from responses_gateway.providers.openai_responses import build_responses_body
from responses_gateway.providers.scripted import ScriptedProvider

PENALTIES = {"presence_penalty": 0.5, "frequency_penalty": -0.25}


def _request(**fields: Any) -> Any:
    return parse_request({"model": "m", "input": "hi", **fields})


def test_accepted_and_echoed_on_the_response() -> None:
    req = _request(**PENALTIES)
    assert (req.presence_penalty, req.frequency_penalty) == (0.5, -0.25)
    response = new_response("m", **req.echo())
    assert (response["presence_penalty"], response["frequency_penalty"]) == (0.5, -0.25)
    # Left out: the Response reports OpenAI's default, 0.
    plain = new_response("m", **_request().echo())
    assert (plain["presence_penalty"], plain["frequency_penalty"]) == (0.0, 0.0)
    assert _request(presence_penalty=None).presence_penalty is None


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("presence_penalty", 2.5, "decimal_above_max_value"),
        ("frequency_penalty", -3, "decimal_below_min_value"),
        ("presence_penalty", "0.5", "invalid_type"),
        ("frequency_penalty", True, "invalid_type"),
    ],
)
def test_out_of_range_or_wrong_type_is_refused_by_name(field: str, value: Any, code: str) -> None:
    with pytest.raises(RequestError) as info:
        _request(**{field: value})
    assert info.value.param == field
    assert info.value.code == code


def test_chat_completions_gemini_and_passthrough_get_them() -> None:
    req = _request(**PENALTIES)
    chat = build_chat_body(req)
    assert (chat["presence_penalty"], chat["frequency_penalty"]) == (0.5, -0.25)
    generation = build_gemini_body(req)["generationConfig"]
    assert (generation["presencePenalty"], generation["frequencyPenalty"]) == (0.5, -0.25)
    passthrough = build_responses_body(req)
    assert (passthrough["presence_penalty"], passthrough["frequency_penalty"]) == (0.5, -0.25)
    # Not asked for: not sent.
    assert "presence_penalty" not in build_chat_body(_request())
    assert "generationConfig" not in build_gemini_body(_request())


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_anthropic_and_the_local_model_refuse_them_by_name(field: str) -> None:
    req = _request(**{field: 0.5})
    with pytest.raises(ProviderError) as anthropic:
        AnthropicProvider(api_key="k").check_request(req)
    assert (anthropic.value.status, anthropic.value.param) == (400, field)
    assert "Anthropic" in str(anthropic.value)
    with pytest.raises(ProviderError) as local:
        LocalProvider("/nonexistent.gguf").check_request(req)
    assert (local.value.status, local.value.param) == (400, field)
    # 0 is no penalty at all: accepted everywhere.
    zero = _request(presence_penalty=0, frequency_penalty=0.0)
    AnthropicProvider(api_key="k").check_request(zero)
    LocalProvider("/nonexistent.gguf").check_request(zero)
    assert "presence_penalty" not in AnthropicProvider(api_key="k").build_body(zero)


def test_a_scripted_model_accepts_them() -> None:
    ScriptedProvider([{"message": ["ok"]}]).check_request(_request(**PENALTIES))
