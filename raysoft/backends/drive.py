"""The driver's loop, shared by the backends."""

from __future__ import annotations

from typing import Any, Callable

ProgressFn = Callable[[dict[str, Any]], None]


def drive(advance: Callable[[], dict[str, Any]], on_progress: ProgressFn) -> None:
    """Call ``advance`` (a coordinator's, local or remote) until the run is done."""
    while True:
        info = advance()
        on_progress(info)
        if info["done"]:
            return
