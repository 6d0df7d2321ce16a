"""Errors of a run that say what to pass, in the caller's words.

A run's message that names an option (``pass {embedder=default} or {embedder=PATH}``) is an
:class:`OptionError` (:class:`OptionNotFoundError` for a missing file): the Python API reads
``pass embedder=default or embedder=PATH``, a command (:meth:`OptionText.for_command`, called
in ``cli/``) ``pass --embedder default or --embedder PATH``. A warning logged with such
placeholders is written the same way by :data:`OPTION_WORDS`, the ``memforest_gpu`` logger's
filter, which a command switches to flags while it runs. The flags are written only by the
command line.
"""
from __future__ import annotations

import contextlib
import logging
import re

__all__ = ["OptionText", "OptionError", "OptionNotFoundError", "FailedElsewhere", "render_options", "OptionWords",
           "OPTION_WORDS"]

#: the options a run's message may name (only these are read as placeholders: a path or an id
#: in the message that holds braces is left as it is)
OPTIONS = ("embedder", "replace_changed", "resume", "memory_budget", "nodes", "turns_per_node", "contexts",
           "skip_missing_contexts", "config", "k", "max_tokens", "fill", "tenant")
_OPTION = re.compile(r"\{(" + "|".join(OPTIONS) + r")(?:=([^{}]*))?\}")


def render_options(template: str, *, command: bool = False) -> str:
    """``template`` with each ``{name}`` / ``{name=value}`` written as the Python API's
    parameter (``name`` / ``name=value``) or, with ``command``, as a flag (``--name`` /
    ``--name value``; a one-letter name: ``-k``)."""

    def one(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        if command:
            flag = ("-" if len(name) == 1 else "--") + name.replace("_", "-")
            return flag if value is None else f"{flag} {value}"
        return name if value is None else f"{name}={value}"

    return _OPTION.sub(one, template)


class OptionText:
    """An error whose message names the run's options (see the module docstring); ``template``
    holds them as ``{name}`` or ``{name=value}``."""

    def __init__(self, template: str):
        self.template = template
        super().__init__(render_options(template))

    def for_command(self) -> str:
        """The message with the options written as flags."""
        return render_options(self.template, command=True)


class OptionError(OptionText, ValueError):
    """A ``ValueError`` whose message names the run's options."""


class OptionNotFoundError(OptionText, FileNotFoundError):
    """A file not found, whose message names the option that gives it."""


class FailedElsewhere(RuntimeError):
    """Another part of the run failed (``where``: ``rank 1``), so this one stopped too;
    ``error``: that part's own exception, which a command words as it would its own."""

    def __init__(self, where: str, error: Exception):
        self.where, self.error = where, error
        super().__init__(f"{where} failed: {error}")


class OptionWords(logging.Filter):
    """Writes a log record's option placeholders as the Python API's parameters, or (``command``)
    as flags."""

    def __init__(self):
        super().__init__()
        self.command = False

    @contextlib.contextmanager
    def as_command(self):
        """Flags while a command runs (its ``main``), the API's words again after it."""
        old, self.command = self.command, True
        try:
            yield
        finally:
            self.command = old

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "{" in record.msg:
            record.msg = render_options(record.msg, command=self.command)
        return True


#: the filter of the ``memforest_gpu`` logger; a command runs ``with OPTION_WORDS.as_command():``
OPTION_WORDS = OptionWords()
logging.getLogger("memforest_gpu").addFilter(OPTION_WORDS)
