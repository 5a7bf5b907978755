"""``raysoft sweep``: a grid of runs (seeds included) as Ray Tune trials.

A sweep file is YAML::

    config: fedsoft_synthetic.yaml      # the base experiment (a path, relative to this file, or a mapping)
    set: ["algorithm.rounds=20"]        # fixed overrides (optional)
    grid:                               # every combination of these values is one trial
      algorithm.prox_weight: [0.01, 0.1]
      seed: [0, 1]
    trial:
      actors: 1                         # client actors of each trial (default 1)
      max_concurrent: null              # trials at once (default: as many as the cluster fits)

Every trial's config is validated before Ray starts. Each trial is a Tune trial whose placement
group reserves one bundle for the trial itself (it drives the run) and one per client actor
(``ray.num_cpus_per_actor`` / ``num_gpus_per_actor`` each); the run puts its client actors into
those bundles (``ray.placement: trial``), so trials share a cluster without taking each other's
resources. The trial's run directory is ``<sweep>/runs/trial-<i>`` (an ordinary run directory);
``sweep.parquet`` has one row per trial: its index, its grid values, its run directory, every
scalar of its ``summary.json`` (nested keys joined with ``.``) and the final evaluation's
cluster metrics (``final.<metric>.c<center>.d<distribution>``), and its score, the best center's
metric averaged over the distributions (``best_center.<metric>``); ``sweep.md`` is their table
(printed at the end, as ``raysoft compare`` prints its own), and while the trials run one line on
stderr says how many are done, running and left, and the best so far (:mod:`raysoft.sweep_report`).
``raysoft sweep --resume DIR``
continues a stopped or failed sweep: finished trials keep their runs, a trial with a checkpoint
(``output.checkpoint_every`` in the base config) continues from it, the others run again. A
stopped or failed sweep deletes no finished or checkpointed trial; Ctrl-C says how many trials
were kept and gives the ``--resume`` command (exit 130).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pandas as pd
import yaml
from pydantic import Field, ValidationError

from .api import check_data
from .backends.plan import Cluster, slots
from .config import Config, ConfigError, Section, apply_overrides, format_error, load_raw, load_yaml, parse_config
from .errors import RunStopped
from .interrupts import Interrupted
from .quiet import quiet_ray
from .results import atomic_path
from .sweep_report import TABLE, Progress, score, table

SPEC = "sweep.yaml"  # the resolved sweep, in the sweep directory


class TrialSpec(Section):
    actors: int = Field(1, ge=1, description="client actors of each trial")
    max_concurrent: int | None = Field(None, ge=1, description="trials at once; default as many as fit")


class SweepSpec(Section):
    config: str | dict[str, object] = Field(description="the base experiment: a YAML path or a mapping")
    set: list[str] = Field(default_factory=list, description="fixed overrides, section.key=value")
    grid: dict[str, list[object]] = Field(description="section.key -> values; every combination is a trial")
    trial: TrialSpec = Field(default_factory=TrialSpec)


def load_spec(path: str | Path) -> tuple[SweepSpec, dict[str, object]]:
    """The sweep file and its base config (raw, with the fixed overrides applied)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sweep file {str(p)!r} not found")
    try:
        raw = load_yaml(p.read_text()) or {}
    except yaml.YAMLError:
        raise ConfigError(f"sweep file {str(p)!r}: invalid YAML") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"sweep file {str(p)!r}: the top level must be a mapping")
    try:
        spec = SweepSpec.model_validate(dict(raw))
    except ValidationError as err:
        raise ConfigError(f"sweep: {format_error(err)}") from None
    if not spec.grid or any(not values for values in spec.grid.values()):
        raise ConfigError("sweep: grid must give at least one value for every key")
    if isinstance(spec.config, str):
        base_path = Path(spec.config)
        base_path = base_path if base_path.is_absolute() else p.parent / base_path
        if not base_path.is_file() and Path(spec.config).is_file():  # relative to the working directory
            base_path = Path(spec.config)
        base = load_raw(base_path, spec.set)
    else:
        base = apply_overrides(spec.config, spec.set)
    return spec, base


def trial_points(spec: SweepSpec) -> list[dict[str, object]]:
    """Every combination of the grid's values, in the grid's key order (the last key fastest)."""
    keys = list(spec.grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(spec.grid[k] for k in keys))]


def trial_config(base: Mapping[str, object], point: Mapping[str, object], actors: int,
                 note: Callable[[str], None] | None = None) -> Config:
    """A trial's validated config: the base, the grid point, and the Ray settings that keep the
    trial's client actors inside its reservation. ``note``: where a grid point's switch of
    plug-in says which keys it dropped (stderr by default)."""
    overrides = [f"{key}={json.dumps(value)}" for key, value in point.items()]
    try:
        cfg = parse_config(apply_overrides(base, overrides, note))
    except ConfigError as err:
        where = ", ".join(f"{k}={v!r}" for k, v in point.items())
        raise ConfigError(f"sweep trial {where}: {err}") from None
    per_actor = math.ceil(cfg.data.clients / actors)
    ray = cfg.ray.model_copy(update={"backend": "ray", "placement": "trial", "clients_per_actor": per_actor})
    out = cfg.output.model_copy(update={"progress": "none"})  # checkpoint_every kept: a long trial resumes
    return cfg.model_copy(update={"ray": ray, "output": out})


def bundles(cfg: Config, actors: int) -> list[dict[str, float]]:
    """A trial's reservation: the trial itself, then one bundle per client actor."""
    actor: dict[str, float] = {"CPU": cfg.ray.num_cpus_per_actor}
    if cfg.ray.num_gpus_per_actor:
        actor["GPU"] = cfg.ray.num_gpus_per_actor
    return [{"CPU": 1.0}] + [dict(actor) for _ in range(actors)]


def _flatten(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[key] = v
    return out


def final_metrics(run_dir: Path) -> dict[str, float]:
    """The last evaluation's cluster metrics of a run: final.<metric>.c<center>.d<distribution>."""
    m = pd.read_parquet(run_dir / "metrics.parquet")
    m = m[m.scope == "cluster"]
    if m.empty:
        return {}
    last = m[m.step == m.step.max()]
    return {f"final.{r.metric}.c{int(r.entity)}.d{int(r.eval_dist)}": float(r.value) for r in last.itertuples()}


def _run_trial(params: dict[str, Any], cfg_dicts: Sequence[Mapping[str, object]], runs: str,
               ship: list[str]) -> None:
    """A Tune trainable: run trial ``params['index']`` (or reuse its finished run) and report
    that it finished (its figures are read from its run directory). ``ship``: the plug-in
    modules' paths on the driver, importable here when this node sees them."""
    from ray import tune

    from .api import resume, run
    from .plugins import ensure_importable

    ensure_importable(ship)
    index = int(params["index"])
    name = f"trial-{index:03d}"
    final = Path(runs) / name
    if not (final / "summary.json").is_file():
        if (final / "config.yaml").is_file():  # a checkpointed trial of a stopped sweep: continued, not redone
            resume(final)
        else:  # nothing resumable of it: a run without checkpoints cut short, or nothing at all
            for left in (final, Path(runs) / f".{name}.partial"):
                if left.exists():
                    shutil.rmtree(left)
            run(parse_config(cfg_dicts[index]), out=runs, dir_name=name)
    tune.report({"index": index})


def sweep(spec_path: str | Path | None = None, out: str | Path | None = None, address: str | None = None,
          resume: str | Path | None = None) -> Path:
    """Run the sweep in ``spec_path`` (or continue the one in ``resume``); return its directory."""
    if resume is not None:
        sweep_dir = Path(resume).absolute()
        if not (sweep_dir / SPEC).is_file():
            raise ConfigError(f"--resume: {str(sweep_dir)!r} is not a sweep directory (no {SPEC})")
        if (sweep_dir / "sweep.parquet").is_file():
            raise ConfigError(f"--resume: {str(sweep_dir)!r} is already complete")
        spec, base = load_spec(sweep_dir / SPEC)
    else:
        if spec_path is None:
            raise ConfigError("sweep: give a SWEEP file (or --resume DIR)")
        spec, base = load_spec(spec_path)
    points = trial_points(spec)
    actors = spec.trial.actors
    # every trial's config, data files and model fit checked before Ray starts
    said: list[str] = []  # a grid point's switch of plug-in, told once however many trials make it

    def once(line: str) -> None:
        if line not in said:
            said.append(line)
            print(line, file=sys.stderr, flush=True)

    cfgs = [check_data(trial_config(base, point, actors, once)) for point in points]
    if resume is None:
        from .api import _prepare_out

        root = _prepare_out(str(out or cfgs[0].output.dir))
        stamp = f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        sweep_dir = (root / stamp).absolute()
        sweep_dir.mkdir()
        resolved = {"config": base, "grid": spec.grid, "trial": spec.trial.model_dump()}
        (sweep_dir / SPEC).write_text(yaml.safe_dump(resolved, sort_keys=False))
    runs = sweep_dir / "runs"
    runs.mkdir(exist_ok=True)
    if resume is not None:
        sys.stderr.write(f"sweep: resuming {sweep_dir}: {resume_plan(runs, cfgs)}\n")
        sys.stderr.flush()
    _tune(cfgs, bundles(cfgs[0], actors), spec.trial.max_concurrent, sweep_dir, runs,
          address or cfgs[0].ray.address, resume is not None, Progress(runs, points))
    rows = []
    for i, point in enumerate(points):
        run_dir = runs / f"trial-{i:03d}"
        summary = json.loads((run_dir / "summary.json").read_text())
        scored = score(summary)
        rows.append({"trial": i, **{f"grid.{k}": _cell(v) for k, v in point.items()}, "run_dir": str(run_dir),
                     **({f"best_center.{scored[0]}": scored[1]} if scored else {}),
                     **_flatten(summary), **final_metrics(run_dir)})
    df = pd.DataFrame(rows)
    with atomic_path(sweep_dir / "sweep.parquet") as tmp:
        df.to_parquet(tmp, index=False)
    with atomic_path(sweep_dir / TABLE) as tmp:
        tmp.write_text(table(df))
    return sweep_dir


def resume_plan(runs: Path, cfgs: list[Config]) -> str:
    """What a resumed sweep does with each trial: ``1 of 3 trials finished; trial 1 from round 162
    of 400 (its last checkpoint); trial 2 from the start``."""
    from .api import resumed_from
    from .runtime.checkpoint import load_checkpoint

    finished, rest = 0, []
    for i, cfg in enumerate(cfgs):
        run_dir = runs / f"trial-{i:03d}"
        if (run_dir / "summary.json").is_file():
            finished += 1
            continue
        blob = load_checkpoint(run_dir) if (run_dir / "checkpoint.pt").is_file() else None
        rest.append(f"trial {i} {resumed_from(blob, cfg) if blob is not None else 'from the start'}")
    return "; ".join([f"{finished} of {len(cfgs)} trials finished", *rest])


def _cell(value: object) -> object:
    """A grid value as a Parquet cell (lists and mappings as their JSON text)."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def fits(reservation: list[dict[str, float]], cluster: Cluster) -> str | None:
    """Why ``cluster``'s nodes can never hold one trial's reservation (its first bundle, the
    trial's own, and identical bundles for its client actors, each on one node, the bundles on
    a node within its resources), or None if they can."""
    head, actor = reservation[0], reservation[1:]
    nodes = [{k: float(n.get(k, 0.0)) for k in ("CPU", "GPU")} for n in cluster.nodes]
    for i, node in enumerate(nodes):  # the trial's own bundle on node i, the actors wherever they fit
        if all(node.get(k, 0.0) + 1e-9 >= v for k, v in head.items()):
            rest = [dict(n) for n in nodes]
            for k, v in head.items():
                rest[i][k] -= v
            if not actor or slots(rest, actor[0].get("CPU", 0.0), actor[0].get("GPU", 0.0)) >= len(actor):
                return None
    need = {k: sum(b.get(k, 0.0) for b in reservation) for k in ("CPU", "GPU")}
    gpus = f" and {need['GPU']:g} GPUs" if need["GPU"] else ""
    return (f"sweep: a trial reserves {need['CPU']:g} CPUs{gpus} (1 for the trial, trial.actors x "
            f"ray.num_cpus_per_actor for its client actors), more than {cluster.describe()} can hold; "
            "lower trial.actors or ray.num_cpus_per_actor / num_gpus_per_actor")


def _pending_watch(deadline_s: float) -> Any:
    """A Tune stopper that ends the sweep once trials have waited ``deadline_s`` for resources
    with none running (an autoscaling cluster that does not grow); ``gave_up`` says it did. Its
    ``callback`` (a Tune callback) watches the trials' states."""
    import time

    from ray import tune

    class Watch(tune.Stopper):
        def __init__(self) -> None:
            self.since: float | None = None  # when the trials started waiting with none running
            self.gave_up = False
            watch = self

            class Seen(tune.Callback):
                def on_step_end(self, iteration: int, trials: list, **info: object) -> None:
                    states = {t.status for t in trials}
                    if "PENDING" in states and "RUNNING" not in states:
                        watch.since = watch.since if watch.since is not None else time.monotonic()
                    else:
                        watch.since = None

            self.callback = Seen()

        def __call__(self, trial_id: str, result: dict) -> bool:
            return False

        def stop_all(self) -> bool:
            if self.since is not None and time.monotonic() - self.since > deadline_s:
                self.gave_up = True
            return self.gave_up

    return Watch()


class _SweepStop:
    """Ctrl-C during a sweep: the first SIGINT asks Tune to stop its trials (through the SIGUSR1
    handler Tune installs for that) and is remembered, so that the sweep then says it was
    stopped and how to continue (not Tune's ``Tuner.restore`` line, not a failure); a second one
    stops at once (``KeyboardInterrupt``). Tune's own SIGINT handler is left out
    (``TUNE_DISABLE_SIGINT_HANDLER``) so that the signal is seen here."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        tune_stop = signal.getsignal(signal.SIGUSR1)
        if self.signum is not None or not callable(tune_stop):
            raise KeyboardInterrupt
        self.signum = signum
        tune_stop(signal.SIGUSR1, frame)

    @contextmanager
    def catching(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGUSR1)}
        env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # not a handler left by an earlier sweep's Tune
        signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)
            if env is None:
                os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
            else:
                os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = env


def _tune(cfgs: list[Config], reservation: list[dict[str, float]], max_concurrent: int | None, sweep_dir: Path,
          runs: Path, address: str | None, resuming: bool, progress: Progress) -> None:
    """Run the trials on Ray Tune (refusing a reservation the cluster can never hold, before a
    local Ray starts); a trial that did not finish stops the sweep, resumable. Ray's and Tune's
    own chatter is off unless asked (:mod:`raysoft.quiet`); ``progress`` talks while the trials run."""
    with quiet_ray():
        _tune_trials(cfgs, reservation, max_concurrent, sweep_dir, runs, address, resuming, progress)


def _tune_trials(cfgs: list[Config], reservation: list[dict[str, float]], max_concurrent: int | None,
                 sweep_dir: Path, runs: Path, address: str | None, resuming: bool, progress: Progress) -> None:
    from ray import tune

    from .backends.cluster import joined_cluster, local_cluster
    from .backends.session import connect, shutdown

    rc = cfgs[0].ray.model_copy(update={"address": address})
    if not (address or os.environ.get("RAY_ADDRESS")):  # a local Ray: known before it starts
        local = local_cluster(rc)
        why = fits(reservation, local) if local is not None else None
        if why:
            raise ConfigError(why)
    from .plugins import runtime_env

    env = runtime_env(cfgs[0])  # the trials import the plug-ins the configs name
    started = connect(rc, env)
    try:
        cluster = joined_cluster()
        why = fits(reservation, cluster)
        if why and not cluster.can_grow:
            raise ConfigError(why)
        trainable = tune.with_resources(
            tune.with_parameters(_run_trial, cfg_dicts=[c.to_dict() for c in cfgs], runs=str(runs),
                                 ship=env["py_modules"] if env else []),
            resources=tune.PlacementGroupFactory(reservation),
        )
        storage = str(sweep_dir / "tune")
        watch = _pending_watch(rc.placement_timeout_s)
        if resuming and tune.Tuner.can_restore(os.path.join(storage, "trials")):
            tuner = tune.Tuner.restore(os.path.join(storage, "trials"), trainable, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space={"index": tune.grid_search(list(range(len(cfgs))))},
                tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent),
                run_config=tune.RunConfig(name="trials", storage_path=storage, verbose=0, stop=watch,
                                          callbacks=[watch.callback]),
            )
        stop = _SweepStop()
        with stop.catching(), progress:  # trials done / running / left and the best so far, once they start
            tuner.fit()
        if stop.signum is not None:
            done = sum((runs / f"trial-{i:03d}" / "summary.json").is_file() for i in range(len(cfgs)))
            kept = sum((d / "checkpoint.pt").is_file() and not (d / "summary.json").is_file()
                       for d in (runs / f"trial-{i:03d}" for i in range(len(cfgs))))
            held = f", {kept} checkpointed" if kept else ""
            raise Interrupted(stop.signum, f"sweep stopped by {signal.Signals(stop.signum).name}; {done} of "
                              f"{len(cfgs)} trials finished{held}, kept in {runs}; continue with: raysoft sweep "
                              f"--resume {sweep_dir}")
        if watch.gave_up:
            need = sum(b.get("CPU", 0.0) for b in reservation)
            raise RunStopped(f"sweep: no trial could start for {rc.placement_timeout_s:g} s (ray.placement_timeout_s):"
                             f" {joined_cluster().describe()} has no room for a trial's {need:g} CPUs and did not grow;"
                             f" `raysoft sweep --resume {sweep_dir}` runs the unfinished trials")
        failed = [i for i in range(len(cfgs)) if not (runs / f"trial-{i:03d}" / "summary.json").is_file()]
        if failed:
            raise RunStopped(f"sweep: trial {failed[0]} did not finish ({len(failed)} of {len(cfgs)}); its error is "
                             f"in {sweep_dir / 'tune'}; `raysoft sweep --resume {sweep_dir}` runs the unfinished "
                             "trials again")
    finally:
        if started:
            shutdown()
