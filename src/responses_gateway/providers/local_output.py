"""What the embedded model writes, on its way out of the worker thread: where an answer ends.

- :class:`TextOut`: free text, cut at the prompt format's stop strings (a base model's transcript
  answer ends at a blank line) and at the call marker (a call written into a text answer is not a
  call, and its markup is not text); the text is held back only while it could be the start of one.
- :class:`CallsOut`: calls; the first streams as it is written, each further one is held until it
  is complete and, if it repeats an earlier call word for word, dropped and the answer ended (a small
  model that has called once tends to call again the same way).

Each ``feed`` returns False when the answer is complete; the worker then stops generating.
"""

from __future__ import annotations

from collections.abc import Callable

from .local_grammar import CALL_CLOSE

__all__ = ["CallsOut", "TextOut", "passing"]


def passing(post: Callable[[str], None]) -> Callable[[str], bool]:
    """``post`` as a sink that never ends the answer (a JSON answer: the grammar ends it)."""

    def sink(text: str) -> bool:
        post(text)
        return True

    return sink


class TextOut:
    """Free text on its way out: held back while it could be the start of a stop string, cut at one.

    ``feed`` returns False once a stop string is complete (the text before it has been posted).
    """

    __slots__ = ("_held", "_post", "_started", "_stops", "_strip")

    def __init__(self, post: Callable[[str], None], stops: tuple[str, ...], strip_leading: bool) -> None:
        self._post = post
        self._stops = stops
        self._strip = strip_leading
        self._started = not strip_leading
        self._held = ""

    def feed(self, text: str) -> bool:
        if not self._started:
            text = text.lstrip()
            if not text:
                return True
            self._started = True
        if not self._stops:
            self._post(text)
            return True
        held = self._held + text
        cut = min((i for i in (held.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            if cut:
                self._post(held[:cut])
            return False
        # Hold the longest tail that a stop string starts with; post the rest.
        keep = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(held)), keep, -1):
                if held.endswith(stop[:n]):
                    keep = n
                    break
        self._held = held[len(held) - keep :]
        if len(held) > keep:
            self._post(held[: len(held) - keep])
        return True

    def flush(self) -> None:
        """The answer ended otherwise (end of turn, output limit): what was held is text after all."""
        if self._held:
            self._post(self._held)
            self._held = ""


class CallsOut:
    """Calls on their way out: the first streams as written; each further one is held until complete
    and dropped, ending the answer, if it repeats an earlier call word for word."""

    __slots__ = ("_buf", "_done", "_post", "boundary")

    def __init__(self, post: Callable[[str], None]) -> None:
        self._post = post
        self._buf = ""
        self._done: list[str] = []
        # True right after a call closed, nothing written since: where the model either ends its
        # answer or starts another call (the worker asks which it prefers).
        self.boundary = False

    def feed(self, text: str) -> bool:
        self.boundary = False
        if not self._done:
            before = len(self._buf)
            self._buf += text
            end = self._buf.find(CALL_CLOSE)
            if end < 0:
                self._post(text)  # the first call streams
                return True
            end += len(CALL_CLOSE)
            self._post(text[: end - before])
            self._done.append(self._buf[:end].strip())
            text, self._buf = self._buf[end:], ""
            if not text:
                self.boundary = True
                return True
        self._buf += text
        while (end := self._buf.find(CALL_CLOSE)) >= 0:
            end += len(CALL_CLOSE)
            call, self._buf = self._buf[:end], self._buf[end:]
            if call.strip() in self._done:
                self._buf = ""
                return False
            self._done.append(call.strip())
            self._post(call)
            self.boundary = not self._buf
        return True

    def flush(self) -> None:
        """An unfinished further call (the output limit cut it): out as it is."""
        if self._buf and self._done:
            self._post(self._buf)
        self._buf = ""
