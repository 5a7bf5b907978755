"""The errors of raysoft (torch-free, so that the driver need not import torch)."""


class ConfigError(ValueError):
    """A bad config or command-line argument; the message is one line naming the key."""


class ClientFailure(RuntimeError):
    """A client actor died; the coordinator recovers from the last checkpoint."""


class UpdateError(RuntimeError):
    """A client returned a NaN or infinite update and ``train.nan_policy`` is ``stop``."""


class RunStopped(RuntimeError):
    """A run failed after it had results (writing, moving or publishing them); the message is
    one line saying where they are kept."""
