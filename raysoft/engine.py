"""The coordinator's logic, free of Ray: drive an algorithm's rounds through an executor.

An *executor* runs client ops wherever the clients live::

    executor.call(op, client_ids, payload, t) -> {client_id: result}

The in-process backend passes a :class:`~raysoft.host.ClientHost`; the Ray backend passes an
executor over client actors. Everything that reaches the results goes through here, in client
order, so the numbers do not depend on the backend or on how clients are packed.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from .algorithms import ClientCall, Plan, Reduced, ServerContext, get_algorithm
from .algorithms.base import split_result
from .config import STREAM_ALGORITHMS, Config
from .errors import ClientFailure, UpdateError  # noqa: F401 - re-exported
from .data import Federation
from .evaluation import HEADLINE, LOWER_IS_BETTER, evaluate_centers, summarize
from .models import build_model
from .results import Recorder, write_tables

log = logging.getLogger(__name__)
CHECKPOINT = "checkpoint.pt"


class Executor(Protocol):
    def call(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int) -> dict[int, Any]: ...

    def keep(self, op: str, client_ids: list[int], payload: dict[str, Any], t: int, poison: list[int],
             part: int | None) -> dict[int, tuple[bool, Any]]:
        ...  # run op, keep the results where they ran (``poison``: fill those with NaN); {client: (finite, rest)}

    def accumulate(self, plan: Plan) -> torch.Tensor:
        ...  # the plan's sum of the kept results, added in client-id order; drops what was kept

    def get_states(self) -> dict[int, Any]: ...

    def set_states(self, states: dict[int, Any]) -> None: ...

    def reset(self) -> None: ...  # rebuild every client from (seed, client id)

    def recover(self) -> None: ...  # replace dead actors (their clients rebuilt from seed and id)

    def kill(self, actor: int) -> None: ...  # fault injection


def record_placement(recorder: Recorder, executor: Any) -> None:
    """Which node hosts which client (Ray backend: placement.parquet)."""
    for actor, where in enumerate(getattr(executor, "placement", [])):
        for k in where["clients"]:
            recorder.add("placement", client=k, actor=actor, node_id=where["node_id"])


def _finite(result: Any) -> bool:
    # A finite sum proves every element finite (a NaN or an infinity never sums to a finite
    # value); only a non-finite sum, which finite values can also reach by overflow, needs the
    # element-wise check, which costs many times more.
    if isinstance(result, torch.Tensor):
        if result.is_floating_point() and bool(torch.isfinite(result.sum())):
            return True
        return bool(torch.isfinite(result).all())
    if isinstance(result, np.ndarray) and result.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            if np.isfinite(result.sum()):
                return True
        return bool(np.isfinite(result).all())
    if isinstance(result, (list, tuple)):
        return all(_finite(r) for r in result)
    if isinstance(result, dict):
        return all(_finite(r) for r in result.values())
    return True


def _poison(result: Any) -> Any:
    """The result with its float tensors filled with NaN (fault injection)."""
    if isinstance(result, torch.Tensor) and result.is_floating_point():
        return torch.full_like(result, float("nan"))
    if isinstance(result, np.ndarray) and result.dtype.kind == "f":
        return np.full_like(result, np.nan)
    if isinstance(result, (list, tuple)):
        return type(result)(_poison(r) for r in result)
    return result


def save_checkpoint(run_dir: Path, blob: dict[str, Any], recorder: Recorder) -> None:
    """Write a checkpoint atomically (temporary file, then rename), then the results so far."""
    tmp = run_dir / f".{CHECKPOINT}.tmp"
    torch.save(blob, tmp)
    os.replace(tmp, run_dir / CHECKPOINT)
    write_tables(run_dir, recorder.tables())


def load_checkpoint(run_dir: Path | None) -> dict[str, Any] | None:
    path = run_dir / CHECKPOINT if run_dir else None
    if path is None or not path.exists():
        return None
    return torch.load(path, weights_only=False)


class Coordinator:
    """Runs the rounds of one experiment and records every measurement."""

    def __init__(self, cfg: Config, executor: Executor, run_id: str, run_dir: str | None = None,
                 resume: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir else None
        self.started = False  # the initial evaluation is done
        self._fired: set[int] = set()  # injected faults already triggered (never re-fired)
        self.executor = executor
        self.algorithm = get_algorithm(cfg.algorithm.name)
        self.fed = Federation(cfg.data, cfg.seed)
        self.ctx = ServerContext(cfg=cfg, sizes=self.fed.sizes, info=self.fed.info)
        self.state = self.algorithm.init_server(self.ctx)
        self.holdouts = [self.fed.holdout(s) for s in range(self.fed.num_distributions)]
        self.scratch = build_model(cfg.model, self.fed.info)
        self.metric = HEADLINE[self.fed.info.task]
        self.recorder = Recorder(run_id)
        self.round = 0
        self.start = time.monotonic()
        self._center_scores: np.ndarray | None = None
        self._local_means: dict[str, float] = {}
        self._record_clients()
        record_placement(self.recorder, executor)
        if resume:
            self.restore(self._load_checkpoint())

    # ------------------------------------------------------------------ recording
    def _elapsed(self) -> float:
        return time.monotonic() - self.start

    def _record_clients(self) -> None:
        shares = self.fed.realized_shares()
        for k in range(self.fed.num_clients):
            for s in range(self.fed.num_distributions):
                self.recorder.add(
                    "clients", step=0, client=k, distribution=s, share=float(shares[k, s]),
                    samples=int(round(shares[k, s] * self.fed.sizes[k])),
                )

    def _metric_row(self, scope: str, entity: int, eval_dist: int, metric: str, value: float) -> None:
        self.recorder.add(
            "metrics", algorithm=self.cfg.algorithm.name, step=self.round, time_s=self._elapsed(),
            scope=scope, entity=entity, eval_dist=eval_dist, metric=metric, value=float(value), virtual_time=None,
        )

    def _record_weights(self, step: int) -> None:
        """The importance weights estimated at the start of round ``step``."""
        weights = self.algorithm.weights(self.state)
        if weights is None:
            return
        for k in range(weights.shape[0]):
            for c in range(weights.shape[1]):
                self.recorder.add("weights", step=step, client=k, center=c, estimate=float(weights[k, c]))

    def _record_assignments(self, predicted: np.ndarray) -> dict[str, Any]:
        """Write the final hard clustering; return its ARI against the clients' main distribution."""
        from sklearn.metrics import adjusted_rand_score

        truth = self.fed.mixtures.argmax(axis=1)
        for k in range(self.fed.num_clients):
            self.recorder.add("assignments", client=k, predicted=int(predicted[k]), truth=int(truth[k]))
        return {"ari": float(adjusted_rand_score(truth, predicted)), "num_clusters": int(len(np.unique(predicted)))}

    # ------------------------------------------------------------------ the loop
    def evaluate(self) -> dict[str, float]:
        """Every center on every holdout set; every client's local model on its own data."""
        centers = self.algorithm.centers(self.state)
        results = evaluate_centers(self.scratch, centers, self.holdouts, self.fed.info.task)
        scores = np.zeros((self.fed.num_distributions, centers.shape[0]))
        for (c, s), metrics in results.items():
            for name, value in metrics.items():
                self._metric_row("cluster", c, s, name, value)
            scores[s, c] = metrics[self.metric]
        payload = self.algorithm.eval_payload(self.state)
        local = self.executor.call("evaluate", list(range(self.fed.num_clients)), payload, self.round)
        for k in sorted(local):
            for name, value in local[k].items():
                if not name.startswith("_"):
                    self._metric_row("client", k, -1, name, value)
        absorb = getattr(self.algorithm, "absorb_eval", None)
        if absorb is not None:
            self.state = absorb(self.state, local)
        self._center_scores = scores
        names = [n for n in local[0] if not n.startswith("_")] if local else []
        self._local_means = {n: float(np.mean([local[k][n] for k in sorted(local)])) for n in names}
        head = {}
        if scores.shape[1]:
            best = scores.min(axis=1) if LOWER_IS_BETTER[self.metric] else scores.max(axis=1)
            head = {f"{self.metric}[{s}]": float(v) for s, v in enumerate(best)}
        if self.metric in self._local_means:
            head[f"local {self.metric}"] = self._local_means[self.metric]
        return head

    # ------------------------------------------------------------------ checkpoints
    def _event(self, kind: str, detail: str = "", client: int = -1, actor: int = -1) -> None:
        log.warning("round %d: %s %s", self.round, kind, detail)
        self.recorder.add("events", step=self.round, time_s=self._elapsed(), kind=kind, client=client,
                          actor=actor, detail=detail)

    def checkpoint(self) -> None:
        """Save everything needed to continue (atomically), and the results so far."""
        assert self.run_dir is not None
        blob = {
            "round": self.round, "started": self.started, "state": self.state, "elapsed": self._elapsed(),
            "recorder": self.recorder.columns, "center_scores": self._center_scores,
            "local_means": self._local_means, "clients": self.executor.get_states(),
        }
        self._event("checkpoint")
        save_checkpoint(self.run_dir, blob, self.recorder)

    def _load_checkpoint(self) -> dict[str, Any] | None:
        return load_checkpoint(self.run_dir)

    def restore(self, blob: dict[str, Any] | None) -> None:
        """Continue from a checkpoint (or, with none, from the very start)."""
        if blob is None:
            self.executor.reset()
            self.state = self.algorithm.init_server(self.ctx)
            self.round, self.started = 0, False
            events = self.recorder.columns["events"]
            self.recorder = Recorder(self.recorder.run_id)
            self.recorder.columns["events"] = events
            self._record_clients()
            self._center_scores, self._local_means = None, {}
            return
        self.executor.set_states(blob["clients"])
        self.state, self.round, self.started = blob["state"], blob["round"], blob["started"]
        events = self.recorder.columns["events"]
        self.recorder.columns = blob["recorder"]
        if events["run_id"]:  # keep this session's events (the checkpoint has the earlier ones)
            for k in events:
                self.recorder.columns["events"][k] = blob["recorder"]["events"][k] + events[k]
        self._center_scores, self._local_means = blob["center_scores"], blob["local_means"]
        self.start = time.monotonic() - blob["elapsed"]

    def advance(self) -> dict[str, Any]:
        """One unit of work: the initial evaluation, or one round (recovering from a dead
        client actor by restoring the last checkpoint). ``done`` says the run is complete."""
        try:
            if not self.started:
                info = {"round": 0, "headline": self.evaluate()}
                self.started = True
            else:
                self._inject_faults()
                info = self.run_round()
                every = self.cfg.output.checkpoint_every
                if every and self.run_dir is not None and self.round % every == 0:
                    self.checkpoint()
        except ClientFailure as err:
            self._event("actor_died", str(err))
            self._recover()
            info = {"round": self.round, "headline": None}
        info["done"] = self.started and self.round >= self.cfg.algorithm.rounds
        return info

    def _recover(self, attempts: int = 5) -> None:
        """Restart dead actors and restore the last checkpoint; retry while the cluster is
        still changing (e.g. a node is going away)."""
        for attempt in range(attempts):
            try:
                self.executor.recover()
                self.restore(self._load_checkpoint())
                self._event("restored", f"continuing from round {self.round}")
                return
            except ClientFailure as err:
                self._event("actor_died", f"during recovery: {err}")
                time.sleep(min(2.0**attempt, 10.0))
        raise RuntimeError(f"could not recover the client actors after {attempts} attempts")

    def _inject_faults(self) -> None:
        for i, f in enumerate(self.cfg.faults):
            if f.kind == "kill_actor" and f.at_round == self.round and i not in self._fired:
                self._fired.add(i)
                self._event("fault_injected", f"kill actor {f.actor}", actor=f.actor)
                self.executor.kill(f.actor)

    def _poisoned(self, op: str, t: int) -> list[int]:
        """The clients whose update of this call an injected fault turns into NaN."""
        return [f.client for f in self.cfg.faults if f.kind == "nan_update" and f.at_round == t and op == "train"]

    def _report_bad(self, op: str, bad: list[int], t: int) -> None:
        for k in bad:
            self._event("nan_update", f"op {op}: non-finite update", client=k)
        if bad and self.cfg.train.nan_policy == "stop":
            raise UpdateError(f"round {t}: client {bad[0]} returned a non-finite update (train.nan_policy: stop)")

    def _report_late(self, op: str) -> None:
        for k in getattr(self.executor, "late", []):
            self._event("late_update", f"op {op}: missed the round deadline", client=k)

    def _check_updates(self, op: str, results: dict[int, Any], t: int) -> dict[int, Any]:
        """Apply injected NaN faults, then report (and exclude, or stop on) non-finite updates."""
        for k in self._poisoned(op, t):
            if k in results:
                results[k] = _poison(results[k])
        bad = [k for k in sorted(results) if not _finite(results[k])]
        self._report_bad(op, bad, t)
        return {k: v for k, v in results.items() if k not in bad}

    def _reduced_call(self, call: ClientCall, t: int) -> Reduced:
        """A call whose results are summed (``call.reduce``): in the client actors when
        ``ray.reduce_in_actors`` (only finiteness, the small rest of each result and one tensor
        per actor travel), else here; the same additions in the same client-id order either way."""
        red = call.reduce
        if self.cfg.ray.reduce_in_actors:
            flags = self.executor.keep(call.op, call.clients, call.payload, t, self._poisoned(call.op, t), red.part)
            self._report_late(call.op)
            self._report_bad(call.op, [k for k in sorted(flags) if not flags[k][0]], t)
            rest = {k: flags[k][1] for k in sorted(flags) if flags[k][0]}
            plan = red.plan(rest)
            value = self.executor.accumulate(plan) if plan.terms else plan.start
            return Reduced(value, sorted(rest), rest)
        results = self.executor.call(call.op, call.clients, call.payload, t)
        self._report_late(call.op)
        results = self._check_updates(call.op, results, t)
        split = {k: split_result(results[k], red.part) for k in sorted(results)}
        value = red.plan({k: v[1] for k, v in split.items()}).apply({k: v[0] for k, v in split.items()})
        return Reduced(value, sorted(split), {k: v[1] for k, v in split.items()})

    def run_round(self) -> dict[str, Any]:
        """Run one round; evaluate when it is due. Returns progress information."""
        t = self.round
        gen = self.algorithm.round(self.ctx, self.state, t)
        try:
            call = next(gen)
            while True:
                if call.reduce is not None:
                    call = gen.send(self._reduced_call(call, t))
                    continue
                results = self.executor.call(call.op, call.clients, call.payload, t)
                self._report_late(call.op)
                results = self._check_updates(call.op, results, t)
                call = gen.send(results)
        except StopIteration as stop:
            self.state, diag = stop.value
        if diag.get("weights_updated"):
            self._record_weights(t)
        self.round = t + 1
        info: dict[str, Any] = {"round": self.round, "headline": None, "trained": diag.get("trained")}
        if self.round % self.cfg.algorithm.eval_every == 0 or self.round == self.cfg.algorithm.rounds:
            info["headline"] = self.evaluate()
        return info

    def summary(self) -> dict[str, Any]:
        """The final figures of the run (call after the last evaluation)."""
        if self._center_scores is None:
            self.evaluate()
        weights = self.algorithm.weights(self.state)
        out = summarize(self._center_scores, self.metric, self._local_means, weights, self.fed.realized_shares())
        assign = getattr(self.algorithm, "assignment", None)
        if assign is not None:
            out.update(self._record_assignments(np.asarray(assign(self.state))))
        out.update(
            run_id=self.recorder.run_id,
            algorithm=self.cfg.algorithm.name,
            dataset=self.cfg.data.name,
            rounds=self.round,
            wall_time_s=self._elapsed(),
        )
        return out

    def results(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tables as columns, summary), for the writer."""
        summary = self.summary()
        return self.recorder.tables(), summary


class OneThread:
    """Wraps a coordinator so that its own work (aggregation, evaluation, the server steps)
    always runs with one torch thread, whichever process hosts it."""

    def __init__(self, coord: Any) -> None:
        self.coord = coord

    def advance(self) -> dict[str, Any]:
        from .host import torch_threads

        with torch_threads(1):
            return self.coord.advance()

    def results(self) -> tuple[dict[str, Any], dict[str, Any]]:
        from .host import torch_threads

        with torch_threads(1):
            return self.coord.results()


def make_coordinator(cfg: Config, executor: Executor, run_id: str, run_dir: str | None = None,
                     resume: bool = False) -> OneThread:
    """The coordinator of a synchronous algorithm, or of an asynchronous stream (CCFL)."""
    from .host import torch_threads

    with torch_threads(1):
        if cfg.algorithm.name in STREAM_ALGORITHMS:
            from .stream import StreamCoordinator

            return OneThread(StreamCoordinator(cfg, executor, run_id, run_dir=run_dir, resume=resume))
        return OneThread(Coordinator(cfg, executor, run_id, run_dir=run_dir, resume=resume))
