"""The errors of raysoft (torch-free, so that the driver need not import torch)."""

from .datafiles import DataFileError, MissingDataError, one_line


class ConfigError(ValueError):
    """A bad config or command-line argument; the message is one line naming the key."""


class ClientFailure(RuntimeError):
    """A client actor died; the coordinator recovers from the last checkpoint."""


class UpdateError(RuntimeError):
    """A client returned a NaN or infinite update and ``train.nan_policy`` is ``stop``."""


class PluginFailure(RuntimeError):
    """An algorithm's own code raised during a run (a client op, or its server half); the message
    is one line naming the algorithm, the op and the client (or the round)."""


def plugin_call(fn, args: tuple, where: str):
    """``fn(*args)``; an exception of the algorithm's own code (not one of raysoft's errors, nor a
    StopIteration) becomes a :class:`PluginFailure` saying ``where`` it happened."""
    try:
        return fn(*args)
    except StopIteration:
        raise
    except OWN_ERRORS:
        raise
    except Exception as err:  # whatever the algorithm raises, as one line
        raise PluginFailure(f"{where}: {type(err).__name__}: {one_line(err)}") from err


class RunStopped(RuntimeError):
    """A run failed after it had results (writing, moving or publishing them); the message is
    one line saying where they are kept."""


# raysoft's own error types, which pass through plugin_call unchanged
OWN_ERRORS = (ConfigError, ClientFailure, UpdateError, RunStopped, PluginFailure, MissingDataError, DataFileError)
