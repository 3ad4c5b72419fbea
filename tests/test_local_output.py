"""Where the embedded model's answer ends (providers/local_output.py), at every split of the stream."""

from __future__ import annotations

import pytest

from responses_gateway.providers.local_grammar import CALL_OPEN
from responses_gateway.providers.local_output import CallsOut, TextOut

STOPS = ("\n\n", "\nQuestion:", CALL_OPEN)


def run_text(text: str, cuts: list[int], *, strip: bool = True) -> tuple[str, bool]:
    """Feed ``text`` split at ``cuts``; what was posted, and whether a stop ended it."""
    posted: list[str] = []
    out = TextOut(posted.append, STOPS, strip)
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    for piece in pieces:
        if piece and not out.feed(piece):
            return "".join(posted), True
    out.flush()
    return "".join(posted), False


@pytest.mark.parametrize(
    ("text", "want", "stopped"),
    [
        (" Paris.\n\nQuestion: next", "Paris.", True),
        (" Paris.\nQuestion: next", "Paris.", True),
        ("\n Rome.", "Rome.", False),  # leading whitespace is not the answer
        ("one\ntwo\nthree", "one\ntwo\nthree", False),  # single line breaks are text
        ("It is 18C. <tool_call>{...}", "It is 18C. ", True),  # call markup never reaches the text
        ("a <tool> b\nQuest", "a <tool> b\nQuest", False),  # partial stops that never complete
    ],
)
def test_text_stops_at_every_split(text: str, want: str, stopped: bool) -> None:
    for a in range(len(text) + 1):
        for b in range(a, len(text) + 1):
            assert run_text(text, [a, b]) == (want, stopped), (a, b)


def test_without_stops_or_stripping_text_passes_through() -> None:
    posted: list[str] = []
    out = TextOut(posted.append, (), False)
    assert out.feed(" a\n\nb") and out.feed("c")
    out.flush()
    assert posted == [" a\n\nb", "c"]


CALL = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
OTHER = '<tool_call>{"name": "f", "arguments": {"x": 2}}</tool_call>'


def run_calls(text: str, size: int) -> tuple[list[str], bool]:
    posted: list[str] = []
    out = CallsOut(posted.append)
    for i in range(0, len(text), size):
        if not out.feed(text[i : i + size]):
            return posted, True
    out.flush()
    return posted, False


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_a_repeated_call_ends_the_answer(size: int) -> None:
    posted, stopped = run_calls(f"{CALL}\n{CALL}\n{OTHER}", size)
    assert "".join(posted) == CALL and stopped


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_different_calls_all_go_out_and_only_the_first_streams(size: int) -> None:
    posted, stopped = run_calls(f"{CALL}\n{OTHER}", size)
    assert "".join(posted) == f"{CALL}\n{OTHER}" and not stopped
    assert posted[-1] == f"\n{OTHER}"  # the second call is held until complete, then sent whole
    if size == 1:
        assert len(posted) == len(CALL) + 1  # the first streamed character by character


def test_a_further_call_cut_by_the_output_limit_still_goes_out() -> None:
    posted, stopped = run_calls(f'{CALL}\n<tool_call>{{"name": "f"', 4)
    assert "".join(posted) == f'{CALL}\n<tool_call>{{"name": "f"' and not stopped


def test_the_boundary_after_each_call_is_known() -> None:
    posted: list[str] = []
    out = CallsOut(posted.append)
    assert not out.boundary
    out.feed(CALL[:-3])
    assert not out.boundary
    out.feed(CALL[-3:])
    assert out.boundary  # the model may end here or start another call
    out.feed("\n<tool_call>")
    assert not out.boundary
    out.feed(OTHER[len("<tool_call>") :])
    assert out.boundary and "".join(posted) == f"{CALL}\n{OTHER}"
