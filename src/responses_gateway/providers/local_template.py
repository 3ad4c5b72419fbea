"""Which prompt format a GGUF gets, read from the file's own metadata, and checked at start-up.

A GGUF chat model carries its chat template (``tokenizer.chat_template``, a Jinja template in Hugging
Face's conventions) in its metadata: Qwen's ChatML, Llama 3's headers, Mistral's ``[INST]``, Gemma's
turns… The embedded model renders a request with that template (in Jinja's sandbox), so any GGUF a
user has is prompted the way it was trained. A file without a template is taken for a base model
(the bundled Gemma 3 270M is one) and prompted with a question-and-answer transcript it continues
(:class:`TranscriptFormat`), whose answers end at a blank line. A models file can force a format
(``prompt_format``: ``template``, ``transcript``, ``gemma``, ``chatml``).

Every format sees the same conversation: ``local_prompt.conversation`` (instructions, system and
developer text, the tool list, user and assistant turns with calls written in the grammar's syntax).
Templates that insist on strict user/assistant alternation or refuse a system message (several
Mistral and Gemma templates ``raise_exception``) get consecutive turns merged and the system text
folded into the first user turn, and are rendered again.

The metadata is read by ``gguf_file.read_gguf``, which ``serve`` also uses to check a model file
before it announces anything.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Protocol

from .gguf_file import GGUFInfo
from .local_prompt import Turn, conversation, merge_turns, render_prompt

JSON = dict[str, Any]

__all__ = [
    "CHATML",
    "GemmaFormat",
    "JinjaFormat",
    "PromptFormat",
    "TranscriptFormat",
    "select_format",
]

log = logging.getLogger("responses_gateway.local")

# What llama.cpp uses for a model without a template.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class PromptFormat(Protocol):
    """Renders a request as the prompt text the model continues (ending with an open assistant turn).

    ``stops``: text that ends a free-text answer (not itself part of it); ``strip_leading``: whitespace
    the model writes first (after ``Answer:``) is not part of the answer.
    """

    name: str
    stops: tuple[str, ...]
    strip_leading: bool

    def render(
        self, items: list[JSON], *, instructions: str | None = None, preamble: str | None = None
    ) -> str: ...


class GemmaFormat:
    """Gemma's turns, written out (the bundled model's GGUF carries no template)."""

    name = "gemma (built in)"
    stops: tuple[str, ...] = ()
    strip_leading = False

    def render(
        self, items: list[JSON], *, instructions: str | None = None, preamble: str | None = None
    ) -> str:
        return render_prompt(items, instructions=instructions, preamble=preamble)


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class JinjaFormat:
    """A Hugging Face chat template (from the GGUF's metadata), rendered in Jinja's sandbox.

    ``bos_token`` renders empty: the tokenizer adds BOS itself when the model wants one, and a template
    that writes ``{{ bos_token }}`` would otherwise give it twice.
    """

    stops: tuple[str, ...] = ()
    strip_leading = False

    def __init__(self, source: str, *, name: str = "gguf chat template", eos_token: str = "") -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self.template = env.from_string(source)  # a syntax error surfaces here, at start-up
        self.name = name
        self._eos = eos_token

    def _messages(self, system: str, turns: list[Turn], *, fold_system: bool) -> list[JSON]:
        merged: list[JSON] = []
        for role, text in turns:
            wire = "assistant" if role == "model" else "user"
            if merged and merged[-1]["role"] == wire:
                merged[-1]["content"] += "\n\n" + text
            else:
                merged.append({"role": wire, "content": text})
        if not merged or merged[0]["role"] != "user":
            merged.insert(0, {"role": "user", "content": ""})
        if system and fold_system:
            first = merged[0]["content"]
            merged[0]["content"] = f"{system}\n\n{first}" if first else system
        elif system:
            merged.insert(0, {"role": "system", "content": system})
        return merged

    def render(
        self, items: list[JSON], *, instructions: str | None = None, preamble: str | None = None
    ) -> str:
        from jinja2.exceptions import TemplateError

        system, turns = conversation(items, instructions=instructions, preamble=preamble)
        last: TemplateError | None = None
        for fold in (False, True):
            messages = self._messages(system, turns, fold_system=fold)
            try:
                return str(
                    self.template.render(
                        messages=messages,
                        add_generation_prompt=True,
                        bos_token="",
                        eos_token=self._eos,
                        tools=None,
                    )
                )
            except TemplateError as exc:
                last = exc
        raise ValueError(f"the model's chat template refused the conversation: {last}")


# The worked examples a base model continues from: short questions, short answers, a blank line after each.
_EXAMPLES = (
    ("What is the capital of Italy?", "Rome."),
    ("How many legs does a spider have?", "Eight."),
    ("What is the largest planet in the solar system?", "Jupiter."),
)
_TRANSCRIPT_HEAD = "Answer each question briefly and accurately."


class TranscriptFormat:
    """A base model's prompt: a question-and-answer transcript it continues, with worked examples.

    A base model (the bundled Gemma 3 270M is one: its GGUF has no chat template) was never trained on
    chat turns; given Gemma's turn markers it echoes the question and rambles (docs/local-model.md has
    the figures). What it has seen plenty of is text like this transcript: after ``Answer:`` it writes a
    short answer, then a blank line, which ends the answer. The system text (instructions, the tool
    list) goes first; tool results come back as the next question.
    """

    name = "question-and-answer transcript (base model)"
    stops: tuple[str, ...] = ("\n\n", "\nQuestion:", "\nAnswer:")
    strip_leading = True

    def render(
        self, items: list[JSON], *, instructions: str | None = None, preamble: str | None = None
    ) -> str:
        system, turns = conversation(items, instructions=instructions, preamble=preamble)
        out = [f"{system}\n\n" if system else "", f"{_TRANSCRIPT_HEAD}\n\n"]
        for question, answer in _EXAMPLES:
            out.append(f"Question: {question}\nAnswer: {answer}\n\n")
        roles, merged = merge_turns(turns)
        for role, texts in zip(roles, merged, strict=True):
            label = "Answer" if role == "model" else "Question"
            out.append(f"{label}: {chr(10).join(texts).strip()}\n\n")
        if roles and roles[-1] == "model":
            out.append("Question: Go on.\n\n")
        out.append("Answer:")
        return "".join(out)


def select_format(info: GGUFInfo, *, eos_token: str = "", choice: str = "auto") -> PromptFormat:
    """The prompt format for a model file.

    ``auto``: the GGUF's own chat template; without one the model is taken for a base model and
    prompted with a transcript. ``template``, ``transcript``, ``gemma``, ``chatml`` force one (a
    models file's ``prompt_format`` option). ``eos_token`` is the model's end-of-sequence text, for
    templates that write it.
    """
    if choice == "transcript":
        return TranscriptFormat()
    if choice == "gemma":
        return GemmaFormat()
    if choice == "chatml":
        return JinjaFormat(CHATML, name="chatml", eos_token=eos_token)
    if info.chat_template:
        return JinjaFormat(info.chat_template, eos_token=eos_token)
    if choice == "template":
        raise ValueError(f"{info.path.name} has no chat template in its metadata (prompt_format: template)")
    log.info("%s has no chat template in its metadata: prompting it as a base model", info.path.name)
    return TranscriptFormat()
