"""CCFL: client-centric federated learning under dynamic mixtures of distributions.

"Client-Centric Federated Learning under Dynamic Mixtures of Distributions" (anonymous ICLR
2024 submission, OpenReview). Algorithm and equation numbers refer to the paper; the readings
chosen where it is ambiguous are in docs/algorithms.md (CCFL).

The server holds K cluster models w_k (a [K, d] float32 stack), a small validation set D_k per
cluster, the global epoch t and each cluster's last-update epoch t_k. Clients upload
asynchronously; each upload (w_m, tau) from client m is one global epoch. ``on_upload`` is the
server thread of Algorithm 2 (``ServerUpdate``) as a pure function over
:class:`CCFLServerState`:

1. t <- t + 1. If t - tau > tau0 the client is stale (:func:`is_stale`): no cluster changes, and
   the reply is sum_k u_k^tau w_k with the client's LAST estimate u^tau (:func:`stale_reply`).
2. Otherwise Algorithm 1, DistributionEstimation (:func:`estimate_distribution`): for each k,
   l_k = F(w_m; D_k) (:func:`cluster_losses`), d1_k = |F(w_k; D_k) - F(w_m; D_k)| and
   d2_k = ||w_m - w_k||_2 (:func:`model_distances`); subtract the bars (:func:`subtract_bar`);
   combine them with c1, c2 (:func:`combine_scores`); u = softmax(A u), once per value of A
   (:func:`amplify`).
3. Algorithm 1, UpdateRatioCompute (:func:`update_ratios`): alpha1 (threshold alpha1_bar,
   then max-normalised; :func:`alpha1`), alpha2 (staleness with a, b: the gap t_k - tau on the
   clock ``staleness_clock`` says, :func:`staleness_gaps`; :func:`alpha2`), alpha_k = alpha0 alpha1_k alpha2_k.
4. Optional global adjustment of section 5.3 (:func:`adjustment_rejects`): after a fraction of
   the run, a cluster whose l_k, d1_k or d2_k exceeds a percentile of its history is not updated.
5. Equation (3) for every cluster with alpha_k > 0, t_k <- t (:func:`update_clusters`).
6. Reply: the personalised model sum_k u_k w_k over the UPDATED clusters
   (:func:`personalised_model`).

The client half minimises objective (2), h_m(w) = f_m(w; D_m) + (rho/2)||w - wbar_m||^2, with
wbar_m the last reply (:func:`client_update`, :func:`client_objective_gradient`).

The settings are :class:`~raysoft.config.CCFLConfig` (the config's ``algorithm`` section);
where the paper is ambiguous, the reading is a key of it. Vectors over clusters ([K]) are float64
numpy arrays; models are flat float32 torch vectors (:data:`~raysoft.params.Params`). Nothing here knows about Ray.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, cast

import numpy as np
import torch
from torch import nn

from ..config import Config
from ..devices import to_device, to_numpy
from ..params import ClientId, Params, weighted_sum
from ..training import model_losses
from .base import ClientContext
from .settings import CCFLConfig
from .stream import (
    StreamAlgorithm,
    StreamClient,
    StreamSource,
    client_objective_gradient,
    client_start,
    client_update,
    nbytes,
    pretrain,
)

Bar = float | Literal["min"]
ValSets = Sequence[tuple[torch.Tensor, torch.Tensor]]


# ----------------------------------------------------------------------------- hyper-parameters
def table2_settings(dataset: str, k: int, num_clients: int | None = None, cycles: int | None = None,
                    **overrides: object) -> CCFLConfig:
    """The paper's setting for ``dataset`` ("fmnist", "cifar100", "miniimagenet") with ``k``
    clusters: Table 2's row, tau0 = number of clients (default 20 K) and T = clients x cycles
    (default 25 for FashionMNIST, 20 otherwise; section 5.1)."""
    try:
        row = TABLE2[(dataset.lower(), int(k))]
    except KeyError:
        raise ValueError(f"Table 2 has no row for {dataset!r} with {k} clusters") from None
    clients = 20 * int(k) if num_clients is None else int(num_clients)
    cyc = (25 if dataset.lower() == "fmnist" else 20) if cycles is None else int(cycles)
    values: dict[str, object] = {**row, "tau0": clients, "rounds": clients * cyc}
    values.update(overrides)
    return CCFLConfig.model_validate(values)


def _row(c1: float, c2: float, a: list[float], l_bar: Bar, d1_bar: Bar, d2_bar: Bar) -> dict[str, object]:
    return {"c1": c1, "c2": c2, "amplifier": a, "l_bar": l_bar, "d1_bar": d1_bar, "d2_bar": d2_bar,
            "alpha1_bar": "ave", "adjust_start": 0.5}


# Table 2 of the paper: (dataset, K) -> distribution-estimation and server-updating parameters.
TABLE2: dict[tuple[str, int], dict[str, object]] = {
    ("fmnist", 2): _row(0.5, 0.4, [3.0], 8.0, 0.0, 0.0),
    ("fmnist", 3): _row(0.5, 0.25, [3.0], 8.0, 0.0, 0.0),
    ("fmnist", 4): _row(0.5, 0.25, [7.0], 8.0, 0.0, 0.0),
    ("fmnist", 6): _row(0.7, 0.2, [15.0], 8.0, 0.0, 0.0),
    ("cifar100", 2): _row(0.5, 0.2, [1.0], 40.0, 0.0, 0.0),
    ("cifar100", 3): _row(0.5, 0.2, [10.0], "min", "min", "min"),
    ("cifar100", 4): _row(0.5, 0.2, [10.0], "min", "min", "min"),
    ("cifar100", 6): _row(0.5, 0.2, [10.0], "min", "min", "min"),
    ("miniimagenet", 2): _row(0.5, 0.2, [1.0], 70.0, 0.0, 0.0),
    ("miniimagenet", 3): _row(0.5, 0.4, [7.0], "min", "min", "min"),
    ("miniimagenet", 4): _row(0.6, 0.3, [15.0], "min", "min", "min"),
    ("miniimagenet", 6): _row(0.6, 0.3, [10.0, 10.0], "min", "min", "min"),
}


# ----------------------------------------------------------------------------- state
@dataclass
class CCFLServerState:
    """Everything the server keeps between uploads."""

    models: torch.Tensor  # [K, d] cluster models w_k^{t_k}
    t: int = 0  # global epoch: the number of uploads received so far
    t_k: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [K] last-update epochs
    last_u: dict[ClientId, np.ndarray] = field(default_factory=dict)  # each client's last fresh estimate u
    history: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 3)))  # [n, K, 3] raw (l, d1, d2)
    #   of every fresh upload so far, for the global adjustment
    self_losses: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [K] cache of F(w_k; D_k);
    #   NaN = not computed for the current w_k. Valid for one fixed (val_sets, task) per run.
    versions: np.ndarray | None = None  # [t + 1, K] updates each cluster had received after each epoch
    #   (row 0: none), for staleness_clock cluster_updates; None: not kept

    @property
    def num_clusters(self) -> int:
        return int(self.models.shape[0])


def init_server_state(models: torch.Tensor) -> CCFLServerState:
    """Algorithm 2's initialisation: the pre-trained cluster models, t = 0 and t_k = 0."""
    k = int(models.shape[0])
    return CCFLServerState(
        models=models.detach().clone().to(torch.float32), t=0, t_k=np.zeros(k, dtype=np.int64),
        last_u={}, history=np.zeros((0, k, 3)), self_losses=np.full(k, np.nan),
        versions=np.zeros((1, k), dtype=np.int64),
    )


def count_updates(versions: np.ndarray | None, updated: np.ndarray) -> np.ndarray | None:
    """The version log after one more epoch in which the clusters ``updated`` ([K] bool) changed."""
    if versions is None:
        return None
    return np.concatenate([versions, (versions[-1] + np.asarray(updated, dtype=np.int64))[None]], axis=0)


def initial_reply(state: CCFLServerState) -> Params:
    """The model every client starts from: wbar^0 = (1/K) sum_k w_k^0 (Algorithm 2)."""
    k = state.num_clusters
    return weighted_sum(state.models, [1.0 / k] * k)


@dataclass(frozen=True)
class Estimate:
    """Algorithm 1's intermediate quantities for one upload ([K] float64 arrays)."""

    l: np.ndarray  # l_k = F(w_m; D_k)
    d1: np.ndarray  # d1_k = |F(w_k; D_k) - F(w_m; D_k)|
    d2: np.ndarray  # d2_k = ||w_m - w_k||_2
    l_adj: np.ndarray  # l_k - l_bar, clamped at score_floor
    d1_adj: np.ndarray  # d1_k - d1_bar, clamped
    d2_adj: np.ndarray  # d2_k - d2_bar, clamped
    scores: np.ndarray  # the c1/c2 combination, before the amplifier (sums to 1)
    u: np.ndarray  # the mixture estimate after the amplifier (sums to 1)


# ----------------------------------------------------------------------------- staleness
def is_stale(t: int, tau: int, tau0: int) -> bool:
    """Algorithm 2: an upload stamped tau and labelled epoch t is stale iff t - tau > tau0."""
    return t - tau > tau0


# ----------------------------------------------------------------------------- Algorithm 1: estimation
PAPER_VALIDATION_SIZE = 2000  # |D_k| of the CCFL paper's experiments


def reduce_losses(per_sample: torch.Tensor, reduction: str, batch_size: int) -> float:
    """F(w; D) from the per-sample losses on D: their mean, or ("batch_sum") the sum over
    consecutive batches of ``batch_size`` of each batch's mean loss (the last batch may be
    smaller and is averaged over its own size), or ("paper_scale") the mean times the number of
    batches of a 2000-sample set."""
    losses = per_sample.detach().to(torch.float64).reshape(-1)
    if reduction == "mean":
        return float(losses.mean())
    if reduction == "batch_sum":
        return float(sum(chunk.mean() for chunk in torch.split(losses, batch_size)))
    if reduction == "paper_scale":  # the batch sum on a set of the paper's 2000 samples
        return float(losses.mean()) * math.ceil(PAPER_VALIDATION_SIZE / batch_size)
    raise ValueError(f"unknown loss reduction {reduction!r}")


def dataset_losses(scratch: nn.Module, vectors: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                   task: str, reduction: str, batch_size: int) -> np.ndarray:
    """[m] F(v; (x, y)) of each parameter vector in ``vectors`` ([m, d]); ``scratch`` is
    overwritten."""
    per = model_losses(scratch, vectors, x, y, task)
    return np.array([reduce_losses(row, reduction, batch_size) for row in per], dtype=np.float64)


def cluster_losses(scratch: nn.Module, w: Params, val_sets: ValSets, task: str,
                   reduction: str = "batch_sum", batch_size: int = 128) -> np.ndarray:
    """[K] l_k = F(w; D_k): the loss of one flat model on every cluster's validation set."""
    return np.array([dataset_losses(scratch, w[None], x, y, task, reduction, batch_size)[0]
                     for x, y in val_sets], dtype=np.float64)


def self_losses(scratch: nn.Module, models: torch.Tensor, val_sets: ValSets, task: str,
                reduction: str = "batch_sum", batch_size: int = 128,
                cached: np.ndarray | None = None) -> np.ndarray:
    """[K] F(w_k; D_k): each cluster model on its own validation set. Entries of ``cached``
    that are not NaN are reused."""
    out = np.full(models.shape[0], np.nan) if cached is None else np.array(cached, dtype=np.float64)
    for k, (x, y) in enumerate(val_sets):
        if np.isnan(out[k]):
            out[k] = dataset_losses(scratch, models[k : k + 1], x, y, task, reduction, batch_size)[0]
    return out


def model_distances(w: Params, models: torch.Tensor, losses: np.ndarray,
                    own_losses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1's two similarities to each cluster: d1_k = |F(w_k; D_k) - l_k| (the loss
    difference on D_k) and d2_k = ||w - w_k||_2 over the flat parameters; ([K], [K])."""
    d1 = np.abs(np.asarray(own_losses, dtype=np.float64) - np.asarray(losses, dtype=np.float64))
    d2 = to_numpy((models.to(torch.float64) - w.to(torch.float64)[None]).norm(dim=1))
    return d1, d2


def subtract_bar(values: np.ndarray, bar: Bar, floor: float | None = 0.0) -> np.ndarray:
    """values - bar, with bar a number or "min" (min_k values_k, Table 2); then clamped from
    below at ``floor`` (None: no clamp)."""
    values = np.asarray(values, dtype=np.float64)
    shifted = values - (values.min() if bar == "min" else float(bar))
    return shifted if floor is None else np.maximum(shifted, floor)


def _share(values: np.ndarray) -> np.ndarray:
    """sum_{i != k} v_i / sum_i v_i for each k; a zero total gives (K - 1) / K (equal values)."""
    total = values.sum()
    k = values.shape[0]
    if total == 0:
        return np.full(k, (k - 1) / k)
    return (total - values) / total


def combine_scores(l: np.ndarray, d1: np.ndarray, d2: np.ndarray, c1: float, c2: float) -> np.ndarray:
    """Algorithm 1: u_k = 1/(K-1) [c1 S(l)_k + c2 S(d1)_k + (1 - c1 - c2) S(d2)_k] with
    S(v)_k = sum_{i != k} v_i / sum_i v_i (inputs already bar-shifted). Sums to 1. K = 1 gives [1]."""
    l, d1, d2 = (np.asarray(v, dtype=np.float64) for v in (l, d1, d2))
    k = l.shape[0]
    if k == 1:
        return np.ones(1)
    return (c1 * _share(l) + c2 * _share(d1) + (1.0 - c1 - c2) * _share(d2)) / (k - 1)


def amplify(scores: np.ndarray, amplifier: Sequence[float]) -> np.ndarray:
    """u <- softmax(A u), applied once per value of A, in order (Table 2 caption)."""
    u = np.asarray(scores, dtype=np.float64)
    for a in amplifier:
        z = a * u
        e = np.exp(z - z.max())
        u = e / e.sum()
    return u


def largest_weight(k: int, amplifier: Sequence[float]) -> float:
    """The largest weight Algorithm 1 can give one cluster when every bar-shifted value is
    non-negative. Each bracket sum_{i != k} v_i / sum_i v_i then lies in [0, 1] and the brackets
    sum to K - 1, so a score is at most 1/(K-1), reached when cluster k's values are all 0; the
    other K - 1 scores then share (K-2)/(K-1), and the softmax gives k the most when they are
    equal. Independent of c1 and c2 (every term at its extreme at once)."""
    if k == 1:
        return 1.0
    best = np.full(k, (k - 2) / (k - 1) ** 2)
    best[0] = 1.0 / (k - 1)
    return float(amplify(best, amplifier)[0])


def kl_floor(cap: float, low: float = 0.4, high: float = 0.9) -> float:
    """The least mean KL(true || estimate) an estimator whose weights never exceed ``cap`` can
    reach when the main cluster's share is uniform on [low, high] (the CCFL paper's A.1: 40-90%).
    For a share s > cap the best estimate gives the main cluster ``cap`` and the others cap's
    complement in the true proportions, leaving the binary KL(s || cap); s <= cap costs nothing.
    The mean is the exact integral of that over [low, high]."""
    if not 0.0 < cap <= 1.0 or not 0.0 <= low < high <= 1.0:
        raise ValueError(f"need 0 < cap <= 1 and 0 <= low < high <= 1, got {cap}, {low}, {high}")
    a = max(low, cap)
    if a >= high:
        return 0.0

    def antiderivative(s: float) -> float:  # of s ln(s/cap) + (1 - s) ln((1 - s)/(1 - cap)) ds
        def xlogx_integral(x: float) -> float:  # of x ln x dx = x^2/2 ln x - x^2/4 (0 at x = 0)
            return 0.0 if x <= 0.0 else x * x / 2 * math.log(x) - x * x / 4
        return (xlogx_integral(s) - math.log(cap) * s * s / 2 - xlogx_integral(1 - s)
                + math.log(1 - cap) * (1 - s) ** 2 / 2)  # cap < 1 here: s > cap is possible

    return (antiderivative(high) - antiderivative(a)) / (high - low)


def estimate_distribution(scratch: nn.Module, w: Params, models: torch.Tensor, val_sets: ValSets,
                          params: CCFLConfig, task: str = "classification",
                          own_losses: np.ndarray | None = None, losses: np.ndarray | None = None) -> Estimate:
    """Algorithm 1, DistributionEstimation, from the uploaded model alone. ``own_losses``: the
    precomputed F(w_k; D_k), ``losses``: the precomputed l_k = F(w; D_k) (each computed when None)."""
    if len(val_sets) != models.shape[0]:
        raise ValueError(f"{len(val_sets)} validation sets for {models.shape[0]} clusters")
    red, bs = params.loss_reduction, params.loss_batch_size
    l = cluster_losses(scratch, w, val_sets, task, red, bs) if losses is None else np.asarray(losses, np.float64)
    own = self_losses(scratch, models, val_sets, task, red, bs) if own_losses is None else own_losses
    d1, d2 = model_distances(w, models, l, own)
    l_adj = subtract_bar(l, params.l_bar, params.score_floor)
    d1_adj = subtract_bar(d1, params.d1_bar, params.score_floor)
    d2_adj = subtract_bar(d2, params.d2_bar, params.score_floor)
    scores = combine_scores(l_adj, d1_adj, d2_adj, params.c1, params.c2)
    return Estimate(l=l, d1=d1, d2=d2, l_adj=l_adj, d1_adj=d1_adj, d2_adj=d2_adj,
                    scores=scores, u=amplify(scores, params.amplifier))


# ----------------------------------------------------------------------------- Algorithm 1: update ratios
def alpha1(u: np.ndarray, bar: float | Literal["ave"] = "ave") -> np.ndarray:
    """alpha1_k = 0 if u_k < alpha1_bar, else u_k / max_k u_k; "ave" = mean_k u_k. The
    comparison has an absolute tolerance of 1e-12, so equal estimates all pass "ave"."""
    u = np.asarray(u, dtype=np.float64)
    threshold = u.mean() if bar == "ave" else float(bar)
    return np.where(u < threshold - 1e-12, 0.0, u / u.max())


def staleness_gaps(state: CCFLServerState, tau: int, params: CCFLConfig) -> np.ndarray:
    """[K] float64: alpha2's gap "t_k - tau" of an upload stamped ``tau``, on the clock
    ``params.staleness_clock`` (docs/algorithms.md#ccfl-staleness-clock):

    * ``uploads``: t_k - tau, every upload a global epoch (Algorithm 2 as written);
    * ``client_cycles``: (t_k - tau) / cycle_uploads, in cycles of every client;
    * ``cluster_updates``: the updates cluster k received after the client's download at tau
      (its model's version gap; needs the state's version log)."""
    if params.staleness_clock == "cluster_updates":
        if state.versions is None:
            raise ValueError("staleness_clock cluster_updates needs the server state's version log (versions)")
        return (state.versions[-1] - state.versions[tau]).astype(np.float64)
    gap = np.asarray(state.t_k, dtype=np.float64) - float(tau)
    return gap / params.cycle_uploads if params.staleness_clock == "client_cycles" else gap


def alpha2(gap: np.ndarray, a: float, b: float) -> np.ndarray:
    """Staleness factor from each cluster's gap (:func:`staleness_gaps`): 1 if gap < b, else
    1 / (a gap + 1)."""
    gap = np.asarray(gap, dtype=np.float64)
    return np.where(gap < b, 1.0, 1.0 / (a * np.maximum(gap, 0.0) + 1.0))


def update_ratios(u: np.ndarray, gap: np.ndarray, params: CCFLConfig) -> np.ndarray:
    """Algorithm 1, UpdateRatioCompute: alpha_k = alpha0 alpha1_k alpha2_k, in [0, alpha0], with
    alpha2 from the staleness ``gap`` (:func:`staleness_gaps`)."""
    return params.alpha0 * alpha1(u, params.alpha1_bar) * alpha2(gap, params.a, params.b)


# ----------------------------------------------------------------------------- global adjustment
def adjustment_active(t: int, params: CCFLConfig) -> bool:
    """Section 5.3: the adjustment runs once t > adjust_start * T (never if adjust_start is None)."""
    return params.adjust_start is not None and t > params.adjust_start * params.rounds


def adjustment_rejects(history: np.ndarray, values: np.ndarray, percentile: float) -> np.ndarray:
    """[K] bool: cluster k's update is rejected if any of the upload's (l_k, d1_k, d2_k)
    (``values``, [K, 3]) exceeds the ``percentile`` of cluster k's history ([n, K, 3]) of
    that quantity. An empty history rejects nothing."""
    values = np.asarray(values, dtype=np.float64)
    if history.shape[0] == 0:
        return np.zeros(values.shape[0], dtype=bool)
    limits = np.percentile(history, percentile, axis=0)  # [K, 3]
    return (values > limits).any(axis=1)


# ----------------------------------------------------------------------------- equation (3) and reply
def update_clusters(models: torch.Tensor, t_k: np.ndarray, w: Params, alpha: np.ndarray,
                    t: int) -> tuple[torch.Tensor, np.ndarray]:
    """Equation (3): w_k <- (1 - alpha_k) w_k + alpha_k w and t_k <- t for every k with
    alpha_k > 0; other clusters are unchanged. Returns new (models, t_k)."""
    new_models, new_t_k = models.clone(), np.array(t_k, dtype=np.int64)
    for k, a in enumerate(np.asarray(alpha, dtype=np.float64)):
        if a > 0:
            new_models[k] = (1.0 - float(a)) * models[k] + float(a) * w
            new_t_k[k] = t
    return new_models, new_t_k


def personalised_model(models: torch.Tensor, u: np.ndarray) -> Params:
    """The reply wbar_m = sum_k u_k w_k."""
    return weighted_sum(models, [float(x) for x in u])


def stale_estimate(last_u: dict[ClientId, np.ndarray], client: ClientId, k: int) -> np.ndarray:
    """The client's estimate from its last fresh upload; uniform 1/K if it has none (a client
    that was stale every time so far: the same model as the initial reply wbar^0)."""
    u = last_u.get(client)
    return np.full(k, 1.0 / k) if u is None else np.asarray(u, dtype=np.float64)


def stale_reply(state: CCFLServerState, client: ClientId) -> tuple[Params, np.ndarray]:
    """Algorithm 2's stale path: sum_k u_k^tau w_k^{t_k} with the client's last estimate
    (:func:`stale_estimate`), and that estimate."""
    u = stale_estimate(state.last_u, client, state.num_clusters)
    return personalised_model(state.models, u), u


# ----------------------------------------------------------------------------- the server step
def on_upload(state: CCFLServerState, params: CCFLConfig, client: ClientId, w_m: Params, tau: int,
              scratch: nn.Module, val_sets: ValSets, task: str = "classification",
              losses: np.ndarray | None = None) -> tuple[CCFLServerState, Params, dict[str, object]]:
    """Algorithm 2's server thread for one upload (w_m, tau) from ``client``: returns the new
    state (its ``t`` is the timestamp sent back with the reply), the personalised reply and
    diagnostics. ``val_sets`` holds (x, y) of D_k per cluster; ``scratch`` is overwritten;
    ``losses``: F(w_m; D_k) if it was computed already (where the client runs)."""
    if tau > state.t:
        raise ValueError(f"upload stamped tau={tau} is newer than the server's epoch t={state.t}")
    k = state.num_clusters
    t = state.t + 1
    diag: dict[str, object] = {"t": t, "client": client, "tau": tau, "staleness": t - tau}
    if is_stale(t, tau, params.tau0):
        reply, u = stale_reply(state, client)
        diag.update(stale=True, u=u, alpha=np.zeros(k), updated=np.zeros(k, dtype=bool),
                    rejected=np.zeros(k, dtype=bool))
        return replace(state, t=t, versions=count_updates(state.versions, np.zeros(k, dtype=bool))), reply, diag

    red, bs = params.loss_reduction, params.loss_batch_size
    own = self_losses(scratch, state.models, val_sets, task, red, bs, cached=state.self_losses)
    est = estimate_distribution(scratch, w_m, state.models, val_sets, params, task, own_losses=own, losses=losses)
    gap = staleness_gaps(state, tau, params)
    alpha = update_ratios(est.u, gap, params)

    raw = np.stack([est.l, est.d1, est.d2], axis=1)  # [K, 3]
    if adjustment_active(t, params):
        rejected = adjustment_rejects(state.history, raw, params.adjust_percentile)
    else:
        rejected = np.zeros(k, dtype=bool)
    alpha = np.where(rejected, 0.0, alpha)

    models, t_k = update_clusters(state.models, state.t_k, w_m, alpha, t)
    updated = alpha > 0
    own = np.where(updated, np.nan, own)  # F(w_k; D_k) must be recomputed for changed models
    reply = personalised_model(models, est.u)
    last_u = dict(state.last_u)
    last_u[client] = est.u
    new_state = CCFLServerState(models=models, t=t, t_k=t_k, last_u=last_u,
                                history=np.concatenate([state.history, raw[None]], axis=0),
                                self_losses=own, versions=count_updates(state.versions, updated))
    diag.update(stale=False, u=est.u, alpha=alpha, updated=updated, rejected=rejected,
                l=est.l, d1=est.d1, d2=est.d2, scores=est.scores, gap=gap,
                alpha2=alpha2(gap, params.a, params.b))
    return new_state, reply, diag


# ----------------------------------------------------------------------------- the algorithm
class PretrainedStart(StreamAlgorithm[CCFLServerState]):
    """What CCFL and its baselines (FedSoft-Async, the stream Local) share: the K cluster models
    pre-trained on the server's public sets (``pretrain_epochs``, ``shared_init``) and the
    clients' proximal term (``rho``), settings of CCFL's, not of the stream template's."""

    settings: CCFLConfig

    def initial_models(self, cfg: Config, data: StreamSource) -> torch.Tensor:
        return pretrain(cfg, data, self.settings.pretrain_epochs, self.settings.shared_init)

    def proximal(self) -> float:
        return self.settings.rho


class CCFL(PretrainedStart):
    """CCFL as a stream algorithm: the client trains on objective (2) from the personalised
    reply (:func:`client_update`, shared with the baselines); the server runs
    :func:`on_upload` on every upload."""

    Settings = CCFLConfig
    settings: CCFLConfig

    _val_sets: ValSets | None = None

    def first_anchor(self, payload: Mapping[str, object]) -> tuple[Params, torch.Tensor | None, int]:
        initial = cast(Params, payload["initial"])  # cold_start's
        return initial, None, nbytes(initial)

    def receive(self, cs: StreamClient, reply: Mapping[str, object]) -> tuple[Params, torch.Tensor | None, int]:
        model = cast(Params, reply["model"])  # reply's: CCFL always sends a model
        return model, None, nbytes(model)

    def init_stream_server(self, models: torch.Tensor) -> CCFLServerState:
        return init_server_state(models)

    def cold_start(self, state: CCFLServerState, initial_models: torch.Tensor) -> dict[str, object]:
        return {"initial": initial_reply(state), "t": state.t}

    def models(self, state: CCFLServerState) -> torch.Tensor:
        return state.models

    def server_work(self, ctx: ClientContext, cs: StreamClient, w: Params | None) -> dict[str, object]:
        """``estimate_on: actors``: l_k = F(w_m; D_k) on every cluster's validation set, computed
        on the uploading client's actor (the same forward passes the server would make)."""
        a = self.settings
        if a.estimate_on != "actors" or w is None:
            return {}
        return {"l": cluster_losses(ctx.scratch, w, self._host_val_sets(ctx), ctx.info.task, a.loss_reduction,
                                    a.loss_batch_size)}

    def _host_val_sets(self, ctx: ClientContext) -> ValSets:
        """The server's D_k where the clients run, built once per host from (data, seed), on its device."""
        if self._val_sets is None:
            data = self.source(ctx.cfg)
            self._val_sets = [data.validation(s) for s in range(data.num_clusters)]
        self._val_sets = to_device(self._val_sets, ctx.device)
        return self._val_sets

    def serve_unseen(self, ctx: ClientContext, cs: StreamClient, w: Params, models: torch.Tensor | None,
                     payload: Mapping[str, object]) -> tuple[Params, dict[str, float]]:
        """A held-out client's cold start: Algorithm 1's estimate u of its first local model
        (:func:`estimate_distribution`, on the server's validation sets D_k, built where the
        client runs as ``estimate_on: actors`` does) and the personalised model sum_k u_k w_k,
        the reply its first fresh upload would get (before any cluster moved); u is ``u[k]``."""
        assert models is not None
        est = estimate_distribution(ctx.scratch, w, models, self._host_val_sets(ctx), self.settings, ctx.info.task)
        return personalised_model(models, est.u), {f"u[{k}]": float(v) for k, v in enumerate(est.u)}

    def server_step(self, state: CCFLServerState, client: int, up: Mapping[str, object], scratch: nn.Module,
                    val_sets: ValSets) -> tuple[CCFLServerState, Params, dict[str, object]]:
        tick = time.perf_counter()
        recomputed = int(np.isnan(state.self_losses).sum())  # F(w_k; D_k) not cached
        # the upload of StreamAlgorithm.step: its model, the reply's epoch tau, and l_k when the actor made it
        w, tau, losses = cast(Params, up["w"]), cast(int, up["tau"]), cast("np.ndarray | None", up.get("l"))
        state, reply, diag = on_upload(state, self.settings, client, w, tau, scratch, val_sets, losses=losses)
        diag["server_s"] = time.perf_counter() - tick
        diag["fresh"] = not diag["stale"]
        if not diag["stale"]:  # w_m on every D_k (unless the actor did), plus the stale F(w_k; D_k)
            sizes = [len(y) for _, y in val_sets]
            diag["server_forwards"] = (0 if "l" in up else sum(sizes)) + recomputed * int(np.mean(sizes))
        return state, reply, diag


__all__ = [
    "CCFL", "TABLE2", "CCFLServerState", "PretrainedStart", "Estimate", "adjustment_active", "adjustment_rejects",
    "alpha1", "alpha2", "amplify", "count_updates", "client_objective_gradient", "client_start", "client_update",
    "cluster_losses", "combine_scores", "dataset_losses", "estimate_distribution", "init_server_state",
    "initial_reply", "is_stale", "kl_floor", "largest_weight", "model_distances", "on_upload",
    "personalised_model", "reduce_losses", "self_losses", "stale_estimate", "stale_reply", "staleness_gaps",
    "subtract_bar",
    "table2_settings", "update_clusters", "update_ratios",
]
