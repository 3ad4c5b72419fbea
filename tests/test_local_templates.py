"""Any GGUF gets its own chat template: selection from the file's metadata, rendering, start-up checks.

The files are written here with the ``gguf`` package (metadata and one tiny tensor, no real weights):
enough to test what the gateway reads from a file and which format it picks, without loading a model.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from gguf_files import QWEN, write_gguf
from responses_gateway.providers.gguf_file import ModelFileError, read_gguf
from responses_gateway.providers.local_prompt import render_prompt
from responses_gateway.providers.local_template import (
    GemmaFormat,
    JinjaFormat,
    TranscriptFormat,
    select_format,
)
from serve_process import GATEWAY, free_port, serve

# Shapes of the templates real GGUFs carry (abridged to what the rendering depends on).
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# Mistral's older template: no system role, strict alternation, both enforced with raise_exception.
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

CONVERSATION: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "18C"},
]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city":"Paris"}}</tool_call>'
RESULT = "Result of get_weather:\n```tool_output\n18C\n```"


def render(path: Path, eos: str = "</s>") -> str:
    fmt = select_format(read_gguf(path), eos_token=eos)
    return fmt.render(CONVERSATION, instructions="Be brief.", preamble=None)


def test_metadata_is_read_past_the_vocabulary(tmp_path: Path) -> None:
    info = read_gguf(write_gguf(tmp_path / "q.gguf", "qwen2", template=QWEN, context=32768))
    assert (info.architecture, info.context_length, info.name) == ("qwen2", 32768, "tiny qwen2")
    assert info.chat_template == QWEN


def test_qwen_chatml_template_from_metadata(tmp_path: Path) -> None:
    text = render(write_gguf(tmp_path / "q.gguf", "qwen2", template=QWEN))
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        f"<|im_start|>assistant\n{CALL}<|im_end|>\n"
        f"<|im_start|>user\n{RESULT}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_llama3_template_and_bos_left_to_the_tokenizer(tmp_path: Path) -> None:
    text = render(write_gguf(tmp_path / "l.gguf", "llama", template=LLAMA3))
    # {{ bos_token }} renders empty: the tokenizer adds BOS, and twice would hurt.
    assert text.startswith("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
    assert text.endswith(
        f"<|start_header_id|>user<|end_header_id|>\n\n{RESULT}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_a_template_without_system_role_gets_it_folded_into_the_first_turn(tmp_path: Path) -> None:
    text = render(write_gguf(tmp_path / "m.gguf", "llama", template=MISTRAL))
    assert text == (
        "[INST] Be brief.\n\nHi [/INST]Hello!</s>"
        "[INST] Weather in Paris? [/INST]" + CALL + "</s>"
        f"[INST] {RESULT} [/INST]"
    )


def test_a_file_without_a_template_is_prompted_as_a_base_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "responses_gateway.local"):
        fmt = select_format(read_gguf(write_gguf(tmp_path / "g.gguf", "gemma3")))
    assert isinstance(fmt, TranscriptFormat)
    assert "g.gguf has no chat template" in caplog.text
    text = fmt.render(CONVERSATION, instructions="Be brief.")
    assert text.startswith("Be brief.\n\nAnswer each question briefly and accurately.\n\nQuestion: What is")
    assert text.endswith(
        "Question: Hi\n\nAnswer: Hello!\n\nQuestion: Weather in Paris?\n\n"
        f"Answer: {CALL}\n\nQuestion: {RESULT}\n\nAnswer:"
    )
    assert fmt.stops[0] == "\n\n" and fmt.strip_leading


def test_a_models_file_can_force_a_format(tmp_path: Path) -> None:
    info = read_gguf(write_gguf(tmp_path / "q.gguf", "qwen2", template=QWEN))
    assert isinstance(select_format(info, choice="transcript"), TranscriptFormat)
    gemma = select_format(info, choice="gemma")
    assert isinstance(gemma, GemmaFormat)
    assert gemma.render(CONVERSATION, instructions="Be brief.") == render_prompt(
        CONVERSATION, instructions="Be brief."
    )
    chatml = select_format(info, choice="chatml")
    assert isinstance(chatml, JinjaFormat) and chatml.name == "chatml"
    assert chatml.render(CONVERSATION[:1]).endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    bare = read_gguf(write_gguf(tmp_path / "b.gguf", "llama"))
    with pytest.raises(ValueError, match=r"b\.gguf has no chat template"):
        select_format(bare, choice="template")


def test_a_template_is_sandboxed(tmp_path: Path) -> None:
    hostile = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    fmt = select_format(read_gguf(write_gguf(tmp_path / "h.gguf", "llama", template=hostile)))
    with pytest.raises(ValueError, match="chat template refused"):
        fmt.render(CONVERSATION[:1])


def test_bad_model_files_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="no such file"):
        read_gguf(tmp_path / "missing.gguf")
    with pytest.raises(ModelFileError, match="not a file"):
        read_gguf(tmp_path)
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model, but it is long enough to be read as one")
    with pytest.raises(ModelFileError, match="not a GGUF model file"):
        read_gguf(text)
    good = write_gguf(tmp_path / "q.gguf", "qwen2", template=QWEN).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[:200])  # ends inside the metadata
    with pytest.raises(ModelFileError, match="damaged GGUF file"):
        read_gguf(cut)


def _serve_fails(tmp_path: Path, *args: str) -> str:
    done = subprocess.run(
        [str(GATEWAY), "serve", "--port", str(free_port()), "--data-dir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "serving" not in output and "Traceback" not in output
    return output


def test_a_bad_model_path_stops_start_up(tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    assert f"{missing}: no such file" in _serve_fails(tmp_path, "--model-path", str(missing))
    notes = tmp_path / "notes.gguf"
    notes.write_text("x" * 100)
    assert "not a GGUF model file" in _serve_fails(tmp_path, "--model-path", str(notes))
    config = tmp_path / "models.yaml"
    config.write_text(f"models:\n  - name: mine\n    provider: local\n    model_path: {notes}\n")
    out = _serve_fails(tmp_path, "--config", str(config))
    assert "models.yaml:" in out and "not a GGUF model file" in out


def test_models_lists_local_context_sizes(tmp_path: Path) -> None:
    qwen = write_gguf(tmp_path / "qwen.gguf", "qwen2", template=QWEN, context=32768)
    config = tmp_path / "models.yaml"
    config.write_text(
        "models:\n  - name: qwen-tiny\n    provider: local\n"
        f"    model_path: {qwen}\n    options: {{n_ctx: 2048}}\n"
    )
    served = serve(tmp_path, "--config", str(config), "--model-path", str(qwen))
    try:
        models = {m["id"]: m for m in httpx.get(f"{served.base_url}/models", timeout=10).json()["data"]}
    finally:
        served.proc.terminate()
        served.proc.wait(10)
    assert models["qwen-tiny"]["context_length"] == 2048
    assert models["qwen-tiny"]["trained_context_length"] == 32768
    # The embedded model name, served from --model-path: the default context, the file's trained one.
    assert models["gemma-3-270m"]["context_length"] == 16384
    assert models["gemma-3-270m"]["trained_context_length"] == 32768
