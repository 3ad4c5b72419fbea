import pytest

from responses_gateway.protocol import BuilderError, StreamBuilder, new_response


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
