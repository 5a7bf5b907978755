"""FedAsync as a raysoft stream plug-in (``algorithm.name: fedasync:FedAsync``).

Xie, Koyejo, Gupta, "Asynchronous Federated Optimization", OPT workshop 2020 (arXiv 1903.03934).
One global model x. A client downloads (x_tau, tau), trains locally on
f(x) + (rho/2)||x - x_tau||^2 starting from x_tau and uploads x_new; the server, at its epoch t
(the t-th upload it applies), mixes

    alpha_t = alpha * s(t - tau)
    x_t     = (1 - alpha_t) x_{t-1} + alpha_t x_new

and sends x_t back. s is the staleness function (``staleness``): constant s = 1, polynomial
s_a(t - tau) = (t - tau + 1)^(-a), or hinge s_{a,b}(t - tau) = 1 if t - tau <= b else
1 / (a (t - tau - b) + 1).

Epochs follow raysoft's stream clock (the same as CCFL's): the server's epoch t counts the uploads
applied so far, a client's reply carries the t it was made at (tau), and its next upload is
applied at epoch t = (uploads applied by then) + 1, so the freshest possible upload has
t - tau = 1 (as in the paper's Algorithm 1, where x_tau is downloaded and x_t is the t-th update).

The client half is raysoft's stream template: it trains on h(w) = f(w) + (rho/2)||w - anchor||^2
with the reply as anchor and as start (``proximal`` gives the template FedAsync's rho), which is
FedAsync's local problem. Only the server half is FedAsync's own: :func:`staleness_weight` and
:func:`fedasync_update` are its maths, pure functions tested alone.

Of raysoft it imports only ``raysoft.sdk`` (the stable plug-in surface).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field

from raysoft.sdk import (
    Config,
    Params,
    StreamAlgorithm,
    StreamClient,
    StreamConfig,
    StreamSource,
    ValSets,
    nbytes,
    pretrain,
    weighted_sum,
)


class FedAsyncConfig(StreamConfig):
    """FedAsync's keys, on top of every stream's (``StreamConfig``: rounds = uploads, rho,
    local_epochs, upload clocks, drift...). Defaults: alpha = 0.6 with the polynomial staleness
    function, a = 0.5 (the choice documented in README.md; the paper could not be consulted
    here); hinge's b = 4."""

    alpha: float = Field(0.6, gt=0.0, lt=1.0, description="the mixing hyperparameter alpha in (0, 1)")
    staleness: Literal["constant", "polynomial", "hinge"] = Field(
        "polynomial", description="s(t - tau): constant 1; polynomial (t - tau + 1)^(-a); hinge 1 if t - tau <= b "
        "else 1 / (a (t - tau - b) + 1)"
    )
    a: float = Field(0.5, ge=0.0, description="polynomial and hinge: the decay a")
    b: float = Field(4.0, ge=0.0, description="hinge: the staleness b up to which uploads are not discounted")
    rho: float = Field(0.1, ge=0.0, description="the client's proximal term (rho/2)||x - x_tau||^2")
    pretrain_epochs: int = Field(5, ge=0, description="epochs of pre-training the K cluster models whose average "
                                 "is x_0, on the server's public samples")


# ----------------------------------------------------------------------------- the server's maths
def staleness_weight(t: int, tau: int, settings: FedAsyncConfig) -> float:
    """s(t - tau), the staleness function of ``settings.staleness`` at server epoch ``t`` for an
    upload trained from the model of epoch ``tau`` (t > tau in a stream: t - tau >= 1)."""
    gap = t - tau
    if gap < 0:
        raise ValueError(f"staleness t - tau must be >= 0 (t={t}, tau={tau})")
    if settings.staleness == "constant":
        return 1.0
    if settings.staleness == "polynomial":
        return float((gap + 1.0) ** (-settings.a))
    if gap <= settings.b:  # hinge
        return 1.0
    return 1.0 / (settings.a * (gap - settings.b) + 1.0)


def mixing_weight(t: int, tau: int, settings: FedAsyncConfig) -> float:
    """alpha_t = alpha * s(t - tau)."""
    return settings.alpha * staleness_weight(t, tau, settings)


def fedasync_update(x: Params, x_new: Params, alpha_t: float) -> Params:
    """x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new, as a new tensor (``x`` is not modified)."""
    return (1.0 - float(alpha_t)) * x + float(alpha_t) * x_new


# ----------------------------------------------------------------------------- the server's state
@dataclass
class FedAsyncState:
    """The server's state: the one global model x_t, the epoch t (uploads applied) and the
    number K of clusters (the stream's distributions), on whose K validation sets the runtime
    evaluates x_t."""

    x: torch.Tensor  # [d] float32, x_t
    t: int = 0
    clusters: int = 1


def initial_model(models: torch.Tensor) -> Params:
    """x_0: the average of the K pre-trained cluster models (1/K each, accumulated in cluster
    order: the same start as raysoft's local_stream and FedSoft-Async clients)."""
    k = int(models.shape[0])
    return weighted_sum(models.detach().to(torch.float32), [1.0 / k] * k)


# ----------------------------------------------------------------------------- the plug-in
class FedAsync(StreamAlgorithm):
    """FedAsync: one global model mixed with every upload, the mixing weight discounted by the
    upload's staleness; every reply is the current global model."""

    Settings = FedAsyncConfig
    settings: FedAsyncConfig

    # the start: K cluster models pre-trained on the server's public samples (x_0 is their average)
    def initial_models(self, cfg: Config, data: StreamSource) -> torch.Tensor:
        return pretrain(cfg, data, self.settings.pretrain_epochs)

    def proximal(self) -> float:
        return self.settings.rho  # FedAsync's local problem f(x) + (rho/2)||x - x_tau||^2

    # client half: the reply is the global model x_tau (anchor and start of the local training)
    def first_anchor(self, payload: dict[str, Any]) -> tuple[Params, torch.Tensor | None, int]:
        x = payload["global_model"]
        return x, None, nbytes(x)

    def receive(self, cs: StreamClient, reply: dict[str, Any]) -> tuple[Params, torch.Tensor | None, int]:
        x = reply["model"]
        return x, None, nbytes(x)

    # server half
    def init_stream_server(self, models: torch.Tensor) -> FedAsyncState:
        return FedAsyncState(x=initial_model(models), t=0, clusters=int(models.shape[0]))

    def cold_start(self, state: FedAsyncState, initial_models: torch.Tensor) -> dict[str, Any]:
        return {"global_model": state.x, "t": state.t}  # the current (x_t, t), as for any newcomer

    def server_step(self, state: FedAsyncState, client: int, up: dict[str, Any], scratch: torch.nn.Module,
                    val_sets: ValSets) -> tuple[FedAsyncState, Params, dict[str, Any]]:
        t, tau = state.t + 1, int(up["tau"])
        s = staleness_weight(t, tau, self.settings)
        alpha_t = self.settings.alpha * s
        x = fedasync_update(state.x, up["w"], alpha_t)
        diag = {"t": t, "client": client, "tau": tau, "staleness": t - tau, "s": s, "alpha": alpha_t,
                "stale": False,  # FedAsync drops no upload: staleness only lowers alpha_t
                "u": None, "fresh": False,  # no mixture estimate
                "diagnostics": {"staleness": t - tau, "alpha_t": alpha_t}}  # diagnostics.parquet, per upload
        return FedAsyncState(x=x, t=t, clusters=state.clusters), x, diag

    def models(self, state: FedAsyncState) -> torch.Tensor:
        """The runtime evaluates ``models(state)[k]`` on cluster k's test set and expects one row
        per cluster: the one global model, once per cluster (a view, no copy). Every cluster's
        figure is the global model's accuracy on that cluster's data."""
        return state.x.unsqueeze(0).expand(state.clusters, -1)


if TYPE_CHECKING:  # mypy checks FedAsync against the stream template (pyproject.toml: [tool.mypy] files)
    _: type[StreamAlgorithm] = FedAsync
