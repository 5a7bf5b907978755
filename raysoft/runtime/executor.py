"""The executor interface: what a coordinator needs from wherever the clients run.

The in-process backend's :class:`~raysoft.backends.host.ClientHost` and the Ray backend's
executor over client actors both implement it; :class:`~raysoft.runtime.faults.FaultInjector`
wraps either one to inject failures for testing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypedDict

import numpy as np
import torch

from ..algorithms.base import Plan
from ..tree import leaves


class Placement(TypedDict):
    """Where one client actor runs (its ``describe``)."""

    clients: list[int]
    node_id: str
    device: str


# what a call_for_reduction answers for one client: (its result is finite, its result's named extras
# (:func:`~raysoft.algorithms.base.split_result`), on the CPU, the bytes of its whole result)
Held = tuple[bool, Mapping[str, object], int]


class Executor(Protocol):
    """Payloads, results and client states are the algorithm's: the executor only carries them
    (``object``), the algorithm reads them."""

    placement: list[Placement]  # per actor (none in-process)
    late: list[int]  # clients whose results missed the last call's deadline (dropped)

    def call(self, op: str, client_ids: list[int], payload: dict[str, object], t: int) -> dict[int, object]:
        """Run client op ``op`` for ``client_ids`` with the broadcast ``payload``; results by client."""
        ...

    def call_for_reduction(self, op: str, client_ids: list[int], payload: dict[str, object],
                           t: int) -> dict[int, Held]:
        """Run ``op`` and keep each result's summed tensor (an ``Update``'s ``summed``, or the
        result itself) where it ran; return {client: (finite, its result's named extras, the
        bytes of its whole result, :func:`~raysoft.runtime.comm.wire_bytes`)}."""
        ...

    def accumulate(self, plan: Plan) -> torch.Tensor:
        """The plan's sum of the kept results, added in client-id order; drops what was kept."""
        ...

    def get_states(self) -> dict[int, object]:
        """Every client's state, on the CPU (for checkpoints)."""
        ...

    def set_states(self, states: dict[int, object]) -> None: ...

    def reset(self) -> None:
        """Rebuild every client from (seed, client id): data and initial state."""
        ...

    def recover(self) -> None:
        """Replace dead actors (their clients rebuilt from seed and id)."""
        ...

    def kill(self, actor: int) -> None:
        """Fault injection: client actor ``actor`` dies (in-process: the next call fails)."""
        ...


def finite(result: object) -> bool:
    """Whether every float tensor and array in a (nested, :mod:`raysoft.tree`) result is finite."""
    return all(_finite(leaf) for leaf in leaves(result))


def _finite(leaf: object) -> bool:
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
