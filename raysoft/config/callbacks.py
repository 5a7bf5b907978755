"""The ``callbacks`` section's entries' base. A callback's own settings subclass it."""

from __future__ import annotations

from .section import PluginSection


class CallbackConfig(PluginSection):
    """One entry of the ``callbacks`` list: a callback's ``name`` (built-in, registered or an
    import path) and the keys of its own settings."""

    KIND = "callbacks"
    name: str
