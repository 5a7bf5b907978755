"""FPFC: fusion penalized federated clustering.

X. Yu, Z. Liu, Y. Sun, W. Wang, "Clustered Federated Learning for Heterogeneous Data", AAAI 2023
student abstract (full version: "Clustered Federated Learning based on Nonconvex Pairwise
Fusion", arXiv:2211.04218), Algorithm 1; the choices are in docs/algorithms.md#fpfc-and-fpfc-l1.

State: device models w_i (the server keeps the last upload of every device), pair variables
theta_ij = -theta_ji and duals v_ij = -v_ji, stored once per unordered pair i < j in compact
[m(m-1)/2, d] float32 arrays. Each round:

1. the server draws A_k (``clients_per_round`` devices, uniformly, without replacement);
2. zeta_i = (1/m) sum_j (w_j + theta_ij - v_ij / rho) for i in A_k;
3. device i runs ``train.local_epochs`` steps of w <- w - lr [grad f_i(w) + rho (w - zeta_i)]
   (full batch when ``train.batch_size`` is null, the paper's choice; mini-batch SGD otherwise);
4. the server updates, for the chosen pairs, theta_ij = prox(w_i - w_j + v_ij / rho) (the SCAD
   surrogate's closed form, :func:`scad_prox`; FPFC-l1: group soft-threshold) and
   v_ij <- v_ij + rho (w_i - w_j - theta_ij). ``pairs: paper`` updates the pairs inside A_k
   once; ``pairs: code`` every pair with at least one end in A_k, and the pairs inside A_k a
   second time, as the reference code's double loop does.

After the last round, devices are clustered by the connected components of the graph with an
edge where ||theta_ij|| <= nu, and every member's model becomes its cluster's n-weighted mean
(``grouping: components``); ``grouping: neighbourhoods`` is the reference code's final step
instead (:func:`neighbourhood_models`): each device's set of devices within nu, the distinct
sets in turn replacing their members' models by the set's n-weighted mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..devices import to_numpy
from ..params import get_flat
from ..rng import numpy_rng
from .base import ClientCall, ClientContext, Configured, RoundGenerator, RoundResult, ServerContext
from .common import evaluate_vector, scratch_optimizer, train_from, uniform_selection
from .ifca import center_cold_start
from .settings import FPFCConfig


# ----------------------------------------------------------------------------- penalty and prox
def scad(t: np.ndarray, lam: float, a: float) -> np.ndarray:
    """SCAD penalty P_a(t, lambda)."""
    t = np.abs(t)
    return np.where(
        t <= lam, lam * t,
        np.where(t <= a * lam, (a * lam * t - 0.5 * (t**2 + lam**2)) / (a - 1), lam**2 * (a + 1) / 2),
    )


def scad_surrogate(t: np.ndarray, lam: float, a: float, xi: float) -> np.ndarray:
    """The smooth surrogate: (lambda / (2 xi)) t^2 + xi lambda / 2 for |t| <= xi, SCAD beyond."""
    t = np.abs(t)
    return np.where(t <= xi, lam / (2 * xi) * t**2 + xi * lam / 2, scad(t, lam, a))


def scad_prox_scale(r: np.ndarray, lam: float, a: float, xi: float, rho: float) -> np.ndarray:
    """s / r for s = argmin_s surrogate(s) + (rho/2)(s - r)^2, the four regions of
    docs/algorithms.md#fpfc-prox."""
    r = np.asarray(r, dtype=np.float64)
    safe = np.where(r > 0, r, 1.0)
    quad = xi * rho / (lam + xi * rho)
    l1 = 1.0 - lam / (rho * safe)
    concave = np.maximum(0.0, 1.0 - a * lam / ((a - 1) * rho * safe)) / (1.0 - 1.0 / ((a - 1) * rho))
    return np.where(r <= xi + lam / rho, quad, np.where(r <= lam + lam / rho, l1, np.where(r <= a * lam, concave, 1.0)))


def l1_prox_scale(r: np.ndarray, lam: float, rho: float) -> np.ndarray:
    """FPFC-l1: the group soft-threshold (1 - (lambda / rho) / r)_+."""
    r = np.asarray(r, dtype=np.float64)
    return np.maximum(0.0, 1.0 - (lam / rho) / np.where(r > 0, r, np.inf))


# ----------------------------------------------------------------------------- pair bookkeeping
def pair_index(i: np.ndarray, j: np.ndarray, m: int) -> np.ndarray:
    """Row of the unordered pair (i, j), i < j, in the compact triangular layout."""
    i, j = np.minimum(i, j), np.maximum(i, j)
    return i * m - i * (i + 1) // 2 + (j - i - 1)


def all_pairs(m: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(m, k=1)


def zeta(w: np.ndarray, theta: np.ndarray, v: np.ndarray, rho: float, devices: list[int]) -> np.ndarray:
    """zeta_i = (1/m) sum_j (w_j + theta_ij - v_ij / rho) for each i in ``devices`` ([len, d]).

    Gathers only device i's m - 1 pair rows (theta_ij = -theta_ji for j < i), so the extra memory
    is O(m d), not O(m^2 d)."""
    m = w.shape[0]
    total = w.sum(axis=0, dtype=np.float64)
    out = np.empty((len(devices), w.shape[1]), dtype=np.float64)
    others = np.arange(m)
    for n, i in enumerate(devices):
        after, before = others[others > i], others[others < i]
        plus, minus = pair_index(np.full(after.size, i), after, m), pair_index(before, np.full(before.size, i), m)
        pair_sum = theta[plus].sum(axis=0, dtype=np.float64) - theta[minus].sum(axis=0, dtype=np.float64)
        dual_sum = v[plus].sum(axis=0, dtype=np.float64) - v[minus].sum(axis=0, dtype=np.float64)
        out[n] = (total + pair_sum - dual_sum / rho) / m
    return out.astype(w.dtype)


def row_norms(a: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """Euclidean norm of each row, accumulated in float64 a chunk of rows at a time."""
    out = np.empty(a.shape[0])
    for start in range(0, a.shape[0], chunk):
        block = a[start : start + chunk].astype(np.float64)
        out[start : start + chunk] = np.sqrt(np.einsum("ij,ij->i", block, block))
    return out


def update_pairs(w: np.ndarray, theta: np.ndarray, v: np.ndarray, i: np.ndarray, j: np.ndarray,
                 cfg: FPFCConfig, chunk: int = 1024) -> None:
    """theta_ij = prox(w_i - w_j + v_ij / rho); v_ij += rho (w_i - w_j - theta_ij), in place, for
    the pairs (i[p], j[p]) with i < j (``chunk`` pairs at a time, to bound the temporaries)."""
    for start in range(0, len(i), chunk):
        _update_chunk(w, theta, v, i[start : start + chunk], j[start : start + chunk], cfg)


def _update_chunk(w: np.ndarray, theta: np.ndarray, v: np.ndarray, i: np.ndarray, j: np.ndarray,
                  cfg: FPFCConfig) -> None:
    rows = pair_index(i, j, w.shape[0])
    diff = w[i] - w[j]
    delta = diff + v[rows] / cfg.rho
    r = np.linalg.norm(delta.astype(np.float64), axis=1)
    if cfg.name == "fpfc_l1":
        scale = l1_prox_scale(r, cfg.lam, cfg.rho)
    else:
        scale = scad_prox_scale(r, cfg.lam, cfg.a, cfg.xi, cfg.rho)
    new_theta = (delta * scale[:, None]).astype(theta.dtype)
    theta[rows] = new_theta
    v[rows] = v[rows] + cfg.rho * (diff - new_theta)


def round_pairs(selected: list[int], m: int, mode: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The batches of pairs (i < j) updated in a round, in order."""
    a = np.asarray(selected)
    inside_i, inside_j = np.triu_indices(len(a), k=1)
    inside = (a[inside_i], a[inside_j])
    if mode == "paper":
        return [inside]
    sel = np.zeros(m, dtype=bool)
    sel[a] = True
    iu, ju = all_pairs(m)
    touching = sel[iu] | sel[ju]
    return [(iu[touching], ju[touching]), inside]


def clusters(theta: np.ndarray, m: int, nu: float) -> np.ndarray:
    """Connected components of the graph with an edge where ||theta_ij|| <= nu; labels are
    numbered by their smallest member."""
    iu, ju = all_pairs(m)
    close = row_norms(theta) <= nu
    parent = np.arange(m)

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(iu[close], ju[close]):
        ra, rb = find(int(a)), find(int(b))
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    roots = np.array([find(x) for x in range(m)])
    _, labels = np.unique(roots, return_inverse=True)
    return labels


def neighbourhoods(theta: np.ndarray, m: int, nu: float) -> list[list[int]]:
    """The reference code's groups: for each device i (in order), the devices j with
    ||theta_ij|| < nu (i itself included, ||theta_ii|| = 0), each distinct set once, in order of
    first appearance. Not a partition: the sets of a chain overlap."""
    near = np.eye(m, dtype=bool) if nu > 0 else np.zeros((m, m), dtype=bool)
    iu, ju = all_pairs(m)
    close = row_norms(theta) < nu
    near[iu[close], ju[close]] = near[ju[close], iu[close]] = True
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for i in range(m):
        group = tuple(int(j) for j in np.flatnonzero(near[i]))
        if group not in seen:
            seen.add(group)
            out.append(list(group))
    return out


def neighbourhood_models(w: np.ndarray, theta: np.ndarray, nu: float,
                         sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The reference code's final step: the :func:`neighbourhoods` in turn replace their members'
    models by the set's n-weighted mean of the members' current models (a model replaced by an
    earlier set enters a later one as replaced). A device's label is the last set that holds it
    (renumbered 0, 1, ... in order); returns (models, labels, number of distinct sets)."""
    m = w.shape[0]
    sets = neighbourhoods(theta, m, nu)
    out = w.astype(np.float64)
    last = np.full(m, -1)
    for g, members in enumerate(sets):
        out[members] = (sizes[members, None] * out[members]).sum(axis=0) / sizes[members].sum()
        last[members] = g
    _, labels = np.unique(last, return_inverse=True)
    return out.astype(w.dtype), labels, len(sets)


def cluster_models(w: np.ndarray, labels: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """[L, d]: the n-weighted average of each cluster's members."""
    out = np.zeros((labels.max() + 1, w.shape[1]), dtype=np.float64)
    for c in range(out.shape[0]):
        members = labels == c
        out[c] = (sizes[members, None] * w[members]).sum(axis=0) / sizes[members].sum()
    return out.astype(w.dtype)


# ----------------------------------------------------------------------------- state and halves
@dataclass
class FPFCState:
    w: np.ndarray  # [m, d] last model of every device
    theta: np.ndarray  # [m(m-1)/2, d]
    v: np.ndarray  # [m(m-1)/2, d]
    sizes: np.ndarray  # [m] training samples per device (cluster models are n-weighted)
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # the client of each device when clients are held out (the devices are the training
    # clients, ascending); None: device i is client i
    clients: np.ndarray | None = None
    total: int = 0  # every client, held-out ones included (with ``clients``)

    def client(self, device: int) -> int:
        return device if self.clients is None else int(self.clients[device])

    def by_client(self, rows: np.ndarray | dict[int, np.ndarray],
                  devices: list[int] | None = None) -> np.ndarray | dict[int, np.ndarray]:
        """``rows`` (one per device) as the payload indexes them, by client: the array itself
        when device i is client i, else {client: row}."""
        if self.clients is None:
            return rows if devices is None else {k: rows[k] for k in devices}
        picked = range(len(rows)) if devices is None else devices
        return {self.client(d): rows[d] for d in picked}


def _fpfc_train(ctx: ClientContext, opt, payload: dict[str, Any], t: int):
    rho = ctx.settings(FPFCConfig).rho
    z = ctx.tensor(payload["zeta"][ctx.client])
    start = ctx.tensor(payload["w"][ctx.client])
    return opt, to_numpy(train_from(ctx, opt, start, t, pull_scale=rho, pull_target=rho * z))


def _fpfc_evaluate(ctx: ClientContext, opt, payload: dict[str, Any], t: int):
    return opt, evaluate_vector(ctx, ctx.tensor(payload["w"][ctx.client]))


def _fpfc_unseen(ctx: ClientContext, _: None, payload: Mapping[str, torch.Tensor], t: int):
    """Cold start of a held-out client: the cluster model (the n-weighted mean of a cluster's
    device models, :meth:`FPFC.centers`) with the lowest average loss on its training data
    (:func:`~raysoft.algorithms.ifca.center_cold_start`), served."""
    return None, center_cold_start(ctx, ctx.tensor(payload["centers"]))


class FPFC(Configured[FPFCConfig]):
    Settings = FPFCConfig
    client_ops = {"train": _fpfc_train, "evaluate": _fpfc_evaluate, "unseen": _fpfc_unseen}
    stateless_ops = ("unseen",)

    def init_server(self, ctx: ServerContext) -> FPFCState:
        pool = ctx.pool  # the devices: every training client (held-out ones have no w_i, no pairs)
        m = len(pool)
        w0 = to_numpy(get_flat(ctx.new_model("client_init")))
        pairs = m * (m - 1) // 2
        w = np.repeat(w0[None, :], m, axis=0)
        theta = np.zeros((pairs, w0.size), np.float32)
        labels = clusters(theta, m, self.settings.nu)
        sizes = np.asarray(ctx.sizes)
        if not ctx.held_out:
            return FPFCState(w, theta, np.zeros_like(theta), sizes, labels)
        return FPFCState(w, theta, np.zeros_like(theta), sizes[pool], labels, np.asarray(pool),
                         ctx.num_clients)

    def init_client(self, ctx: ClientContext):
        return scratch_optimizer(ctx)

    def round(self, ctx: ServerContext, state: FPFCState, t: int) -> RoundGenerator:
        a = self.settings
        m = state.w.shape[0]
        selected = uniform_selection(m, a.clients_per_round, numpy_rng(ctx.cfg.seed, "select", t))  # devices
        z = zeta(state.w, state.theta, state.v, a.rho, selected)
        payload = {"zeta": state.by_client(dict(zip(selected, z)), selected), "w": state.by_client(state.w, selected)}
        # each client receives its own zeta_k, w_k (and knows rho)
        res = yield ClientCall("train", [state.client(d) for d in selected], payload, each=("zeta", "w"))
        w, theta, v = state.w.copy(), state.theta, state.v  # theta, v updated in place (large)
        for d in selected:  # an excluded (non-finite) update leaves the device's last model
            if state.client(d) in res:
                w[d] = res[state.client(d)]
        for i, j in round_pairs(selected, m, a.pairs):
            update_pairs(w, theta, v, i, j, a)
        labels = clusters(theta, m, a.nu)
        diagnostics: dict[str, float] = {}
        last = t + 1 == a.rounds
        if last:  # every member takes its cluster's n-weighted model
            diagnostics = {f"clusters_nu={nu:g}": int(clusters(theta, m, nu).max() + 1) for nu in a.report_thresholds}
            if a.grouping == "components":
                w = cluster_models(w, labels, state.sizes)[labels]
            else:
                w, labels, sets = neighbourhood_models(w, theta, a.nu, state.sizes)
                diagnostics["neighbourhood_sets"] = sets
        return RoundResult(FPFCState(w, theta, v, state.sizes, labels, state.clients, state.total), diagnostics,
                           weights_updated=last)

    def centers(self, state: FPFCState) -> torch.Tensor:
        """The current clusters' n-weighted models (after the last round: the final models)."""
        return torch.as_tensor(cluster_models(state.w, state.labels, state.sizes))

    def weights(self, state: FPFCState) -> np.ndarray:
        """One-hot rows of every client's cluster (a held-out client's row: uniform)."""
        k = state.labels.max() + 1
        one_hot = np.eye(k)[state.labels]
        if state.clients is None:
            return one_hot
        out = np.full((state.total, k), 1.0 / k)
        out[state.clients] = one_hot
        return out

    def assignment(self, state: FPFCState) -> np.ndarray:
        """Every client's cluster (a held-out client's: -1)."""
        if state.clients is None:
            return state.labels
        out = np.full(state.total, -1, dtype=np.int64)
        out[state.clients] = state.labels
        return out

    def eval_payload(self, state: FPFCState) -> dict[str, object]:
        return {"w": state.by_client(state.w)}

    def unseen_payload(self, state: FPFCState) -> dict[str, torch.Tensor]:
        return {"centers": self.centers(state)}

    def serve(self, ctx: ClientContext, opt: object, payload: dict[str, Any], t: int) -> torch.Tensor:
        """The model served to a client: its own w_i (after the last round, its cluster's model)."""
        return ctx.tensor(payload["w"][ctx.client])
