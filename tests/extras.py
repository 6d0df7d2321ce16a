"""Optional extras in tests: skipped on a machine without them, required where they are
installed on purpose (``.ci/run`` exports ``MEMFOREST_REQUIRE_EXTRAS=1``; ``CI`` counts too),
so that a broken import there fails instead of silently skipping a whole suite."""
import importlib
import os

import pytest

__all__ = ["extras_required", "need", "skip_or_fail"]

_OFF = ("", "0", "false", "no", "off")


def extras_required() -> bool:
    """``MEMFOREST_REQUIRE_EXTRAS`` when set (1 / 0), else whether ``CI`` is set and not false."""
    flag = os.environ.get("MEMFOREST_REQUIRE_EXTRAS")
    if flag is not None:
        return flag.strip().lower() not in _OFF
    return os.environ.get("CI", "").strip().lower() not in _OFF


def need(module: str):
    """``pytest.importorskip(module)``, except that where extras are required the import
    runs plainly and its error fails the test (or the collection of its module)."""
    if extras_required():
        return importlib.import_module(module)
    return pytest.importorskip(module)


def skip_or_fail(reason: str):
    """Skip, or fail where extras are required (the thing skipped is expected there)."""
    if extras_required():
        pytest.fail(f"{reason} (MEMFOREST_REQUIRE_EXTRAS / CI is set, so this fails instead of skipping)")
    pytest.skip(reason)
