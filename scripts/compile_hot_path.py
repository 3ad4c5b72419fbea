"""Build the compiled hot path: a copy of ``src/`` with the per-event modules compiled by mypyc.

Usage: ``python scripts/compile_hot_path.py DEST`` (``make run`` and ``make test`` call it when a source
changed). It copies ``src/`` to ``DEST/src`` and compiles there, with the mypy of the test extra (its
mypyc) and the machine's C compiler, the modules of ``responses_gateway.protocol.native.COMPILED_MODULES``
into one shared library; the ``.py`` files stay beside the extension modules. ``PYTHONPATH=DEST/src``
then imports that build, and without it the interpreter runs ``src/`` as written: the same source, the
fallback. The tree is built aside and moved into place, so a failed build leaves no tree behind
(``make run`` then serves the interpreted build). docs/architecture.md, "The compiled hot path".
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from responses_gateway.protocol.native import COMPILED_MODULES  # noqa: E402


def build(dest: Path) -> Path:
    """Build the compiled tree in ``dest`` (replacing what is there); its ``src`` directory."""
    started = time.monotonic()
    work = dest.with_name(dest.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    mypyc = Path(sys.executable).parent / "mypyc"
    files = [name.replace(".", "/") + ".py" for name in COMPILED_MODULES]
    done = subprocess.run(
        [str(mypyc), "--config-file", str(ROOT / "pyproject.toml"), *files],
        cwd=src,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"mypyc failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    shutil.rmtree(src / "build", ignore_errors=True)
    missing = [f for f in files if not list(src.glob(f.removesuffix(".py") + ".*.so"))]
    if missing:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"mypyc left no extension module for {', '.join(missing)}")
    shutil.rmtree(dest, ignore_errors=True)
    work.rename(dest)
    print(
        f"compiled {len(files)} modules with mypyc into {dest / 'src'} in {time.monotonic() - started:.0f} s"
    )
    return dest / "src"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DEST")
    try:
        build(Path(sys.argv[1]).resolve())
    except (RuntimeError, OSError) as exc:
        sys.exit(f"the compiled hot path could not be built: {exc}")


if __name__ == "__main__":
    main()
