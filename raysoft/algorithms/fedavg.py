"""FedAvg and Local, the reference points of the clustered-FL papers.

FedAvg (McMahan et al., AISTATS 2017): each round, ``clients_per_round`` clients drawn
uniformly start from the global model, train locally, and the server takes the n_k-weighted
average of their models. Local: each selected client trains its own model on its own data,
with no communication (no centers and no weights: it defines neither).

Both keep each client's optimizer state (Adam moments, SGD momentum) across rounds, like
FedSoft and FedEM's reference code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..optim import SGD, Adam
from ..params import get_flat, set_flat
from ..rng import numpy_rng
from ..training import make_optimizer, proximal_train
from .base import ClientCall, ClientContext, Configured, RoundGenerator, RoundResult, ServerContext, WeightedMean
from .common import (
    batched_local_train,
    evaluate_vector,
    own_data_metrics,
    scratch_optimizer,
    select_uniform,
    served_metrics,
    served_vector_metrics,
    train_from,
)
from .settings import FedAvgConfig, LocalConfig


@dataclass
class GlobalModel:
    model: torch.Tensor  # [d]


def _fedavg_train(ctx: ClientContext, opt, payload: Mapping[str, torch.Tensor], t: int):
    return opt, train_from(ctx, opt, payload["model"], t)


def _fedavg_train_batched(ctxs: list[ClientContext], opts: list, payload: Mapping[str, torch.Tensor], t: int):
    return opts, batched_local_train(ctxs, None, opts, t, start=payload["model"])


def _fedavg_evaluate(ctx: ClientContext, opt, payload: Mapping[str, torch.Tensor], t: int):
    return opt, evaluate_vector(ctx, payload["model"])


def _fedavg_unseen(ctx: ClientContext, _: None, payload: Mapping[str, torch.Tensor], t: int):
    """Cold start of a held-out client: the global model, as it is."""
    return None, served_vector_metrics(ctx, payload["model"])


def _fedavg_evaluate_batched(ctxs: list[ClientContext], opts: list, payload: Mapping[str, torch.Tensor], t: int):
    """:func:`_fedavg_evaluate` of a host's clients at once: the global model passes forward over
    their data together (:func:`~raysoft.evaluation.score_clients`); each client's metrics are
    its own samples', as alone."""
    from ..evaluation import score_clients

    ctx = ctxs[0]
    set_flat(ctx.scratch, payload["model"])
    out = score_clients(ctx.scratch, [(c.data.x, c.data.y) for c in ctxs], ctx.info.task)
    tested = [i for i, c in enumerate(ctxs) if c.data.test_x is not None and c.data.test_y is not None]
    splits = [(ctxs[i].data.test_x, ctxs[i].data.test_y) for i in tested]
    for i, m in zip(tested, score_clients(ctx.scratch, splits, ctx.info.task)):  # type: ignore[arg-type]
        out[i].update({f"test_{k}": v for k, v in m.items()})
    return opts, out


class FedAvg(Configured[FedAvgConfig]):
    """FedAvg: one global model, the n_k-weighted average of the selected clients' models."""

    Settings = FedAvgConfig
    client_ops = {"train": _fedavg_train, "evaluate": _fedavg_evaluate, "unseen": _fedavg_unseen}
    stateless_ops = ("unseen",)
    batched_ops = {"train": _fedavg_train_batched, "evaluate": _fedavg_evaluate_batched}

    def init_server(self, ctx: ServerContext) -> GlobalModel:
        return GlobalModel(get_flat(ctx.new_model("center", 0)))

    def init_client(self, ctx: ClientContext) -> Adam | SGD:
        return scratch_optimizer(ctx)

    def round(self, ctx: ServerContext, state: GlobalModel, t: int) -> RoundGenerator:
        selected = select_uniform(ctx, self.settings.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))
        res = yield ClientCall("train", selected, {"model": state.model}, reduce=WeightedMean(ctx.sizes))
        model = res.value if res.clients else state.model
        return RoundResult(GlobalModel(model), trained=len(res.clients))

    def centers(self, state: GlobalModel) -> torch.Tensor:
        return state.model[None, :]

    def weights(self, state: GlobalModel) -> None:
        return None

    def eval_payload(self, state: GlobalModel) -> dict[str, torch.Tensor]:
        return {"model": state.model}


@dataclass
class LocalClient:
    model: torch.nn.Module
    optimizer: Adam | SGD


def _local_train(ctx: ClientContext, cs: LocalClient, payload: Mapping[str, object], t: int):
    proximal_train(cs.model, cs.optimizer, ctx.data.x, ctx.data.y, ctx.info.task, ctx.cfg.train,
                   rng=numpy_rng(ctx.cfg.seed, "shuffle", ctx.client, t))
    return cs, None


def _local_train_batched(ctxs: list[ClientContext], states: list[LocalClient], payload: Mapping[str, object], t: int):
    batched_local_train(ctxs, [cs.model for cs in states], [cs.optimizer for cs in states], t)
    return states, [None] * len(states)


def _local_evaluate(ctx: ClientContext, cs: LocalClient, payload: Mapping[str, object], t: int):
    return cs, own_data_metrics(ctx, cs.model)


def local_budget(rounds: int, clients_per_round: int, trainers: int, local_epochs: int) -> int:
    """The epochs a training client of Local has had, in expectation, after ``rounds`` rounds:
    rounds * min(K, trainers) / trainers * local_epochs, rounded to the nearest whole number,
    at least 1 (K = clients_per_round, ``trainers`` the clients that train)."""
    return max(1, round(rounds * min(clients_per_round, trainers) / trainers * local_epochs))


def _local_unseen(ctx: ClientContext, _: None, payload: Mapping[str, object], t: int):
    """Cold start of a held-out client: its own model, from the shared initial model
    (``client_init``, as every client's), trained with the run's local solver for the budget a
    training client has had by round t (:func:`local_budget`), its mini-batch order from the
    stream (seed, "unseen-shuffle", client, t)."""
    cfg = ctx.cfg
    trainers = cfg.data.clients - cfg.data.held_out_count()
    epochs = local_budget(t, ctx.settings(LocalConfig).clients_per_round, trainers, cfg.train.local_epochs)
    model = ctx.new_model("client_init")
    proximal_train(model, make_optimizer(cfg.train, model.parameters()), ctx.data.x, ctx.data.y, ctx.info.task,
                   cfg.train, rng=numpy_rng(cfg.seed, "unseen-shuffle", ctx.client, t), epochs=epochs)
    return None, {**served_metrics(ctx, model), "epochs": float(epochs)}


class Local(Configured[LocalConfig]):
    """Local: every selected client trains its own model; no communication."""

    Settings = LocalConfig
    client_ops = {"train": _local_train, "evaluate": _local_evaluate, "unseen": _local_unseen}
    stateless_ops = ("unseen",)
    batched_ops = {"train": _local_train_batched}

    def init_server(self, ctx: ServerContext) -> None:
        return None  # no server state: every model is a client's own

    def init_client(self, ctx: ClientContext) -> LocalClient:
        model = ctx.new_model("client_init")
        return LocalClient(model, make_optimizer(ctx.cfg.train, model.parameters()))

    def round(self, ctx: ServerContext, state: None, t: int) -> RoundGenerator:
        selected = select_uniform(ctx, self.settings.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))
        yield ClientCall("train", selected, {})
        return RoundResult(state, trained=len(selected))

    def eval_payload(self, state: None) -> dict[str, object]:
        return {}

    def serve(self, ctx: ClientContext, cs: LocalClient, payload: Mapping[str, object], t: int) -> torch.nn.Module:
        """The model served to a client: its own."""
        return cs.model
