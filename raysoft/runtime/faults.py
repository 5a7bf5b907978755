"""Fault injection for testing recovery, as a wrapper around an executor.

``faults:`` in the config lists them: ``kill_actor`` kills client actor ``actor`` before the
first client call of round ``at_round`` (``hang_actor`` keeps it busy, alive and silent, for
``factor`` seconds); ``nan_update`` turns client ``client``'s training
result of that round into NaN; ``slow_client`` makes that client's work take ``factor`` times
as long from that round on (applied where the client runs: :func:`slowdown`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from ..algorithms.base import SERVED_OP
from ..config import Fault
from ..tree import map_leaves
from ..unseen import UNSEEN_OP
from .executor import Executor, Held


def slowdown(faults: Sequence[Fault], client: int, t: int) -> float:
    """How many times longer client ``client``'s work of round ``t`` takes (1: not slowed)."""
    return max([f.factor for f in faults if f.kind == "slow_client" and f.client == client and t >= f.at_round]
               or [1.0])


T = TypeVar("T")


def poison(result: T) -> T:
    """The result with its float tensors and arrays (nested, :mod:`raysoft.tree`) filled with NaN."""
    return map_leaves(_nan, result)


def _nan(leaf: object) -> object:
    if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
        return torch.full_like(leaf, float("nan"))
    if isinstance(leaf, np.ndarray) and leaf.dtype.kind == "f":
        return np.full_like(leaf, np.nan)
    return leaf


EventFn = Callable[..., None]
EVALUATION_OPS = ("evaluate", SERVED_OP, UNSEEN_OP)  # the calls of an evaluation, never a round's training


class FaultInjector:
    """An executor that injects the config's faults into the one it wraps."""

    def __init__(self, inner: Executor, faults: Sequence[Fault]) -> None:
        self.inner = inner
        self.faults = list(faults)
        self.fired: set[int] = set()  # kill faults already triggered (never re-fired after a restore)
        self.on_event: EventFn = lambda *a, **k: None  # the coordinator's event recorder

    def __getattr__(self, name: str) -> Any:
        """Everything else (placement, late, states, reset, recover, accumulate, and the Ray
        executor's hang, set_costs, take_counters) is the inner executor's."""
        return getattr(self.inner, name)

    def _before(self, op: str, t: int) -> None:
        if op in EVALUATION_OPS:  # a round's faults fire at its first client call, evaluations aside
            return
        for i, f in enumerate(self.faults):
            if f.kind == "kill_actor" and f.at_round == t and i not in self.fired:
                self.fired.add(i)
                self.on_event("fault_injected", f"kill actor {f.actor}", actor=f.actor)
                self.inner.kill(f.actor)
            if f.kind == "hang_actor" and f.at_round == t and i not in self.fired:
                self.fired.add(i)
                self.on_event("fault_injected", f"hang actor {f.actor} for {f.factor:g} s", actor=f.actor)
                self.inner.hang(f.actor, f.factor)  # type: ignore[attr-defined]  # hang_actor: the Ray backend's

    def _poisoned(self, op: str, t: int) -> list[int]:
        return [f.client for f in self.faults if f.kind == "nan_update" and f.at_round == t and op == "train"]

    def call(self, op: str, client_ids: list[int], payload: dict[str, object], t: int) -> dict[int, object]:
        self._before(op, t)
        results = self.inner.call(op, client_ids, payload, t)
        for k in self._poisoned(op, t):
            if k in results:
                results[k] = poison(results[k])
        return results

    def call_for_reduction(self, op: str, client_ids: list[int], payload: dict[str, object],
                           t: int) -> dict[int, Held]:
        self._before(op, t)
        flags = self.inner.call_for_reduction(op, client_ids, payload, t)
        for k in self._poisoned(op, t):  # a NaN update is never summed: it is not finite (it was sent: its bytes stay)
            if k in flags:
                flags[k] = (False, poison(flags[k][1]), flags[k][2])
        return flags
