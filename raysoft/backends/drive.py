"""The driver's loop, shared by the backends: ask the coordinator for one unit of work at a
time (the initial evaluation, then a round or a stream step), hand each step's progress to the
progress line and the callbacks, and end the run early when a callback asks. The in-process
backend calls its coordinator directly, the Ray backend through the coordinator actor; both
drive it with :func:`drive`, so that progress and early stops behave the same on either."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ProgressFn = Callable[[dict[str, Any]], Any]


def drive(advance: Callable[..., dict[str, Any]], on_progress: ProgressFn) -> None:
    """Call ``advance`` (a coordinator's, local or remote) until the run is done. When
    ``on_progress`` returns True (a callback asks to stop), ``advance(stop=True)`` ends the run
    where it is."""
    while True:
        info = advance()
        stop = on_progress(info)
        if info["done"]:
            return
        if stop is True:
            advance(stop=True)
            return
