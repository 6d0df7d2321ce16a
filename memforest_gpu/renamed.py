"""Names changed so that each says its idea: keyword arguments renamed for their unit
(``budget`` -> ``max_tokens``, ``limits``) and names a user types (a method of the evaluation,
``memforest-min-tree`` -> ``memforest-min-spanning``). The old one still works for one release,
with a ``DeprecationWarning``."""
from __future__ import annotations

import warnings

__all__ = ["renamed_keyword", "renamed_name"]


def renamed_keyword(func: str, extra: dict, old: str, new: str, value):
    """The value of ``new`` for a call of ``func`` whose extra keywords are ``extra``: ``value``,
    or the one given by the old name ``old`` (warned about). Any other extra keyword, or both
    names at once, is a ``TypeError`` as Python would raise it."""
    unknown = sorted(k for k in extra if k != old)
    if unknown:
        raise TypeError(f"{func}() got an unexpected keyword argument {unknown[0]!r}")
    if old not in extra:
        return value
    if value is not None:
        raise TypeError(f"{func}() got both {new}= and its old name {old}=")
    warnings.warn(f"{func}({old}=...) is renamed {func}({new}=...); {old}= goes in the next release",
                  DeprecationWarning, stacklevel=3)
    return extra[old]


def renamed_name(what: str, name: str, renames: dict[str, str]) -> str:
    """``name``, or the new name of an old one in ``renames`` (``{old: new}``; warned about).
    ``what`` says what it names (``"method"``)."""
    new = renames.get(name)
    if new is None:
        return name
    warnings.warn(f"{what} {name!r} is renamed {new!r}; {name!r} goes in the next release",
                  DeprecationWarning, stacklevel=3)
    return new
