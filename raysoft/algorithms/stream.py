"""The protocol of asynchronous, client-driven streams (CCFL, FedSoft-Async, the stream Local).

A stream algorithm is an object made from its settings (:class:`~raysoft.config.StreamConfig`)
with a client half and a server half, both Ray-free:

* client half: ``init_client(ctx) -> StreamClient`` and the client ops ``stream_step`` (receive
  the last reply, take the next dataset, train on objective (2) of the CCFL paper with the reply
  as anchor, return the upload) and ``stream_score`` (score the last reply at the end). The
  template :meth:`StreamAlgorithm.step` is the same for every stream algorithm; what differs is
  said by the hooks :meth:`~StreamAlgorithm.first_anchor`, :meth:`~StreamAlgorithm.receive`,
  :meth:`~StreamAlgorithm.start_from`, :meth:`~StreamAlgorithm.estimate` and
  :meth:`~StreamAlgorithm.upload`; every one trains with :func:`client_update`;
* server half: ``init_stream_server(models) -> state`` (from the pre-trained cluster models),
  ``cold_start(state, initial_models)`` (what a client downloads before its first upload),
  ``server_step(state, client, upload, scratch, val_sets) -> (state, model, diag)`` for one
  upload, and ``reply(state, model)`` (what goes back to the client).

``has_server`` is False for the stream Local (no server, no cluster models to evaluate).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch import nn

from ..config import Config, TrainConfig
from ..data.drift import CycleData
from ..data.streams import StreamSource, stream_source
from ..devices import to_device
from ..models import build_model
from ..optim import SGD, Adam
from ..params import Params, get_flat, set_flat
from ..rng import numpy_rng, torch_generator
from ..training import evaluate, make_optimizer, proximal_train
from .base import ClientContext, Configured
from .settings import StreamConfig

ValSets = list[tuple[torch.Tensor, torch.Tensor]]
ST = TypeVar("ST")  # an algorithm's server state


def kl_divergence(p: np.ndarray, q: np.ndarray, eps: float = 1e-12) -> float:
    """KL(p || q) in nats, with q floored at eps."""
    p, q = np.asarray(p, float), np.maximum(np.asarray(q, float), eps)
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] / q[nz])))


def nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else int(t.numel() * t.element_size())


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    return float(0.5 * np.abs(np.asarray(p, float) - np.asarray(q, float)).sum())


@dataclass
class StreamClient:
    client: int
    drift: StreamSource | None  # the data's source: not checkpointed, attached again from (data, seed)
    optimizer: Adam | SGD
    local: Params | None = None
    tau: int = 0
    cycle: int = 0  # index of the current dataset (one per clock tick)
    mu: np.ndarray | None = None  # FedSoft-Async: the mixture estimate of the last upload
    uploaded_shares: np.ndarray | None = None  # the true mixture at the last upload (upload_policy shift)
    cache: CycleData | None = None  # rebuilt from (seed, client, cycle); not checkpointed

    @property
    def data(self) -> CycleData:
        if self.cache is None:
            assert self.drift is not None, "a stream client's data source is attached by the template"
            self.cache = self.drift.cycle(self.client, self.cycle)
        return self.cache

    def data_on(self, device: torch.device) -> CycleData:
        """:attr:`data` on ``device`` (moved there once a cycle: the host's device)."""
        self.cache = data = to_device(self.data, device)
        return data

    def next_cycle(self) -> None:
        self.cycle += 1
        self.cache = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "cache": None, "drift": None}


def pretrain(cfg: Config, data: StreamSource, epochs: int = 0, shared_init: bool = True) -> torch.Tensor:
    """The K cluster models [K, d], each pre-trained on its cluster's public set for ``epochs``
    (with the ``train`` section), from one shared random initialisation (``shared_init``) or
    one per cluster. ``epochs`` 0: the initialisations themselves."""
    out = []
    for s in range(data.num_clusters):
        model = build_model(cfg.model, data.info, torch_generator(cfg.seed, "center", 0 if shared_init else s))
        if epochs:
            x, y = data.public(s)
            proximal_train(model, make_optimizer(cfg.train, model.parameters()), x, y, data.info.task, cfg.train,
                           rng=numpy_rng(cfg.seed, "pretrain", s), epochs=epochs)
        out.append(get_flat(model))
    return torch.stack(out)


def client_objective_gradient(grad_f: torch.Tensor, w: Params, anchor: Params, rho: float) -> torch.Tensor:
    """Gradient of objective (2): grad h_m(w) = grad f_m(w) + rho (w - wbar_m)."""
    return grad_f + rho * (w - anchor)


def client_start(local: Params, reply: Params, settings: StreamConfig) -> Params:
    """The model a client trains from after receiving ``reply``: the reply itself
    (``client_starts_from_reply``, the default reading) or its own local model."""
    return reply.clone() if settings.client_starts_from_reply else local.clone()


def client_update(model: nn.Module, optimizer: Adam | SGD, x: torch.Tensor, y: torch.Tensor, task: str,
                  train_cfg: TrainConfig, anchor: Params, rho: float,
                  rng: np.random.Generator | None = None, epochs: int | None = None) -> Params:
    """Local training on objective (2) from ``model``'s current parameters, in place: the
    local solver with the prox gradient rho w - rho wbar_m added (``anchor`` = wbar_m, the last
    reply; :func:`client_objective_gradient`), for ``epochs`` passes (None: the train
    section's). ``optimizer`` must be bound to ``model``'s parameters. Returns the trained vector."""
    proximal_train(model, optimizer, x, y, task, train_cfg, pull_scale=float(rho),
                   pull_target=float(rho) * anchor, rng=rng, epochs=epochs)
    return get_flat(model)


class StreamAlgorithm(Configured[StreamConfig], Generic[ST]):
    """The template every stream algorithm shares; subclasses fill in the hooks."""

    Settings: type[StreamConfig] = StreamConfig

    stream = True  # marks the stream template (raysoft.plugins.stream_base)
    own_data = True  # the client's data is built per cycle, not by the federation
    has_server = True

    stateless_ops: tuple[str, ...] = ("unseen",)  # a held-out client's cold start starts from nothing of its own

    def __init__(self, settings: StreamConfig) -> None:
        super().__init__(settings)
        self.client_ops: dict[str, Callable[..., tuple[object, object]]] = {"stream_step": self.step,
                                                                           "stream_score": self.score}
        if type(self).serve_unseen is not StreamAlgorithm.serve_unseen:  # a cold start for held-out clients
            self.client_ops["unseen"] = self.unseen
        self._source: StreamSource | None = None

    # ------------------------------------------------------------------ data and the start
    def source(self, cfg: Config) -> StreamSource:
        """The clients' data (:func:`raysoft.data.streams.stream_source`), made once where the
        algorithm lives."""
        if self._source is None:
            a = self.settings
            self._source = stream_source(cfg.data, cfg.seed, a.public_samples, a.rest_split, a.validation)
        return self._source

    def initial_models(self, cfg: Config, data: StreamSource) -> torch.Tensor:
        """The K cluster models [K, d] the server starts from (``init_stream_server``'s argument):
        by default one random initialisation (the model's, from ``(seed, "center", 0)``) for
        every cluster; CCFL and its baselines pre-train theirs (``pretrain_epochs``)."""
        return pretrain(cfg, data)

    def proximal(self) -> float:
        """rho of objective (2), the pull of a client's training towards the reply it got
        (rho/2)||w - anchor||^2; 0 by default: plain local training from the reply."""
        return 0.0

    # ------------------------------------------------------------------ client half
    def init_client(self, ctx: ClientContext) -> StreamClient:
        return StreamClient(client=ctx.client, drift=self.source(ctx.cfg),
                            optimizer=make_optimizer(ctx.cfg.train, ctx.scratch.parameters()))

    def attach(self, ctx: ClientContext, cs: StreamClient) -> StreamClient:
        """``cs`` with its data source (states moved or restored from a checkpoint come without it)."""
        if cs.drift is None:
            cs.drift = self.source(ctx.cfg)
        return cs

    def first_anchor(self, payload: dict[str, Any]) -> tuple[Params, torch.Tensor | None, int]:
        """(anchor, the K models if they came down, bytes downloaded) of a cold start."""
        raise NotImplementedError

    def receive(self, cs: StreamClient, reply: dict[str, Any]) -> tuple[Params, torch.Tensor | None, int]:
        """(the new anchor, the K models if they came down, bytes downloaded) of a reply."""
        raise NotImplementedError

    def start_from(self, cs: StreamClient, anchor: Params) -> Params:
        """The model the client trains from after a reply (:func:`client_start`)."""
        assert cs.local is not None
        return client_start(cs.local, anchor, self.settings)

    def estimate(self, ctx: ClientContext, cs: StreamClient, models: torch.Tensor | None) -> np.ndarray | None:
        """The client's own estimate of its mixture (FedSoft-Async), or None."""
        return None

    def upload(self, cs: StreamClient, mu: np.ndarray | None) -> tuple[Params | None, int]:
        """(what the client uploads, its bytes)."""
        assert cs.local is not None
        return cs.local, nbytes(cs.local) + (8 * len(mu) if mu is not None else 0)

    def server_work(self, ctx: ClientContext, cs: StreamClient, w: Params | None) -> dict[str, object]:
        """Server-side work that depends on the upload alone, done where the client runs (in
        parallel with the other clients) and sent with it; nothing by default."""
        return {}

    def score_reply(self, ctx: ClientContext, cs: StreamClient, anchor: Params) -> dict[str, float]:
        """Cli Aft: the reply on the test set of the data it was sent for."""
        set_flat(ctx.scratch, anchor)
        data = cs.data_on(ctx.device)
        return evaluate(ctx.scratch, data.test_x, data.test_y, ctx.info.task)

    def score(self, ctx: ClientContext, cs: StreamClient, payload: dict[str, Any], t: int):
        """Client op ``stream_score``: at the end of the stream, the last reply's Cli Aft."""
        self.attach(ctx, cs)
        anchor, _, _ = self.receive(cs, payload["replies"][ctx.client])
        return cs, self.score_reply(ctx, cs, anchor)

    def step(self, ctx: ClientContext, cs: StreamClient, payload: dict[str, Any], t: int):
        """Client op ``stream_step``: receive the last reply (or the cold start), score it on the
        current test set (Cli Aft of the previous upload), take the next tick's data, train on
        objective (2) with the reply as anchor, score the result (Cli Bfr) and return the upload.
        With ``upload_policy: shift`` the client keeps training on each new tick's data,
        silently, until its mixture has moved by ``shift_threshold`` since its last upload (or
        ``max_silent_ticks`` passed). Also returns the client's costs: bytes down/up, samples
        trained, estimation forward passes and seconds spent training and estimating."""
        a = ctx.settings(StreamConfig)  # a client op: its settings from ctx, as every client op's
        self.attach(ctx, cs)
        reply = payload["replies"].get(ctx.client)
        extras = (payload if reply is None else reply).get("extras") or {}  # back to the server as they came
        after, down, models = None, 0, None
        if reply is None:  # first upload: cold start from the server's current initialisation tuple (w, t)
            cs.tau = int(payload.get("t", 0))
            anchor, models, down = self.first_anchor(payload)
            start = anchor.clone()
        else:
            cs.tau = reply["t"]
            anchor, models, down = self.receive(cs, reply)
            after = self.score_reply(ctx, cs, anchor) if self.has_server else None
            start = self.start_from(cs, anchor)
            if a.drift:
                cs.next_cycle()
        silent, samples, train_s = 0, 0, 0.0
        while True:
            tick = time.perf_counter()
            set_flat(ctx.scratch, start)
            cs.optimizer.bind(ctx.scratch.parameters())
            epochs = a.local_epochs or ctx.cfg.train.local_epochs  # H, the local work of a cycle
            data = cs.data_on(ctx.device)
            start = client_update(ctx.scratch, cs.optimizer, data.x, data.y, ctx.info.task, ctx.cfg.train,
                                  anchor, self.proximal(), rng=numpy_rng(ctx.cfg.seed, "shuffle", ctx.client, cs.cycle),
                                  epochs=epochs)
            samples += len(cs.data) * epochs
            train_s += time.perf_counter() - tick
            if (a.upload_policy == "clock" or cs.uploaded_shares is None or silent >= a.max_silent_ticks
                    or total_variation(cs.data.shares, cs.uploaded_shares) >= a.shift_threshold):
                break
            silent += 1  # no shift: keep training on the next tick's data, without uploading
            if a.drift:
                cs.next_cycle()
        cs.local = start
        tick = time.perf_counter()
        mu = self.estimate(ctx, cs, models)
        est_s = time.perf_counter() - tick if mu is not None else 0.0
        forwards = len(models) * len(cs.data) if mu is not None and models is not None else 0
        set_flat(ctx.scratch, cs.local)
        data = cs.data_on(ctx.device)
        before = evaluate(ctx.scratch, data.test_x, data.test_y, ctx.info.task)
        cs.uploaded_shares = cs.data.shares
        w, up = self.upload(cs, mu)
        tick = time.perf_counter()
        work = self.server_work(ctx, cs, w)
        work_s = time.perf_counter() - tick if work else 0.0
        # the samples this step trained and passed forward (its estimate, Cli Bfr and Cli Aft):
        # the arithmetic raysoft bench's floor counts (not recorded in the results)
        ledger = {"train": samples, "forward": forwards + len(cs.data.test_y) * (1 + (after is not None))}
        return cs, {"w": w, "tau": cs.tau, "before": before, "after": after, "mu": mu, "shares": cs.data.shares,
                    "samples": len(cs.data), "silent": silent, "finished": time.time(), "ledger": ledger,
                    "extras": extras, **work,
                    "cost": {"bytes_down": down, "bytes_up": up, "samples_trained": samples,
                             "estimation_forwards": forwards, "train_s": train_s, "estimation_s": est_s,
                             "server_on_actor_s": work_s}}

    def serve_unseen(self, ctx: ClientContext, cs: StreamClient, w: Params, models: torch.Tensor | None,
                     payload: dict[str, Any]) -> tuple[Params, dict[str, float]]:
        """The model a held-out client is served after its first local training ``w`` (and the
        figures of how it was chosen): the reply the algorithm would send to that first upload.
        Subclasses say which; without it, the client op ``unseen`` is absent and held-out
        clients are skipped."""
        raise NotImplementedError

    def unseen(self, ctx: ClientContext, _: None, payload: dict[str, Any], t: int):
        """Client op ``unseen``, the cold start of a held-out client (``data.held_out``): as a
        newcomer, it downloads the server's current initialisation tuple (``payload``: the
        algorithm's ``cold_start``, plus the cluster models as ``models``), trains once on its
        data at its first tick (objective (2) from that anchor, the stream's local work, its
        mini-batch order from the stream (seed, "unseen-shuffle", client)), is served
        :meth:`serve_unseen` and scored on that tick's test split. Never uploaded."""
        a = ctx.settings(StreamConfig)
        cs = self.init_client(ctx)
        anchor = self.first_anchor(payload)[0]
        set_flat(ctx.scratch, anchor)
        cs.optimizer.bind(ctx.scratch.parameters())
        data = cs.data_on(ctx.device)
        w = client_update(ctx.scratch, cs.optimizer, data.x, data.y, ctx.info.task, ctx.cfg.train, anchor,
                          self.proximal(), rng=numpy_rng(ctx.cfg.seed, "unseen-shuffle", ctx.client),
                          epochs=a.local_epochs or ctx.cfg.train.local_epochs)
        models = payload.get("models")
        served, extra = self.serve_unseen(ctx, cs, w, None if models is None else ctx.tensor(models), payload)
        return None, {**self.score_reply(ctx, cs, served), **extra}

    # ------------------------------------------------------------------ server half
    def init_stream_server(self, models: torch.Tensor) -> ST:
        """The server's state, from the K cluster models [K, d] (:meth:`initial_models`). Not
        ``init_server``, which is a synchronous algorithm's (from its ServerContext)."""
        raise NotImplementedError

    def cold_start(self, state: ST, initial_models: torch.Tensor) -> dict[str, object]:
        """What a client downloads before its first upload: the server's current initialisation
        tuple, whose ``t`` (the server's epoch) stamps the client's first upload."""
        raise NotImplementedError

    def server_step(self, state: ST, client: int, up: dict[str, Any], scratch: torch.nn.Module,
                    val_sets: ValSets) -> tuple[ST, Params | None, dict[str, Any]]:
        """The server's answer to one upload: (new state, the reply's model or None, diag).
        ``diag`` has ``stale``, ``staleness``, ``u`` (the estimate, or None), ``fresh`` (the
        estimate was made for this upload) and, where the server estimated, Algorithm 1's terms
        (``l``, ``d1``, ``d2``, ``scores``, ``alpha``, ``rejected``, ``gap``, ``alpha2``: with
        ``scores``, one row per cluster of estimation.parquet) and ``server_s`` /
        ``server_forwards`` (its cost)."""
        raise NotImplementedError

    def reply(self, state: ST, model: Params | None) -> dict[str, object]:
        """What goes back to the client: the reply's model, (for FedSoft-Async) the K cluster
        models, and optionally ``extras``, a dict of the plug-in's own fields (plain values and
        tensors) that the client's next upload carries back unchanged as ``up["extras"]`` (a
        model version, say). The engine adds ``t``, the uploads applied so far (the client's tau)."""
        return {"model": model, "models": None}

    def models(self, state: ST) -> torch.Tensor:
        """The cluster models [K, d] (evaluated every ``eval_every`` uploads, row k on cluster
        k's test set): required of every algorithm with a server."""
        raise NotImplementedError
