"""The argument parser of ``memforest``: help lines with their defaults, and a usage error
as one line (``memforest compress: error: argument --keys: ...``, exit 2) rather than the
whole usage text, whether argparse or a command's cheap checks (:func:`check_usage`) find it."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

__all__ = ["HelpFormatter", "Parser", "command_name", "check_usage"]


class HelpFormatter(argparse.HelpFormatter):
    """Each option's one-line help, with its default appended unless the help states it."""

    def _get_help_string(self, action):
        h = action.help or ""
        d = action.default
        if not action.option_strings or "(default" in h or d is None or d is False or d == argparse.SUPPRESS:
            return h
        return h + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` using :class:`HelpFormatter` whose errors are one line; its
    sub-parsers inherit both."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        """One line on stderr naming the command and the argument, then exit 2."""
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def command_name(args: argparse.Namespace) -> str:
    """The words of the parsed command: ``compress``, ``mem0 compress``."""
    return " ".join(x for x in (getattr(args, "cmd", None), getattr(args, "sub", None)) if x)


def check_usage(args: argparse.Namespace, check: Callable[[argparse.Namespace], None]) -> bool:
    """Run a command's cheap ``check(args)`` (flags and paths; nothing is loaded): ``True`` when
    it passes, else ``False`` after one line on stderr naming the command and what is wrong."""
    try:
        check(args)
    except (ValueError, OSError) as e:
        print(f"memforest {command_name(args)}: error: {e}", file=sys.stderr)
        return False
    return True
