"""Ray's and Ray Tune's own chatter, off unless asked (``RAYSOFT_RAY_LOGS=1``).

raysoft says what a run or a sweep does in its own lines; around them Ray logs each file package
it builds and pushes (``packaging.py``: dozens of INFO lines for a Ray Job's working directory),
and Tune warns that TensorboardX is missing, prints its experiment table on stdout and, on
Ctrl-C, offers its own ``Tuner.restore(...)`` where ``raysoft sweep --resume`` is the command to
use; a Ray Job's submission warns that ``.git`` is "now ignored" (raysoft excludes it anyway),
its logs carry the job manager's own INFO lines and the client says "WebSocket closed" at their
end. :func:`quiet_ray` silences exactly those while its block runs (:func:`job_lines` the job
manager's); Ray's warnings and errors about anything else still come through.
``RAYSOFT_RAY_LOGS=1`` keeps everything.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

ASK = "RAYSOFT_RAY_LOGS"
"""The environment variable that keeps Ray's and Tune's own messages (any value but empty or 0)."""

INFO_LOGGERS = ("ray._private.runtime_env", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk")
"""Loggers whose INFO lines (file packages built and pushed) are chatter: WARNING and above only."""

DROPPED = {
    # a Ray Job's working directory: .git and friends are skipped as raysoft's own excludes ask
    "ray._private.runtime_env.working_dir": ("is now ignored by default",),
    "ray.tune.utils.callback": ("TensorboardX logger cannot be instantiated",),
    "ray.tune.tune": ("Stop signal received", "Tuner.restore", "Trials did not complete"),
    "ray.tune.analysis.experiment_analysis": ("Failed to fetch metrics",),
}
"""logger -> the messages of it that raysoft says better itself (or that do not apply)."""

ENVIRONMENT = {"RAY_AIR_NEW_OUTPUT": "0"}
"""Tune's legacy reporter, which verbose=0 silences (the new one prints its experiment table)."""


JOB_CHATTER = re.compile(r"^\S+ \S+\s+INFO job_manager\.py:\d+ -- ")
"""A Ray Job's log line from Ray's job manager (``... INFO job_manager.py:581 -- Runtime env is
setting up.``), not from the job: left out of the logs ``raysoft run --address http://...``
follows (:func:`job_lines`)."""


def job_lines(text: str) -> str:
    """A chunk of a Ray Job's logs without the job manager's INFO lines (all kept when :func:`asked`)."""
    if asked():
        return text
    return "".join(line for line in text.splitlines(keepends=True) if not JOB_CHATTER.match(line))


def asked() -> bool:
    """Whether the user asked for Ray's and Tune's own messages."""
    return os.environ.get(ASK, "") not in ("", "0")


class _Drop(logging.Filter):
    def __init__(self, phrases: tuple[str, ...]) -> None:
        super().__init__()
        self.phrases = phrases

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(p in text for p in self.phrases)


def _module_of(name: str) -> None:
    """Import the module that owns logger ``name`` (one that sets its own level on import must
    have done so before the level is changed here)."""
    try:
        importlib.import_module(name)
    except ImportError:
        pass


@contextmanager
def quiet_ray() -> Iterator[None]:
    """Ray's packaging INFO lines and Tune's chatter off while the block runs (unless
    :func:`asked`); the loggers and the environment are restored after it."""
    if asked():
        yield
        return
    levels: list[tuple[logging.Logger, int]] = []
    filters: list[tuple[logging.Logger, logging.Filter]] = []
    env = {k: os.environ.get(k) for k in ENVIRONMENT}
    for name in INFO_LOGGERS:
        _module_of(name)
        family = [logging.getLogger(name)] + [  # and its descendants with a level of their own
            lg for key, lg in list(logging.root.manager.loggerDict.items())
            if key.startswith(name + ".") and isinstance(lg, logging.Logger) and lg.level != logging.NOTSET]
        for logger in family:
            if logger.getEffectiveLevel() < logging.WARNING:
                levels.append((logger, logger.level))
                logger.setLevel(logging.WARNING)
    for name, phrases in DROPPED.items():
        logger = logging.getLogger(name)
        drop = _Drop(phrases)
        logger.addFilter(drop)
        filters.append((logger, drop))
    os.environ.update(ENVIRONMENT)
    try:
        yield
    finally:
        for logger, level in levels:
            logger.setLevel(level)
        for logger, added in filters:
            logger.removeFilter(added)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
