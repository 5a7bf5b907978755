"""FedSoft-Async: CCFL's asynchronous baseline (section 5 of the CCFL paper).

Clients download all K cluster models, estimate their mixture mu by FedSoft's per-sample argmin
count (with FedSoft's floor ``sigma``), mix their own start sum_k mu_k w_k and upload
(w_m, mu). The server updates every cluster with alpha_mk = alpha0 * mu_mk * alpha2_k (CCFL's
staleness factor; no alpha1 threshold and no max-normalisation). A stale upload
(t - tau > tau0) changes nothing. The readings chosen where the paper is silent are in
docs/algorithms.md (FedSoft-Async).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import cast

import numpy as np
import torch

from ..devices import to_numpy
from ..params import ClientId, Params
from ..training import model_losses
from .base import ClientContext
from .ccfl import (
    CCFLServerState,
    PretrainedStart,
    alpha2,
    count_updates,
    init_server_state,
    is_stale,
    personalised_model,
    staleness_gaps,
    update_clusters,
)
from .fedsoft import importance_weights
from .settings import CCFLConfig, FedSoftAsyncConfig
from .stream import StreamClient, ValSets, nbytes


def async_ratios(mu: np.ndarray, gap: np.ndarray, params: CCFLConfig) -> np.ndarray:
    """alpha_mk = alpha0 * mu_k * alpha2_k, alpha2 from the staleness ``gap`` (CCFL's
    :func:`~raysoft.algorithms.ccfl.staleness_gaps`)."""
    return params.alpha0 * np.asarray(mu, dtype=np.float64) * alpha2(gap, params.a, params.b)


def on_upload_async(state: CCFLServerState, params: CCFLConfig, client: ClientId, w_m: Params, tau: int,
                    mu: np.ndarray) -> tuple[CCFLServerState, dict[str, object]]:
    """The server step of FedSoft-Async for one upload (w_m, mu) stamped tau. The client mixes
    its own reply from the K models it downloads, so the server computes none."""
    t = state.t + 1
    mu = np.asarray(mu, dtype=np.float64)
    mu = mu / mu.sum()
    diag: dict[str, object] = {"t": t, "client": client, "tau": tau, "staleness": t - tau, "u": mu}
    if is_stale(t, tau, params.tau0):
        diag.update(stale=True, alpha=np.zeros_like(mu))
        return replace(state, t=t, versions=count_updates(state.versions, np.zeros(len(mu), dtype=bool))), diag
    alpha = async_ratios(mu, staleness_gaps(state, tau, params), params)
    models, t_k = update_clusters(state.models, state.t_k, w_m, alpha, t)
    last_u = dict(state.last_u)
    last_u[client] = mu
    diag.update(stale=False, alpha=alpha)
    return replace(state, models=models, t=t, t_k=t_k, last_u=last_u,
                   versions=count_updates(state.versions, alpha > 0)), diag


class FedSoftAsync(PretrainedStart):
    """The client estimates its mixture on the K models it downloads and mixes its own reply."""

    Settings = FedSoftAsyncConfig
    settings: FedSoftAsyncConfig

    def first_anchor(self, payload: Mapping[str, object]) -> tuple[Params, torch.Tensor | None, int]:
        models = cast(torch.Tensor, payload["initial_models"])  # the start is their average
        return personalised_model(models, np.full(len(models), 1.0 / len(models))), models, nbytes(models)

    def receive(self, cs: StreamClient, reply: Mapping[str, object]) -> tuple[Params, torch.Tensor | None, int]:
        models = cast(torch.Tensor, reply["models"])
        assert cs.mu is not None  # estimated before its first upload
        return personalised_model(models, cs.mu), models, nbytes(models)

    def estimate(self, ctx: ClientContext, cs: StreamClient, models: torch.Tensor | None) -> np.ndarray | None:
        assert models is not None
        data = cs.data_on(ctx.device)
        losses = model_losses(ctx.scratch, models, data.x, data.y, ctx.info.task)
        cs.mu = importance_weights(to_numpy(losses), self.settings.sigma)
        return cs.mu

    def serve_unseen(self, ctx: ClientContext, cs: StreamClient, w: Params, models: torch.Tensor | None,
                     payload: Mapping[str, object]) -> tuple[Params, dict[str, float]]:
        """A held-out client's cold start: its own estimate mu on the K models it downloaded
        (:meth:`estimate`, FedSoft's estimation step) and its mixture sum_k mu_k w_k, the anchor
        its own reply would give; mu is ``u[k]``."""
        models = cast(torch.Tensor, payload["initial_models"])
        mu = self.estimate(ctx, cs, models)
        assert mu is not None
        return personalised_model(models, mu), {f"u[{k}]": float(v) for k, v in enumerate(mu)}

    def init_stream_server(self, models: torch.Tensor) -> CCFLServerState:
        return init_server_state(models)

    def cold_start(self, state: CCFLServerState, initial_models: torch.Tensor) -> dict[str, object]:
        return {"initial_models": state.models.clone(), "t": state.t}  # the current cluster models

    def server_step(self, state: CCFLServerState, client: int, up: Mapping[str, object], scratch: torch.nn.Module,
                    val_sets: ValSets) -> tuple[CCFLServerState, None, dict[str, object]]:
        # the upload of StreamAlgorithm.step: its model, the reply's epoch tau and its estimate mu
        w, tau, mu = cast(Params, up["w"]), cast(int, up["tau"]), cast(np.ndarray, up["mu"])
        state, diag = on_upload_async(state, self.settings, client, w, tau, mu)
        diag["fresh"] = True  # every client estimates its own mixture at every upload
        return state, None, diag

    def models(self, state: CCFLServerState) -> torch.Tensor:
        return state.models

    def reply(self, state: CCFLServerState, model: Params | None) -> dict[str, object]:
        return {"model": None, "t": state.t, "models": state.models.clone()}
