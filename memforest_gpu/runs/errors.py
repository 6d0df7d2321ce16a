"""Errors of a run that say what to pass, in the caller's words.

A run's message that names an option (``pass {embedder=default} or {embedder=PATH}``) is an
:class:`OptionError`: the Python API reads ``pass embedder=default or embedder=PATH``, a
command (:meth:`OptionError.for_command`, called in ``cli/``) ``pass --embedder default or
--embedder PATH``. The flags are written only by the command line.
"""
from __future__ import annotations

import re

__all__ = ["OptionError", "render_options"]

#: the options a run's message may name (only these are read as placeholders: a path or an id
#: in the message that holds braces is left as it is)
OPTIONS = ("embedder", "replace_changed", "resume")
_OPTION = re.compile(r"\{(" + "|".join(OPTIONS) + r")(?:=([^{}]*))?\}")


def render_options(template: str, *, command: bool = False) -> str:
    """``template`` with each ``{name}`` / ``{name=value}`` written as the Python API's
    parameter (``name`` / ``name=value``) or, with ``command``, as a flag (``--name`` /
    ``--name value``)."""

    def one(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        if command:
            flag = "--" + name.replace("_", "-")
            return flag if value is None else f"{flag} {value}"
        return name if value is None else f"{name}={value}"

    return _OPTION.sub(one, template)


class OptionError(ValueError):
    """A ``ValueError`` whose message names the run's options (see the module docstring);
    ``template`` holds them as ``{name}`` or ``{name=value}``."""

    def __init__(self, template: str):
        self.template = template
        super().__init__(render_options(template))

    def for_command(self) -> str:
        """The message with the options written as flags."""
        return render_options(self.template, command=True)
