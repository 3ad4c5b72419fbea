"""Every runnable example in README.md, taken from README.md itself, run against the embedded model.

A newcomer's first hour is these examples: each must finish (within its default output limit, in
seconds) and show what the README says it shows. The address in the examples (127.0.0.1:8080, what
``make run`` serves) is pointed at a gateway started for the test; ``.venv/bin/`` at this
environment's scripts. The models-file example needs upstream keys and servers that are not here, and
the Codex configuration is exercised by the Codex tests (test_real_codex*.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_process import Served, serve

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)
BIN = Path(sys.executable).parent


def _examples() -> list[tuple[str, str]]:
    out = []
    for lang, code in BLOCKS:
        if lang == "sh" and ("curl " in code or "responses-gateway check" in code):
            out.append(("sh", code))
        elif lang == "python" and "OpenAI(" in code:
            out.append(("python", code))
    return out


EXAMPLES = _examples()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = serve(tmp_path_factory.mktemp("readme"))
    yield served
    served.proc.terminate()
    served.proc.wait(10)


def test_the_readme_has_the_examples_a_newcomer_runs() -> None:
    kinds = [(lang, "curl" in code, "check" in code) for lang, code in EXAMPLES]
    assert ("sh", True, False) in kinds  # the curl stream
    assert ("python", False, False) in kinds  # the openai SDK snippet
    assert sum(check for _, _, check in kinds) == 1  # the check examples (a recording and a URL)


@pytest.mark.parametrize(
    "index", range(len(EXAMPLES)), ids=[f"{lang}-{i}" for i, (lang, _) in enumerate(EXAMPLES)]
)
def test_readme_example_runs(gateway: Served, index: int) -> None:
    lang, code = EXAMPLES[index]
    code = code.replace("127.0.0.1:8080", f"127.0.0.1:{gateway.port}").replace(".venv/bin/", f"{BIN}/")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RG_"))}
    command = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert done.returncode == 0, (
        f"{code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )
    out = done.stdout
    if "curl " in code:
        assert "event: response.created" in out
        assert "event: response.completed" in out or "event: response.incomplete" in out
        assert "response.output_text.delta" in out
    elif "check" in code:
        assert ": OK (profile" in out, out  # the recording; the URL's probes pass (exit status 0)
    else:  # the SDK snippet prints the text as it streams, then the usage
        assert "input_tokens=" in out and "output_tokens=" in out, out
