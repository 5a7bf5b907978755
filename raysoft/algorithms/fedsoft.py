"""FedSoft: soft clustered federated learning with proximal local updating.

Y. Ruan and C. Joe-Wong, "FedSoft: Soft Clustered Federated Learning with Proximal Local
Updating", AAAI 2022 (arXiv:2112.06053). Algorithm 1; equation numbers refer to the paper.

Every tau rounds all clients estimate importance weights u_ks by assigning each local sample
to the center with the lowest loss, with the counter smoother sigma as a floor. The server
turns them into selection probabilities v_sk (6), draws K clients per cluster without
replacement, each client in the union solves the proximal problem (4) once, and each center
becomes the 1/K average of its selected clients' models. Each client keeps its local model and
optimizer across rounds (as the reference code does): the proximal term is the only coupling,
and the local models are FedSoft's personalised models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from ..devices import to_numpy
from ..optim import SGD, Adam
from ..params import Params, get_flat, set_flat
from ..rng import numpy_rng
from ..training import make_optimizer, model_losses, proximal_train
from .base import (
    ClientCall,
    ClientContext,
    Configured,
    Plan,
    Reduction,
    RoundGenerator,
    RoundResult,
    ServerContext,
    Update,
    planned_sum,
)
from .common import batched_local_train, own_data_metrics, served_metrics
from .settings import FedSoftConfig


# ----------------------------------------------------------------------------- pure sub-steps
def importance_weights(losses: np.ndarray | torch.Tensor, sigma: float) -> np.ndarray:
    """u_ks = max(n_ks / n_k, sigma), where n_ks counts samples whose lowest-loss center is s.

    ``losses`` is [S, n_k]: the loss of each center on each local sample. Ties go to the
    lowest center index.
    """
    losses = np.asarray(losses)
    num_centers, n = losses.shape
    counts = np.bincount(losses.argmin(axis=0), minlength=num_centers)
    return np.maximum(counts / n, sigma)


def selection_probabilities(u: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Equation (6): v_sk = u_ks n_k / sum_k' u_k's n_k'; [S, N]. A zero column gives 1/N."""
    mass = np.asarray(u, dtype=np.float64).T * np.asarray(sizes, dtype=np.float64)[None, :]
    totals = mass.sum(axis=1, keepdims=True)
    n = mass.shape[1]
    return np.where(totals > 0, mass / np.where(totals > 0, totals, 1.0), 1.0 / n)


def select_clients(v: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """For each cluster s, K clients drawn without replacement with probabilities v[s].

    If fewer than K clients have a positive probability (only possible with sigma = 0), all of
    them are selected.
    """
    out = []
    for probs in v:
        support = int((probs > 0).sum())
        size = min(k, support)
        out.append(np.sort(rng.choice(len(probs), size=size, replace=False, p=probs / probs.sum())))
    return out


def prox_gradient(
    grad_f: torch.Tensor, w: torch.Tensor, centers: torch.Tensor, u: torch.Tensor, lam: float
) -> torch.Tensor:
    """Gradient (5) of h_k: grad f_k(w) + lambda * sum_s u_ks (w - c_s)."""
    return grad_f + lam * (u.sum() * w - u @ centers)


def distance_to_mixture(w: Params, u_k: torch.Tensor, centers: torch.Tensor) -> float:
    """||w_k - sum_s u_ks c_s||: how far a local model ends from the mixture of the centers it
    was pulled toward."""
    return float(torch.linalg.vector_norm(w - u_k.to(centers.dtype) @ centers))


def coupling(models: dict[int, Params], u: np.ndarray, centers: torch.Tensor) -> float:
    """The mean over the clients in ``models`` of :func:`distance_to_mixture` (0 when the
    proximal term holds every local model at its mixture; large when they drift on their own)."""
    if not models:
        return float("nan")
    u_t = torch.as_tensor(np.asarray(u), dtype=centers.dtype)
    return float(np.mean([distance_to_mixture(models[k], u_t[k], centers) for k in sorted(models)]))


@dataclass(frozen=True)
class CenterSums(Reduction):
    """The new centers as a sum of the clients' models, which a backend may make where the
    clients are (``ray.reduce_in_actors``): with ``selected`` (sample selection), c_s is the
    uniform average of the finite models of Sel_s, and a cluster with none keeps ``old[s]``;
    without (full participation), c_s = sum_k v_sk w_k over the finite models (the old centers
    if there is none). A client selected by several clusters adds its model to each of their
    rows. Sums a client's ``Update(w_k, {"dist": its distance to its mixture})``'s w_k."""

    old: torch.Tensor
    selected: tuple[np.ndarray, ...] | None = None
    v: np.ndarray | None = None

    def plan(self, extras: Mapping[int, Mapping[str, object]]) -> Plan:
        if self.selected is None:
            assert self.v is not None
            if not extras:
                return Plan(self.old.clone(), {})
            rows = range(self.v.shape[0])
            return Plan(torch.zeros_like(self.old),
                        {k: [(s, float(self.v[s, k])) for s in rows] for k in sorted(extras)})
        start = torch.zeros_like(self.old)
        terms: dict[int, list[tuple[int | None, float]]] = {}
        for s, sel in enumerate(self.selected):
            members = [int(k) for k in sel if int(k) in extras]  # excluded updates are absent
            if not members:
                start[s] = self.old[s]
            for k in members:
                terms.setdefault(k, []).append((s, 1.0 / len(members)))
        return Plan(start, terms)


def aggregate_selected(selected: list[np.ndarray], models: dict[int, Params], old: torch.Tensor) -> torch.Tensor:
    """c_s = (1/|Sel_s|) sum_{k in Sel_s} w_k; a cluster that selected nobody keeps its center."""
    return planned_sum(CenterSums(old, tuple(selected)).plan({k: {} for k in models}), models)


def aggregate_full(v: np.ndarray, models: dict[int, Params], old: torch.Tensor) -> torch.Tensor:
    """Full participation: c_s = sum_k v_sk w_k (``old`` if there is no model)."""
    return planned_sum(CenterSums(old, None, v).plan({k: {} for k in models}), models)


# ----------------------------------------------------------------------------- state
@dataclass
class FedSoftState:
    centers: torch.Tensor  # [S, d]
    u: np.ndarray  # [N, S], the latest importance weights


@dataclass
class FedSoftClient:
    model: torch.nn.Module  # the personalised local model w_k
    optimizer: Adam | SGD


# ----------------------------------------------------------------------------- client half
def client_estimate(ctx: ClientContext, cs: FedSoftClient, payload: dict[str, Any], t: int):
    """Importance weights of this client from the per-sample losses of every center."""
    losses = model_losses(ctx.scratch, payload["centers"], ctx.data.x, ctx.data.y, ctx.info.task)
    return cs, importance_weights(to_numpy(losses), ctx.settings(FedSoftConfig).sigma)


def client_train(ctx: ClientContext, cs: FedSoftClient, payload: dict[str, Any], t: int):
    """Solve the proximal problem (4) from the persisting local model; return w_k^{t+1}."""
    a = ctx.settings(FedSoftConfig)
    lam = a.prox_weight
    u = ctx.tensor(payload["u"][ctx.client], dtype=torch.float32)
    centers = payload["centers"]
    if a.start == "mixture":  # the reading where w_k starts from the downloaded centers
        set_flat(cs.model, u @ centers)
    # grad h = grad f + lam * (sum_s u_s) * w - lam * sum_s u_s c_s   (equation (5))
    proximal_train(
        cs.model, cs.optimizer, ctx.data.x, ctx.data.y, ctx.info.task, ctx.cfg.train,
        pull_scale=float(lam * u.sum()), pull_target=lam * (u @ centers),
        rng=numpy_rng(ctx.cfg.seed, "shuffle", ctx.client, t),
    )
    w = get_flat(cs.model)
    return cs, Update(w, {"dist": distance_to_mixture(w, u, centers)})


def client_train_batched(ctxs: list[ClientContext], states: list[FedSoftClient], payload: dict[str, Any], t: int):
    """:func:`client_train` for several clients of one host at once (:mod:`raysoft.batched`)."""
    a = ctxs[0].settings(FedSoftConfig)
    lam, centers = a.prox_weight, payload["centers"]
    u = ctxs[0].tensor(np.asarray(payload["u"])[[c.client for c in ctxs]], dtype=torch.float32)  # [C, S]
    if a.start == "mixture":
        for cs, row in zip(states, u @ centers):
            set_flat(cs.model, row)
    rows = batched_local_train(ctxs, [cs.model for cs in states], [cs.optimizer for cs in states],
                               pull_scale=lam * u.sum(dim=1), pull_target=lam * (u @ centers), t=t)
    return states, [Update(w, {"dist": distance_to_mixture(w, uk, centers)}) for w, uk in zip(rows, u)]


def client_evaluate(ctx: ClientContext, cs: FedSoftClient, payload: Mapping[str, object], t: int):
    """The local model's metrics on the client's own training data (as the paper evaluates)."""
    return cs, own_data_metrics(ctx, cs.model)


def mixture_of_centers(u: np.ndarray, centers: torch.Tensor) -> Params:
    """sum_s (u_s / sum u) c_s: the centers combined by the normalised importance weights."""
    w = torch.as_tensor(np.asarray(u, dtype=np.float64) / float(np.sum(u)), dtype=centers.dtype,
                        device=centers.device)
    return w @ centers


def client_unseen(ctx: ClientContext, _: None, payload: dict[str, Any], t: int):
    """Cold start of a held-out client: FedSoft's estimation step on its training data
    (:func:`importance_weights`, with the run's sigma) and the centers combined by those
    weights, normalised (:func:`mixture_of_centers`), served; the weights are the metrics
    ``u[s]``."""
    losses = model_losses(ctx.scratch, payload["centers"], ctx.data.x, ctx.data.y, ctx.info.task)
    u = importance_weights(to_numpy(losses), ctx.settings(FedSoftConfig).sigma)
    set_flat(ctx.scratch, mixture_of_centers(u, payload["centers"]))
    return None, {**served_metrics(ctx, ctx.scratch), **{f"u[{s}]": float(v) for s, v in enumerate(u)}}


# ----------------------------------------------------------------------------- server half
class FedSoft(Configured[FedSoftConfig]):
    Settings = FedSoftConfig
    client_ops = {"estimate": client_estimate, "train": client_train, "evaluate": client_evaluate,
                  "unseen": client_unseen}
    stateless_ops = ("estimate", "unseen")  # the centers' losses on the client's data
    batched_ops = {"train": client_train_batched}

    def init_server(self, ctx: ServerContext) -> FedSoftState:
        a = self.settings
        s = int(a.num_centers)
        centers = torch.stack([get_flat(ctx.new_model("center", i)) for i in range(s)])
        return FedSoftState(centers=centers, u=np.full((ctx.num_clients, s), 1.0 / s))

    def init_client(self, ctx: ClientContext) -> FedSoftClient:
        model = ctx.new_model("client_init")  # one shared initial model, as the reference code
        return FedSoftClient(model=model, optimizer=make_optimizer(ctx.cfg.train, model.parameters()))

    def round(self, ctx: ServerContext, state: FedSoftState, t: int) -> RoundGenerator:
        a = self.settings
        everyone = ctx.pool  # every training client (held-out ones are never asked)
        u = state.u
        estimated = False
        if t % a.estimation_interval == 0:
            res = yield ClientCall("estimate", everyone, {"centers": state.centers})
            u = state.u.copy()  # a client whose estimate was excluded keeps its previous one
            for k, uk in res.items():
                u[k] = uk
            estimated = True
        v = selection_probabilities(u, ctx.pool_sizes)  # a held-out client's n_k = 0: never drawn
        if a.selection == "sample":
            selected = select_clients(v, a.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))
            trainers = sorted({int(k) for sel in selected for k in sel})
        else:
            trainers = everyone
        payload = {"centers": state.centers, "u": u}  # the state only: the clients know sigma, lambda, start
        sums = (
            CenterSums(state.centers, tuple(selected))
            if a.selection == "sample"
            else CenterSums(state.centers, None, v)
        )
        res = yield ClientCall("train", trainers, payload, reduce=sums, each=("u",))  # a client reads its own u_k
        dists = [cast(float, res.extras[k]["dist"]) for k in res.clients]
        coupling = float(np.mean(dists)) if dists else float("nan")
        return RoundResult(FedSoftState(centers=res.value, u=u), {"coupling": coupling}, weights_updated=estimated,
                           trained=len(trainers))

    def centers(self, state: FedSoftState) -> torch.Tensor:
        return state.centers

    def weights(self, state: FedSoftState) -> np.ndarray:
        return state.u

    def eval_payload(self, state: FedSoftState) -> dict[str, object]:
        return {}

    def unseen_payload(self, state: FedSoftState) -> dict[str, object]:
        return {"centers": state.centers}

    def serve(self, ctx: ClientContext, cs: FedSoftClient, payload: Mapping[str, object], t: int) -> torch.nn.Module:
        """The model served to a client: its local (personalised) model, trained with the
        proximal pull towards its mixture of the centers."""
        return cs.model
