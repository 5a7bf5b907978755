"""FedBuff as a raysoft stream plug-in (``algorithm.name: fedbuff:FedBuff``).

Nguyen, Malik, Zhao, Sanjabi, Rabbat, Zhu, Huba, "Federated Learning with Buffered Asynchronous
Aggregation", AISTATS 2022 (arXiv 2106.06639), Algorithm 1. One global model w. A client
downloads w at the server's model version v, trains it locally (plain local SGD: no proximal
term) and uploads its result; the server turns it into the client's update
Delta = w_v - w_local, weights it by the staleness of v (the model versions made since the
client's download, t - v), and adds it to a buffer. When the buffer holds K updates the
server applies their mean with the server learning rate eta_g,

    w <- w - eta_g * (1/K) * sum_i s(t - v_i) Delta_i,    s(g) = 1 / sqrt(1 + g)

(the paper's choice of staleness function; ``staleness: constant`` turns it off), empties the
buffer and makes the next model version t + 1. Every reply is the current global model, and
its version travels with the reply as a plug-in field (``extras``), so the client's next
upload says which version it trained from: the server keeps the versions some client may still
train from, and forgets the others once every client has uploaded.

The client half is raysoft's stream template (it trains from the reply, rho = 0); the data is
any dataset of the data contract (the job runs on ``blobs.py``, a drifting dataset plug-in
beside this file). The server's maths are pure functions tested alone: :func:`staleness_weight`,
:func:`buffer_update`, :func:`apply_buffer`.

Of raysoft it imports only ``raysoft.sdk`` (the stable plug-in surface).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field

from raysoft.sdk import Params, StreamAlgorithm, StreamClient, StreamConfig, ValSets, nbytes


class FedBuffConfig(StreamConfig):
    """FedBuff's keys, on top of every stream's (``StreamConfig``: rounds = uploads, local_epochs,
    upload clocks, drift...). Defaults: the paper's K = 10 and its staleness function
    1 / sqrt(1 + staleness); eta_g = 1 (the buffer's mean applied as it is)."""

    buffer_size: int = Field(10, ge=1, description="K, the client updates the server buffers before it applies them")
    server_lr: float = Field(1.0, gt=0.0, description="eta_g, the server's learning rate on the buffer's mean")
    staleness: Literal["sqrt", "constant"] = Field(
        "sqrt", description="s(t - v): sqrt 1 / sqrt(1 + t - v) (the paper's), or constant 1"
    )
    clients: int = Field(1, ge=1, description="the stream's clients, default data.clients: the server forgets a "
                         "model version once every client has uploaded and none trains from it")

    @classmethod
    def fill_defaults(cls, given: dict[str, Any], clients: Any, distributions: Any) -> dict[str, Any]:
        filled = super().fill_defaults(given, clients, distributions)
        if isinstance(clients, int) and not isinstance(clients, bool) and "clients" not in given:
            filled["clients"] = clients
        return filled


# ----------------------------------------------------------------------------- the server's maths
def staleness_weight(staleness: int, kind: str = "sqrt") -> float:
    """s(t - v): 1 / sqrt(1 + staleness), or 1 (``constant``); ``staleness`` in model versions."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0 (got {staleness})")
    return 1.0 if kind == "constant" else 1.0 / math.sqrt(1.0 + staleness)


def buffer_update(buffer: Params | None, delta: Params, weight: float) -> Params:
    """The buffer after adding ``weight * delta`` (a new tensor; ``buffer`` None: empty)."""
    return weight * delta if buffer is None else buffer + weight * delta


def apply_buffer(w: Params, buffer: Params, count: int, server_lr: float) -> Params:
    """w - eta_g * buffer / K: the buffered updates' mean applied with the server learning rate."""
    return w - (server_lr / count) * buffer


# ----------------------------------------------------------------------------- the server's state
@dataclass
class FedBuffState:
    """The global model w at model version ``version``, the buffer (sum of weighted updates) and
    how many updates it holds, the model each outstanding version stands for (``models``: the
    versions some client trains from), and how many clusters the runtime evaluates w on."""

    w: torch.Tensor
    version: int = 0
    buffer: torch.Tensor | None = None
    count: int = 0
    models: dict[int, torch.Tensor] = field(default_factory=dict)
    holders: dict[int, int] = field(default_factory=dict)  # client -> the version it trains from
    clusters: int = 1


def on_upload(state: FedBuffState, client: int, w_local: Params, trained_from: int,
              settings: FedBuffConfig) -> tuple[FedBuffState, dict[str, float]]:
    """The server's answer to one upload (pure: ``state`` is not modified): the client's update
    against the version it trained from, weighted by its staleness, into the buffer; the
    buffer applied when it holds K; the client now holds the current version."""
    staleness = state.version - trained_from
    weight = staleness_weight(staleness, settings.staleness)
    buffer: Params | None = buffer_update(state.buffer, state.models[trained_from] - w_local, weight)
    count, w, version = state.count + 1, state.w, state.version
    applied = count >= settings.buffer_size
    if applied:
        assert buffer is not None
        w, version = apply_buffer(state.w, buffer, count, settings.server_lr), version + 1
        buffer, count = None, 0
    holders = {**state.holders, client: version}
    models = {**state.models, version: w}
    if len(holders) >= settings.clients:  # a client yet to upload may train from any version so far
        models = {v: m for v, m in models.items() if v == version or v in holders.values()}
    diag = {"staleness": float(staleness), "weight": weight, "applied": float(applied), "version": float(version)}
    return FedBuffState(w=w, version=version, buffer=buffer, count=count, models=models, holders=holders,
                        clusters=state.clusters), diag


# ----------------------------------------------------------------------------- the plug-in
class FedBuff(StreamAlgorithm):
    """FedBuff: client updates buffered, their staleness-weighted mean applied every K uploads;
    every reply is the current global model and its version."""

    Settings = FedBuffConfig
    settings: FedBuffConfig

    # client half: the reply's model is where the client's local training starts
    def first_anchor(self, payload: dict[str, Any]) -> tuple[Params, torch.Tensor | None, int]:
        w = payload["global_model"]
        return w, None, nbytes(w)

    def receive(self, cs: StreamClient, reply: dict[str, Any]) -> tuple[Params, torch.Tensor | None, int]:
        w = reply["model"]
        return w, None, nbytes(w)

    # server half
    def init_stream_server(self, models: torch.Tensor) -> FedBuffState:
        w = models[0].detach().to(torch.float32).clone()  # the template's start: one random initialisation
        return FedBuffState(w=w, models={0: w}, clusters=int(models.shape[0]))

    def cold_start(self, state: FedBuffState, initial_models: torch.Tensor) -> dict[str, Any]:
        return {"global_model": state.w, "extras": {"version": state.version}}

    def server_step(self, state: FedBuffState, client: int, up: dict[str, Any], scratch: torch.nn.Module,
                    val_sets: ValSets) -> tuple[FedBuffState, Params, dict[str, Any]]:
        new, figures = on_upload(state, client, up["w"], int(up["extras"]["version"]), self.settings)
        diag = {"stale": False,  # FedBuff drops no update: staleness only weighs it down
                "u": None, "fresh": False, "staleness": figures["staleness"],
                "diagnostics": figures}  # diagnostics.parquet, per upload
        return new, new.w, diag

    def reply(self, state: FedBuffState, model: Params | None) -> dict[str, Any]:
        return {"model": model, "models": None, "extras": {"version": state.version}}

    def models(self, state: FedBuffState) -> torch.Tensor:
        """The one global model, once per cluster (a view): each cluster's figure is w on its data."""
        return state.w.unsqueeze(0).expand(state.clusters, -1)


if TYPE_CHECKING:  # mypy checks FedBuff against the stream template (pyproject.toml: [tool.mypy] files)
    _: type[StreamAlgorithm] = FedBuff
