"""SIGTERM and SIGINT during a run: the run stops cleanly instead of dying mid-write.

While :func:`stop_on_signals` is active (``raysoft.run`` and ``raysoft.resume`` use it, in the
main thread), SIGTERM raises :class:`Interrupted` where the driver is (also inside a blocking
``ray.get``, which lets Python handle signals), as Ctrl-C raises ``KeyboardInterrupt``; the run
then removes or keeps its directory and says which. A second signal while the run cleans up is
ignored, so the clean-up finishes. Torch-free and Ray-free.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    """A signal stopped the run; the message says what was kept."""

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


_state = {"raised": False}


def _on_signal(signum: int, frame) -> None:  # the signal module's signature
    if _state["raised"]:  # the run is already stopping: let its clean-up finish
        return
    _state["raised"] = True
    raise Interrupted(signum)


def ours(handler) -> bool:
    """``handler`` is the one :func:`stop_on_signals` installs."""
    return handler is _on_signal


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM raises :class:`Interrupted` inside the block (main thread only; elsewhere the
    block runs unchanged); SIGINT raises ``KeyboardInterrupt`` as always."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_signal)
    was, _state["raised"] = _state["raised"], False
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _state["raised"] = was


@contextmanager
def keep_sigterm_handler() -> Iterator[None]:
    """Around ``ray.init``, which installs its own SIGTERM handler (exit at once): put ours back
    if it was active, so that a signal still stops the run cleanly."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and ours(before):
            signal.signal(signal.SIGTERM, before)
