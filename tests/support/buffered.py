"""A FedBuff-style stream plug-in for the report's tests (``support.buffered:Buffered``): one
global model, updated once per ``buffer`` uploads.

Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022
(arXiv 2106.06639): a client trains from the global model x_tau it downloaded and uploads its
change delta = w - x_tau; the server adds delta / sqrt(1 + t - tau) to a buffer and, once the
buffer holds ``buffer`` uploads, moves x by ``server_lr`` times their mean and empties it. Every
reply is the current x. The runtime evaluates ``models(state)[k]`` on distribution k's holdout
set, so the one model is returned once per distribution: the report must show one global model
and say nothing about clusters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field

from raysoft.sdk import Params, StreamAlgorithm, StreamClient, StreamConfig, ValSets, nbytes, weighted_sum


class BufferedConfig(StreamConfig):
    buffer: int = Field(3, ge=1, description="uploads per server update (FedBuff's K)")
    server_lr: float = Field(1.0, gt=0.0, description="the server's learning rate eta_g")


@dataclass
class BufferedState:
    x: torch.Tensor
    t: int = 0
    clusters: int = 1
    pending: torch.Tensor | None = None  # the sum of the buffered, staleness-scaled changes
    count: int = 0
    versions: dict[int, torch.Tensor] | None = None  # x at every server version t (the x_tau of a reply)


class Buffered(StreamAlgorithm):
    """FedBuff's server over raysoft's stream template (its client half unchanged)."""

    Settings = BufferedConfig
    settings: BufferedConfig

    def first_anchor(self, payload: dict[str, Any]) -> tuple[Params, torch.Tensor | None, int]:
        return payload["global_model"], None, nbytes(payload["global_model"])

    def receive(self, cs: StreamClient, reply: dict[str, Any]) -> tuple[Params, torch.Tensor | None, int]:
        return reply["model"], None, nbytes(reply["model"])

    def init_stream_server(self, models: torch.Tensor) -> BufferedState:
        k = int(models.shape[0])
        x = weighted_sum(models.detach().to(torch.float32), [1.0 / k] * k)
        return BufferedState(x=x, clusters=k, versions={0: x})

    def cold_start(self, state: BufferedState, initial_models: torch.Tensor) -> dict[str, Any]:
        return {"global_model": state.x, "t": state.t}

    def server_step(self, state: BufferedState, client: int, up: dict[str, Any], scratch: torch.nn.Module,
                    val_sets: ValSets) -> tuple[BufferedState, Params, dict[str, Any]]:
        t, tau = state.t + 1, int(up["tau"])
        versions = dict(state.versions or {})
        delta = up["w"] - versions[tau]
        scaled = delta / float((1 + t - tau) ** 0.5)
        pending = scaled if state.pending is None else state.pending + scaled
        count, x = state.count + 1, state.x
        if count == self.settings.buffer:
            x, pending, count = state.x + self.settings.server_lr * pending / count, None, 0
        diag = {"t": t, "client": client, "tau": tau, "staleness": t - tau, "stale": False, "u": None,
                "fresh": False, "diagnostics": {"staleness": t - tau, "buffered": count}}
        versions[t] = x
        new = BufferedState(x=x, t=t, clusters=state.clusters, pending=pending, count=count, versions=versions)
        return new, x, diag

    def models(self, state: BufferedState) -> torch.Tensor:
        return state.x.unsqueeze(0).expand(state.clusters, -1)
