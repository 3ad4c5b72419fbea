"""GGUF files written for tests: metadata and one tiny tensor, no real weights (the ``gguf`` package)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

# Qwen's ChatML template, abridged to what rendering depends on.
QWEN = (
    "{%- for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{%- endfor %}{%- if add_generation_prompt %}{{'<|im_start|>assistant\\n'}}"
    "{%- endif %}"
)


def write_gguf(path: Path, arch: str, *, template: str | None = None, context: int | None = 4096) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    if context is not None:
        writer.add_context_length(context)
    if template is not None:
        writer.add_chat_template(template)
    writer.add_token_list(["<s>", "</s>"] + [f"t{i}" for i in range(1000)])  # an array to walk past
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_tensor("weight", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
