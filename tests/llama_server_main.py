"""``python -m llama_cpp.server`` as a user runs it, loaded without llama.cpp's extra CPU buffer types.

Some VMs (this project's CI among them) advertise AMX without enabling it, and llama.cpp's AMX kernels
then crash on the first request; the gateway's own embedded model turns them off the same way
(``providers/local.py``). Everything else is llama-cpp-python's server, unchanged.
"""

from __future__ import annotations

import sys
from typing import Any

from llama_cpp import llama_cpp as capi

_original = capi.llama_model_default_params


def _without_extra_buffers() -> Any:
    params = _original()
    params.use_extra_bufts = False
    return params


if __name__ == "__main__":
    capi.llama_model_default_params = _without_extra_buffers
    from llama_cpp.server.__main__ import main

    sys.argv[0] = "llama_cpp.server"
    main()
