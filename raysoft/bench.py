"""``raysoft bench``: seconds per round of raysoft against the bare loop and Flower.

Each (workload, system) pair runs in a subprocess of this command (one process tree, one
sitting) while a sampler sums the resident memory of that subprocess and all its descendants
(Ray's raylet and workers included) every 0.2 s. Systems:

* ``raysoft``: the workload's config through :func:`raysoft.backends.run_backend` on local Ray
  (Ray's start-up is outside the per-round times, inside the total);
* ``bare``: one process, one model per client step, a plain Python loop over the selected clients
  with ``torch.optim`` and the same local steps and averaging (the same maths: the pure
  FedSoft sub-steps and the same client selection streams) - the honest floor of a naive
  implementation;
* ``flower``: W2's FedAvg in Flower's Ray simulation, in a virtual environment of its own
  (Flower pins another Ray release), on the very clients, selections and initial model of the
  bare loop (exported to an ``.npz``); see :mod:`raysoft.bench_flower`.

A round's time is the median over the rounds after the first (the warm-up); for W3 (a stream)
a "round" is N uploads, one per client on average.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .config import ConfigError, parse_config

WORKLOADS = ("W1", "W2", "W3")
SYSTEMS = {"W1": ("raysoft", "bare"), "W2": ("raysoft", "bare", "flower"), "W3": ("raysoft",)}
DEFAULT_ROUNDS = {"W1": 6, "W2": 6, "W3": 0}  # W3: 0 = 200 uploads
COLUMNS = ["workload", "system", "sec_per_round", "updates_per_s", "peak_rss_mb", "peak_pss_mb", "rounds",
           "updates_per_round",
           "quality", "quality_metric", "total_s"]


# ----------------------------------------------------------------------------- the workloads
def workload_config(name: str, rounds: int, quick: bool = False) -> dict[str, Any]:
    """The config of a reference workload (``quick``: a small version, for a smoke test)."""
    if name == "W1":  # FedSoft, synthetic linear regression (jobs/fedsoft_synthetic.yaml)
        clients, k = (10, 6) if quick else (100, 60)
        return {
            "seed": 0,
            "algorithm": {"name": "fedsoft", "rounds": rounds, "clients_per_round": k, "estimation_interval": 2,
                          "sigma": 1e-4, "prox_weight": 1.0, "eval_every": rounds},
            "data": {"name": "synthetic", "clients": clients, "distributions": 2, "partition": "10:90",
                     "theta_std": 10.0},
            "model": {"name": "linear", "init": "xavier_normal"},
            "train": {"optimizer": "adam", "lr": 0.005, "batch_size": 10, "local_epochs": 10},
            "ray": {"num_cpus": 2, "num_cpus_per_actor": 1},
        }
    if name == "W2":  # FedAvg, rotated Fashion-MNIST 0/180, the 28x28 CNN
        clients, k, channels, hidden = (10, 6, [8, 16], 64) if quick else (100, 60, [32, 64], 512)
        return {
            "seed": 0,
            "algorithm": {"name": "fedavg", "rounds": rounds, "clients_per_round": k, "eval_every": rounds},
            "data": {"name": "fmnist", "clients": clients, "distributions": 2, "partition": "10:90",
                     "rotations": [0, 180], "test_samples": 1000},
            "model": {"name": "cnn", "channels": channels, "hidden": hidden},
            "train": {"optimizer": "sgd", "lr": 0.05 if quick else 0.01, "momentum": 0.0, "batch_size": 32, "local_epochs": 1,
                      "shuffle": True},
            "ray": {"num_cpus": 2, "num_cpus_per_actor": 1},
        }
    if name == "W3":  # CCFL, rotated Fashion-MNIST K = 4, 80 clients, 200 uploads (rounds: N uploads each)
        clients = 8 if quick else 80
        uploads = rounds * clients if rounds else 200
        return {
            "seed": 0,
            "algorithm": {"name": "ccfl", "rounds": uploads, "eval_every": uploads,
                          "public_samples": 100 if quick else 400, "pretrain_epochs": 1,
                          "loss_reduction": "paper_scale", "alpha0": 0.025},
            "data": {"name": "fmnist", "clients": clients, "distributions": 4, "partition": "random",
                     "samples_min": 100 if quick else 500, "samples_max": 200 if quick else 2000,
                     "test_samples": 200 if quick else 1000},
            "model": {"name": "cnn", "channels": [8, 16] if quick else [16, 32], "hidden": 64 if quick else 128},
            "train": {"optimizer": "adam", "lr": 0.001, "batch_size": 128, "local_epochs": 1, "shuffle": True},
            "ray": {"num_cpus": 2},
        }
    raise ConfigError(f"--workload: unknown workload {name!r} (known: {', '.join(WORKLOADS)})")


# ----------------------------------------------------------------------------- memory
def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree_memory_mb(root: int) -> tuple[float, float]:
    """(RSS, PSS) of ``root`` and all its descendants, summed, in MB (Linux /proc). RSS counts a
    page shared by several processes (torch's libraries, Ray's object store) once per process;
    PSS splits it between them, so the PSS sum is the tree's real footprint."""
    kids = _children_map()
    todo, rss, pss, page = [root], 0, 0, os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        todo.extend(kids.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * page
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss += next(int(ln.split()[1]) for ln in f if ln.startswith("Pss:")) * 1024
        except (OSError, StopIteration):
            continue
    return rss / 2**20, pss / 2**20


class PeakSampler:
    """Samples :func:`tree_memory_mb` of a process every ``interval`` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval, self.peak, self.peak_pss = pid, interval, 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss, pss = tree_memory_mb(self.pid)
            self.peak, self.peak_pss = max(self.peak, rss), max(self.peak_pss, pss)
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def round_stats(times: list[float], updates: list[int]) -> tuple[float, float]:
    """(median seconds per round after the warm-up round, client updates per second over the
    same rounds)."""
    if not times:
        raise ValueError("no rounds were timed")
    timed = times[1:] or times
    done = updates[1:] or updates
    return float(np.median(timed)), float(sum(done) / sum(timed))


# ----------------------------------------------------------------------------- the systems
def _quality_of(tables: dict[str, Any], summary: dict[str, Any], workload: str) -> tuple[float, str]:
    """W1: mean over distributions of the best center's MSE; W2: the mean holdout accuracy of
    the global model; W3: the mean cluster-model accuracy of the last evaluation."""
    m = tables["metrics"].to_pandas()
    m = m[(m["scope"] == "cluster") & (m["step"] == m["step"].max())]
    if workload == "W1":
        best = m[m["metric"] == "mse"].groupby("eval_dist")["value"].min()
        return float(best.mean()), "center mse"
    acc = m[m["metric"] == "accuracy"]
    if workload == "W2":
        return float(acc[acc["entity"] == 0]["value"].mean()), "accuracy"
    return float(acc.groupby("eval_dist")["value"].max().mean()), "cluster accuracy"


def run_raysoft(workload: str, raw: dict[str, Any]) -> dict[str, Any]:
    from .api import check_data
    from .backends import run_backend

    cfg = check_data(parse_config(raw))
    marks: list[tuple[float, int, int]] = []

    def on_progress(info: dict[str, Any]) -> None:
        marks.append((time.monotonic(), int(info["round"]), int(info.get("trained") or 0)))

    start = time.monotonic()
    tables, summary = run_backend(cfg, "bench", on_progress)
    total = time.monotonic() - start
    if workload == "W3":  # a "round" is N uploads; the first advance is the initial evaluation
        n = cfg.data.clients
        times, updates = [], []
        for (t0, r0, _), (t1, r1, _) in zip(marks[1:], marks[2:]):
            if r1 > r0:
                times.append((t1 - t0) * n / (r1 - r0))
                updates.append(n)
    else:
        times = [b[0] - a[0] for a, b in zip(marks, marks[1:])]
        updates = [b[2] for b in marks[1:]]
    quality, metric = _quality_of(tables, summary, workload)
    return {"sec_per_round_all": times, "updates": updates, "quality": quality, "quality_metric": metric,
            "total_s": total}


def _bare_setup(raw: dict[str, Any]):
    import torch

    from .algorithms.base import ServerContext
    from .data import Federation
    from .models import build_model

    cfg = parse_config(raw)
    fed = Federation(cfg.data, cfg.seed)
    ctx = ServerContext(cfg=cfg, sizes=fed.sizes, info=fed.info)
    data = [fed.client_data(k) for k in range(fed.num_clients)]
    torch.set_num_threads(2)
    return cfg, fed, ctx, data, build_model


def _sgd_epochs(model, opt, x, y, task, cfg, rng) -> None:
    """The plain local loop: shuffled mini-batches, mean loss, backward, step."""
    import torch.nn.functional as F

    model.train()
    for _ in range(cfg.train.local_epochs):
        order = rng.permutation(len(y)) if cfg.train.shuffle else np.arange(len(y))
        for i in range(0, len(y), cfg.train.batch_size):
            idx = order[i:i + cfg.train.batch_size]
            out = model(x[idx])
            loss = F.mse_loss(out, y[idx]) if task == "regression" else F.cross_entropy(out, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()


def bare_fedavg(raw: dict[str, Any], export: Path | None = None) -> dict[str, Any]:
    """FedAvg as a plain loop; ``export`` writes its clients, selections and initial model for
    Flower."""
    import torch
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from .algorithms.common import uniform_selection
    from .rng import numpy_rng

    start = time.monotonic()
    cfg, fed, ctx, data, build_model = _bare_setup(raw)
    a, n = cfg.algorithm, fed.sizes
    glob = ctx.new_model("center", 0)
    selections = [uniform_selection(fed.num_clients, a.clients_per_round, numpy_rng(cfg.seed, "select", t))
                  for t in range(a.rounds)]
    holdouts = [fed.holdout(s) for s in range(fed.num_distributions)]
    if export is not None:
        arrays: dict[str, Any] = {f"init_{i}": p.detach().numpy() for i, p in enumerate(glob.parameters())}
        for k, d in enumerate(data):
            arrays[f"x_{k}"], arrays[f"y_{k}"] = d.x.numpy(), d.y.numpy()
        arrays.update(
            num_clients=fed.num_clients, selection=np.array(selections, dtype=np.int64),
            x_test=torch.cat([h[0] for h in holdouts]).numpy(), y_test=torch.cat([h[1] for h in holdouts]).numpy(),
            lr=cfg.train.lr, momentum=cfg.train.momentum, batch_size=cfg.train.batch_size,
            local_epochs=cfg.train.local_epochs, seed=cfg.seed, channels=np.array(cfg.model.channels),
            hidden=cfg.model.hidden, classes=fed.info.num_outputs,
        )
        np.savez(export, **arrays)
    local = ctx.new_model("center", 0)
    times = []
    for t, sel in enumerate(selections):
        t0 = time.monotonic()
        g = parameters_to_vector(glob.parameters()).detach().clone()
        acc = torch.zeros_like(g)
        for k in sel:
            vector_to_parameters(g.clone(), local.parameters())
            opt = torch.optim.SGD(local.parameters(), lr=cfg.train.lr, momentum=cfg.train.momentum)
            _sgd_epochs(local, opt, data[k].x, data[k].y, fed.info.task, cfg,
                        numpy_rng(cfg.seed, "shuffle", k, t))
            acc += float(n[k]) * parameters_to_vector(local.parameters()).detach()
        vector_to_parameters(acc / float(sum(n[k] for k in sel)), glob.parameters())
        times.append(time.monotonic() - t0)
    glob.eval()
    with torch.no_grad():
        accs = [float((glob(x).argmax(-1) == y).float().mean()) for x, y in holdouts]
    return {"sec_per_round_all": times, "updates": [len(s) for s in selections], "quality": float(np.mean(accs)),
            "quality_metric": "accuracy", "total_s": time.monotonic() - start}


def bare_fedsoft(raw: dict[str, Any]) -> dict[str, Any]:
    """FedSoft (Algorithm 1) as a plain loop over clients, with FedSoft's pure sub-steps."""
    import torch
    import torch.nn.functional as F
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from .algorithms.fedsoft import importance_weights, select_clients, selection_probabilities
    from .rng import numpy_rng

    start = time.monotonic()
    cfg, fed, ctx, data, build_model = _bare_setup(raw)
    a, lam = cfg.algorithm, cfg.algorithm.prox_weight
    S, N = int(a.num_centers or fed.num_distributions), fed.num_clients
    centers = torch.stack([parameters_to_vector(ctx.new_model("center", s).parameters()).detach() for s in range(S)])
    models = [ctx.new_model("client_init") for _ in range(N)]
    opts = [torch.optim.Adam(m.parameters(), lr=cfg.train.lr) for m in models]
    scratch = ctx.new_model("client_init")
    u = np.full((N, S), 1.0 / S)
    times, updates = [], []
    for t in range(a.rounds):
        t0 = time.monotonic()
        if t % a.estimation_interval == 0:
            with torch.no_grad():
                for k in range(N):
                    losses = []
                    for s in range(S):
                        vector_to_parameters(centers[s].clone(), scratch.parameters())
                        losses.append(((scratch(data[k].x) - data[k].y) ** 2).numpy())
                    u[k] = importance_weights(np.stack(losses), a.sigma)
        selected = select_clients(selection_probabilities(u, fed.sizes), a.clients_per_round,
                                  numpy_rng(cfg.seed, "select", t))
        trainers = sorted({int(k) for sel in selected for k in sel})
        trained = {}
        for k in trainers:
            uk = torch.as_tensor(u[k], dtype=torch.float32)
            model, opt, x, y = models[k], opts[k], data[k].x, data[k].y
            rng = numpy_rng(cfg.seed, "shuffle", k, t)
            for _ in range(cfg.train.local_epochs):
                order = rng.permutation(len(y))
                for i in range(0, len(y), cfg.train.batch_size):
                    idx = order[i:i + cfg.train.batch_size]
                    w = parameters_to_vector(model.parameters())
                    prox = 0.5 * lam * (uk * ((w[None, :] - centers) ** 2).sum(dim=1)).sum()
                    loss = F.mse_loss(model(x[idx]), y[idx]) + prox
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            trained[k] = parameters_to_vector(model.parameters()).detach().clone()
        centers = torch.stack([torch.stack([trained[int(k)] for k in sel]).mean(0) if len(sel) else centers[s]
                               for s, sel in enumerate(selected)])
        times.append(time.monotonic() - t0)
        updates.append(len(trainers))
    with torch.no_grad():
        mse = []
        for s in range(fed.num_distributions):
            x, y = fed.holdout(s)
            errs = []
            for c in centers:
                vector_to_parameters(c.clone(), scratch.parameters())
                errs.append(float(((scratch(x) - y) ** 2).mean()))
            mse.append(min(errs))
    return {"sec_per_round_all": times, "updates": updates, "quality": float(np.mean(mse)),
            "quality_metric": "center mse", "total_s": time.monotonic() - start}


# ----------------------------------------------------------------------------- orchestration
def _worker(argv: list[str]) -> int:
    """``python -m raysoft.bench --worker SYSTEM WORKLOAD ROUNDS QUICK OUT_JSON [EXPORT]``."""
    system, workload, rounds, quick, out = argv[:5]
    export = Path(argv[5]) if len(argv) > 5 else None
    raw = workload_config(workload, int(rounds), quick == "1")
    if system == "raysoft":
        res = run_raysoft(workload, raw)
    elif workload == "W1":
        res = bare_fedsoft(raw)
    else:
        res = bare_fedavg(raw, export)
    Path(out).write_text(json.dumps(res))
    return 0


def _measure(label: str, cmd: list[str], out_json: Path, timeout: float | None) -> tuple[dict[str, Any], PeakSampler]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # always a fresh local Ray of the subprocess's own
    with tempfile.TemporaryFile() as err:
        # its own process group (Ray's processes join it): a timeout kills all of them
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
        with PeakSampler(proc.pid) as sampler:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise RuntimeError(f"{label}: timed out after {timeout} s") from None
        if code != 0:
            err.seek(0)
            lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
            raise RuntimeError(f"{label}: exit {code}: {lines[-1] if lines else ''}")
    return json.loads(out_json.read_text()), sampler


def bench(workloads: list[str], rounds: int | None, out: Path, quick: bool, flower: str,
          timeout: float | None = None) -> "Any":
    """Run every (workload, system); write ``bench.parquet`` and return its table."""
    import pandas as pd

    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="raysoft-bench-"))
    for w in workloads:
        r = rounds or (3 if quick else DEFAULT_ROUNDS[w])  # W3: rounds of N uploads (0: 200 uploads)
        export = scratch / f"{w}.npz"
        for system in SYSTEMS[w]:
            res_path = scratch / f"{w}-{system}.json"
            if system == "flower":
                if flower == "skip":
                    continue
                from .flower_env import ensure_flower_venv, run_flower

                own = tree_memory_mb(os.getpid())  # this process alone: no children now
                with PeakSampler(os.getpid()) as sampler:  # this process plus Flower's tree
                    flwr = run_flower(ensure_flower_venv(Path(flower)), export, res_path, num_actors=2,
                                      timeout=timeout)
                sampler.peak, sampler.peak_pss = sampler.peak - own[0], sampler.peak_pss - own[1]
                res = {"sec_per_round_all": flwr["sec_per_round"], "quality": flwr["accuracy"],
                       "quality_metric": "accuracy", "total_s": flwr["total_s"],
                       "updates": [flwr["clients_per_round"]] * len(flwr["sec_per_round"])}
            else:
                cmd = [sys.executable, "-m", "raysoft.bench", "--worker", system, w, str(r), "1" if quick else "0",
                       str(res_path)] + ([str(export)] if system == "bare" and w == "W2" else [])
                res, sampler = _measure(f"{w} {system}", cmd, res_path, timeout)
            sec, ups = round_stats(res["sec_per_round_all"], res["updates"])
            rows.append({"workload": w, "system": system, "sec_per_round": sec, "updates_per_s": ups,
                         "peak_rss_mb": sampler.peak, "peak_pss_mb": sampler.peak_pss,
                         "rounds": len(res["sec_per_round_all"]),
                         "updates_per_round": float(np.mean(res["updates"])), "quality": res["quality"],
                         "quality_metric": res["quality_metric"], "total_s": res["total_s"]})
            print(f"{w} {system}: {sec:.3f} s/round, {ups:.1f} updates/s, peak RSS {sampler.peak:.0f} MB, "
                  f"PSS {sampler.peak_pss:.0f} MB", file=sys.stderr)
    table = pd.DataFrame(rows, columns=COLUMNS)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".bench.parquet.tmp"
    table.to_parquet(tmp, index=False)
    os.replace(tmp, out / "bench.parquet")
    (out / "bench.md").write_text(markdown(table))
    return table


def markdown(table: "Any") -> str:
    """The bench table, with raysoft's speed-up over each other system of the same workload."""
    lines = ["| workload | system | s / round | updates / s | peak RSS (MB) | peak PSS (MB) | quality | raysoft speed-up |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        ray = table[(table["workload"] == r["workload"]) & (table["system"] == "raysoft")]["sec_per_round"]
        ratio = "–" if r["system"] == "raysoft" or ray.empty else f"{r['sec_per_round'] / float(ray.iloc[0]):.2f}×"
        lines.append(f"| {r['workload']} | {r['system']} | {r['sec_per_round']:.3f} | {r['updates_per_s']:.1f} | "
                     f"{r['peak_rss_mb']:.0f} | {r['peak_pss_mb']:.0f} | {r['quality']:.4g} ({r['quality_metric']}) | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker(argv[1:])
    p = argparse.ArgumentParser(prog="raysoft bench", description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="W1,W2,W3", help="comma-separated: W1, W2, W3 (default: all)")
    p.add_argument("--rounds", type=int, help="rounds to time (default: W1 6, W2 6; W3 200 uploads, or this many rounds of N uploads)")
    p.add_argument("--out", default="runs/bench", help="where bench.parquet goes (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a small version of each workload (a smoke test)")
    p.add_argument("--flower", default=".venv-flower",
                   help="the Flower virtual environment (created on first use), or 'skip'")
    args = p.parse_args(argv)
    workloads = [w.strip() for w in args.workload.split(",") if w.strip()]
    try:
        for w in workloads:
            workload_config(w, 2)
        if args.rounds is not None and args.rounds < 2:
            raise ConfigError("--rounds: needs at least 2 (the first is the warm-up)")
        table = bench(workloads, args.rounds, Path(args.out), args.quick, args.flower)
    except ConfigError as err:
        print(f"raysoft bench: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"raysoft bench: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    print(markdown(table), end="")
    print(Path(args.out).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
