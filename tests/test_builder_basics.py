import orjson
import pytest

from responses_gateway.protocol import BuilderError, StreamBuilder, new_response
from responses_gateway.protocol.sse import encode_event
from responses_gateway.protocol.stop import StopScanner


def test_text_message_event_order_and_numbers() -> None:
    b = StreamBuilder(new_response("m"))
    b.start()
    msg = b.open_message()
    b.text_delta(msg, "Hel")
    b.text_delta(msg, "lo")
    b.complete()
    events = b.take()
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == "Hello"
    assert final["output"][0]["status"] == "completed"


def test_delta_after_close_raises() -> None:
    b = StreamBuilder(new_response("m"))
    b.start()
    msg = b.open_message()
    b.close_message(msg)
    with pytest.raises(BuilderError):
        b.text_delta(msg, "late")
    b.complete()
    with pytest.raises(BuilderError):
        b.complete()


@pytest.mark.parametrize("stop", [None, ("lo",)])
def test_a_delta_given_with_its_json_is_the_same_delta(stop: tuple[str, ...] | None) -> None:
    """``text_delta_json`` makes the events ``text_delta`` makes; the frame it keeps is the serialized
    event's, and only when the event went out as given (not with a stop sequence to watch)."""
    runs = []
    for with_json in (False, True):
        b = StreamBuilder(
            new_response("m", response_id="resp_1", created_at=1), id_factory=lambda p: p + "_1"
        )
        b.stop = StopScanner(stop) if stop else None
        b.start()
        msg = b.open_message()
        b.text_delta(msg, "He")  # opens the text part
        events = b.take()
        for piece in ("l", "lo ✓", " wor", "ld"):
            if with_json:
                b.text_delta_json(msg, piece, orjson.dumps(piece))
            else:
                b.text_delta(msg, piece)
            made = b.take()
            events += made
            if with_json and not stop:
                assert b.frame is not None
                assert made == [b.frame[0]]
                assert b.frame[1] == encode_event(made[0])
            else:
                assert b.frame is None
        b.complete()
        runs.append(events + b.take())
    assert runs[0] == runs[1]
