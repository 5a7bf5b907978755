"""The executor interface: what a coordinator needs from wherever the clients run.

The in-process backend's :class:`~raysoft.backends.host.ClientHost` and the Ray backend's
executor over client actors both implement it; :class:`~raysoft.runtime.faults.FaultInjector`
wraps either one to inject failures for testing.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from ..algorithms.base import Plan


class Executor(Protocol):
    placement: list[dict[str, Any]]  # per actor: {"clients": [...], "node_id": ..., "device": ...}
    late: list[int]  # clients whose results missed the last call's deadline (dropped)

    def call(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int) -> dict[int, Any]:
        """Run client op ``op`` for ``client_ids`` with the broadcast ``payload``; results by client."""
        ...

    def keep(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int,
             part: int | None) -> dict[int, tuple[bool, Any]]:
        """Run ``op`` and keep each result's summed part (element ``part`` of a result tuple, or
        the whole result) where it ran; return {client: (finite, the rest of its result)}."""
        ...

    def accumulate(self, plan: Plan) -> torch.Tensor:
        """The plan's sum of the kept results, added in client-id order; drops what was kept."""
        ...

    def get_states(self) -> dict[int, Any]:
        """Every client's state, on the CPU (for checkpoints)."""
        ...

    def set_states(self, states: dict[int, Any]) -> None: ...

    def reset(self) -> None:
        """Rebuild every client from (seed, client id): data and initial state."""
        ...

    def recover(self) -> None:
        """Replace dead actors (their clients rebuilt from seed and id)."""
        ...


def finite(result: Any) -> bool:
    """Whether every float in a (nested) result is finite."""
    # A finite sum proves every element finite (a NaN or an infinity never sums to a finite
    # value); only a non-finite sum, which finite values can also reach by overflow, needs the
    # element-wise check, which costs many times more.
    if isinstance(result, torch.Tensor):
        if result.is_floating_point() and bool(torch.isfinite(result.sum())):
            return True
        return bool(torch.isfinite(result).all())
    if isinstance(result, np.ndarray) and result.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(result.sum()):
                return True
        return bool(np.isfinite(result).all())
    if isinstance(result, (list, tuple)):
        return all(finite(r) for r in result)
    if isinstance(result, dict):
        return all(finite(r) for r in result.values())
    return True
