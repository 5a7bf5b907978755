"""Ray's private APIs that raysoft uses, all in this module, each with its fallback.

Ray's public API has no way to do these six things, so raysoft reaches into ``ray._private``
here and nowhere else (``tests/backends/test_raycompat.py`` scans the package for any other
use). Another Ray release may move or drop any of them; each function then falls back as it
says, and none lets an ``ImportError`` or ``AttributeError`` of Ray's internals reach the user:

========================  ===========================================  ==============================
function                  private API (Ray 2.60)                       without it
========================  ===========================================  ==============================
:func:`enable_token_auth` ``authentication_token_setup.                nothing: ``RAY_AUTH_MODE`` in
                          _enable_token_auth`` (refreshes the mode     the environment, set by the
                          a Ray imported earlier cached)               caller, is what ray.init reads
:func:`local_resources`   ``resource_and_label_spec.                   None: the caller counts the
                          ResourceAndLabelSpec`` (Ray's detection of   CPUs itself and leaves GPUs to
                          a new node's CPUs and GPUs)                  the check once Ray runs
:func:`started_here`      ``worker._global_node.ray_init_cluster``     False: the cluster may grow
                          (whether ray.init started the local Ray)     (a bounded wait for placement)
:func:`local_ray_pids`    ``worker._global_node.all_processes``        []: no watchdog (the local Ray
                          (the processes of the local Ray)             is stopped by ray.shutdown)
:func:`bootstrap_address` ``services.find_bootstrap_address``          None: ray.init looks itself
                          (the cluster ``auto`` stands for)
:func:`upload_py_modules` ``runtime_env.py_modules.                    :class:`RayCompatError`, one
                          upload_py_modules_if_needed`` (local         line: install the plug-ins on
                          modules into the cluster's storage)          the cluster instead
========================  ===========================================  ==============================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import RunFailure


class RayCompatError(RunFailure, RuntimeError):
    """A private API of Ray that raysoft needs and has no fallback for is missing in the Ray
    installed (exit 1, one line)."""


def _global_node() -> Any:
    """The node ray.init started in this process (None if it started none, or Ray keeps it
    elsewhere)."""
    try:
        from ray._private import worker
    except ImportError:
        return None
    return getattr(worker, "_global_node", None)


def enable_token_auth() -> None:
    """Ray's token authentication for this process, as ray.init enables it: Ray's cached
    config refreshed from ``RAY_AUTH_MODE`` (which the caller has set). Without the private
    call, nothing: the variable is what a later ray.init and Ray's processes read."""
    try:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth
    except ImportError:
        return
    _enable_token_auth()


def local_resources(num_cpus: int | None) -> dict[str, float] | None:
    """The CPUs and GPUs (``{"CPU": n, "GPU": g}``) Ray would give a local node started now
    with ``num_cpus`` (None: Ray's count), by Ray's own detection (``CUDA_VISIBLE_DEVICES`` and
    Ray's resource overrides respected; torch is not imported); None when that detection is
    unavailable or fails."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec(num_cpus=num_cpus).resolve(is_head=True, node_ip_address="127.0.0.1")
    except Exception:  # noqa: BLE001 - a private API: any failure means "unknown"
        return None
    if spec.num_cpus is None:
        return None
    return {"CPU": float(spec.num_cpus), "GPU": float(spec.num_gpus or 0)}


def started_here() -> bool:
    """Whether the Ray this process is connected to is the local one its own ray.init started;
    False when that cannot be told."""
    return bool(getattr(_global_node(), "ray_init_cluster", False))


def local_ray_pids() -> list[int]:
    """The process ids of the local Ray this process started (its GCS, raylet, ...); [] when
    none was started here or they cannot be found."""
    processes = getattr(_global_node(), "all_processes", None)
    if not isinstance(processes, dict):
        return []
    return [info.process.pid for infos in processes.values() for info in infos
            if getattr(info, "process", None) is not None]


def bootstrap_address() -> str | None:
    """The GCS address of the latest Ray cluster started on this machine, as ``ray.init(address=
    "auto")`` finds it; None if there is none or it cannot be looked up."""
    try:
        from ray._private.services import find_bootstrap_address

        return find_bootstrap_address(None)
    except Exception:  # noqa: BLE001 - a private API: without it, ray.init looks itself
        return None


def upload_py_modules(paths: Sequence[str], scratch_dir: str) -> dict[str, Any]:
    """``{"py_modules": [URI, ...]}``: the local modules ``paths`` uploaded to the connected
    cluster (their ``.gitignore`` respected), as ray.init does with local ``py_modules``.
    :class:`RayCompatError` (one line) when the installed Ray lacks the upload."""
    try:
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    except ImportError:
        import ray

        raise RayCompatError(
            f"shipping plug-in modules needs ray._private.runtime_env.py_modules.upload_py_modules_if_needed, "
            f"missing in Ray {ray.__version__}: install the plug-ins on the cluster's nodes instead") from None
    return upload_py_modules_if_needed({"py_modules": list(paths)}, include_gitignore=True, scratch_dir=scratch_dir)


__all__ = ["RayCompatError", "bootstrap_address", "enable_token_auth", "local_ray_pids", "local_resources",
           "started_here", "upload_py_modules"]
