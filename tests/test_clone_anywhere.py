"""A clone with nothing beside it (no ``shared/``) has everything its tests need: the suite collects
without one error. The recordings the tests replay live in ``tests/fixtures/recordings``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_clone_without_shared_collects_every_test(tmp_path: Path) -> None:
    clone = tmp_path / "somewhere" / "responses-gateway"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=120)
    # What the clone has is what is committed: the working tree's recordings must be committed too.
    assert (clone / "tests" / "fixtures" / "recordings" / "MANIFEST.md").is_file()
    assert not (clone.parent / "shared").exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RG_", "PYTEST_"))}
    env["PYTHONPATH"] = str(clone / "src")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " error" not in done.stdout.splitlines()[-1], done.stdout[-3000:]
    collected = int(done.stdout.strip().splitlines()[-1].split()[0])
    assert collected > 1500, done.stdout[-500:]
