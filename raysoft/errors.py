"""The errors of raysoft, one family (torch-free, so that the driver need not import torch).

Every error raysoft raises on purpose is a :class:`RaysoftError` whose message is one line. Two
kinds, each with its exit code (the one place they are mapped: :func:`exit_code`):

- a :class:`Refusal` (exit 2): bad input found before anything is written (a config key, a data
  file, a plug-in, a report path);
- a :class:`RunFailure` (exit 1): a run that started and stopped (a NaN update under
  ``nan_policy: stop``, an algorithm's own exception, a failure after results existed).

A signal that stops a run is :class:`raysoft.interrupts.Interrupted`, a ``KeyboardInterrupt``
(exit 128 + the signal's number), outside the family on purpose: ``except Exception`` must not
swallow it.

Each concrete error also derives from the built-in its callers used to catch (``ValueError``,
``FileNotFoundError``, ``RuntimeError``), so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def one_line(text: object) -> str:
    """``text`` with its whitespace (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def first_line(err: BaseException) -> str:
    """The first non-blank line of an error's message (its type name if it has none): for the
    errors of other libraries, whose messages go on with tracebacks and hints."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def error_line(err: BaseException) -> str:
    """An error's message and its notes, on one line (its type name if it has no message); each
    part that does not end a sentence is ended with a full stop before the next, so that a note
    ("The run directory is kept ...") never runs into the message."""
    parts = [one_line(part) for part in (str(err), *getattr(err, "__notes__", ())) if str(part).strip()]
    ended = [p if i == len(parts) - 1 or p.endswith((".", "!", "?", ":", ";")) else f"{p}."
             for i, p in enumerate(parts)]
    return " ".join(ended) or type(err).__name__


class RaysoftError(Exception):
    """The base of every error raysoft raises on purpose; the message is one line."""

    exit_code = 1
    kind = "error"
    trace = ""  # a plug-in's whole traceback, as text, where it was raised (plugin_call)


class Refusal(RaysoftError):
    """Bad input, refused before anything is written (exit 2)."""

    exit_code = 2
    kind = "error"


class RunFailure(RaysoftError):
    """A run that started and stopped (exit 1)."""

    exit_code = 1
    kind = "run stopped"


class ConfigError(Refusal, ValueError):
    """A bad config or command-line argument; the message is one line naming the key."""


class CoordinatorFailure(RunFailure, RuntimeError):
    """The coordinator actor died (its process or node) or stopped answering: the run stops,
    one line; a checkpointed run can be resumed."""


class JoinError(Refusal, ConnectionError):
    """A cluster address where nothing answered within ``ray.join_timeout_s``: one line naming
    the address and what did not answer, before anything is written."""


class MissingDataError(Refusal, FileNotFoundError):
    """Dataset files are not where they should be; the message is one line."""


class DataFileError(Refusal, ValueError):
    """A dataset file is there but not in the format its loader reads; the message is one line
    naming the file."""


class ReportError(Refusal, ValueError):
    """A path that is not a run directory, or an unusable output directory (one line)."""


class ClientFailure(RunFailure, RuntimeError):
    """A client actor died; the coordinator recovers from the last checkpoint."""


class RecoveryFailure(RunFailure, RuntimeError):
    """The client actors could not be restarted and restored after a failure, in every attempt:
    the run stops, one line; a checkpointed run can be resumed."""


class UpdateError(RunFailure, RuntimeError):
    """A client returned a NaN or infinite update and ``train.nan_policy`` is ``stop``."""


class PluginFailure(RunFailure, RuntimeError):
    """An algorithm's own code raised during a run (a client op, or its server half); the message
    is one line naming the algorithm, the op and the client (or the round)."""


class RunStopped(RunFailure, RuntimeError):
    """A run failed after it had results (writing, moving or publishing them); the message is
    one line saying where they are kept."""


def exit_code(err: BaseException) -> int:
    """The process exit code of an error that ends a command: its class's for raysoft's own
    errors, 1 for anything else."""
    return err.exit_code if isinstance(err, RaysoftError) else 1


def _library_dirs() -> tuple[str, ...]:
    """The folders whose code is not the user's: the standard library, installed packages, and
    raysoft's engine (its built-in algorithms are the user-facing code of their own)."""
    import sysconfig

    here = os.path.dirname(os.path.abspath(__file__))
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return (*sorted(dirs), os.path.realpath(here))


def user_frame(err: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``err``'s traceback in the user's code (not the
    standard library, an installed package or raysoft's engine; raysoft's built-in algorithms
    count as user code), relative to the working directory when under it; None if there is none."""
    import traceback

    library = _library_dirs()
    algorithms = os.path.join(library[-1], "algorithms")
    found = None
    for frame in traceback.extract_tb(err.__traceback__):
        path = os.path.realpath(frame.filename)
        if path.startswith(algorithms + os.sep) or not any(path.startswith(d + os.sep) for d in library):
            if not frame.filename.startswith("<"):
                found = (path, frame.lineno)
    if found is None:
        return None
    path, line = found
    rel = os.path.relpath(path)
    return f"{path if rel.startswith('..') else rel}:{line}"


def full_traceback(err: BaseException) -> str:
    """The whole traceback of ``err`` as text: the one recorded where a plug-in's own exception
    was raised (:func:`plugin_call`, possibly in another process), else ``err``'s own chain."""
    import traceback

    recorded = getattr(err, "trace", "")
    if isinstance(recorded, str) and recorded:
        return recorded
    return "".join(traceback.format_exception(err))


def plugin_call(fn: Callable[..., T], args: tuple, where: str) -> T:
    """``fn(*args)``; an exception of the algorithm's own code (not one of raysoft's errors, nor a
    StopIteration) becomes a :class:`PluginFailure` saying ``where`` it happened and the file and
    line in the user's code it came from; its whole traceback is kept as text in ``trace`` (it
    crosses process boundaries with the error), for ``--traceback``."""
    try:
        return fn(*args)
    except StopIteration:
        raise
    except RaysoftError:
        raise
    except Exception as err:  # whatever the algorithm raises, as one line
        import traceback

        at = user_frame(err)
        failure = PluginFailure(f"{where}: {type(err).__name__}: {one_line(err)}" + (f" (at {at})" if at else ""))
        failure.trace = "".join(traceback.format_exception(err))
        raise failure from err
