"""``raysoft compare``: several algorithms on identical clients, data, seed and budget.

Each algorithm runs the same config, with the ``algorithm`` section's keys given to every
algorithm that has them (``rounds``, ``clients_per_round``, ``eval_every`` to all;
``estimation_interval`` only to FedSoft, ``num_centers`` to the clustered ones, ...). The
comparison directory holds one run directory per algorithm (named after it), and
``comparison.parquet`` and ``comparison.md`` (written by
:func:`raysoft.report.markdown.comparison_markdown`, as ``raysoft report`` writes its
comparison_report.md): the shape of the FedSoft paper's Table 2 (Ruan & Joe-Wong, AAAI 2022),
i.e. for each distribution the metric of its best center (and that center's index), and the mean
local-model metric w-bar. A client's local model is the algorithm's own (FedSoft: w_k; IFCA: its
chosen center; FedEM: the learner with the largest pi, as FedSoft's paper evaluates the
baselines, with FedEM's pi-mixture prediction in its own column; FedAvg: the global model;
Local: its own model). Streams (CCFL, FedSoft-Async, Local as a stream) also get the CCFL
paper's Table 1: Cli Bfr, Cli Aft, Cluster, the mean KL and the bytes per client.

Every comparison also says how each algorithm serves its clients (:func:`clients_table`,
``comparison_clients.parquet`` and the "Clients served" table of comparison.md): the last
evaluation's personalised metric over the clients (``client_metrics.parquet``: mean, p10,
median, p90, the worst tenth's mean), each algorithm's per-client gain over Local and over
FedAvg when they are in the comparison (the same seed and data, so the same clients), the share
of clients it serves worse than Local, and its time to ``output.target`` when one is set.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import yaml

from .api import _prepare_out, check_resources, is_uri, resume, run
from .config import Config, ConfigError, parse_config
from .interrupts import Interrupted, stop_on_signals
from .metrics import lower_is_better
from .plugins import is_stream_algorithm, registered, settings_class, short_name
from .report.analysis import local_means, regime, regime_text
from .report.load import RunData, load_run
from .report.markdown import comparison_markdown


def algorithm_configs(raw: Mapping[str, object] | Config, algorithms: list[str]) -> dict[str, Config]:
    """One config per algorithm from a raw config mapping whose ``algorithm`` section may hold
    the keys of several algorithms: each key goes to the algorithms that have it."""
    for a in algorithms:
        try:
            settings_class("algorithms", a)
        except ConfigError as err:
            raise ConfigError(f"--algorithms: {err}") from None
    if len(set(algorithms)) != len(algorithms) or not algorithms:
        raise ConfigError("--algorithms: give each algorithm once")
    base = dict(raw.to_dict() if isinstance(raw, Config) else raw)
    section = base.get("algorithm") or {}
    if not isinstance(section, Mapping):
        raise ConfigError("algorithm: must be a mapping")
    given = {k: v for k, v in section.items() if k != "name" and v is not None}
    # beside the stream algorithms, "local" is Local on the same streams
    name = section.get("name")
    streams = (isinstance(name, str) and is_stream_algorithm(name)) or any(is_stream_algorithm(a) for a in algorithms)
    mixed = [a for a in algorithms if streams and a != "local" and not is_stream_algorithm(a)]
    if mixed:
        raise ConfigError(f"--algorithms: {mixed[0]} runs synchronous rounds; compare it with other synchronous "
                          "algorithms, not with the streams")
    used: set[str] = set()
    out = {}
    for name in algorithms:
        real = "local_stream" if name == "local" and streams else name
        fields = settings_class("algorithms", real).model_fields
        section = {"name": real, **{k: v for k, v in given.items() if k in fields}}
        used |= section.keys()
        out[name] = parse_config({**base, "algorithm": section})
    _drop_others(sorted(set(given) - used), algorithms)
    return out


def _drop_others(stray: list[str], algorithms: list[str]) -> None:
    """Keys of the section that no chosen algorithm has: those of another installed algorithm are
    dropped with one line on stderr (a config for five algorithms runs for any subset); a key no
    algorithm has is refused."""
    if not stray:
        return
    others: set[str] = set()
    for name in registered("algorithms"):
        try:
            others |= set(settings_class("algorithms", name).model_fields)
        except ConfigError:  # a broken plug-in of another package says so where it is used
            continue
    unknown = [k for k in stray if k not in others]
    if unknown:
        raise ConfigError(f"algorithm.{unknown[0]}: none of {', '.join(algorithms)} has this key")
    sys.stderr.write(f"--algorithms {','.join(algorithms)}: dropped the other algorithms' keys {', '.join(stray)}\n")


STREAM_KEYS = ("cli_bfr", "cli_aft", "cluster_acc", "kl", "bytes_down_per_client", "bytes_up_per_client")


def _stream_row(name: str, run: RunData) -> list[dict[str, object]]:
    """The CCFL paper's Table 1 row of a stream run, with the mean KL and the bytes per client."""
    return [{"algorithm": name, **{k: run.summary.get(k) for k in STREAM_KEYS}, "run_dir": run.name}]


def _row(name: str, run: RunData) -> list[dict[str, object]]:
    """comparison.parquet's rows of one run: one per distribution (its best center), or one."""
    if run.is_stream:
        return _stream_row(name, run)
    s = run.summary
    metric = s["metric"]
    local, mixture = local_means(run)
    r = regime(run)
    common = {"algorithm": name, "metric": metric, "local_mean": local, "local_mean_mixture": mixture,
              "weight_mae": s.get("weight_mae"), "run_dir": run.name,
              **{k: r.get(k) for k in ("optimizer", "lr", "momentum", "batch_size", "local_epochs")},
              "regime": regime_text(r)}
    dists = s.get("distributions") or []
    if not dists:
        return [{**common, "distribution": None, "best_center": None, "best_center_metric": None}]
    return [
        {**common, "distribution": d["distribution"], "best_center": d["best_center"], "best_center_metric": d[metric]}
        for d in dists
    ]


def _final_client_metric(run: RunData) -> pd.Series | None:
    """The run's headline metric per training client at its last evaluation (client -> value)."""
    path = run.path / "client_metrics.parquet"
    if not path.is_file():
        return None
    df = pd.read_parquet(path)
    df = df[~df.held_out & (df.metric == run.metric)]
    if df.empty:
        return None
    return df[df.step == df.step.max()].set_index("client").value.sort_index()


def gain(values: pd.Series, base: pd.Series, metric: str) -> pd.Series:
    """Per client, how much better ``values`` serve it than ``base`` (of the clients in both):
    the difference in accuracy, or the decrease of a lower-is-better metric (mse, loss)."""
    values, base = values.align(base, join="inner")
    return base - values if lower_is_better(metric) else values - base


def clients_table(names: list[str], runs: list[RunData]) -> pd.DataFrame:
    """One row per algorithm: its personalised headline metric over the clients at the last
    evaluation (mean, p10, median, p90, worst10_mean: the summary's ``personalised``), its mean
    per-client gain over Local and over FedAvg (where they are compared), the share of clients
    it serves worse than Local, and its time to target (``output.target``: the first step, and
    virtual second, at which the clients' mean and their worse tenth reached it)."""
    finals = {name: _final_client_metric(run) for name, run in zip(names, runs)}
    local = finals.get("local")
    fedavg = finals.get("fedavg")
    rows = []
    for name, one in zip(names, runs):
        s = one.summary.get("personalised") or {}
        row: dict[str, object] = {"algorithm": name, "metric": one.metric, "clients": s.get("clients")}
        row.update({k: (s.get(one.metric) or {}).get(k) for k in ("mean", "p10", "median", "p90", "worst10_mean")})
        mine = finals[name]
        for base_name, base in (("local", local), ("fedavg", fedavg)):
            g = gain(mine, base, one.metric) if mine is not None and base is not None and base_name != name else None
            row[f"gain_over_{base_name}"] = None if g is None or g.empty else float(g.mean())
            if base_name == "local":
                row["worse_than_local"] = None if g is None or g.empty else float((g < 0).mean())
        ttt = one.summary.get("time_to_target") or {}
        for key in ("mean", "p10"):
            hit = ttt.get(key)
            row[f"target_{key}_step"] = None if hit is None else hit["step"]
            row[f"target_{key}_virtual_s"] = None if hit is None else hit["virtual_time"]
        row["target"] = ttt.get("target")
        rows.append(row)
    return pd.DataFrame(rows)


def _cell(value: object, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def clients_markdown(table: pd.DataFrame) -> str:
    """The "Clients served" section of comparison.md (from :func:`clients_table`)."""
    lines = ["## Clients served", "",
             "Each client's personalised model (what the algorithm serves it) on its own test split at the last "
             "evaluation: the mean over the clients, the 10th and 90th percentiles, the median and the mean of the "
             "worst tenth; gain: the mean over clients of how much better each is served than by Local or FedAvg "
             "(the same clients; for mse and loss, the decrease); worse than Local: the share of clients served "
             "worse; to target: the first round (upload) at which the mean, and the worse tenth, reached "
             "output.target.", "",
             "| algorithm | metric | mean | p10 | median | p90 | worst 10 % | gain over Local | gain over FedAvg "
             "| worse than Local | to target (mean / p10) |", "|---" * 11 + "|"]
    for r in table.to_dict("records"):
        target = "–" if r["target"] is None or r["target"] != r["target"] else (
            f"{_cell(r['target_mean_step'])} / {_cell(r['target_p10_step'])}")
        worse = r["worse_than_local"]
        lines.append(f"| {r['algorithm']} | {r['metric']} | {_cell(r['mean'])} | {_cell(r['p10'])} | "
                     f"{_cell(r['median'])} | {_cell(r['p90'])} | {_cell(r['worst10_mean'])} | "
                     f"{_cell(r['gain_over_local'])} | {_cell(r['gain_over_fedavg'])} | "
                     f"{'–' if worse is None or worse != worse else f'{100 * worse:.0f} %'} | {target} |")
    return "\n".join(lines) + "\n"


MANIFEST = "compare.yaml"  # what a comparison runs: its algorithms and its config (for --resume)


def _with_address(configs: dict[str, Config], address: str | None) -> dict[str, Config]:
    if not address:
        return configs
    return {a: parse_config({**c.to_dict(), "ray": {**c.to_dict()["ray"], "address": address}})
            for a, c in configs.items()}


def compare(
    raw: Mapping[str, object] | Config, algorithms: list[str], out: str | Path | None = None,
    progress: str | None = None, address: str | None = None,
) -> Path:
    """Run every algorithm; return the comparison directory.

    The comparison directory is written in place, beside ``compare.yaml`` (its algorithms and
    config); ``comparison.md``, written last, marks it complete. A failure or a signal keeps
    every run it finished or checkpointed, says where, and ``raysoft compare --resume DIR``
    (:func:`resume_compare`) runs only what is missing; a comparison that kept nothing is removed.
    """
    configs = _with_address(algorithm_configs(raw, algorithms), address)  # validate all before running any
    cfg = next(iter(configs.values()))
    if is_uri(str(out or cfg.output.dir)):
        raise ConfigError("output.dir: raysoft compare writes to a local folder (not a URI)")
    for c in configs.values():  # before Ray starts: every algorithm's client actors must fit
        check_resources(c)
    labels = _labels(configs)
    out_dir = _prepare_out(str(out or cfg.output.dir))
    name = f"compare-{short_name(cfg.data.name)}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    final = out_dir / name
    final.mkdir()
    try:
        base = raw.to_dict() if isinstance(raw, Config) else dict(raw)
        _write_atomic(final / MANIFEST, yaml.safe_dump({"algorithms": list(algorithms), "config": base},
                                                       sort_keys=False))
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)
        raise
    return _run_all(final, configs, labels, progress, address, fresh=True)


def resume_compare(path: str | Path, progress: str | None = None, address: str | None = None) -> Path:
    """Continue an interrupted or failed comparison in ``path``: its finished runs are kept,
    a run with a directory (checkpointed) is resumed, the others run; return ``path``."""
    d = Path(path)
    if not (d / MANIFEST).is_file():
        raise ConfigError(f"--resume: {str(d)!r} is not a comparison directory (no {MANIFEST})")
    if (d / "comparison.md").is_file():
        raise ConfigError(f"--resume: {str(d)!r} is already complete")
    try:
        manifest = yaml.safe_load((d / MANIFEST).read_text())
        algorithms, raw = list(manifest["algorithms"]), dict(manifest["config"])
    except Exception as err:  # noqa: BLE001 - any unreadable manifest is one line
        raise ConfigError(f"--resume: {str(d / MANIFEST)!r} is not readable ({type(err).__name__})") from None
    configs = _with_address(algorithm_configs(raw, algorithms), address)
    for c in configs.values():
        check_resources(c)
    return _run_all(d.absolute(), configs, _labels(configs), progress, address, fresh=False)


def _labels(configs: dict[str, Config]) -> dict[str, str]:
    labels = {a: short_name(a) for a in configs}
    if len(set(labels.values())) != len(labels):
        raise ConfigError(f"--algorithms: two algorithms would share a run folder ({', '.join(labels)})")
    return labels


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _run_one(d: Path, cfg: Config, label: str, progress: str | None, address: str | None) -> Path:
    """One algorithm's run directory in the comparison ``d``: kept if finished, resumed if it has
    one (a checkpointed run writes in place), else run."""
    run_dir = d / label
    if (run_dir / "summary.json").is_file():
        return run_dir
    if (run_dir / "config.yaml").is_file():
        return resume(run_dir, address=address, progress=progress).run_dir
    shutil.rmtree(d / f".{label}.partial", ignore_errors=True)  # a run without checkpoints killed mid-way
    return run(cfg, out=d, progress=progress, dir_name=label).run_dir


def _kept(d: Path, labels: dict[str, str]) -> tuple[list[str], list[str]]:
    """The algorithms whose runs in ``d`` are finished, and those kept resumable."""
    done = [a for a, label in labels.items() if (d / label / "summary.json").is_file()]
    resumable = [a for a, label in labels.items() if a not in done and (d / label / "config.yaml").is_file()]
    return done, resumable


def _kept_line(d: Path, done: list[str], resumable: list[str]) -> str:
    parts = [f"finished: {', '.join(done)}"] if done else []
    parts += [f"resumable: {', '.join(resumable)}"] if resumable else []
    return (f"the comparison is kept in {d} ({'; '.join(parts) or 'nothing run yet'}); "
            f"continue with: raysoft compare --resume {d}")


def _run_all(d: Path, configs: dict[str, Config], labels: dict[str, str], progress: str | None,
             address: str | None, fresh: bool) -> Path:
    """Run (or keep, or resume) every algorithm's run in ``d``, then write the tables. A failure
    or a signal keeps ``d`` with what it holds and says so; a fresh comparison that holds no
    run is removed."""
    cfg = next(iter(configs.values()))
    started = False
    with stop_on_signals():
        try:
            if cfg.ray.backend == "ray":
                from .backends.session import connect

                started = connect(cfg.ray)  # one Ray session for every algorithm
            rows, runs = [], []
            for algo, c in configs.items():
                runs.append(load_run(_run_one(d, c, labels[algo], progress, address)))
                rows += _row(algo, runs[-1])
            pd.DataFrame(rows).to_parquet(d / "comparison.parquet", index=False)
            from .report.driver import comparison_figures  # matplotlib, only once there is something to draw

            served = clients_table(list(configs), runs)
            served.to_parquet(d / "comparison_clients.parquet", index=False)
            figures = comparison_figures(runs, d)  # each only where some run has what it shows
            text = comparison_markdown(runs, d, figures) + "\n" + clients_markdown(served)
            _write_atomic(d / "comparison.md", text)  # last: the comparison is complete
        except BaseException as err:
            done, resumable = _kept(d, labels)
            if fresh and not done and not resumable:  # nothing to keep: the run said what it removed
                shutil.rmtree(d, ignore_errors=True)
                raise
            line = _kept_line(d, done, resumable)
            if isinstance(err, KeyboardInterrupt):
                signum = getattr(err, "signum", signal.SIGINT)
                raise Interrupted(signum, f"comparison stopped by {signal.Signals(signum).name}; {line}") from None
            err.add_note(f"{line[0].upper()}{line[1:]}.")
            raise
        finally:
            if started:
                from .backends.session import shutdown

                shutdown()
    return d
