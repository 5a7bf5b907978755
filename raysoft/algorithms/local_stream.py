"""Local on a stream: no server; each client keeps training its own model on its drifting
data with objective (2) anchored at its previous model (the CCFL paper's Local baseline). Every
client starts from the same model as CCFL's clients (the average of the pre-trained cluster
models), so the three stream algorithms see the same start."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import cast

import numpy as np
import torch

from ..params import Params
from .base import ClientContext
from .ccfl import CCFLServerState, PretrainedStart, init_server_state, initial_reply
from .settings import LocalStreamConfig
from .stream import StreamClient, ValSets


class LocalStream(PretrainedStart):
    """CCFL's Local baseline: no server; each client keeps training its own model."""

    Settings = LocalStreamConfig  # the CCFL comparison's keys, so one job file runs all three
    has_server = False

    def first_anchor(self, payload: Mapping[str, object]) -> tuple[Params, torch.Tensor | None, int]:
        return cast(Params, payload["initial"]), None, 0  # the common start, not a download

    def receive(self, cs: StreamClient, reply: Mapping[str, object]) -> tuple[Params, torch.Tensor | None, int]:
        assert cs.local is not None
        return cs.local, None, 0  # the client's own model is its anchor

    def upload(self, cs: StreamClient, mu: np.ndarray | None) -> tuple[Params | None, int]:
        return None, 0

    def serve_unseen(self, ctx: ClientContext, cs: StreamClient, w: Params, models: torch.Tensor | None,
                     payload: Mapping[str, object]) -> tuple[Params, dict[str, float]]:
        """A held-out client's cold start: its own model after its first local training."""
        return w, {}

    def init_stream_server(self, models: torch.Tensor) -> CCFLServerState:
        return init_server_state(models)  # only its epoch t moves

    def cold_start(self, state: CCFLServerState, initial_models: torch.Tensor) -> dict[str, object]:
        return {"initial": initial_reply(state), "t": state.t}

    def server_step(self, state: CCFLServerState, client: int, up: Mapping[str, object], scratch: torch.nn.Module,
                    val_sets: ValSets) -> tuple[CCFLServerState, None, dict[str, object]]:
        return replace(state, t=state.t + 1), None, {"stale": False, "staleness": 0, "u": None, "fresh": False}
