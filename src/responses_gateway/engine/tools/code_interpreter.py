"""``code_interpreter``, run by the gateway for any model: Python in a sandboxed, persistent kernel.

The model is offered a function ``code_interpreter(code)``; its call is shown to the client as a
``code_interpreter_call`` item whose code streams as the model writes it
(``response.code_interpreter_call_code.delta``). The engine then runs the code in the request's
container (``containers.py``; the kernel is ``sandbox.Kernel``, under bubblewrap), reports
``interpreting`` and ``completed``, and the model gets the logs in its next turn. ``outputs`` (``logs``
and ``image`` entries: matplotlib figures as PNG data URLs) are on the item when the request's
``include`` has ``code_interpreter_call.outputs``, as OpenAI does.

The container: ``{"type": "auto"}`` reuses the live container of the conversation's latest
``code_interpreter_call`` (so variables carry over through ``previous_response_id``), else makes a new
one; a container id names a live container the caller owns.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import stat
from collections.abc import AsyncIterator
from typing import Any

from ...protocol.builder import HostedCall, HostedSpec, Item, StreamBuilder
from ...protocol.json_field import clean_text
from ...protocol.request import RequestError
from ...sandbox import SandboxError
from ..hosted import HostedTool, HostedUse, RunContext
from ..results import Kept, ResultLog
from .containers import MOVED_NOTE, Container, ContainerPool, check_path

__all__ = ["OUTPUTS_INCLUDE", "CodeInterpreter"]

JSON = dict[str, Any]

log = logging.getLogger("responses_gateway.tools")

OUTPUTS_INCLUDE = "code_interpreter_call.outputs"
FUNCTION_NAME = "code_interpreter"
# What the model is told of one call's result at most (the client's ``logs`` are bounded by the sandbox).
_MODEL_RESULT_CHARS = 16_000
_IMAGE_BYTES = 8 << 20  # one figure
_IMAGES_BYTES = 20 << 20  # all the figures of one call (as data URLs)
_MAX_IMAGES = 10
MEMORY_LIMIT = "1g"  # sandbox.Limits.memory_bytes
# A file named in an answer: ``sandbox:/mnt/data/out/a.csv`` or ``/mnt/data/a.csv``.
_MENTION = re.compile(r"(sandbox:)?/mnt/data/([\w\-./]+)")

DESCRIPTION = (
    "Run Python code in a stateful sandbox, like a Jupyter notebook cell: variables, imports and files "
    "persist between calls. Use it for calculations, data analysis and plots. The working directory is "
    "/mnt/data (files there persist; the user's files are there too). numpy, pandas and matplotlib may "
    "be imported; there is no network access. Print what you want to see: stdout, stderr and the value "
    "of the last expression are returned; matplotlib figures left open are saved as PNG images."
)


class CodeInterpreter(HostedTool):
    results: ResultLog
    type = "code_interpreter"
    kind = "code_interpreter_call"
    function_name = FUNCTION_NAME

    def __init__(self, pool: ContainerPool) -> None:
        self.pool = pool
        self.results = ResultLog()

    def unavailable(self) -> str | None:
        return self.pool.unavailable()

    def function(self, config: JSON) -> JSON:
        return {
            "type": "function",
            "name": FUNCTION_NAME,
            "description": DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The Python code to run."}},
                "required": ["code"],
                "additionalProperties": False,
            },
            "strict": True,
        }

    async def use(self, config: JSON, *, param: str, history: list[JSON], ctx: RunContext) -> HostedUse:
        chosen = config.get("container")
        if isinstance(chosen, str):
            container = await self.pool.get(chosen, ctx.owner)
            if container is None:
                raise RequestError(
                    f"No container found with id '{chosen}' (containers expire after "
                    f"{self.pool.idle_minutes:g} idle minutes).",
                    param=f"{param}.container",
                )
            return _Use(self, container, ctx.owner)
        if not isinstance(chosen, dict) or chosen.get("type") != "auto":
            raise RequestError(
                '\'container\' must be a container id or {"type": "auto"}.', param=f"{param}.container"
            )
        file_ids = chosen.get("file_ids") or []
        if not isinstance(file_ids, list) or not all(isinstance(f, str) for f in file_ids):
            raise RequestError(
                "'container.file_ids' must be a list of file ids.", param=f"{param}.container.file_ids"
            )
        if file_ids and self.pool.files is None:
            raise RequestError(
                "container.file_ids needs the Files API, which this gateway serves only with a store.",
                param=f"{param}.container.file_ids",
            )
        memory = chosen.get("memory_limit")
        if memory not in (None, MEMORY_LIMIT):
            raise RequestError(
                f"This gateway's containers have {MEMORY_LIMIT} of memory per process: "
                f"container.memory_limit may only be '{MEMORY_LIMIT}'.",
                param=f"{param}.container.memory_limit",
            )
        container = None
        for item in reversed(history):
            if item.get("type") == "code_interpreter_call":
                cid = item.get("container_id")
                container = await self.pool.get(cid, ctx.owner) if isinstance(cid, str) else None
                break
        if container is None:
            container = await self.pool.new(ctx.owner)
        use = _Use(self, container, ctx.owner)
        try:
            await self.pool.add_files(container, ctx.owner, file_ids)
        except LookupError as exc:
            await use.aclose()
            missing = str(exc.args[0])
            raise RequestError(
                f"No file found with id '{missing}'.",
                param=f"{param}.container.file_ids[{file_ids.index(missing)}]",
            ) from None
        return use

    def history(self, item: JSON, owner: str | None, items: list[JSON]) -> tuple[JSON, JSON] | None:
        item_id = item.get("id")
        code = item.get("code")
        if not isinstance(item_id, str) or not item_id:
            raise RequestError("A code_interpreter_call item needs its 'id'.", param=".id")
        if code is not None and not isinstance(code, str):
            raise RequestError("'code' must be a string.", param=".code")
        kept = self.results.get(owner, item_id)
        call_id, result = (kept.call_id, kept.text) if kept is not None else (item_id, None)
        if result is None:
            outputs = item.get("outputs")
            result = _model_text_from_outputs(outputs) if isinstance(outputs, list) and outputs else None
        if result is None:
            result = "(The output of this call is no longer available.)"
        arguments = json.dumps({"code": code or ""}, ensure_ascii=False)
        call = {"type": "function_call", "call_id": call_id, "name": FUNCTION_NAME, "arguments": arguments}
        return call, {"type": "function_call_output", "call_id": call_id, "output": result}


class _Use(HostedUse):
    tool: CodeInterpreter

    def __init__(self, tool: CodeInterpreter, container: Container, owner: str | None) -> None:
        self.tool = tool
        self.container = container
        self._owner = owner
        container.users += 1  # not expired while this request may use it
        self._held = True

    def spec(self) -> HostedSpec:
        return HostedSpec(
            "code_interpreter_call",
            {"code": "", "container_id": self.container.id, "outputs": None},
            stream_key="code",
        )

    def citations(self, text: str) -> list[JSON]:
        """``container_file_citation`` for each file of the container the answer names
        (``sandbox:/mnt/data/x.csv``, ``/mnt/data/x.csv``), at each place it names it."""
        if "/mnt/data/" not in text:
            return []
        container = self.container
        out: list[JSON] = []
        for match in _MENTION.finditer(text):
            path = match.group(2).rstrip(".,;:!?")
            fid = container.paths.get(path)
            if fid is None:
                continue
            start = match.start()
            out.append(
                {
                    "type": "container_file_citation",
                    "container_id": container.id,
                    "end_index": start + len(match.group(1) or "") + len("/mnt/data/") + len(path),
                    "file_id": fid,
                    "filename": path.rsplit("/", 1)[-1],
                    "start_index": start,
                }
            )
        return out

    def skip(self, call: HostedCall, item: Item, builder: StreamBuilder, why: str) -> None:
        self.tool.results.keep_soon(self._owner, item.id, Kept(call.call_id, why))
        builder.close_tool_call(item, status="incomplete")

    async def run(
        self, call: HostedCall, item: Item, builder: StreamBuilder, ctx: RunContext
    ) -> AsyncIterator[None]:
        pool, results = self.tool.pool, self.tool.results
        builder.tool_progress(item, "interpreting")
        yield
        try:
            code = json.loads(call.arguments, strict=False)["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if not isinstance(code, str) or not code.strip():
            text = 'Error: the call must give Python code as {"code": "..."}.'
            await results.keep(ctx.owner, item.id, Kept(call.call_id, text))
            builder.close_tool_call(item, status="failed", outputs=None)
            yield
            return
        container = self.container
        result = None
        failure = None
        async with container.lock:
            try:
                kernel = await pool.kernel(container)
                result = await kernel.run(code)
            except (SandboxError, RuntimeError) as exc:  # could not start, or expired meanwhile
                failure = str(exc)
            pool.touch(container)
        if result is None:
            log.warning("container %s: the sandbox failed: %s", container.id, failure)
            failed = f"Error: the sandbox failed ({failure})."
            await results.keep(ctx.owner, item.id, Kept(call.call_id, failed))
            builder.close_tool_call(item, status="failed", outputs=None)
            yield
            return
        images = await asyncio.to_thread(_read_images, container, result.images)
        logs = clean_text(result.logs)
        outputs: list[JSON] = []
        if logs:
            outputs.append({"type": "logs", "logs": logs})
        outputs.extend({"type": "image", "url": url} for _, url in images)
        error = None if result.error is None else clean_text(result.error)
        files = [clean_text(name) for name in result.files_written]
        for name in (*result.files_written, *result.images):
            if check_path(name) is None:
                container.file_for(name, "assistant")
        text = _model_text(logs, error, files, [name for name, _ in images])
        if container.moved:
            container.moved = False
            text = f"{MOVED_NOTE}\n{text}"
        await pool.sync(container)
        await results.keep(ctx.owner, item.id, Kept(call.call_id, text))
        shown = outputs if OUTPUTS_INCLUDE in ctx.include else None
        builder.close_tool_call(item, status="completed", outputs=shown)
        yield

    async def aclose(self) -> None:
        if self._held:
            self._held = False
            self.container.users -= 1


def _read_images(container: Container, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """The figures a call saved, as data URLs: at most ``_MAX_IMAGES``, ``_IMAGES_BYTES`` in all."""
    out: list[tuple[str, str]] = []
    budget = _IMAGES_BYTES
    for name in names[:_MAX_IMAGES]:
        url = _data_url(container, name, budget)
        if url is not None:
            out.append((name, url))
            budget -= len(url)
    return out


def _data_url(container: Container, name: str, budget: int) -> str | None:
    """A figure the kernel saved, as a data URL. The name comes from the sandbox, which is untrusted:
    only a plain PNG file directly in the container's directory is read, never through a link."""
    if "/" in name or name.startswith(".") or not name.endswith(".png"):
        return None
    limit = min(_IMAGE_BYTES, budget * 3 // 4)
    try:
        fd = os.open(container.directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = file.read(limit + 1)
    if len(data) > limit or not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _model_text(logs: str, error: str | None, files: list[str], images: list[str]) -> str:
    """One call's result as the model reads it in the next turn."""
    parts = [logs if logs else "(no output)"]
    if error is not None and error not in logs:
        parts.append(f"Error: {error}")
    if images:
        parts.append("Figures saved: " + ", ".join(f"/mnt/data/{n}" for n in images))
    if files:
        parts.append("Files written: " + ", ".join(f"/mnt/data/{n}" for n in files))
    text = "\n".join(parts)
    if len(text) > _MODEL_RESULT_CHARS:
        half = _MODEL_RESULT_CHARS // 2
        text = f"{text[:half]}\n[… {len(text) - 2 * half} characters cut …]\n{text[-half:]}"
    return text


def _model_text_from_outputs(outputs: list[Any]) -> str:
    entries = [o for o in outputs if isinstance(o, dict)]
    logs = "".join(o["logs"] for o in entries if o.get("type") == "logs" and isinstance(o.get("logs"), str))
    images = sum(1 for o in entries if o.get("type") == "image")
    text = logs or "(no output)"
    return text + (f"\n({images} figure(s) shown to the user)" if images else "")
