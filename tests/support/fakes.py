"""Hand-made stand-ins for the runtime's collaborators: an executor whose client results are
chosen by the test (and which records every request), and a one-call algorithm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from raysoft.algorithms import ClientCall, Reduction, RoundResult
from raysoft.algorithms.base import Plan, split_result
from raysoft.params import get_flat
from raysoft.runtime.comm import wire_bytes
from raysoft.runtime.executor import finite

Result = Callable[[int, dict[str, Any], int], Any]  # (client, payload, t) -> that client's result


def local_mse(k: int, payload: dict[str, Any], t: int) -> dict[str, float]:
    """The ``evaluate`` result of client k at round t: an easily recognised number."""
    return {"mse": 100.0 * t + k}


class FakeExecutor:
    """An executor over hand-chosen results: ``results[op](client, payload, t)``. Every request
    goes to ``log``: ("call", op, clients, payload, t), ("call_for_reduction", op, clients, payload, t),
    ("accumulate", plan), ("kill", actor), ("set_states", states), ("reset",), ("recover",).
    Clients in ``late`` never answer a non-evaluate call and are then reported in ``late``.
    ``states`` stands for the clients' states."""

    def __init__(self, results: dict[str, Result] | None = None, late: list[int] | None = None,
                 placement: list[dict[str, Any]] | None = None) -> None:
        self.results = {"evaluate": local_mse, **(results or {})}
        self.missing = list(late or [])
        self.late: list[int] = []
        self.placement = placement if placement is not None else []
        self.log: list[tuple] = []
        self.kept: dict[int, Any] = {}
        self.states: dict[int, Any] = {}

    def _run(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int) -> dict[int, Any]:
        self.late = [] if op == "evaluate" else [k for k in client_ids if k in self.missing]
        return {k: self.results[op](k, payload, t) for k in client_ids if k not in self.late}

    def call(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int) -> dict[int, Any]:
        self.log.append(("call", op, list(client_ids), payload, t))
        return self._run(op, client_ids, payload, t)

    def call_for_reduction(self, op: str, client_ids: list[int], payload: dict[str, Any],
                           t: int) -> dict[int, tuple[bool, Any, int]]:
        self.log.append(("call_for_reduction", op, list(client_ids), payload, t))
        out = {}
        for k, r in self._run(op, client_ids, payload, t).items():
            self.kept[k], extras = split_result(r, op)
            out[k] = (finite(r), extras, wire_bytes(r))
        return out

    def accumulate(self, plan: Plan) -> torch.Tensor:
        self.log.append(("accumulate", plan))
        kept, self.kept = self.kept, {}
        return plan.apply(kept)

    def get_states(self) -> dict[int, Any]:
        return dict(self.states)

    def set_states(self, states: dict[int, Any]) -> None:
        self.log.append(("set_states", dict(states)))
        self.states = dict(states)

    def reset(self) -> None:
        self.log.append(("reset",))
        self.states = {}

    def recover(self) -> None:
        self.log.append(("recover",))

    def kill(self, actor: int) -> None:
        self.log.append(("kill", actor))

    def asked(self, *kinds: str) -> list[tuple]:
        """The logged requests of the given kinds ("call", "call_for_reduction", ...), in order."""
        return [entry for entry in self.log if entry[0] in kinds]


class OneCall:
    """A tiny synchronous algorithm: each round yields one ``ClientCall("train", clients,
    {"x": t}, reduce)`` and keeps what came back in ``state["seen"]`` (one entry a round), so a
    test sees exactly what reached the algorithm. Two centers of zeros; importance weights
    k / 10 and 1 - k / 10, reported as updated every round."""

    name = "one_call"
    # the ops it asks for (the fake executor computes their results; these are never run)
    client_ops: dict[str, Any] = {"train": lambda *a: None, "evaluate": lambda *a: None}

    def __init__(self, clients: tuple[int, ...] = (0, 1, 2), reduce: Reduction | None = None) -> None:
        self.clients, self.reduce = list(clients), reduce

    def init_server(self, ctx: Any) -> dict[str, Any]:
        d = get_flat(ctx.new_model("center", 0)).numel()
        u = np.arange(ctx.num_clients) / 10.0
        return {"t": 0, "seen": [], "centers": torch.zeros(2, d), "weights": np.stack([u, 1 - u], axis=1)}

    def init_client(self, ctx: Any) -> dict[str, Any]:
        return {}

    def round(self, ctx: Any, state: dict[str, Any], t: int):
        got = yield ClientCall("train", self.clients, {"x": t}, self.reduce)
        return RoundResult({**state, "t": t + 1, "seen": state["seen"] + [got]}, weights_updated=True,
                           trained=len(self.clients))

    def centers(self, state: dict[str, Any]) -> torch.Tensor:
        return state["centers"]

    def weights(self, state: dict[str, Any]) -> np.ndarray:
        return state["weights"]

    def eval_payload(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"t": state["t"]}
