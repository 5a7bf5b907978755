"""What every coordinator shares: the clock, the recorder, events, the cluster evaluation,
checkpoints and recovery, and the step loop. :mod:`~raysoft.runtime.rounds` (synchronous
rounds) and :mod:`~raysoft.runtime.streams` (asynchronous streams) fill in the rest."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..algorithms.base import eval_metrics
from ..config import Config
from ..errors import ClientFailure, PluginFailure, RecoveryFailure, one_line
from ..evaluation import (
    client_summary,
    clustering_rows,
    evaluate_centers,
    match_centers,
    time_to_target,
    weight_error,
    worse_percentile,
)
from ..results import Recorder
from ..unseen import UNSEEN_OP, held_out_clients, unseen_summary
from .checkpoint import RECORD_TYPES, load_checkpoint, prove_loadable, save_checkpoint
from .executor import Executor

if TYPE_CHECKING:
    import pyarrow as pa

    from ..data import Federation
    from ..progress import Event

log = logging.getLogger(__name__)


class Served:
    """Every client's personalised model on its own test split, at every evaluation: the rows
    of ``client_metrics.parquet``, the last evaluation's values and, per evaluation, the
    headline metric's mean and worse tenth (:func:`~raysoft.evaluation.worse_percentile`),
    from which the summary's ``personalised`` and ``time_to_target`` are made."""

    def __init__(self, metric: str) -> None:
        self.metric = metric
        self.last: dict[int, dict[str, float]] = {}  # client -> metrics, at the last evaluation
        self.step: int | None = None  # the step of the last evaluation
        self.history: list[dict[str, float | None]] = []  # one entry per evaluation
        self.skipped: str | None = None  # why no client was scored

    def record(self, coord: CoordinatorBase, results: dict[int, dict[str, float]], held_out: bool = False,
               step: int | None = None, vtime: float | None = None) -> None:
        """Rows for ``results`` ({client: metrics}, in client order) at ``step`` (default the
        coordinator's round); the training clients' (``held_out`` false) also go to the history."""
        step = coord.round if step is None else step
        for k in sorted(results):
            for name, value in results[k].items():
                coord.recorder.add("client_metrics", step=step, client=int(k), held_out=held_out, metric=name,
                                   value=float(value))
        if held_out or not results:
            return
        self.last, self.step = {k: dict(results[k]) for k in sorted(results)}, step
        values = np.array([results[k][self.metric] for k in sorted(results) if self.metric in results[k]])
        if len(values):
            vt = vtime if vtime is not None else getattr(coord, "virtual_now", None)
            self.history.append({"step": step, "virtual_time": vt, "mean": float(values.mean()),
                                 "worse": worse_percentile(values, self.metric)})

    def summary(self, target: float | None) -> dict[str, object]:
        """``personalised``: the last evaluation's distribution of every metric over the clients
        (:func:`~raysoft.evaluation.client_summary`), and ``time_to_target`` when a target is set."""
        if not self.last:
            return {"personalised": {"skipped": self.skipped or "no client has a test split"}}
        names = list(self.last[min(self.last)])
        out: dict[str, object] = {"personalised": {
            "metric": self.metric, "step": self.step, "clients": len(self.last),
            **{n: client_summary(np.array([m[n] for m in self.last.values() if n in m]), n) for n in names}}}
        if target is not None:
            out["time_to_target"] = time_to_target(self.history, target, self.metric)
        return out


class Clusterings:
    """An algorithm's clusterings scored against the clients' true clusters at every
    evaluation (``clustering.parquet``): a hard assignment (``clustering`` "assignment"), or
    the argmax of soft weights ("weights_argmax", with ``mixture_mae``, the weight error
    matched as the summary's ``weight_mae``); ``changed`` counts the clients whose cluster
    changed since the previous evaluation (of the clients scored at both)."""

    def __init__(self) -> None:
        self.previous: dict[str, dict[int, int]] = {}  # clustering -> {client: cluster} at the last evaluation

    def record(self, coord: CoordinatorBase, truth: np.ndarray, hard: np.ndarray | None, weights: np.ndarray | None,
               scores: np.ndarray | None, lower: bool, clients: list[int] | None = None,
               matching: tuple[int, ...] | None = None, step: int | None = None) -> None:
        """``truth``: the clients' true shares [clients, distributions]; ``hard`` their
        clusters, or ``weights`` [clients, centers]; ``scores`` [distributions, centers] (the
        matching of centers to distributions, unless ``matching`` is given); ``clients``: the
        ids of the rows (default 0..n-1)."""
        if hard is None and weights is None:
            return
        name = "assignment" if hard is not None else "weights_argmax"
        predicted = np.asarray(hard if hard is not None else np.asarray(weights).argmax(axis=1), dtype=np.int64)
        ids = list(range(len(predicted))) if clients is None else list(clients)
        if len(ids) < 2:
            return
        prev = self.previous.get(name)
        both = [i for i, k in enumerate(ids) if prev is not None and k in prev]
        rows = clustering_rows(truth.argmax(axis=1), predicted, None)
        if prev is not None:
            rows["changed"] = float(sum(prev[ids[i]] != predicted[i] for i in both))
        if weights is not None and hard is None:
            w = np.asarray(weights, dtype=float)
            if matching is None and scores is not None and truth.shape[1] <= scores.shape[1] <= 9 \
                    and scores.shape[1] == w.shape[1]:
                matching = match_centers(scores, lower)
            if matching is not None:
                rows["mixture_mae"] = weight_error(w, truth, matching)
        step = coord.round if step is None else step
        for metric, value in rows.items():
            coord.recorder.add("clustering", step=step, clustering=name, metric=metric, value=float(value))
        self.previous[name] = {k: int(p) for k, p in zip(ids, predicted)}


RECORD_TYPES.extend([Served, Clusterings])  # a checkpoint holds them (checkpoint_types)


class CoordinatorBase:
    """Drives one run through an executor and records every measurement. Subclasses set
    ``CHECKPOINTED`` (the attributes a checkpoint holds) and implement :meth:`init_run`,
    :meth:`evaluate`, :meth:`step`, :meth:`done` and :meth:`results`."""

    CHECKPOINTED: tuple[str, ...] = ()
    served: Served  # every client's served model, scored (set by the subclass's init_run)

    def __init__(self, cfg: Config, executor: Executor, run_id: str, run_dir: str | None = None) -> None:
        self.cfg, self.executor = cfg, executor
        self.run_dir = Path(run_dir) if run_dir else None
        self.recorder = Recorder(run_id)
        self.start = time.monotonic()
        self.started = False  # the initial evaluation is done
        self.stopped_at: int | None = None  # the round at which a callback stopped the run
        self.rows_sent = 0  # metric rows already handed to the driver's callbacks
        self.unsaid: list[Event] = []  # events not yet handed to the driver
        self._work: dict[str, int] = {}  # samples per kind of work since the last report (raysoft bench's floors)
        self.held_out = held_out_clients(cfg.data, cfg.seed)  # kept out of training (data.held_out)
        self.training = [k for k in range(cfg.data.clients) if k not in set(self.held_out)]
        self.unseen: dict[str, object] | None = None  # the held-out clients' last cold start, summarised
        for actor, where in enumerate(executor.placement):
            for k in where["clients"]:
                self.recorder.add("placement", client=k, actor=actor, node_id=where["node_id"])
        if hasattr(executor, "on_event"):
            executor.on_event = self.event

    def _count(self, kind: str, samples: int) -> None:
        """Add ``samples`` to the work of ``kind`` (a client op, an evaluation; for a stream the
        samples trained or passed forward) that the next progress report carries."""
        self._work[kind] = self._work.get(kind, 0) + int(samples)

    def _executor_counters(self) -> dict[str, object]:
        """The client actors' loads since the last report (Ray's executor), else nothing."""
        counters = getattr(self.executor, "take_counters", None)
        return counters() if counters is not None else {}

    # ------------------------------------------------------------------ subclasses
    def init_run(self) -> None:
        """Set every piece of run state to the start of the run."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        raise NotImplementedError

    def step(self) -> dict[str, object]:
        """One unit of work after the initial evaluation (a round, or a batch of uploads)."""
        raise NotImplementedError

    def done(self) -> bool:
        raise NotImplementedError

    @property
    def round(self) -> int:
        """The current round (a stream's: the uploads applied so far)."""
        raise NotImplementedError

    def results(self) -> tuple[dict[str, pa.Table], dict[str, object]]:
        """(tables as columns, summary), for the writer."""
        raise NotImplementedError

    # ------------------------------------------------------------------ recording
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def row(self, scope: str, entity: int, eval_dist: int, metric: str, value: float, step: int | None = None,
            vtime: float | None = None) -> None:
        """One row of metrics.parquet (``step`` defaults to the current round)."""
        self.recorder.add("metrics", algorithm=self.cfg.algorithm.name, step=self.round if step is None else step,
                          time_s=self.elapsed(), scope=scope, entity=entity, eval_dist=eval_dist, metric=metric,
                          value=float(value), virtual_time=vtime)

    def record_labels(self, fed: Federation) -> None:
        """labels.parquet: each client's label counts per split, where the dataset gives them
        (:meth:`raysoft.data.Federation.label_counts`); a zero count is not a row."""
        counts = fed.label_counts()
        for k, splits in sorted((counts or {}).items()):
            for split, per_label in splits.items():
                for label in np.flatnonzero(per_label):
                    self.recorder.add("labels", client=int(k), split=split, label=int(label),
                                      count=int(per_label[label]))

    def event(self, kind: str, detail: str = "", client: int = -1, actor: int = -1) -> None:
        """One row of events.parquet; every kind but a checkpoint is also said on the driver's
        stderr as it happens (:meth:`advance` hands it over, the progress display prints it)."""
        log.debug("round %d: %s %s", self.round, kind, detail)
        self.recorder.add("events", step=self.round, time_s=self.elapsed(), kind=kind, client=client,
                          actor=actor, detail=detail)
        if kind != "checkpoint":
            self.unsaid.append({"step": self.round, "kind": kind, "detail": detail, "client": client})

    def event_counts(self) -> dict[str, int]:
        """What the run survived, for ``summary.json``: the number of events of each kind (a
        checkpoint is not one), e.g. ``{"actor_died": 1, "restored": 1, "late_update": 4}``."""
        counts: dict[str, int] = {}
        for kind in self.recorder.columns.get("events", {}).get("kind", []):
            if kind != "checkpoint":
                counts[kind] = counts.get(kind, 0) + 1
        return dict(sorted(counts.items()))

    def evaluate_clusters(self, scratch: torch.nn.Module, models: torch.Tensor,
                          holdouts: Sequence[tuple[torch.Tensor, torch.Tensor]], task: str,
                          metric: str) -> np.ndarray:
        """Every model on every holdout set, recorded; returns ``metric`` as [distribution, model]."""
        results = evaluate_centers(scratch, models, holdouts, task)
        scores = np.zeros((len(holdouts), models.shape[0]))
        for (c, s), metrics in results.items():
            for name, value in metrics.items():
                self.row("cluster", c, s, name, value)
            scores[s, c] = metrics[metric]
        return scores

    # ------------------------------------------------------------------ held-out clients
    def unseen_due(self, total: int) -> bool:
        """Whether the held-out clients are cold-started at this evaluation: at every one
        (``data.held_out_eval: every``) or at the final one (the run's ``total`` reached)."""
        return bool(self.held_out) and (self.cfg.data.held_out_eval == "every" or self.round >= total)

    def score_unseen(self, algorithm: Any, payload: dict[str, object], metric: str,
                     call: Callable[..., dict[int, object]] | None = None) -> None:
        """The held-out clients' cold starts: the algorithm's client op ``unseen`` with
        ``payload``, run where each client's data lives (``call``: the executor's), its metrics
        rows of client_metrics.parquet (held_out true) and summarised by ``metric``
        (:func:`~raysoft.unseen.unseen_summary`) in :attr:`unseen`. An algorithm without the op
        has them skipped, said once as an event (``held_out_skipped``) and in the summary."""
        name = self.cfg.algorithm.name
        if UNSEEN_OP not in algorithm.client_ops:
            if self.unseen is None:
                self.event("held_out_skipped", f"algorithm {name!r} has no cold start (client op {UNSEEN_OP!r}): its "
                           f"{len(self.held_out)} held-out clients are not scored")
            self.unseen = {"clients": list(self.held_out), "scored": 0,
                           "skipped": f"algorithm {name!r} has no cold start (client op {UNSEEN_OP!r})"}
            return
        results = (call or self.executor.call)(UNSEEN_OP, list(self.held_out), payload, self.round)
        metrics: dict[int, dict[str, float]] = {}
        for k in sorted(results):
            try:
                metrics[k] = eval_metrics(results[k])
            except TypeError as err:
                what = str(err).replace("its evaluate op", f"its {UNSEEN_OP} op")
                raise PluginFailure(f"algorithm {name!r}: held-out client {k}: {what}") from None
        self.served.record(self, metrics, held_out=True)  # rows as the training clients', no history
        self.unseen = {"clients": list(self.held_out), **unseen_summary(metrics, metric, self.round)}

    def unseen_part(self) -> dict[str, object]:
        """The summary's ``held_out`` (none when no client is held out)."""
        if not self.held_out:
            return {}
        return {"held_out": self.unseen or {"clients": list(self.held_out), "scored": 0}}

    # ------------------------------------------------------------------ the loop
    def advance(self, stop: bool = False) -> dict[str, Any]:
        """One unit of work: the initial evaluation, or one step (recovering from a dead client
        actor by restoring the last checkpoint). ``done`` says the run is complete. With
        ``stop`` (a callback asked for it) no work is done: the run ends where it is. With
        callbacks configured, ``rows`` holds the metric rows recorded since the last call."""
        if stop:
            self.stopped_at = self.round
            return {"round": self.round, "headline": None, "done": True}
        try:
            if not self.started:
                info = {"round": self.round, "headline": self.evaluate()}
                self.started = True
            else:
                info = self.step()
        except ClientFailure as err:
            self.event("actor_died", str(err))
            self.recover()
            info = {"round": self.round, "headline": None}
        info["done"] = self.started and self.done()
        info["events"], self.unsaid = self.unsaid, []
        if self.cfg.callbacks:
            cols = self.recorder.columns["metrics"]
            info["rows"] = {k: v[self.rows_sent:] for k, v in cols.items()}
            self.rows_sent = len(cols["run_id"])
        return info

    def maybe_checkpoint(self) -> None:
        every = self.cfg.output.checkpoint_every
        if every and self.run_dir is not None and self.round % every == 0:
            self.checkpoint()

    # ------------------------------------------------------------------ checkpoints and recovery
    def checkpoint(self) -> None:
        """Save everything needed to continue (atomically), and the results so far."""
        assert self.run_dir is not None
        self.event("checkpoint")
        blob = {name: getattr(self, name) for name in self.CHECKPOINTED}
        blob.update(elapsed=self.elapsed(), recorder=self.recorder.columns, clients=self.executor.get_states())
        save_checkpoint(self.run_dir, blob, self.recorder)
        if not getattr(self, "_proved", False):  # the first one loads, or the run stops (one line)
            prove_loadable(self.run_dir, self.cfg.algorithm.name)
            self._proved = True

    def restore(self, blob: dict[str, Any] | None) -> None:
        """Continue from a checkpoint; with none, start the run again from the beginning (the
        events and placement recorded so far are kept)."""
        kept = {name: self.recorder.columns[name] for name in ("events", "placement")}
        if blob is None:
            self.executor.reset()
            self.recorder = Recorder(self.recorder.run_id)
            self.recorder.columns.update(kept)
            self.started = False
            self.init_run()
            return
        self.executor.set_states(blob["clients"])
        for name in self.CHECKPOINTED:
            if name in blob:  # a field added since the checkpoint keeps its initial value
                setattr(self, name, blob[name])
        self.recorder.columns = {**self.recorder.columns, **blob["recorder"]}  # tables added since stay
        events, saved = kept["events"], blob["recorder"]["events"]
        # the events recorded since the checkpoint was written: in the process that wrote it,
        # the checkpoint's own events are this session's first ones
        n = len(saved["run_id"])
        same = all(events[k][:n] == saved[k] for k in ("time_s", "kind", "detail"))
        for k in events:
            saved[k] = saved[k] + (events[k][n:] if same else events[k])
        self.start = time.monotonic() - blob["elapsed"]

    def resume(self) -> None:
        """Continue from the run directory's checkpoint (from the start without one)."""
        blob = load_checkpoint(self.run_dir)
        if blob is not None:
            self.restore(blob)

    def recover(self, attempts: int = 5) -> None:
        """Restart dead actors and restore the last checkpoint; retry while the cluster is
        still changing (e.g. a node is going away)."""
        last = ""
        for attempt in range(attempts):
            try:
                self.executor.recover()
                self.restore(load_checkpoint(self.run_dir))
                self.event("restored", f"continuing from round {self.round}")
                return
            except ClientFailure as err:
                last = one_line(err)
                self.event("actor_died", f"during recovery: {err}")
                time.sleep(min(2.0**attempt, 10.0))
        raise RecoveryFailure(f"could not recover the client actors after {attempts} attempts (the last: {last})")
