"""Which build the suite runs on. ``make test`` runs it twice: on ``src/`` as written (the interpreted
fallback) and on the compiled hot path (``PYTHONPATH=build/compiled/src``, what ``make run`` serves),
with ``RG_TEST_BUILD`` naming the build; this makes sure each run imported the build it names."""

from __future__ import annotations

import importlib
import os

import pytest

from responses_gateway.protocol.native import COMPILED_MODULES, compiled_modules

BUILD = os.environ.get("RG_TEST_BUILD")


@pytest.mark.skipif(BUILD is None, reason="RG_TEST_BUILD unset (the suite run by hand, on either build)")
def test_the_suite_runs_on_the_build_it_names() -> None:
    assert BUILD in ("compiled", "interpreted")
    assert compiled_modules() == (sorted(COMPILED_MODULES) if BUILD == "compiled" else [])
    # What is imported is what was found.
    for name in COMPILED_MODULES:
        module = importlib.import_module(name)
        assert str(module.__file__).endswith(".py") == (BUILD == "interpreted"), module.__file__
