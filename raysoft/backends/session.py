"""The Ray session of a driver: joining a cluster (within ``ray.join_timeout_s``) or starting a
local Ray of its own (with a watchdog that ends it if the driver dies), the runtime
environment that carries the plug-ins, and stopping what it started."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from ..config import Config, RayConfig
from ..errors import JoinError, first_line
from ..interrupts import keep_sigterm_handler
from ..plugins import ship_paths
from . import auth, raycompat
from .join import probe


def plugin_env(cfg: Config) -> dict[str, Any] | None:
    """The runtime environment that makes the config's plug-ins importable in the coordinator and
    its client actors (which inherit it): the plug-in modules named by import path, uploaded to
    the cluster (Ray's ``py_modules``; Ray takes local paths at ``ray.init`` only, so they are
    uploaded here, as ``ray.init`` would, and named by their content-hash URIs). None when every
    plug-in is installed or built in."""
    paths = ship_paths(cfg)
    if not paths:
        return None
    import tempfile

    from ..quiet import quiet_ray

    with tempfile.TemporaryDirectory(prefix="raysoft-ship-") as scratch, quiet_ray():
        return raycompat.upload_py_modules(paths, scratch)


def connect(rc: RayConfig, runtime_env: dict[str, Any] | None = None) -> bool:
    """Join the cluster of ``ray.address`` (or RAY_ADDRESS), else start a local Ray of its own
    (the one :func:`local_cluster` describes); True if this call started (and so must stop) it.
    ``runtime_env``: this driver's job's (a sweep's plug-ins, for its trials). A run's SIGTERM
    handler survives ``ray.init`` (which installs its own)."""
    if ray.is_initialized():
        return False
    address = rc.address or os.environ.get("RAY_ADDRESS")
    source = "ray.address" if rc.address else "RAY_ADDRESS"
    if address and address != "local":  # nothing answering there: one line within the deadline
        probe(address, rc.join_timeout_s, source)
    auth.prepare(None if address in (None, "local") else address)
    with keep_sigterm_handler():
        if address:
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING,
                         runtime_env=runtime_env)
            except ConnectionError as err:
                raise JoinError(f"{source} {address}: {first_line(err)}") from None
        else:  # a new local Ray, even if another one runs on this machine (Ray would join it)
            ray.init(
                address="local",
                num_cpus=rc.num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                runtime_env=runtime_env,
            )
            _start_watchdog()
    return True


_WATCHDOG: list[Any] = []  # the watchdog of the local Ray this process started, if any


def _start_watchdog() -> None:
    """A process that ends the local Ray just started once this driver is gone, even if the
    driver is killed with SIGKILL and cannot clean up (``watchdog.py``)."""
    import subprocess
    import sys

    pids = raycompat.local_ray_pids()
    if not pids:
        return
    script = os.path.join(os.path.dirname(__file__), "watchdog.py")
    _WATCHDOG.append(subprocess.Popen([sys.executable, script, str(os.getpid()), *map(str, pids)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))


def shutdown() -> None:
    """Stop the local Ray this process started (and its watchdog)."""
    ray.shutdown()
    while _WATCHDOG:
        w = _WATCHDOG.pop()
        w.terminate()
        w.wait(timeout=10)
