"""IFCA: the Iterative Federated Clustering Algorithm.

A. Ghosh, J. Chung, D. Yin, K. Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020 (arXiv:2006.04088), Algorithm 1.

Each round the server broadcasts the k centers to ``clients_per_round`` clients drawn
uniformly; each picks j = argmin_j F_i(theta_j), its average loss over its whole local data.
Option II (``option: model``, the default): the client trains theta_j locally and each center
becomes the plain average of its members' models. Option I (``option: gradient``): the client
returns grad F_i(theta_j) and theta_j <- theta_j - (lr / m) sum of its members' gradients, with
m the number of selected clients (the reference code's normalisation). A center that no client
chose keeps its model. ``option: fpfc_code`` is the IFCA baseline of the FPFC reference code,
kept to measure what it does to FPFC's Table 1: each selected client's one-step model
theta_j - lr g_i is averaged with weight 1 / m over all m selected clients, not over the n_j
members, so theta_j <- (n_j / m) theta_j - (lr / m) sum of the members' gradients: every center
shrinks by n_j / m each round, and one that no client chose becomes zero. Importance weights
are one-hot; a client's local model is its chosen center (chosen again at each evaluation, on
the client's own data). ``assignment: oracle`` replaces the choice by the client's true cluster
(its majority distribution): FedAvg on each cluster's clients, the ceiling of a hard clustering.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from ..devices import to_numpy
from ..optim import SGD, Adam
from ..params import Params, get_flat, set_flat
from ..rng import numpy_rng
from ..training import full_gradient
from .base import (
    ClientCall,
    ClientContext,
    Configured,
    EvalResult,
    Plan,
    Reduction,
    RoundGenerator,
    RoundResult,
    ServerContext,
    Update,
    planned_sum,
)
from .common import evaluate_vector, mean_losses, scratch_optimizer, select_uniform, served_vector_metrics, train_from
from .settings import IFCAConfig


def assign_cluster(losses: torch.Tensor | np.ndarray) -> int:
    """argmin_j of the clients' average losses (ties to the lowest index)."""
    return int(np.argmin(np.asarray(losses)))


def true_cluster(components: np.ndarray, k: int) -> int:
    """The client's majority distribution (ties to the lowest index): its center under
    ``assignment: oracle``."""
    return int(np.argmax(np.bincount(np.asarray(components, dtype=np.int64), minlength=k)))


def _choose(ctx: ClientContext, payload: dict[str, Any]) -> int:
    """The center client ``ctx.client`` joins: its lowest-loss one, or its true cluster under
    ``assignment: oracle`` (a setting: read from ``ctx``, not sent)."""
    centers = payload["centers"]
    if ctx.settings(IFCAConfig).assignment == "oracle":
        return true_cluster(ctx.data.components, centers.shape[0])
    return assign_cluster(to_numpy(mean_losses(ctx, centers)))


GRADIENT_OPTIONS = ("gradient", "fpfc_code")  # the options whose clients return one full-batch gradient


@dataclass(frozen=True)
class CenterUpdate(Reduction):
    """The new centers from the ``Update(update, {"center": j})`` results (j the chosen center)
    of the clients whose update is finite. Option II (``model``): theta_j = plain average of
    the models of the clients that chose j; option I (``gradient``): theta_j <- theta_j -
    (lr / m) sum_{i: s_i = j} g_i, m the number of those clients. Empty clusters keep their
    center. ``fpfc_code``: theta_j <- (n_j / m) theta_j - (lr / m) sum_{i: s_i = j} g_i, n_j
    the clients that chose j (an empty cluster's center becomes zero)."""

    old: torch.Tensor
    option: str = "model"
    lr: float = 0.0

    def plan(self, extras: Mapping[int, Mapping[str, object]]) -> Plan:
        chosen = {k: int(cast(int, e["center"])) for k, e in sorted(extras.items())}
        start = self.old.clone()
        if self.option == "fpfc_code" and chosen:
            counts = np.bincount(list(chosen.values()), minlength=start.shape[0])
            start *= torch.as_tensor(counts / len(chosen), dtype=start.dtype)[:, None]
        if self.option in GRADIENT_OPTIONS:
            return Plan(start, {k: (j, -self.lr / len(chosen)) for k, j in chosen.items()})
        terms: dict[int, tuple[int | None, float]] = {}
        for j in range(self.old.shape[0]):
            members = [k for k in chosen if chosen[k] == j]
            if members:
                start[j].zero_()
                terms.update({k: (j, 1.0 / len(members)) for k in members})
        return Plan(start, terms)


def average_members(assignments: dict[int, int], models: dict[int, Params], old: torch.Tensor) -> torch.Tensor:
    """Option II: theta_j = plain average of the models of the clients that chose j; empty
    clusters keep their center."""
    chosen: dict[int, Mapping[str, object]] = {k: {"center": j} for k, j in assignments.items() if k in models}
    return planned_sum(CenterUpdate(old).plan(chosen), models)


def gradient_step(assignments: dict[int, int], grads: dict[int, Params], old: torch.Tensor, lr: float) -> torch.Tensor:
    """Option I: theta_j <- theta_j - (lr / m) sum_{i: s_i = j} g_i, m = number of selected clients."""
    return planned_sum(CenterUpdate(old, "gradient", lr).plan({k: {"center": assignments[k]} for k in grads}), grads)


def one_hot(assignment: np.ndarray, k: int) -> np.ndarray:
    """[N, k] one-hot rows; clients never assigned (-1) get uniform rows."""
    out = np.full((assignment.shape[0], k), 1.0 / k)
    known = assignment >= 0
    out[known] = np.eye(k)[assignment[known]]
    return out


@dataclass
class IFCAState:
    centers: torch.Tensor  # [k, d]
    assignment: np.ndarray  # [N] last chosen center, -1 if never seen


def _ifca_train(ctx: ClientContext, opt: Adam | SGD, payload: dict[str, Any], t: int):
    centers = payload["centers"]
    j = _choose(ctx, payload)
    if ctx.settings(IFCAConfig).option in GRADIENT_OPTIONS:
        set_flat(ctx.scratch, centers[j])
        return opt, Update(full_gradient(ctx.scratch, ctx.data.x, ctx.data.y, ctx.info.task), {"center": j})
    return opt, Update(train_from(ctx, opt, centers[j], t), {"center": j})


def _ifca_assign(ctx: ClientContext, opt: Adam | SGD, payload: dict[str, Any], t: int):
    return opt, _choose(ctx, payload)


def _ifca_evaluate(ctx: ClientContext, opt: Adam | SGD, payload: dict[str, Any], t: int):
    j = _choose(ctx, payload)
    return opt, EvalResult(evaluate_vector(ctx, payload["centers"][j]), extra=j)  # extra: the chosen center


def center_cold_start(ctx: ClientContext, centers: torch.Tensor) -> EvalResult:
    """Cold start of a held-out client over ``centers`` (IFCA's, FPFC's): the center with the
    lowest average loss on its training data (:func:`assign_cluster`, IFCA's cluster estimate),
    scored; ``extra`` is the chosen center, also the metric ``center``."""
    j = assign_cluster(to_numpy(mean_losses(ctx, centers)))
    return EvalResult({**served_vector_metrics(ctx, centers[j]), "center": float(j)}, extra=j)


def _ifca_unseen(ctx: ClientContext, _: None, payload: dict[str, Any], t: int):
    """Cold start of a held-out client: IFCA's cluster estimate (its true cluster under
    ``assignment: oracle``), the chosen center served."""
    if ctx.settings(IFCAConfig).assignment == "oracle":
        j = _choose(ctx, payload)
        return None, EvalResult({**served_vector_metrics(ctx, payload["centers"][j]), "center": float(j)}, extra=j)
    return None, center_cold_start(ctx, payload["centers"])


class IFCA(Configured[IFCAConfig]):
    Settings = IFCAConfig
    client_ops = {"train": _ifca_train, "evaluate": _ifca_evaluate, "assign": _ifca_assign, "unseen": _ifca_unseen}
    readonly_ops = ("evaluate", "assign")
    stateless_ops = ("unseen",)

    def init_server(self, ctx: ServerContext) -> IFCAState:
        return IFCAState(self._draw_centers(ctx, 0), np.full(ctx.num_clients, -1))

    def _draw_centers(self, ctx: ServerContext, attempt: int) -> torch.Tensor:
        k = self.settings.num_centers
        stream = ("center",) if attempt == 0 else ("center-attempt", attempt)
        return torch.stack([get_flat(ctx.new_model(*stream, j)) for j in range(k)])

    def good_init(self, ctx: ServerContext, state: IFCAState) -> Generator[ClientCall, dict[int, int], torch.Tensor]:
        """Re-draw the centers until each one is chosen by >= init_threshold of all clients
        (keeps the most balanced draw if none qualifies)."""
        a = self.settings
        everyone = ctx.pool
        best, best_min = state.centers, -1
        for attempt in range(a.init_attempts):
            centers = state.centers if attempt == 0 else self._draw_centers(ctx, attempt)
            res = yield ClientCall("assign", everyone, {"centers": centers})
            smallest = np.bincount(list(res.values()), minlength=centers.shape[0]).min()
            if smallest > best_min:
                best, best_min = centers, smallest
            if smallest >= a.init_threshold * len(everyone):
                break
        return best

    def init_client(self, ctx: ClientContext) -> Adam | SGD:
        return scratch_optimizer(ctx)

    def round(self, ctx: ServerContext, state: IFCAState, t: int) -> RoundGenerator:
        a = self.settings
        if t == 0 and a.init_threshold > 0 and a.assignment == "loss":
            state = IFCAState((yield from self.good_init(ctx, state)), state.assignment)
        selected = select_uniform(ctx, a.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))
        res = yield ClientCall("train", selected, {"centers": state.centers},  # the clients know option, assignment
                               reduce=CenterUpdate(state.centers, a.option, ctx.cfg.train.lr))
        assignments = {k: int(cast(int, e["center"])) for k, e in res.extras.items()}
        centers = res.value
        assignment = state.assignment.copy()
        for k, j in assignments.items():
            assignment[k] = j
        return RoundResult(IFCAState(centers, assignment), weights_updated=True)

    def absorb_eval(self, state: IFCAState, results: dict[int, EvalResult]) -> IFCAState:
        """Every client's chosen center at evaluation time (its evaluation's ``extra``) becomes
        its current assignment."""
        assignment = state.assignment.copy()
        for k, r in results.items():
            assignment[k] = r.extra
        return IFCAState(state.centers, assignment)

    def centers(self, state: IFCAState) -> torch.Tensor:
        return state.centers

    def weights(self, state: IFCAState) -> np.ndarray:
        return one_hot(state.assignment, state.centers.shape[0])

    def assignment(self, state: IFCAState) -> np.ndarray:
        """Each client's chosen center (at the last evaluation, every client chooses)."""
        return state.assignment

    def eval_payload(self, state: IFCAState) -> dict[str, object]:
        return {"centers": state.centers}
