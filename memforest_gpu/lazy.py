"""Public names imported at their first use (PEP 562): a package lists where each of its names
is defined, and importing the package loads none of those modules until a name is used."""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

__all__ = ["public_names"]


def public_names(package: str, where: dict[str, str]) -> tuple[Callable, Callable]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose public names are ``where``
    (name -> the module that defines it): a name is imported at its first use, then kept."""

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
