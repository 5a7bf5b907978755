"""The coordinator of asynchronous, client-driven event streams (CCFL, FedSoft-Async, Local).

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
``cli_bfr`` / ``cli_aft`` are the CCFL paper's Table 1 definitions: the mean over clients at
their final upload-download cycle; ``cluster_acc`` the cluster models' accuracy averaged over
every evaluation; the means over all uploads are ``cli_bfr_all_uploads`` / ``cli_aft_all_uploads``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..algorithms.stream import StreamAlgorithm, StreamConfig, kl_divergence
from ..config import Config
from ..errors import ConfigError, plugin_call
from ..evaluation import summarize, weight_error
from ..metrics import headline_dists
from ..models import build_model
from ..rng import numpy_rng
from .comm import totals as comm_totals
from .executor import Executor
from .recording import Clusterings, CoordinatorBase, Served

if TYPE_CHECKING:
    import pyarrow as pa


class StreamCoordinator(CoordinatorBase):
    """Runs an asynchronous stream over an executor (the same executors as the rounds)."""

    # everything a checkpoint must hold to continue the stream exactly (no random state: every
    # draw is derived from (seed, purpose, ids))
    CHECKPOINTED = ("state", "uploads", "started", "next_time", "ticks", "replies", "computed", "last_step", "last_u",
                    "unseen",
                    "last_shares", "last_vtime", "kl", "kl_fresh", "stale", "center_scores", "means", "totals",
                    "final_before", "final_after", "cluster_history", "finished", "served", "clusterings",
                    "latest_served", "vtime_now")

    def __init__(self, cfg: Config, executor: Executor, algorithm: StreamAlgorithm, run_id: str,
                 run_dir: str | None = None) -> None:
        super().__init__(cfg, executor, run_id, run_dir)
        self.algorithm = algorithm
        self.a: StreamConfig = algorithm.settings
        self.drift = algorithm.source(cfg)  # the clients' data: any dataset, drift optional
        self.info = self.drift.info
        if self.info.task != "classification":
            raise ConfigError(f"algorithm {self.a.name}: a stream scores accuracy, so it needs a classification "
                              f"dataset (data.name {cfg.data.name!r} is {self.info.task})")
        self.scratch = build_model(cfg.model, self.info)
        self.initial_models = plugin_call(algorithm.initial_models, (cfg, self.drift),
                                          f"algorithm {self.a.name!r} raised making its initial models")
        self.val_sets = [self.drift.validation(s) for s in range(self.drift.num_clusters)]
        self.val_samples = sum(len(y) for _, y in self.val_sets)  # the server's D_k, all K of them
        self.holdouts = [self.drift.holdout(s) for s in range(self.drift.num_clusters)]
        lo, hi = self.a.upload_rate
        self.rates = np.array([numpy_rng(cfg.seed, "clock-rate", m).uniform(lo, hi) for m in range(cfg.data.clients)])
        self.init_run()

    def init_run(self) -> None:
        n = self.cfg.data.clients
        self.state = self.algorithm.init_stream_server(self.initial_models)
        self.uploads = 0  # the engine's upload counter (the global epoch t): never the plug-in's state
        self.joins = np.asarray(self.cfg.data.join_schedule or [0.0] * n, dtype=float)
        self.next_time = np.array([self.joins[m] + self._gap(m, 0) for m in range(n)])  # each client's next tick
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
        self.center_scores: np.ndarray | None = None
        self.means: dict[str, list[float]] = {"accuracy_before": [], "accuracy_after": []}
        self.final_before: dict[int, float] = {}  # each client's Cli Bfr / Cli Aft of its last upload
        self.final_after: dict[int, float] = {}
        self.cluster_history: list[float] = []  # mean accuracy of the cluster models at each evaluation
        self.finished = False
        self.unseen = None
        self.served = Served("accuracy")
        self.clusterings = Clusterings()
        self.latest_served: dict[int, dict[str, float]] = {}  # each client's latest served-model metrics
        self.vtime_now: float | None = None  # the virtual time of the last upload applied
        fed = getattr(self.drift, "fed", None)  # a stream over a dataset's federation (not the rotated images)
        if fed is not None:
            self.record_labels(fed)  # its clients' label counts at cycle 0 (a scenario's, say)
        self.totals = {k: 0.0 for k in ("bytes_down", "bytes_up", "samples_trained", "estimation_forwards",
                                        "server_forwards", "train_s", "estimation_s", "server_estimation_s",
                                        "server_on_actor_s", "silent_ticks")}

    @property
    def round(self) -> int:
        return self.uploads

    def done(self) -> bool:
        return self.uploads >= self.a.rounds

    def restore(self, blob: dict[str, Any] | None) -> None:
        super().restore(blob)
        if blob is not None and "uploads" not in blob:  # a checkpoint from before the engine counted
            self.uploads = int(self.state.t)

    def _gap(self, m: int, c: int) -> float:
        return float(numpy_rng(self.cfg.seed, "clock", m, c).exponential(1.0 / self.rates[m]))

    # ------------------------------------------------------------------ the stream
    def evaluate(self) -> dict[str, float]:
        """Every cluster model on every cluster's test set (not for Local: it has no server)."""
        head: dict[str, float] = {}
        if self.algorithm.has_server:
            scores = self.evaluate_clusters(self.scratch, self.algorithm.models(self.state), self.holdouts,
                                            "classification", "accuracy")
            self._count("forward", scores.shape[1] * sum(len(y) for _, y in self.holdouts))
            self.center_scores = scores
            self.cluster_history.append(float(np.mean(np.diag(scores))))
            head = headline_dists("cluster accuracy", np.diag(scores))
        if self.means["accuracy_before"]:  # the local models at their uploads (the CCFL paper's Cli Bfr), the last 50
            head["local models accuracy"] = float(np.mean(self.means["accuracy_before"][-50:]))
        if self.unseen_due(self.a.rounds):  # the held-out clients' cold starts, as newcomers now
            payload = dict(self.algorithm.cold_start(self.state, self.initial_models))
            if self.algorithm.has_server:
                payload["models"] = self.algorithm.models(self.state)
            self.score_unseen(self.algorithm, payload, "accuracy")
        if self.uploads >= self.a.rounds:  # every client's last reply is scored before the last evaluation's rows
            self._finish()
        self.served.record(self, dict(self.latest_served), vtime=self.vtime_now)
        ids = sorted(self.last_u)
        if ids:  # cluster k starts from distribution k's model: no matching to guess
            k = self.drift.num_clusters
            self.clusterings.record(self, np.stack([self.last_shares[m] for m in ids]), None,
                                    np.stack([self.last_u[m] for m in ids]), None, False, clients=ids,
                                    matching=tuple(range(k)))
        return head

    def _apply(self, m: int, up: dict[str, Any]) -> None:
        """The server's answer to client m's upload, and its records."""
        self.state, reply, diag = plugin_call(
            self.algorithm.server_step, (self.state, m, up, self.scratch, self.val_sets),
            f"algorithm {self.a.name!r} raised in its server step, upload of client {m}")
        self.uploads += 1  # the engine counts, whatever the plug-in's state says
        self.totals["server_estimation_s"] += diag.get("server_s", 0.0)
        self.totals["server_forwards"] += diag.get("server_forwards", 0)
        ledger = up.get("ledger", {})
        self._count("train", ledger.get("train", 0))
        self._count("forward", ledger.get("forward", 0) + diag.get("server_forwards", 0)
                    + ("l" in up) * self.val_samples)  # F(w_m; D_k) made on the actor
        t, vt = self.uploads, up["vtime"]
        self.stale += bool(diag["stale"])
        for name, value in up["before"].items():
            self.row("client", m, -1, f"{name}_before", value, vtime=vt)
        self.means["accuracy_before"].append(up["before"]["accuracy"])
        self.final_before[m] = up["before"]["accuracy"]
        self.vtime_now = vt
        if not self.algorithm.has_server:  # no reply: the client is served its own model
            self.latest_served[m] = dict(up["before"])
        if up["after"] is not None:  # the previous reply, scored on the data it was sent for
            self._record_after(m, up["after"])
        cost = up["cost"]  # what this upload's cycle downloaded (the last reply, or the cold start) and uploaded
        self.recorder.add("comm", step=t, client=m, direction="down", bytes=int(cost.get("bytes_down", 0)))
        self.recorder.add("comm", step=t, client=m, direction="up", bytes=int(cost.get("bytes_up", 0)))
        for name, value in cost.items():
            self.totals[name] = self.totals.get(name, 0.0) + value
            if not name.endswith("_s"):
                self.row("client", m, -1, name, value, vtime=vt)
        self.totals["silent_ticks"] += up["silent"]
        self.row("client", m, -1, "silent_ticks", up["silent"], vtime=vt)
        for name, value in diag.get("diagnostics", {}).items():  # an algorithm's own per-upload figures
            self.recorder.add("diagnostics", step=t, name=name, value=float(value))
        if diag["u"] is not None:
            u = np.asarray(diag["u"], dtype=float)
            kl = kl_divergence(up["shares"], u)
            self.kl.append(kl)
            if diag["fresh"]:  # a stale CCFL upload reuses the client's last estimate
                self.kl_fresh.append(kl)
            self.row("client", m, -1, "kl", kl, vtime=vt)
            self.row("client", m, -1, "staleness", diag["staleness"], vtime=vt)
            for c, est in enumerate(u):
                self.recorder.add("weights", step=t, client=m, center=c, estimate=float(est))
            if "scores" in diag:  # CCFL's Algorithm 1 terms (raw, before the bars), its staleness gap and alpha2
                for c in range(len(u)):
                    self.recorder.add("estimation", step=t, client=m, center=c, l=float(diag["l"][c]),
                                      d1=float(diag["d1"][c]), d2=float(diag["d2"][c]),
                                      score=float(diag["scores"][c]), alpha=float(diag["alpha"][c]),
                                      rejected=bool(diag["rejected"][c]), gap=float(diag["gap"][c]),
                                      alpha2=float(diag["alpha2"][c]))
            self.last_u[m] = u
        for s, share in enumerate(up["shares"]):
            self.recorder.add("clients", step=t, client=m, distribution=s, share=float(share),
                              samples=int(round(share * up["samples"])))
        self.last_step[m], self.last_shares[m], self.last_vtime[m] = t, np.asarray(up["shares"]), vt
        # the reply, stamped with the engine's epoch t (the client's tau); its ``extras`` come back
        # with the client's next upload
        self.replies[m] = {**self.algorithm.reply(self.state, reply), "t": t}
        self.ticks[m] += 1 + up["silent"]
        self.next_time[m] = vt + self._gap(m, int(self.ticks[m]))

    def _record_after(self, m: int, after: dict[str, float]) -> None:
        for name, value in after.items():
            self.row("client", m, -1, f"{name}_after", value, step=self.last_step[m], vtime=self.last_vtime[m])
        self.means["accuracy_after"].append(after["accuracy"])
        self.final_after[m] = after["accuracy"]
        self.latest_served[m] = dict(after)

    def _finish(self) -> None:
        """Score every client's last reply (Cli Aft of its final upload): computed uploads that
        will never be applied carry it; the other clients score it now."""
        if not self.algorithm.has_server or self.finished:
            return
        self.finished = True
        for m in sorted(self.computed):
            if self.computed[m]["after"] is not None:
                self._record_after(m, self.computed[m]["after"])
        rest = [m for m in sorted(self.replies) if m not in self.computed]
        if rest:
            scores = self.executor.call("stream_score", rest, {"replies": {m: self.replies[m] for m in rest}},
                                        self.uploads)
            for m in rest:
                self._record_after(m, cast(dict[str, float], scores[m]))  # stream_score: metric -> value

    def _keys(self) -> np.ndarray:
        """Per client, the virtual time before which nothing of it can happen: its computed
        upload's time, else its next tick, else (not joined yet) its join time."""
        keys = np.array([self.computed[m]["vtime"] if m in self.computed
                         else self.next_time[m] if m in self.replies else self.joins[m]
                         for m in range(self.cfg.data.clients)])
        keys[list(self.held_out)] = np.inf  # a held-out client never uploads
        return keys

    def _step_costs(self) -> np.ndarray:
        """Each client's next step in forward passes (a training sample counts three: its forward
        and backward), for ``ray.balance: cost``: its next dataset's training epochs, its Cli Bfr
        and Cli Aft, and F(w_m; D_k) on the server's validation sets. Only where clients run
        depends on it, never a number."""
        epochs = self.a.local_epochs or self.cfg.train.local_epochs
        sizes = np.array([self.drift.shares(m, int(self.ticks[m]) if self.a.drift else 0)[0]
                          for m in range(self.cfg.data.clients)], dtype=np.float64)
        return 3 * epochs * sizes + 2 * sizes / 5 + self.val_samples

    def _upload_time(self, m: int, silent: int) -> float:
        """The virtual time of client m's computed upload: its next tick, plus the ticks it let
        pass silently (upload_policy shift)."""
        return float(self.next_time[m] + sum(self._gap(m, int(self.ticks[m]) + j) for j in range(1, silent + 1)))

    def step(self) -> dict[str, object]:
        """One batch: train every client whose next upload is not computed (in parallel), then
        apply uploads in virtual-time order while the earliest is computed (an uncomputed
        client's next tick bounds its upload time from below)."""
        total = int(self.a.rounds)
        n = self.cfg.data.clients
        began, waited = time.perf_counter(), 0.0
        # a client that has not joined yet is due when nothing earlier is left to apply: it then
        # fetches the server's current initialisation tuple (w, t), as a newcomer does
        frontier = float(self._keys().min())
        need = [m for m in self.training if m not in self.computed and (m in self.replies or self.joins[m] <= frontier)]
        if need:
            payload: dict[str, object] = {"replies": {m: self.replies[m] for m in need if m in self.replies}}
            if any(m not in self.replies for m in need):  # someone's first upload: the cold start comes down
                payload.update(self.algorithm.cold_start(self.state, self.initial_models))
                payload["t"] = self.uploads  # the engine's epoch stamps the newcomers' first uploads
            if hasattr(self.executor, "set_costs"):  # balanced steps (ray.balance: cost)
                self.executor.set_costs(self._step_costs())
            tick = time.perf_counter()
            done = cast(dict[int, dict[str, Any]], self.executor.call("stream_step", need, payload, self.uploads))
            waited = time.perf_counter() - tick
            for m in sorted(done):
                done[m]["vtime"] = self._upload_time(m, done[m]["silent"])
            self.computed.update(done)
        head = None
        order = None
        if self.a.mode == "realtime":  # arrival order within the batch
            order = sorted(self.computed, key=lambda m: (self.computed[m]["finished"], m))
        while self.uploads < total:
            if order is not None:
                if not order:
                    break
                m = order.pop(0)
            else:
                keys = self._keys()
                m = int(np.lexsort((np.arange(n), keys))[0])
                if m not in self.computed:
                    break
            self._apply(m, self.computed.pop(m))
            if self.uploads % self.a.eval_every == 0 or self.uploads == total:
                head = self.evaluate()
            self.maybe_checkpoint()
        if self.uploads >= total:
            self._finish()
        work, self._work = self._work, {}
        # the coordinator's own seconds (applying the uploads: the server steps, evaluations,
        # checkpoints) and the clients it waited for
        info: dict[str, object] = {"round": self.uploads, "headline": head, "work": work, "trained": len(need),
                "coordinator_busy_s": time.perf_counter() - began - waited, "coordinator_bytes": 0}
        info.update(self._executor_counters())
        return info

    def results(self) -> tuple[dict[str, pa.Table], dict[str, object]]:
        if self.center_scores is None and self.algorithm.has_server:
            self.evaluate()
        ids = sorted(self.last_u)
        weights = np.stack([self.last_u[m] for m in ids]) if ids else None
        truth = np.stack([self.last_shares[m] for m in ids]) if ids else np.zeros((0, 0))
        means = {k: float(np.mean(v)) for k, v in self.means.items() if v}
        k = self.drift.num_clusters
        scores = self.center_scores if self.center_scores is not None else np.zeros((k, 0))
        out = summarize(scores, "accuracy", means, weights, truth)
        if weights is not None:  # cluster k is pre-trained on distribution k: no matching to guess
            out["matching"] = {str(s): s for s in range(k)}
            out["weight_mae"] = weight_error(weights, truth, tuple(range(k)))
        # the CCFL paper's Table 1: clients' accuracy at their final upload-download cycle (before
        # uploading and of the reply), the clusters' accuracy averaged over all evaluations; the
        # mean KL; and the means over every upload
        final = lambda d: float(np.mean(list(d.values()))) if d else None  # noqa: E731
        out.update(cli_bfr=final(self.final_before), cli_aft=final(self.final_after),
                   cluster_acc=float(np.mean(self.cluster_history)) if self.cluster_history else None,
                   kl=float(np.mean(self.kl)) if self.kl else None,
                   kl_fresh_estimates=float(np.mean(self.kl_fresh)) if self.kl_fresh else None,
                   cli_bfr_all_uploads=means.get("accuracy_before"), cli_aft_all_uploads=means.get("accuracy_after"),
                   cluster_acc_final=float(np.mean(np.diag(scores))) if scores.shape[1] else None)
        out.update(comm_totals(self.recorder, self.cfg.data.clients))  # bytes_down, bytes_up: comm.parquet's sums
        n, tot = len(self.training), self.totals  # the clients that upload
        out.update(bytes_down_per_client=tot["bytes_down"] / n, bytes_up_per_client=tot["bytes_up"] / n,
                   samples_trained_per_client=tot["samples_trained"] / n,
                   client_estimation_forwards_per_client=tot["estimation_forwards"] / n,
                   server_estimation_forwards=int(tot["server_forwards"]), silent_ticks=int(tot["silent_ticks"]),
                   # where the time goes: seconds summed over clients (they run in parallel) and the server's
                   time_breakdown_s={"client_training": tot["train_s"], "client_estimation": tot["estimation_s"],
                                     "server_estimation": tot["server_estimation_s"],
                                     "server_estimation_on_actors": tot.get("server_on_actor_s", 0.0)})
        out.update(run_id=self.recorder.run_id, kind="stream", algorithm=self.a.name, dataset=self.cfg.data.name,
                   rounds=int(self.uploads), uploads=int(self.uploads), stale_uploads=int(self.stale),
                   wall_time_s=self.elapsed(), events=self.event_counts())
        out.update(self.unseen_part())
        out.update(self.served.summary(self.cfg.output.target))
        return self.recorder.tables(), out
