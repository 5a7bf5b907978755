"""The coordinator of synchronous algorithms: drive an algorithm's rounds through an executor.

Everything that reaches the results goes through here, in client order, so the numbers do not
depend on the backend or on how clients are packed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np
import torch

from ..algorithms import ClientCall, Reduced, ServerContext
from ..algorithms.base import (
    SERVED_OP,
    Algorithm,
    as_round_result,
    default_served,
    eval_metrics,
    has_served,
    leaves_state,
    split_result,
    with_defaults,
)
from ..config import Config
from ..data import Federation
from ..errors import PluginFailure, UpdateError, plugin_call
from ..evaluation import summarize
from ..metrics import HEADLINE, LOWER_IS_BETTER, headline_dists
from ..models import build_model
from ..tree import leaves
from ..unseen import UNSEEN_OP
from .clock import RoundClock
from .comm import Ledger, download_bytes, totals, wire_bytes
from .executor import Executor, finite
from .recording import Clusterings, CoordinatorBase, Served

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")


def nbytes(obj: object) -> int:
    """Bytes of the tensors and arrays in ``obj`` (nested dicts, lists, tuples, dataclass-like
    objects): what a payload or a result carries; scalars and small Python values count 0."""
    return sum(_leaf_bytes(leaf) for leaf in leaves(obj))


def _leaf_bytes(leaf: object) -> int:
    if isinstance(leaf, torch.Tensor):
        return leaf.numel() * leaf.element_size()
    if isinstance(leaf, np.ndarray):
        return int(leaf.nbytes)
    return 0


class RoundCoordinator(CoordinatorBase):
    """Runs the rounds of one synchronous experiment and records every measurement."""

    CHECKPOINTED = ("round", "started", "state", "center_scores", "local_means", "virtual_now", "unseen", "served",
                    "clusterings")

    def __init__(self, cfg: Config, executor: Executor, algorithm: Algorithm, run_id: str,
                 run_dir: str | None = None) -> None:
        self._round = 0
        super().__init__(cfg, executor, run_id, run_dir)
        self.algorithm = with_defaults(algorithm)  # the optional attributes it lacks: their defaults
        self.fed = Federation(cfg.data, cfg.seed)
        self.ctx = ServerContext(cfg=cfg, sizes=self.fed.sizes, info=self.fed.info, held_out=self.held_out)
        if hasattr(executor, "set_costs"):  # balanced rounds: a client's training costs its samples
            executor.set_costs(self.fed.sizes)
        self.holdouts = [self.fed.holdout(s) for s in range(self.fed.num_distributions)]
        self.scratch = build_model(cfg.model, self.fed.info)
        self.metric = HEADLINE[self.fed.info.task]
        self.clock = (RoundClock(cfg.clock, self.fed.sizes, cfg.train.local_epochs, cfg.faults, cfg.seed)
                      if cfg.clock.on else None)
        self.init_run()

    @property
    def round(self) -> int:
        return self._round

    @round.setter
    def round(self, value: int) -> None:
        self._round = value

    @property
    def virtual_now(self) -> float | None:
        """The simulated seconds at the end of the last round run (``clock:``), else None."""
        return None if self.clock is None else self.clock.now

    @virtual_now.setter
    def virtual_now(self, value: float | None) -> None:
        if self.clock is not None:
            self.clock.now, self.clock.longest = float(value or 0.0), 0.0

    def row(self, scope: str, entity: int, eval_dist: int, metric: str, value: float, step: int | None = None,
            vtime: float | None = None) -> None:
        """One row of metrics.parquet, at the simulated time of the clock when there is one."""
        super().row(scope, entity, eval_dist, metric, value, step, self.virtual_now if vtime is None else vtime)

    def _exec(self, fn: Callable[..., T], *args: object, sent: object = None) -> T:
        """``fn(*args)`` on the executor, its time counted as waiting on the clients and the
        bytes of ``sent`` and of its answer as passing through the coordinator."""
        began = time.perf_counter()
        out = fn(*args)
        self._waited += time.perf_counter() - began
        self._bytes += nbytes(sent) + nbytes(out)
        return out

    def init_run(self) -> None:
        self._waited, self._bytes = 0.0, 0
        self._comm = Ledger()
        self.state = self.algorithm.init_server(self.ctx)
        self.round = 0
        self.virtual_now = 0.0
        self.center_scores: np.ndarray | None = None
        self.local_means: dict[str, float] = {}
        self.unseen = None
        self.served = Served(self.metric)
        self.clusterings = Clusterings()
        shares = self.fed.realized_shares()
        for k in range(self.fed.num_clients):
            for s in range(self.fed.num_distributions):
                self.recorder.add("clients", step=0, client=k, distribution=s, share=float(shares[k, s]),
                                  samples=int(round(shares[k, s] * self.fed.sizes[k])))
        self.record_labels(self.fed)

    def done(self) -> bool:
        return self.round >= self.cfg.algorithm.rounds

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, float]:
        """Every center on every holdout set (an algorithm without ``centers`` has none);
        every client's local model on its own data (its ``evaluate`` op's metrics)."""
        centers = self.algorithm.centers
        if centers is not None:
            scores = self.evaluate_clusters(self.scratch, centers(self.state), self.holdouts, self.fed.info.task,
                                            self.metric)
        else:
            scores = np.zeros((len(self.holdouts), 0))
        self._count("holdout", scores.shape[1] * sum(len(y) for _, y in self.holdouts))
        payload = self.algorithm.eval_payload(self.state)
        self._count("evaluate", int(self.fed.sizes[self.training].sum()))
        local = self._exec(self.executor.call, "evaluate", list(self.training), payload, self.round, sent=payload)
        metrics: dict[int, dict[str, float]] = {}
        for k in sorted(local):
            try:
                metrics[k] = eval_metrics(local[k])
            except TypeError as err:
                raise PluginFailure(f"algorithm {self.cfg.algorithm.name!r}: client {k}: {err}") from None
            for name, value in metrics[k].items():
                self.row("client", k, -1, name, value)
        absorb = self.algorithm.absorb_eval
        if absorb is not None:
            self.state = absorb(self.state, local)
        self.center_scores = scores
        self._score_served(payload)
        self._score_clusterings(scores)
        names = list(metrics[min(metrics)]) if metrics else []
        self.local_means = {n: float(np.mean([metrics[k][n] for k in sorted(metrics)])) for n in names}
        head = {}
        if scores.shape[1]:
            best = scores.min(axis=1) if LOWER_IS_BETTER[self.metric] else scores.max(axis=1)
            head = headline_dists(f"best center {self.metric}", best)
        if self.metric in self.local_means:
            head[f"local models {self.metric}"] = self.local_means[self.metric]
        if self.unseen_due(self.cfg.algorithm.rounds):
            self._cold_starts()
        return head

    def _cold_starts(self) -> None:
        """The held-out clients' cold starts, with the algorithm's ``unseen_payload(state)``
        (else its ``eval_payload(state)``)."""
        make = self.algorithm.unseen_payload or self.algorithm.eval_payload
        sent = make(self.state)
        self._count(UNSEEN_OP, int(self.fed.sizes[list(self.held_out)].sum()))
        self.score_unseen(self.algorithm, sent, self.metric,
                          lambda *args: self._exec(self.executor.call, *args, sent=sent))

    def _score_served(self, payload: Mapping[str, object]) -> None:
        """Every client's personalised model (what the algorithm serves it) on its own test
        split: rows of ``client_metrics.parquet`` (held_out false), the history of the headline
        metric's distribution for the summary (:class:`~raysoft.runtime.recording.Served`)."""
        if not has_served(self.algorithm, self.state):
            self.served.skipped = "the algorithm has no serve and no model the engine can tell each client is served"
            return
        sent = {**payload, **(default_served(self.algorithm, self.state) or {})}
        clients = list(self.training)  # the held-out clients' are their cold starts (data.held_out)
        self._count("served", int(self.fed.sizes[clients].sum()))  # test splits: as large as training sets
        results = self._exec(self.executor.call, SERVED_OP, clients, sent, self.round, sent=sent)
        scored = {k: cast(dict[str, float], results[k]) for k in sorted(results) if results[k] is not None}
        self.served.record(self, scored, held_out=False)  # the served op's result: metric -> value

    def _score_clusterings(self, scores: np.ndarray) -> None:
        """The algorithm's clusterings against the clients' true clusters (the argmax of their
        realised shares, as in ``clients.parquet``): ``clustering.parquet`` rows."""
        truth = self.fed.realized_shares()
        assign = self.algorithm.assignment
        hard = None if assign is None else np.asarray(assign(self.state))
        weights = None if hard is not None else self._weights()
        ids = list(self.training)  # a held-out client has no cluster of its own (data.held_out)
        self.clusterings.record(self, truth[ids], None if hard is None else hard[ids],
                                None if weights is None else np.asarray(weights)[ids], scores,
                                LOWER_IS_BETTER[self.metric], clients=ids)

    # ------------------------------------------------------------------ client calls
    def _report_bad(self, op: str, bad: list[int], t: int) -> None:
        for k in bad:
            self.event("nan_update", f"op {op}: non-finite update", client=k)
        if bad and self.cfg.train.nan_policy == "stop":
            raise UpdateError(f"round {t}: client {bad[0]} returned a non-finite update (train.nan_policy: stop)")

    def _report_late(self, op: str) -> None:
        for k in self.executor.late:
            self.event("late_update", f"op {op}: missed the round deadline", client=k)

    def _without_held_out(self, call: ClientCall) -> ClientCall:
        """The call without the held-out clients (``data.held_out``): a plug-in that selects
        from every client still never trains one."""
        if not self.held_out or not set(call.clients) & set(self.held_out):
            return call
        out = set(self.held_out)
        return ClientCall(call.op, [k for k in call.clients if k not in out], call.payload, call.reduce)

    def _on_time(self, call: ClientCall, t: int) -> ClientCall:
        """The call without the clients whose training misses the simulated round deadline
        (``clock:``; each one an event); ops that leave the clients' states alone are not timed."""
        if self.clock is None or leaves_state(self.algorithm, call.op):
            return call
        on_time, late = self.clock.split(call.clients, t)
        deadline = self.cfg.clock.round_deadline_s
        for k, d in late.items():
            self.event("late_update", f"op {call.op}: would take {d:.4g} simulated s, past the round deadline of "
                       f"{deadline:g} s (clock.round_deadline_s)", client=k)
        return call if not late else dataclasses.replace(call, clients=list(on_time))

    def _call(self, call: ClientCall, t: int) -> dict[int, object]:
        """A call's finite results (non-finite ones reported, and excluded or stopping the run)."""
        results = self._exec(self.executor.call, call.op, call.clients, call.payload, t, sent=call.payload)
        self._report_late(call.op)
        for k in sorted(results):  # every result that came back was sent, finite or not
            self._comm.returned(k, wire_bytes(results[k]))
        bad = [k for k in sorted(results) if not finite(results[k])]
        self._report_bad(call.op, bad, t)
        return {k: results[k] for k in sorted(results) if k not in bad}  # client order, whatever the executor's

    def _reduced_call(self, call: ClientCall, t: int) -> Reduced:
        """A call whose results are summed (``call.reduce``): in the client actors when
        ``ray.reduce_in_actors`` (only finiteness, the named extras of each result and one tensor
        per actor travel), else here; the same additions in the same client-id order either way."""
        red = call.reduce
        assert red is not None
        if self.cfg.ray.reduce_in_actors:
            flags = self._exec(self.executor.call_for_reduction, call.op, call.clients, call.payload, t,
                               sent=call.payload)
            self._report_late(call.op)
            for k in sorted(flags):  # the size of the whole result, counted where it was made
                self._comm.returned(k, flags[k][2])
            self._report_bad(call.op, [k for k in sorted(flags) if not flags[k][0]], t)
            extras = {k: flags[k][1] for k in sorted(flags) if flags[k][0]}
            plan = red.plan(extras)
            value = self._exec(self.executor.accumulate, plan, sent=plan.start) if plan.terms else plan.start
            return Reduced(value, sorted(extras), extras)
        results = self._call(call, t)
        split = {k: split_result(results[k], call.op) for k in sorted(results)}
        extras = {k: v[1] for k, v in split.items()}
        value = red.plan(extras).apply({k: v[0] for k, v in split.items()}, self.cfg.ray.tree_group)
        return Reduced(value, sorted(split), extras)

    def _check_call(self, call: object, t: int) -> None:
        """A call the algorithm's round yielded is a ClientCall of one of its client ops, else
        the run stops with one line naming the op and the ops there are."""
        name = self.cfg.algorithm.name
        if not isinstance(call, ClientCall):
            raise PluginFailure(f"algorithm {name!r}: its round {t} yielded {type(call).__name__}, not a ClientCall")
        ops = self.algorithm.client_ops
        if call.op not in ops:
            raise PluginFailure(f"algorithm {name!r}: its round {t} asked the clients for op {call.op!r}, which is not "
                                f"in its client_ops ({', '.join(sorted(ops))})")

    def step(self) -> dict[str, object]:
        """Run one round; evaluate when it is due; checkpoint when due."""
        t = self.round
        began, self._waited, self._bytes, self._work = time.perf_counter(), 0.0, 0, {}
        self._comm = Ledger()  # this round's bytes per client (a round run again starts afresh)
        where = f"algorithm {self.cfg.algorithm.name!r} raised in its server half, round {t}"
        gen = plugin_call(self.algorithm.round, (self.ctx, self.state, t), where)
        try:
            call = plugin_call(next, (gen,), where)
            while True:
                self._check_call(call, t)
                call = self._without_held_out(call)
                # sent to every client asked, a late one too (its result is what misses the deadline)
                self._comm.sent(download_bytes(call.payload, call.clients, call.each,
                                               f"algorithm {self.cfg.algorithm.name!r}, round {t}, op {call.op!r}"))
                call = self._on_time(call, t)  # once per call, before its work is counted
                self._count(call.op, int(self.fed.sizes[list(call.clients)].sum()))  # the samples it covers
                result = self._reduced_call(call, t) if call.reduce is not None else self._call(call, t)
                call = plugin_call(gen.send, (result,), where)
        except StopIteration as stop:
            try:
                outcome = as_round_result(stop.value)
            except TypeError as err:
                raise PluginFailure(f"algorithm {self.cfg.algorithm.name!r}: its round {t} {err}") from None
        self.state = outcome.state
        self._comm.write(self.recorder, t + 1)  # at the step its evaluation is filed under
        if outcome.weights_updated:
            self._record_weights(t)
        for name, value in outcome.diagnostics.items():  # an algorithm's own per-round figures
            self.recorder.add("diagnostics", step=t, name=name, value=float(value))
        self.round = t + 1
        if self.clock is not None:
            self.clock.end_round()
        info: dict[str, object] = {"round": self.round, "headline": None, "trained": outcome.trained}
        if self.round % self.cfg.algorithm.eval_every == 0 or self.round == self.cfg.algorithm.rounds:
            tick = time.perf_counter()
            info["headline"] = self.evaluate()
            info["evaluate_s"] = time.perf_counter() - tick  # the whole evaluation (raysoft bench times W5's)
        self.maybe_checkpoint()
        # the coordinator's own seconds this round (not waiting on the clients) and the bytes of
        # the payloads it sent and the results it received
        info["coordinator_busy_s"] = time.perf_counter() - began - self._waited
        info["coordinator_bytes"] = self._bytes
        info["work"] = dict(self._work)  # samples per client op (and "holdout") this round
        info.update(self._executor_counters())
        return info

    def _record_weights(self, step: int) -> None:
        """The importance weights estimated at the start of round ``step`` (none without ``weights``)."""
        weights = self._weights()
        if weights is None:
            return
        for k in self.training if self.held_out else range(weights.shape[0]):
            for c in range(weights.shape[1]):
                self.recorder.add("weights", step=step, client=k, center=c, estimate=float(weights[k, c]))

    def _weights(self) -> np.ndarray | None:
        """The algorithm's ``weights(state)``, or None when it has no ``weights``."""
        weights = self.algorithm.weights
        return None if weights is None else weights(self.state)

    # ------------------------------------------------------------------ the end
    def _record_assignments(self, predicted: np.ndarray) -> dict[str, float]:
        """Write the final hard clustering; return its ARI against the clients' main distribution."""
        from sklearn.metrics import adjusted_rand_score

        truth = self.fed.mixtures.argmax(axis=1)
        if self.held_out:  # the training clients' clustering: a held-out client has none
            truth, predicted, ids = truth[self.training], predicted[self.training], self.training
        else:
            ids = list(range(self.fed.num_clients))
        for i, k in enumerate(ids):
            self.recorder.add("assignments", client=k, predicted=int(predicted[i]), truth=int(truth[i]))
        return {"ari": float(adjusted_rand_score(truth, predicted)), "num_clusters": int(len(np.unique(predicted)))}

    def summary(self) -> dict[str, object]:
        """The final figures of the run (call after the last evaluation)."""
        if self.center_scores is None:
            self.evaluate()
        assert self.center_scores is not None
        if self.held_out and self.unseen is None:  # a run stopped before its final evaluation
            self._cold_starts()
        weights, truth = self._weights(), self.fed.realized_shares()
        if self.held_out:  # the importance-weight error of the training clients
            weights, truth = (None if weights is None else weights[self.training]), truth[self.training]
        out = summarize(self.center_scores, self.metric, self.local_means, weights, truth)
        assign = self.algorithm.assignment
        if assign is not None:
            out.update(self._record_assignments(np.asarray(assign(self.state))))
        out.update(
            run_id=self.recorder.run_id,
            kind="rounds",
            algorithm=self.cfg.algorithm.name,
            dataset=self.cfg.data.name,
            rounds=self.round,
            wall_time_s=self.elapsed(),
            events=self.event_counts(),
        )
        if self.clock is not None:
            out["virtual_time_s"] = self.clock.now
        out.update(totals(self.recorder, self.fed.num_clients))
        out.update(self.unseen_part())
        out.update(self.served.summary(self.cfg.output.target))
        return out

    def results(self) -> tuple[dict[str, pa.Table], dict[str, object]]:
        summary = self.summary()
        return self.recorder.tables(), summary
