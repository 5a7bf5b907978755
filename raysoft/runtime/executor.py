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
from ..tree import leaves


class Executor(Protocol):
    placement: list[dict[str, Any]]  # per actor: {"clients": [...], "node_id": ..., "device": ...}
    late: list[int]  # clients whose results missed the last call's deadline (dropped)

    def call(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int) -> dict[int, Any]:
        """Run client op ``op`` for ``client_ids`` with the broadcast ``payload``; results by client."""
        ...

    def call_for_reduction(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int,
             part: int | None) -> dict[int, tuple[bool, Any, int]]:
        """Run ``op`` and keep each result's summed part (element ``part`` of a result tuple, or
        the whole result) where it ran; return {client: (finite, the rest of its result, the
        bytes of its whole result, :func:`~raysoft.runtime.comm.wire_bytes`)}."""
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
    """Whether every float tensor and array in a (nested, :mod:`raysoft.tree`) result is finite."""
    return all(_finite(leaf) for leaf in leaves(result))


def _finite(leaf: Any) -> bool:
    # A finite sum proves every element finite (a NaN or an infinity never sums to a finite
    # value); only a non-finite sum, which finite values can also reach by overflow, needs the
    # element-wise check, which costs many times more.
    if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
        return bool(torch.isfinite(leaf.sum())) or bool(torch.isfinite(leaf).all())
    if isinstance(leaf, np.ndarray) and leaf.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(leaf.sum()):
                return True
        return bool(np.isfinite(leaf).all())
    return True
