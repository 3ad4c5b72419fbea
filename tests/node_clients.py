"""Real JavaScript clients for the tests, installed by scripts/node-clients.sh from tests/clients/NAME."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "node-clients.sh"


def ensure_client(name: str) -> Path:
    """Install the client ``name`` if needed and return its directory (node_modules inside).

    Fails (never skips) when it cannot be installed: a test that quietly does not run proves nothing.
    """
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise RuntimeError(
            "Node.js and npm are needed for the real-client tests (apt-get install nodejs npm)"
        )
    done = subprocess.run([str(SCRIPT), name], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/node-clients.sh {name} failed ({done.returncode}):\n{done.stderr}")
    return ROOT / "tests" / "clients" / name
