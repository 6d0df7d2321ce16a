"""What every command's run shares once its flags are checked: errors raised by the run, in
the command line's words (:func:`error_message`, :func:`interrupted_message`,
:func:`option_error`), the guard that prints them as one line (:func:`guarded`), and what the
checks before a run call its options (:data:`CLI_NAMES`). It imports the runs' error types, so
only a command's run module imports it, never the parser.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from ..config import ConfigError
from ..mergers import MissingOptionError
from ..runs.driver import MergerFailedError
from ..runs.errors import OPTION_WORDS, FailedElsewhere, OptionText
from ..runs.journal import JournalExistsError, JournalWriteError
from ..runs.loading import NoEmbeddingsError, RunInterrupted
from ..runs.preflight import Names
from .flags import FIELDS, flag_of
from .parser import command_name

__all__ = ["CLI_NAMES", "error_message", "interrupted_message", "option_error", "guarded"]

#: what the checks before a run (runs/preflight.py) call its options on the command line
CLI_NAMES = Names(format="--format", out_format="--out-format", output="OUTPUT", report="--report")


def option_error(e: ValueError, names) -> str:
    """An error of a part that takes a command's options as its parameters (a merger, the
    evaluation; ``names``: those options) in the command's words: a
    :class:`~memforest_gpu.config.ConfigError` whose field is one of ``names`` is named by
    that option's flag (``max_tokens must ...`` -> ``--max-tokens must ...``); any other
    error's text is left as it is (no message is read for a name)."""
    if isinstance(e, ConfigError) and e.field in names:
        return e.named(flag_of(e.field))
    return error_message(e)


def error_message(e: Exception) -> str:
    """The message of an error raised past the command line (by the run, on the data) in its
    words: a config field's :class:`~memforest_gpu.config.ConfigError` names its flag
    (``merge_within must ...`` -> ``--merge-within must ...``); a journal left by an
    interrupted run, a merger that failed on every request or a journal that cannot be
    written names ``--resume`` (another rank's error too); a run's
    :class:`~memforest_gpu.runs.errors.OptionText` names its options as flags; a store
    without vectors read with ``--embedder none`` says which values of the flag embed it."""
    if isinstance(e, ConfigError) and e.field in FIELDS:
        return e.named("--" + e.field.replace("_", "-"))
    if isinstance(e, (JournalExistsError, MergerFailedError, JournalWriteError)):
        return e.message("--resume")
    if isinstance(e, FailedElsewhere):
        return f"{e.where} failed: {error_message(e.error)}"
    if isinstance(e, OptionText):
        return e.for_command()
    if isinstance(e, MissingOptionError):
        return e.message(f"{flag_of(e.missing[0])} ...")
    if isinstance(e, NoEmbeddingsError):
        return (f"{e.path}: the store has no embeddings, so --embedder none cannot be used; pass --embedder auto "
                "(all-MiniLM-L6-v2), default or PATH to embed it")
    return str(e)


def interrupted_message(e: KeyboardInterrupt) -> str:
    """What a command prints for Ctrl-C: what the run kept and, when it can be resumed, the
    flag that resumes it."""
    if isinstance(e, RunInterrupted):
        return e.message("rerun the same command with --resume")
    return str(e) or "interrupted"


def guarded(run: Callable) -> Callable:
    """A command's ``run(args)`` as the command line runs it: warnings name the options as
    flags; an error is one line on stderr naming the command (exit 2), Ctrl-C says what the run
    kept (exit 130) and a closed pipe (``memforest ... | head``) ends it quietly (exit 0)."""

    @functools.wraps(run)
    def command(args) -> int:
        name = command_name(args)
        try:
            with OPTION_WORDS.as_command():
                return run(args)
        except BrokenPipeError:
            return 0
        except KeyboardInterrupt as e:  # one line (what is kept, how to resume), no traceback
            print(f"memforest {name}: {interrupted_message(e)}", file=sys.stderr)
            return 130
        except (ValueError, OSError, ImportError, RuntimeError) as e:
            print(f"memforest {name}: error: {error_message(e)}", file=sys.stderr)
            return 2

    return command
