"""Clustered Federated Learning (CFL) as a raysoft plug-in: ``algorithm.name: cfl:CFL``.

F. Sattler, K.-R. Müller, W. Samek, "Clustered Federated Learning: Model-Agnostic Distributed
Multitask Optimization under Privacy Constraints", IEEE TNNLS 2020 (arXiv:1910.01991), as its
reference code runs it (github.com/felisat/clustered-federated-learning):

* the run starts with one cluster holding every client, and one model;
* every round each participating client downloads its cluster's model W_c, trains it locally
  and returns its update dW_i = W_i - W_c (the client keeps none of its trained weights, only
  its optimizer state, as the reference client's optimizer persists);
* per cluster c, with the updates of its members: mean_norm = ||mean_i dW_i|| and
  max_norm = max_i ||dW_i||. The cluster is split when mean_norm < eps1 (the cluster's model is
  near a stationary point of its members' joint objective) and max_norm > eps2 (some member is
  still far from its own) and |c| > 2 and the round (counted from 1) is > warmup. The split is
  the bipartition of the members by complete-linkage agglomerative clustering of -alpha, alpha_ij
  the cosine similarity of dW_i and dW_j: it minimises the largest similarity across the two
  groups. Both halves start from the parent's model; the first keeps the parent's index, the
  second becomes the last cluster;
* then every cluster's model += the mean of its members' updates (``weighting: samples``: the
  n_i-weighted mean, also for mean_norm).

Each round's number of clusters is the diagnostic ``num_clusters`` (diagnostics.parquet), with
every cluster's ``mean_norm[c]`` and ``max_norm[c]`` (to choose eps1 and eps2) and, at a split
of cluster c, ``max_cross_similarity[c]``, the largest alpha_ij across its two halves. The
centers evaluated on the holdout sets are the current cluster models (their number grows), a
client's model is its cluster's, and the final assignment is scored by its adjusted Rand index.

Choices where the reference code is silent or does otherwise: with partial participation
(``clients_per_round`` below ``data.clients``; the default is every client, as the reference) a
cluster is split only in a round where all its members took part; a cluster none of whose
members took part keeps its model. The reference notebook maps a split's halves back to client
ids only for the first split (it keeps positions within the cluster); here they are always
client ids.

This file imports only from ``raysoft.sdk``, the stable surface for plug-ins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from pydantic import Field

from raysoft.sdk import (
    SGD,
    Adam,
    AlgorithmConfig,
    ClientCall,
    ClientContext,
    Configured,
    RoundGenerator,
    RoundResult,
    ServerContext,
    evaluate_vector,
    get_flat,
    numpy_rng,
    scratch_optimizer,
    to_numpy,
    train_from,
    uniform_selection,
    weighted_sum,
)


class CFLConfig(AlgorithmConfig):
    """CFL (Sattler et al., TNNLS'20): split a cluster in two by the cosine similarity of its
    members' updates once its model is stationary but some member's update is still large."""

    clients_per_round: int = Field(
        60, ge=1, description="clients drawn per round; default data.clients (every client, as the reference code)"
    )
    eps1: float = Field(0.4, gt=0.0, description="split only if ||mean update of the cluster|| < eps1 (reference 0.4)")
    eps2: float = Field(1.6, gt=0.0, description="split only if the largest member update norm > eps2 (reference 1.6)")
    warmup: int = Field(20, ge=0, description="no split in rounds 1..warmup (reference 20)")
    weighting: Literal["mean", "samples"] = Field(
        "mean", description="mean: plain mean of the members' updates (reference); samples: weighted by n_i"
    )

    @classmethod
    def fill_defaults(cls, given: dict[str, Any], clients: Any, distributions: Any) -> dict[str, Any]:
        """clients_per_round defaults to every client (the reference code's frac = 1.0)."""
        filled = super().fill_defaults(given, clients, distributions)
        if "clients_per_round" not in given and isinstance(clients, int):
            filled["clients_per_round"] = clients
        return filled


# ----------------------------------------------------------------------------- the maths
def cosine_similarities(updates: np.ndarray) -> np.ndarray:
    """[m, m] alpha_ij = <dW_i, dW_j> / (||dW_i|| ||dW_j|| + 1e-12) of the rows of ``updates``
    ([m, d], flattened updates), in float64."""
    u = np.asarray(updates, dtype=np.float64)
    norms = np.linalg.norm(u, axis=1)
    return (u @ u.T) / (norms[:, None] * norms[None, :] + 1e-12)


def mean_weights(sizes: Sequence[float] | np.ndarray, weighting: str) -> np.ndarray:
    """The coefficients of the members' mean: 1/m each (``mean``) or n_i / sum n (``samples``)."""
    n = np.asarray(sizes, dtype=np.float64)
    if weighting == "samples":
        return n / n.sum()
    return np.full(n.shape[0], 1.0 / n.shape[0])


def update_norms(updates: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """(mean_norm, max_norm): ||sum_i w_i dW_i|| and max_i ||dW_i|| of the rows of ``updates``."""
    u = np.asarray(updates, dtype=np.float64)
    return float(np.linalg.norm(weights @ u)), float(np.linalg.norm(u, axis=1).max())


def should_split(mean_norm: float, max_norm: float, size: int, round_number: int, eps1: float, eps2: float,
                 warmup: int) -> bool:
    """The reference criterion: mean_norm < eps1 and max_norm > eps2 and size > 2 and
    round_number (counted from 1) > warmup."""
    return mean_norm < eps1 and max_norm > eps2 and size > 2 and round_number > warmup


def bipartition(similarities: np.ndarray) -> tuple[list[int], list[int]]:
    """The two groups (positions, ascending; the group of position 0 first) that complete-linkage
    agglomerative clustering of the distances -alpha leaves when merged down to two clusters:
    repeatedly merge the two clusters whose largest pairwise distance is smallest (ties: the
    first pair in row-major order). What scikit-learn's AgglomerativeClustering(n_clusters=2,
    metric="precomputed", linkage="complete").fit(-alpha) computes, as the reference does."""
    s = np.asarray(similarities, dtype=np.float64)
    m = s.shape[0]
    if m < 2 or s.shape != (m, m):
        raise ValueError(f"bipartition needs a square matrix of at least 2 x 2 (got {s.shape})")
    dist = -s
    dist = np.maximum(dist, dist.T)  # a symmetric distance (alpha is symmetric up to rounding)
    np.fill_diagonal(dist, np.inf)
    groups: dict[int, list[int]] = {i: [i] for i in range(m)}
    while len(groups) > 2:
        alive = sorted(groups)
        sub = dist[np.ix_(alive, alive)]
        i, j = (int(v) for v in np.unravel_index(int(np.argmin(sub)), sub.shape))
        a, b = sorted((alive[i], alive[j]))
        groups[a] += groups.pop(b)
        dist[a, :] = np.maximum(dist[a, :], dist[b, :])  # complete linkage: the farthest pair
        dist[:, a] = dist[a, :]
        dist[a, a] = np.inf
        dist[b, :] = np.inf
        dist[:, b] = np.inf
    first, second = (sorted(g) for g in groups.values())
    return (first, second) if first[0] < second[0] else (second, first)


def max_cross_similarity(similarities: np.ndarray, first: Sequence[int], second: Sequence[int]) -> float:
    """max alpha_ij over i in ``first``, j in ``second``: the split's worst cross-group similarity."""
    s = np.asarray(similarities, dtype=np.float64)
    return float(s[np.ix_(list(first), list(second))].max())


def aggregate(model: torch.Tensor, updates: Sequence[torch.Tensor], weights: np.ndarray) -> torch.Tensor:
    """W_c + sum_i w_i dW_i, summed in the given (client) order."""
    return model + weighted_sum(list(updates), [float(w) for w in weights])


def clusters_of(labels: np.ndarray, num_clusters: int) -> list[list[int]]:
    """The members (ascending client ids) of each cluster 0..num_clusters-1."""
    return [[int(k) for k in np.flatnonzero(labels == c)] for c in range(num_clusters)]


# ----------------------------------------------------------------------------- state
@dataclass
class CFLState:
    models: torch.Tensor  # [C, d], one model per cluster
    labels: np.ndarray  # [N], each client's cluster


# ----------------------------------------------------------------------------- the client half
def _train(ctx: ClientContext, opt: Adam | SGD, payload: dict[str, Any], t: int) -> tuple[Adam | SGD, torch.Tensor]:
    """Train the client's cluster model locally; return the update dW_i = W_i - W_c."""
    start = payload["models"][int(payload["labels"][ctx.client])]
    return opt, train_from(ctx, opt, start, t) - start


def _evaluate(ctx: ClientContext, opt: Adam | SGD, payload: dict[str, Any],
              t: int) -> tuple[Adam | SGD, dict[str, float]]:
    """The client's cluster model on the client's own data."""
    return opt, evaluate_vector(ctx, payload["models"][int(payload["labels"][ctx.client])])


# ----------------------------------------------------------------------------- the server half
class CFL(Configured[CFLConfig]):
    """CFL (Sattler et al., TNNLS'20): one cluster at first, split in two by the cosine similarity
    of its members' updates when its model is stationary but a member's update is still large."""

    Settings = CFLConfig
    client_ops = {"train": _train, "evaluate": _evaluate}

    def init_server(self, ctx: ServerContext) -> CFLState:
        model = get_flat(ctx.new_model("center", 0))
        return CFLState(model[None, :].clone(), np.zeros(ctx.num_clients, dtype=np.int64))

    def init_client(self, ctx: ClientContext) -> Adam | SGD:
        return scratch_optimizer(ctx)

    def round(self, ctx: ServerContext, state: CFLState, t: int) -> RoundGenerator:
        a = self.settings
        selected = uniform_selection(ctx.num_clients, a.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))
        updates = yield ClientCall("train", selected, {"models": state.models, "labels": state.labels})
        num = state.models.shape[0]
        groups = clusters_of(state.labels, num)
        models = [state.models[c] for c in range(num)]
        diagnostics: dict[str, float] = {}
        for c, members in enumerate(list(groups)):
            got = [k for k in members if k in updates]  # finite updates, ascending client id
            if not got:
                continue
            u = to_numpy(torch.stack([updates[k] for k in got]).double())
            mean_norm, max_norm = update_norms(u, mean_weights(ctx.sizes[got], a.weighting))
            diagnostics[f"mean_norm[{c}]"], diagnostics[f"max_norm[{c}]"] = mean_norm, max_norm
            if len(got) == len(members) and should_split(mean_norm, max_norm, len(members), t + 1, a.eps1, a.eps2,
                                                         a.warmup):
                sims = cosine_similarities(u)
                first, second = bipartition(sims)
                diagnostics[f"max_cross_similarity[{c}]"] = max_cross_similarity(sims, first, second)
                groups[c] = [got[i] for i in first]
                groups.append([got[i] for i in second])
                models.append(models[c])  # both halves start from the parent's model
        new_models = []
        for c, members in enumerate(groups):
            got = [k for k in members if k in updates]
            if got:
                w = mean_weights(ctx.sizes[got], a.weighting)
                new_models.append(aggregate(models[c], [updates[k] for k in got], w))
            else:
                new_models.append(models[c].clone())
        labels = np.empty_like(state.labels)
        for c, members in enumerate(groups):
            labels[members] = c
        diagnostics["num_clusters"] = len(groups)
        return RoundResult(CFLState(torch.stack(new_models), labels), diagnostics,
                           weights_updated=t == 0 or len(groups) > num, trained=len(updates))

    def centers(self, state: CFLState) -> torch.Tensor:
        return state.models

    def weights(self, state: CFLState) -> np.ndarray:
        return np.eye(state.models.shape[0])[state.labels]

    def assignment(self, state: CFLState) -> np.ndarray:
        """Each client's cluster."""
        return state.labels

    def eval_payload(self, state: CFLState) -> dict[str, Any]:
        return {"models": state.models, "labels": state.labels}


if TYPE_CHECKING:  # mypy checks CFL against the protocol (pyproject.toml: [tool.mypy] files)
    from raysoft.sdk import Clustered

    _: type[Clustered] = CFL
