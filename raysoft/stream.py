"""Asynchronous, client-driven event streams (CCFL and FedSoft-Async), free of Ray.

Clients upload when their own clock says: client m's uploads are separated by exponential
gaps with a rate drawn once per client from U[upload_rate] (fast and slow clients coexist),
starting at its join time. Each upload is one global epoch t of the server.

**Reproducible asynchrony** (``mode: virtual``): a client's next upload depends only on its
last reply, so every client whose upload is not yet computed trains at the same time (in
parallel on the client actors); the server then applies uploads strictly in virtual-time order
(ties by client id) until it reaches a client whose next upload is not computed, and the cycle
repeats. The numbers do not depend on the cluster, the packing or the timing.
``mode: realtime`` applies each batch's uploads in the order they finished (wall clock), for
studying true asynchrony; it is not reproducible.

Recorded per upload (``step`` = the global epoch t): the client's Cli Bfr (``accuracy_before``,
the uploaded model on a test set with its current mixture), Cli Aft (``accuracy_after``, the
reply on the same test set, measured when the client next trains, or at the end of the stream
for its last reply, and filed under the same step), ``kl`` = KL(true mixture || estimate), the
client's costs, the estimate in ``weights.parquet`` and the true mixture in ``clients.parquet``;
every ``eval_every`` uploads, every cluster model on every cluster's test set. The summary's
``cli_bfr`` / ``cli_aft`` are papers/ccfl.md Table 1's: the mean over clients at their final
upload-download cycle; ``cluster_acc`` the cluster models' accuracy averaged over every
evaluation; the means over all uploads are ``cli_bfr_all_uploads`` / ``cli_aft_all_uploads``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .algorithms.base import ClientContext
from .algorithms.ccfl import (CCFLParams, client_start, init_server_state, initial_reply, on_upload,
                              personalised_model)
from .algorithms.fedsoft import importance_weights
from .algorithms.fedsoft_async import on_upload_async
from .config import CCFLConfig, Config
from .data.drift import CycleData, DriftingImages
from .engine import load_checkpoint, record_placement, save_checkpoint
from .evaluation import evaluate_centers, summarize, weight_error
from .models import build_model
from .optim import SGD, Adam
from .params import Params, get_flat, set_flat
from .results import Recorder
from .rng import numpy_rng, torch_generator
from .training import evaluate, make_optimizer, model_losses, proximal_train


def ccfl_params(cfg: Config) -> CCFLParams:
    """The pure server's parameters from the config."""
    a: CCFLConfig = cfg.algorithm  # type: ignore[assignment]
    return CCFLParams(
        c1=a.c1, c2=a.c2, amplifier=tuple(a.amplifier), l_bar=a.l_bar, d1_bar=a.d1_bar, d2_bar=a.d2_bar,
        score_floor=a.score_floor, loss_reduction=a.loss_reduction, alpha0=a.alpha0, alpha1_bar=a.alpha1_bar,
        a=a.a, b=a.b, tau0=int(a.tau0), adjust_start=a.adjust_start, adjust_percentile=a.adjust_percentile,
        total_epochs=int(a.rounds), rho=a.rho,
    )


def kl_divergence(p: np.ndarray, q: np.ndarray, eps: float = 1e-12) -> float:
    """KL(p || q) in nats, with q floored at eps."""
    p, q = np.asarray(p, float), np.maximum(np.asarray(q, float), eps)
    nz = p > 0
    return float(np.sum(p[nz] * np.log(p[nz] / q[nz])))


# ----------------------------------------------------------------------------- client half
def nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else int(t.numel() * t.element_size())


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    return float(0.5 * np.abs(np.asarray(p, float) - np.asarray(q, float)).sum())


@dataclass
class StreamClient:
    client: int
    drift: DriftingImages
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
            self.cache = self.drift.cycle(self.client, self.cycle)
        return self.cache

    def next_cycle(self) -> None:
        self.cycle += 1
        self.cache = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "cache": None}


def _receive(name: str, cs: StreamClient, reply: dict[str, Any]) -> tuple[Params, torch.Tensor | None, int]:
    """(the new anchor, the K models if they came down, bytes downloaded) of a reply."""
    if name == "local_stream":  # no server: the client's own model is its anchor
        return cs.local, None, 0
    if name == "fedsoft_async":  # all K models come down; the client mixes them itself
        models = reply["models"]
        return personalised_model(models, cs.mu), models, nbytes(models)
    return reply["model"], None, nbytes(reply["model"])


def _score_reply(ctx: ClientContext, cs: StreamClient, anchor: Params) -> dict[str, float]:
    """Cli Aft: the reply on the test set of the data it was sent for."""
    set_flat(ctx.scratch, anchor)
    return evaluate(ctx.scratch, cs.data.test_x, cs.data.test_y, ctx.info.task)


def stream_score(ctx: ClientContext, cs: StreamClient, payload: dict[str, Any], t: int):
    """At the end of the stream: score the last reply (Cli Aft of the client's final upload)."""
    a: CCFLConfig = ctx.cfg.algorithm  # type: ignore[assignment]
    anchor, _, _ = _receive(a.name, cs, payload["replies"][ctx.client])
    return cs, _score_reply(ctx, cs, anchor)


def stream_step(ctx: ClientContext, cs: StreamClient, payload: dict[str, Any], t: int):
    """Receive the last reply (or the initial model), score it on the current test set (Cli Aft
    of the previous upload), take the next tick's data, train on objective (2) with the reply as
    anchor, score the result (Cli Bfr) and return the upload. With ``upload_policy: shift`` the
    client keeps training on each new tick's data, silently, until its mixture has moved by
    ``shift_threshold`` since its last upload (or ``max_silent_ticks`` passed).
    Also returns the client's costs: bytes down/up, samples trained, estimation forward passes
    and seconds spent training and estimating."""
    a: CCFLConfig = ctx.cfg.algorithm  # type: ignore[assignment]
    reply = payload["replies"].get(ctx.client)
    after, down, models = None, 0, None
    if reply is None:  # first upload: cold start from the initialisation tuple
        cs.tau = 0
        if a.name == "fedsoft_async":  # the K initial models; the start is their average
            models = payload["initial_models"]
            anchor, down = personalised_model(models, np.full(len(models), 1.0 / len(models))), nbytes(models)
        else:
            anchor = payload["initial"]
            down = nbytes(anchor) if a.name == "ccfl" else 0
        start = anchor.clone()
    else:
        cs.tau = reply["t"]
        anchor, models, down = _receive(a.name, cs, reply)
        after = _score_reply(ctx, cs, anchor) if a.name != "local_stream" else None
        start = client_start(cs.local, anchor, payload["params"]) if a.name != "local_stream" else cs.local.clone()
        if a.drift:
            cs.next_cycle()
    silent, samples, train_s = 0, 0, 0.0
    while True:
        tick = time.perf_counter()
        set_flat(ctx.scratch, start)
        cs.optimizer.bind(ctx.scratch.parameters())
        proximal_train(ctx.scratch, cs.optimizer, cs.data.x, cs.data.y, ctx.info.task, ctx.cfg.train,
                       pull_scale=float(a.rho), pull_target=float(a.rho) * anchor,
                       rng=numpy_rng(ctx.cfg.seed, "shuffle", ctx.client, cs.cycle))
        start = get_flat(ctx.scratch)
        samples += len(cs.data) * ctx.cfg.train.local_epochs
        train_s += time.perf_counter() - tick
        if (a.upload_policy == "clock" or cs.uploaded_shares is None or silent >= a.max_silent_ticks
                or total_variation(cs.data.shares, cs.uploaded_shares) >= a.shift_threshold):
            break
        silent += 1  # no shift: keep training on the next tick's data, without uploading
        if a.drift:
            cs.next_cycle()
    cs.local = start
    mu, est_s, forwards = None, 0.0, 0
    if models is not None:  # FedSoft-Async: the client estimates its mixture on the K models
        tick = time.perf_counter()
        losses = model_losses(ctx.scratch, models, cs.data.x, cs.data.y, ctx.info.task)
        cs.mu = mu = importance_weights(losses.numpy(), 1e-4)
        est_s, forwards = time.perf_counter() - tick, len(models) * len(cs.data)
    set_flat(ctx.scratch, cs.local)
    before = evaluate(ctx.scratch, cs.data.test_x, cs.data.test_y, ctx.info.task)
    cs.uploaded_shares = cs.data.shares
    up = 0 if a.name == "local_stream" else nbytes(cs.local) + (8 * len(mu) if mu is not None else 0)
    return cs, {"w": cs.local if a.name != "local_stream" else None, "tau": cs.tau, "before": before,
                "after": after, "mu": mu, "shares": cs.data.shares, "samples": len(cs.data), "silent": silent,
                "finished": time.time(),
                "cost": {"bytes_down": down, "bytes_up": up, "samples_trained": samples,
                         "estimation_forwards": forwards, "train_s": train_s, "estimation_s": est_s}}


class StreamAlgorithm:
    """The client half of CCFL / FedSoft-Async / Local streams for a ClientHost (data built per tick)."""

    own_data = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.client_ops = {"stream_step": stream_step, "stream_score": stream_score}

    def init_client(self, ctx: ClientContext) -> StreamClient:
        a: CCFLConfig = ctx.cfg.algorithm  # type: ignore[assignment]
        drift = DriftingImages(ctx.cfg.data, ctx.cfg.seed, a.public_samples, a.rest_split)
        return StreamClient(client=ctx.client, drift=drift,
                            optimizer=make_optimizer(ctx.cfg.train, ctx.scratch.parameters()))


# ----------------------------------------------------------------------------- server / engine
def pretrain(cfg: Config, drift: DriftingImages, scratch_info) -> torch.Tensor:
    """Each cluster model pre-trained on its public set (``pretrain_epochs`` with ``train``)."""
    a: CCFLConfig = cfg.algorithm  # type: ignore[assignment]
    out = []
    for s in range(drift.num_clusters):
        model = build_model(cfg.model, scratch_info, torch_generator(cfg.seed, "center", 0 if a.shared_init else s))
        if a.pretrain_epochs:
            x, y = drift.public(s)
            proximal_train(model, make_optimizer(cfg.train, model.parameters()), x, y, "classification", cfg.train,
                           rng=numpy_rng(cfg.seed, "pretrain", s), epochs=a.pretrain_epochs)
        out.append(get_flat(model))
    return torch.stack(out)


class StreamCoordinator:
    """Runs an asynchronous stream over an executor (same executors as the synchronous rounds)."""

    # everything a checkpoint must hold to continue the stream exactly (no random state: every
    # draw is derived from (seed, purpose, ids))
    CHECKPOINTED = ("state", "started", "next_time", "ticks", "replies", "computed", "last_step", "last_u",
                    "last_shares", "last_vtime", "kl", "kl_fresh", "stale", "_center_scores", "_means", "totals",
                    "final_before", "final_after", "cluster_history", "finished")

    def __init__(self, cfg: Config, executor, run_id: str, run_dir: str | None = None, resume: bool = False) -> None:
        self.cfg, self.executor = cfg, executor
        self.run_dir = Path(run_dir) if run_dir else None
        a: CCFLConfig = cfg.algorithm  # type: ignore[assignment]
        self.a, self.params = a, ccfl_params(cfg)
        self.server = a.name != "local_stream"
        self.drift = DriftingImages(cfg.data, cfg.seed, a.public_samples, a.rest_split)
        self.info = self.drift.info
        self.scratch = build_model(cfg.model, self.info)
        self.state = init_server_state(pretrain(cfg, self.drift, self.info))
        self.initial_models = self.state.models.clone()
        self.val_sets = [self.drift.public(s) for s in range(self.drift.num_clusters)]
        self.holdouts = [self.drift.holdout(s) for s in range(self.drift.num_clusters)]
        self.recorder = Recorder(run_id)
        record_placement(self.recorder, executor)
        self.start = time.monotonic()
        n = cfg.data.clients
        lo, hi = a.upload_rate
        self.rates = np.array([numpy_rng(cfg.seed, "clock-rate", m).uniform(lo, hi) for m in range(n)])
        joins = cfg.data.join_schedule or [0.0] * n
        self.next_time = np.array([joins[m] + self._gap(m, 0) for m in range(n)])  # each client's next tick
        self.ticks = np.zeros(n, dtype=np.int64)  # clock ticks used (uploads + silent ticks)
        self.replies: dict[int, dict[str, Any]] = {}
        self.computed: dict[int, dict[str, Any]] = {}
        self.last_step: dict[int, int] = {}
        self.last_u: dict[int, np.ndarray] = {}
        self.last_shares: dict[int, np.ndarray] = {}
        self.last_vtime: dict[int, float] = {}
        self.kl: list[float] = []
        self.kl_fresh: list[float] = []  # uploads whose estimate was made for them (not reused)
        self.stale = 0
        self.started = False
        self._center_scores: np.ndarray | None = None
        self._means: dict[str, list[float]] = {"accuracy_before": [], "accuracy_after": []}
        self.final_before: dict[int, float] = {}  # each client's Cli Bfr / Cli Aft of its last upload
        self.final_after: dict[int, float] = {}
        self.cluster_history: list[float] = []  # mean accuracy of the cluster models at each evaluation
        self.finished = False
        self.totals = {k: 0.0 for k in ("bytes_down", "bytes_up", "samples_trained", "estimation_forwards",
                                        "server_forwards", "train_s", "estimation_s", "server_estimation_s",
                                        "silent_ticks")}
        if resume:
            self.restore(load_checkpoint(self.run_dir))

    @property
    def round(self) -> int:
        return self.state.t

    def _gap(self, m: int, c: int) -> float:
        return float(numpy_rng(self.cfg.seed, "clock", m, c).exponential(1.0 / self.rates[m]))

    def _elapsed(self) -> float:
        return time.monotonic() - self.start

    def _row(self, scope: str, entity: int, eval_dist: int, metric: str, value: float, step: int | None = None,
             vtime: float | None = None) -> None:
        self.recorder.add("metrics", algorithm=self.a.name, step=self.round if step is None else step,
                          time_s=self._elapsed(), scope=scope, entity=entity, eval_dist=eval_dist,
                          metric=metric, value=float(value), virtual_time=vtime)

    # ------------------------------------------------------------------ checkpoints
    def _event(self, kind: str, detail: str = "") -> None:
        self.recorder.add("events", step=self.round, time_s=self._elapsed(), kind=kind, client=-1, actor=-1,
                          detail=detail)

    def checkpoint(self) -> None:
        """Save the stream (server state, clocks, pending uploads, histories, client states) and
        the results so far, atomically."""
        assert self.run_dir is not None
        self._event("checkpoint")
        blob = {name: getattr(self, name) for name in self.CHECKPOINTED}
        blob.update(elapsed=self._elapsed(), recorder=self.recorder.columns, clients=self.executor.get_states())
        save_checkpoint(self.run_dir, blob, self.recorder)

    def restore(self, blob: dict[str, Any] | None) -> None:
        """Continue from a checkpoint (with none: from the start, which is where we are)."""
        if blob is None:
            return
        self.executor.set_states(blob["clients"])
        for name in self.CHECKPOINTED:
            if name in blob:  # a field added since the checkpoint keeps its initial value
                setattr(self, name, blob[name])
        self.recorder.columns = {**self.recorder.columns, **blob["recorder"]}  # tables added since
        self.start = time.monotonic() - blob["elapsed"]

    # ------------------------------------------------------------------ the stream
    def evaluate(self) -> dict[str, float]:
        """Every cluster model on every cluster's test set (not for Local: it has no server)."""
        head: dict[str, float] = {}
        if self.server:
            res = evaluate_centers(self.scratch, self.state.models, self.holdouts, "classification")
            k = self.drift.num_clusters
            scores = np.zeros((k, k))
            for (c, s), metrics in res.items():
                for name, value in metrics.items():
                    self._row("cluster", c, s, name, value)
                scores[s, c] = metrics["accuracy"]
            self._center_scores = scores
            self.cluster_history.append(float(np.mean(np.diag(scores))))
            head = {f"acc[{s}]": float(scores[s, s]) for s in range(k)}
        if self._means["accuracy_before"]:
            head["cli bfr"] = float(np.mean(self._means["accuracy_before"][-50:]))
        return head

    def _server_step(self, m: int, up: dict[str, Any]) -> tuple[Params | None, dict[str, Any]]:
        """The server's reply to one upload (and the cost of estimating it)."""
        if self.a.name == "local_stream":
            self.state = replace(self.state, t=self.state.t + 1)
            return None, {"stale": False, "staleness": 0, "u": None}
        if self.a.name == "fedsoft_async":
            self.state, _, diag = on_upload_async(self.state, self.params, m, up["w"], up["tau"], up["mu"])
            return None, diag  # the client mixes the K models it downloads itself
        tick = time.perf_counter()
        recomputed = int(np.isnan(self.state.self_losses).sum())
        self.state, reply, diag = on_upload(self.state, self.params, m, up["w"], up["tau"], self.scratch,
                                            self.val_sets)
        self.totals["server_estimation_s"] += time.perf_counter() - tick
        if not diag["stale"]:  # w_m on every D_k, plus the cluster models whose F(w_k; D_k) was stale
            sizes = [len(y) for _, y in self.val_sets]
            self.totals["server_forwards"] += sum(sizes) + recomputed * int(np.mean(sizes))
        return reply, diag

    def _apply(self, m: int, up: dict[str, Any]) -> None:
        reply, diag = self._server_step(m, up)
        t, vt = self.state.t, up["vtime"]
        self.stale += bool(diag["stale"])
        for name, value in up["before"].items():
            self._row("client", m, -1, f"{name}_before", value, vtime=vt)
        self._means["accuracy_before"].append(up["before"]["accuracy"])
        self.final_before[m] = up["before"]["accuracy"]
        if up["after"] is not None:  # the previous reply, scored on the data it was sent for
            self._record_after(m, up["after"])
        for name, value in up["cost"].items():
            self.totals[name] += value
            if not name.endswith("_s"):
                self._row("client", m, -1, name, value, vtime=vt)
        self.totals["silent_ticks"] += up["silent"]
        self._row("client", m, -1, "silent_ticks", up["silent"], vtime=vt)
        if diag["u"] is not None:
            u = np.asarray(diag["u"], dtype=float)
            kl = kl_divergence(up["shares"], u)
            self.kl.append(kl)
            estimated = "scores" in diag  # CCFL estimated at this upload (a stale one reuses the last u)
            if estimated or self.a.name == "fedsoft_async":  # FedSoft-Async's clients always estimate
                self.kl_fresh.append(kl)
            self._row("client", m, -1, "kl", kl, vtime=vt)
            self._row("client", m, -1, "staleness", diag["staleness"], vtime=vt)
            for c, est in enumerate(u):
                self.recorder.add("weights", step=t, client=m, center=c, estimate=float(est))
            if estimated:  # CCFL's Algorithm 1 terms (raw, before the bars)
                for c in range(len(u)):
                    self.recorder.add("estimation", step=t, client=m, center=c, l=float(diag["l"][c]),
                                      d1=float(diag["d1"][c]), d2=float(diag["d2"][c]),
                                      score=float(diag["scores"][c]), alpha=float(diag["alpha"][c]),
                                      rejected=bool(diag["rejected"][c]))
            self.last_u[m] = u
        for s, share in enumerate(up["shares"]):
            self.recorder.add("clients", step=t, client=m, distribution=s, share=float(share),
                              samples=int(round(share * up["samples"])))
        self.last_step[m], self.last_shares[m], self.last_vtime[m] = t, np.asarray(up["shares"]), vt
        self.replies[m] = {"model": reply, "t": t,
                           "models": self.state.models.clone() if self.a.name == "fedsoft_async" else None}
        self.ticks[m] += 1 + up["silent"]
        self.next_time[m] = vt + self._gap(m, int(self.ticks[m]))

    def _record_after(self, m: int, after: dict[str, float]) -> None:
        for name, value in after.items():
            self._row("client", m, -1, f"{name}_after", value, step=self.last_step[m], vtime=self.last_vtime[m])
        self._means["accuracy_after"].append(after["accuracy"])
        self.final_after[m] = after["accuracy"]

    def _finish(self) -> None:
        """Score every client's last reply (Cli Aft of its final upload): computed uploads that
        will never be applied carry it; the other clients score it now."""
        if not self.server or self.finished:
            return
        self.finished = True
        for m in sorted(self.computed):
            if self.computed[m]["after"] is not None:
                self._record_after(m, self.computed[m]["after"])
        rest = [m for m in sorted(self.replies) if m not in self.computed]
        if rest:
            scores = self.executor.call("stream_score", rest, {"replies": {m: self.replies[m] for m in rest}},
                                        self.state.t)
            for m in rest:
                self._record_after(m, scores[m])

    def _upload_time(self, m: int, silent: int) -> float:
        """The virtual time of client m's computed upload: its next tick, plus the ticks it let
        pass silently (upload_policy shift)."""
        return float(self.next_time[m] + sum(self._gap(m, int(self.ticks[m]) + j) for j in range(1, silent + 1)))

    def advance(self) -> dict[str, Any]:
        """The initial evaluation, or one batch: train every client whose next upload is not
        computed (in parallel), then apply uploads in virtual-time order while the earliest is
        computed (an uncomputed client's next tick bounds its upload time from below)."""
        if not self.started:
            self.started = True
            return {"round": 0, "headline": self.evaluate(), "done": False}
        total = int(self.a.rounds)
        n = self.cfg.data.clients
        need = [m for m in range(n) if m not in self.computed]
        if need:
            payload = {
                "params": self.params, "replies": {m: self.replies[m] for m in need if m in self.replies},
                "initial": initial_reply(self.state) if len(self.replies) < len(need) else None,
                "initial_models": self.initial_models if self.a.name == "fedsoft_async" else None,
            }
            done = self.executor.call("stream_step", need, payload, self.state.t)
            for m in sorted(done):
                done[m]["vtime"] = self._upload_time(m, done[m]["silent"])
            self.computed.update(done)
        head = None
        order = None
        if self.a.mode == "realtime":  # arrival order within the batch
            order = sorted(self.computed, key=lambda m: (self.computed[m]["finished"], m))
        every = self.cfg.output.checkpoint_every
        while self.state.t < total:
            if order is not None:
                if not order:
                    break
                m = order.pop(0)
            else:
                keys = np.array([self.computed[i]["vtime"] if i in self.computed else self.next_time[i]
                                 for i in range(n)])
                m = int(np.lexsort((np.arange(n), keys))[0])
                if m not in self.computed:
                    break
            self._apply(m, self.computed.pop(m))
            if self.state.t % self.a.eval_every == 0 or self.state.t == total:
                head = self.evaluate()
            if every and self.run_dir is not None and self.state.t % every == 0:
                self.checkpoint()
        if self.state.t >= total:
            self._finish()
        return {"round": self.state.t, "headline": head, "done": self.state.t >= total}

    def results(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._center_scores is None and self.server:
            self.evaluate()
        ids = sorted(self.last_u)
        weights = np.stack([self.last_u[m] for m in ids]) if ids else None
        truth = np.stack([self.last_shares[m] for m in ids]) if ids else np.zeros((0, 0))
        means = {k: float(np.mean(v)) for k, v in self._means.items() if v}
        k = self.drift.num_clusters
        scores = self._center_scores if self._center_scores is not None else np.zeros((k, 0))
        out = summarize(scores, "accuracy", means, weights, truth)
        if weights is not None:  # cluster k is pre-trained on distribution k: no matching to guess
            out["matching"] = {str(s): s for s in range(k)}
            out["weight_mae"] = weight_error(weights, truth, np.arange(k))
        # papers/ccfl.md Table 1: clients' accuracy at their final upload-download cycle (before
        # uploading and of the reply), the clusters' accuracy averaged over all evaluations; the
        # mean KL; and the means over every upload
        final = lambda d: float(np.mean(list(d.values()))) if d else None  # noqa: E731
        out.update(cli_bfr=final(self.final_before), cli_aft=final(self.final_after),
                   cluster_acc=float(np.mean(self.cluster_history)) if self.cluster_history else None,
                   kl=float(np.mean(self.kl)) if self.kl else None,
                   kl_fresh_estimates=float(np.mean(self.kl_fresh)) if self.kl_fresh else None,
                   cli_bfr_all_uploads=means.get("accuracy_before"), cli_aft_all_uploads=means.get("accuracy_after"),
                   cluster_acc_final=float(np.mean(np.diag(scores))) if scores.shape[1] else None)
        n, tot = self.cfg.data.clients, self.totals
        out.update(bytes_down_per_client=tot["bytes_down"] / n, bytes_up_per_client=tot["bytes_up"] / n,
                   samples_trained_per_client=tot["samples_trained"] / n,
                   client_estimation_forwards_per_client=tot["estimation_forwards"] / n,
                   server_estimation_forwards=int(tot["server_forwards"]), silent_ticks=int(tot["silent_ticks"]),
                   # where the time goes: seconds summed over clients (they run in parallel) and the server's
                   time_breakdown_s={"client_training": tot["train_s"], "client_estimation": tot["estimation_s"],
                                     "server_estimation": tot["server_estimation_s"]})
        out.update(run_id=self.recorder.run_id, algorithm=self.a.name, dataset=self.cfg.data.name,
                   rounds=int(self.state.t), uploads=int(self.state.t), stale_uploads=int(self.stale),
                   wall_time_s=self._elapsed())
        return self.recorder.tables(), out
