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

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import FedSoftConfig
from ..optim import SGD, Adam
from ..params import Params, get_flat, mean, set_flat, weighted_sum
from ..rng import numpy_rng
from ..training import make_optimizer, model_losses, proximal_train
from .base import ClientCall, ClientContext, Configured, RoundGenerator, ServerContext
from .common import batched_local_train, own_data_metrics


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


def prox_gradient(grad_f: torch.Tensor, w: torch.Tensor, centers: torch.Tensor, u: torch.Tensor, lam: float) -> torch.Tensor:
    """Gradient (5) of h_k: grad f_k(w) + lambda * sum_s u_ks (w - c_s)."""
    return grad_f + lam * (u.sum() * w - u @ centers)


def coupling(models: dict[int, Params], u: np.ndarray, centers: torch.Tensor) -> float:
    """The mean over the clients in ``models`` of ||w_k - sum_s u_ks c_s||: how far each local
    model ends from the mixture of the centers it was pulled toward (0 when the proximal term
    holds it there; large when the local models drift on their own)."""
    if not models:
        return float("nan")
    ids = sorted(models)
    mix = torch.as_tensor(np.asarray(u)[ids], dtype=centers.dtype) @ centers
    return float(torch.stack([models[k] for k in ids]).sub(mix).norm(dim=1).mean())


def aggregate_selected(selected: list[np.ndarray], models: dict[int, Params], old: torch.Tensor) -> torch.Tensor:
    """c_s = (1/|Sel_s|) sum_{k in Sel_s} w_k; a cluster that selected nobody keeps its center."""
    rows = []
    for s, sel in enumerate(selected):
        members = [models[int(k)] for k in sel if int(k) in models]  # excluded updates are absent
        rows.append(mean(members) if members else old[s].clone())
    return torch.stack(rows)


def aggregate_full(v: np.ndarray, models: dict[int, Params]) -> torch.Tensor:
    """Full participation: c_s = sum_k v_sk w_k."""
    ids = sorted(models)
    return torch.stack([weighted_sum([models[k] for k in ids], [v[s, k] for k in ids]) for s in range(v.shape[0])])


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
    return cs, importance_weights(losses.numpy(), payload["sigma"])


def client_train(ctx: ClientContext, cs: FedSoftClient, payload: dict[str, Any], t: int):
    """Solve the proximal problem (4) from the persisting local model; return w_k^{t+1}."""
    lam = payload["prox_weight"]
    u = torch.as_tensor(payload["u"][ctx.client], dtype=torch.float32)
    centers = payload["centers"]
    if payload.get("start") == "mixture":  # the reading where w_k starts from the downloaded centers
        set_flat(cs.model, u @ centers)
    # grad h = grad f + lam * (sum_s u_s) * w - lam * sum_s u_s c_s   (equation (5))
    proximal_train(
        cs.model, cs.optimizer, ctx.data.x, ctx.data.y, ctx.info.task, ctx.cfg.train,
        pull_scale=float(lam * u.sum()), pull_target=lam * (u @ centers),
        rng=numpy_rng(ctx.cfg.seed, "shuffle", ctx.client, t),
    )
    return cs, get_flat(cs.model)


def client_train_batched(ctxs: list[ClientContext], states: list[FedSoftClient], payload: dict[str, Any], t: int):
    """:func:`client_train` for several clients of one host at once (:mod:`raysoft.batched`)."""
    lam, centers = payload["prox_weight"], payload["centers"]
    u = torch.as_tensor(np.asarray(payload["u"])[[c.client for c in ctxs]], dtype=torch.float32)  # [C, S]
    if payload.get("start") == "mixture":
        for cs, row in zip(states, u @ centers):
            set_flat(cs.model, row)
    rows = batched_local_train(ctxs, [cs.model for cs in states], [cs.optimizer for cs in states],
                               pull_scale=lam * u.sum(dim=1), pull_target=lam * (u @ centers), t=t)
    return states, rows


def client_evaluate(ctx: ClientContext, cs: FedSoftClient, payload: dict[str, Any], t: int):
    """The local model's metrics on the client's own training data (as the paper evaluates)."""
    return cs, own_data_metrics(ctx, cs.model)


# ----------------------------------------------------------------------------- server half
class FedSoft(Configured[FedSoftConfig]):
    name = "fedsoft"
    client_ops = {"estimate": client_estimate, "train": client_train, "evaluate": client_evaluate}
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
        everyone = list(range(ctx.num_clients))
        u, diag = state.u, {}
        if t % a.estimation_interval == 0:
            res = yield ClientCall("estimate", everyone, {"centers": state.centers, "sigma": a.sigma})
            u = state.u.copy()  # a client whose estimate was excluded keeps its previous one
            for k, uk in res.items():
                u[k] = uk
            diag["weights_updated"] = True
        v = selection_probabilities(u, ctx.sizes)
        if a.selection == "sample":
            selected = select_clients(v, a.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))
            trainers = sorted({int(k) for sel in selected for k in sel})
        else:
            trainers = everyone
        payload = {"centers": state.centers, "u": u, "prox_weight": a.prox_weight, "start": a.start}
        models = yield ClientCall("train", trainers, payload)
        diag["diagnostics"] = {"coupling": coupling(models, u, state.centers)}
        if a.selection == "sample":
            centers = aggregate_selected(selected, models, state.centers)
        else:
            centers = aggregate_full(v, models) if models else state.centers
        diag["trained"] = len(trainers)
        return FedSoftState(centers=centers, u=u), diag

    def centers(self, state: FedSoftState) -> torch.Tensor:
        return state.centers

    def weights(self, state: FedSoftState) -> np.ndarray:
        return state.u

    def eval_payload(self, state: FedSoftState) -> dict[str, Any]:
        return {}
