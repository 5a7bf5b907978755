"""FedProx as a raysoft plug-in: ``algorithm.name: fedprox:FedProx``.

T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020 (arXiv:1812.06127), Algorithm 2.

Each round the server draws ``clients_per_round`` clients uniformly and sends them the global
model w^t. Client k approximately minimises its proximal objective

    h_k(w; w^t) = F_k(w) + (mu / 2) ||w - w^t||^2

starting from w^t, with the configured local solver (``train``: optimizer, lr, batch size,
epochs): the gradient of the proximal term, mu (w - w^t), is added to every mini-batch gradient.
The server's new model is the n_k-weighted average of the returned models. With mu = 0 this is
FedAvg, number for number (the same random streams and the same arithmetic as the built-in
``fedavg``, trained client by client).

Like the built-in FedAvg, each client keeps its optimizer state (Adam moments, SGD momentum)
across rounds. The paper's variable local work (stragglers doing fewer epochs) is not modelled:
every selected client runs ``train.local_epochs`` epochs.

This file imports only from ``raysoft.sdk``, the stable surface for plug-ins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field

from raysoft.sdk import (
    SGD,
    Adam,
    AlgorithmConfig,
    ClientCall,
    ClientContext,
    ClientOp,
    Configured,
    RoundGenerator,
    RoundResult,
    ServerContext,
    WeightedMean,
    evaluate_vector,
    get_flat,
    numpy_rng,
    proximal_pull,
    scratch_optimizer,
    select_uniform,
    served_vector_metrics,
    train_from,
)


class FedProxConfig(AlgorithmConfig):
    """FedProx (Li et al., MLSys'20): FedAvg whose clients minimise F_k(w) + mu/2 ||w - w^t||^2."""

    mu: float = Field(0.01, ge=0.0, description="weight of the proximal term mu/2 ||w - w^t||^2 (0: FedAvg)")


# ----------------------------------------------------------------------------- the state
@dataclass
class GlobalModel:
    model: torch.Tensor  # [d], w^t


# ----------------------------------------------------------------------------- the client half
def _train(ctx: ClientContext, opt: Adam | SGD, payload: dict[str, Any], t: int) -> tuple[Adam | SGD, torch.Tensor]:
    """Client k: approximately minimise F_k(w) + mu/2 ||w - w^t||^2 from w^t; return w.
    ``proximal_pull`` (from raysoft.sdk) adds mu (w - w^t) to every mini-batch gradient. mu is
    a setting, known to every client (``ctx.settings``), not sent: the payload is w^t alone."""
    start = payload["model"]
    mu = ctx.settings(FedProxConfig).mu
    return opt, train_from(ctx, opt, start, t, **proximal_pull(mu, start))


def _evaluate(ctx: ClientContext, opt: Adam | SGD, payload: dict[str, Any],
              t: int) -> tuple[Adam | SGD, dict[str, float]]:
    """The global model's metrics on the client's own data."""
    return opt, evaluate_vector(ctx, payload["model"])


def _unseen(ctx: ClientContext, _: None, payload: dict[str, Any], t: int) -> tuple[None, dict[str, float]]:
    """The cold start of a held-out client (``data.held_out``): the global model, as it is."""
    return None, served_vector_metrics(ctx, payload["model"])


# ----------------------------------------------------------------------------- the server half
class FedProx(Configured[FedProxConfig]):
    """FedProx (Li et al., MLSys'20): FedAvg whose clients minimise F_k(w) + mu/2 ||w - w^t||^2."""

    Settings = FedProxConfig
    client_ops: dict[str, ClientOp] = {"train": _train, "evaluate": _evaluate, "unseen": _unseen}
    stateless_ops = ("unseen",)  # a held-out client's cold start reads no state of its own

    def init_server(self, ctx: ServerContext) -> GlobalModel:
        return GlobalModel(get_flat(ctx.new_model("center", 0)))  # the same w^0 as the built-in FedAvg

    def init_client(self, ctx: ClientContext) -> Adam | SGD:
        return scratch_optimizer(ctx)

    def round(self, ctx: ServerContext, state: GlobalModel, t: int) -> RoundGenerator:
        selected = select_uniform(ctx, self.settings.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))
        res = yield ClientCall("train", selected, {"model": state.model}, reduce=WeightedMean(ctx.sizes))
        model = res.value if res.clients else state.model  # every update excluded: keep w^t
        return RoundResult(GlobalModel(model), trained=len(res.clients))

    def centers(self, state: GlobalModel) -> torch.Tensor:
        return state.model[None, :]

    def weights(self, state: GlobalModel) -> None:
        return None

    def eval_payload(self, state: GlobalModel) -> dict[str, Any]:
        return {"model": state.model}


if TYPE_CHECKING:  # mypy checks FedProx against the protocol (pyproject.toml: [tool.mypy] files)
    from raysoft.sdk import Clustered

    _: type[Clustered] = FedProx
