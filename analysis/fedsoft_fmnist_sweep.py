"""FedSoft on rotated Fashion-MNIST (jobs/compare_fmnist.yaml): a sweep over the proximal weight
lambda, where a local solve starts (``algorithm.start``) and the optimiser, to find whether any
documented setting gives FedSoft's centers the accuracy of FedAvg's global model.

    .venv/bin/python analysis/fedsoft_fmnist_sweep.py [--settings start=mixture,opt=sgd,lam=0.1 ...]
        [--rounds 25] [--eval-every 5] [--fedavg] [--set k=v ...]

Every setting runs the comparison's clients, data, seed, CNN, batch 32 and one local epoch (the
same local sample-passes as the other methods); ``opt=sgd`` is the comparison's SGD (lr 0.05,
momentum 0.9), ``opt=adam`` the FedSoft reference code's Adam for its CIFAR CNN (lr 5e-4).
``--fedavg`` adds FedAvg on the same budget as the reference line. Prints one Markdown row per
run as it finishes: each distribution's best center (accuracy %, index), the mean accuracy of the
clients' own models (w-bar), the weight MAE, and the coupling diagnostic (mean over the round's
trained clients of ||w_k - sum_s u_ks c_s||) at the last round. ``raysoft report`` on the printed
run directories draws the curves.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

import raysoft
from raysoft.compare import algorithm_configs
from raysoft.config import COMPARE_DEFAULT, ConfigError, load_raw
from raysoft.options import add_overrides
from raysoft.report.analysis import local_means
from raysoft.report.load import load_run

JOB = Path(__file__).parent.parent / "jobs" / "compare_fmnist.yaml"
OPTIMISERS = {
    "sgd": ["train.optimizer=sgd", "train.lr=0.05", "train.momentum=0.9"],
    "adam": ["train.optimizer=adam", "train.lr=0.0005", "train.momentum=0.0"],
}
DEFAULT = [
    "start=mixture,opt=sgd,lam=0.1", "start=local,opt=sgd,lam=0.1",
    "start=mixture,opt=adam,lam=0.1", "start=local,opt=adam,lam=0.1",
    "start=local,opt=sgd,lam=1.0", "start=mixture,opt=sgd,lam=1.0",
    "start=mixture,opt=sgd,lam=0.01", "start=local,opt=adam,lam=1.0",
]


def overrides(setting: str) -> list[str]:
    """Config overrides of one ``start=..,opt=..,lam=..`` setting."""
    kv = dict(part.split("=", 1) for part in setting.split(","))
    if set(kv) != {"start", "opt", "lam"} or kv["opt"] not in OPTIMISERS:
        raise SystemExit(f"--settings: expected start=local|mixture,opt=sgd|adam,lam=FLOAT, got {setting!r}")
    return [f"algorithm.start={kv['start']}", f"algorithm.prox_weight={kv['lam']}", *OPTIMISERS[kv["opt"]]]


def row(label: str, run_dir: Path) -> str:
    """The table row of one run directory."""
    run = load_run(run_dir)
    s = run.summary
    by = {d["distribution"]: d for d in s.get("distributions", [])}
    centers = " | ".join(f"{100 * by[k][run.metric]:.1f} ({by[k]['best_center']})" if k in by else "–"
                         for k in (0, 1))
    coupling = "–"
    diag = run_dir / "diagnostics.parquet"
    if diag.exists():
        d = pd.read_parquet(diag)
        d = d[d.name == "coupling"]
        if len(d):
            coupling = f"{d.sort_values('step').value.iloc[-1]:.2f}"
    mae = s.get("weight_mae")
    return (f"| {label} | {centers} | {100 * local_means(run)[0]:.1f} | "
            f"{'–' if mae is None else f'{mae:.3f}'} | {coupling} | {s['wall_time_s']:.0f} s |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", nargs="+", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--fedavg", action="store_true")
    ap.add_argument("--out", default="runs/fedsoft_sweep")
    add_overrides(ap)
    ap.add_argument("--rows", nargs="+", metavar="LABEL=RUN_DIR", default=[],
                    help="print the rows of runs made before, instead of running")
    args = ap.parse_args()
    header = ("| setting | c*[0] (index) | c*[1] (index) | w̄ | weight MAE | coupling | run time |\n"
              "|---|---|---|---|---|---|---|")
    if args.rows:
        print(header)
        for item in args.rows:
            label, _, path = item.partition("=")
            print(row(label, Path(path)))
        return
    # the job's regimes dropped: every setting names its own optimiser (a regime would win over it)
    budget = ["regimes={}", f"algorithm.rounds={args.rounds}", f"algorithm.eval_every={args.eval_every}",
              "output.progress=none"]
    runs = [(s, "fedsoft", overrides(s)) for s in args.settings]
    if args.fedavg:
        runs.insert(0, ("fedavg", "fedavg", []))
    try:  # every run's config checked before the first run starts
        cfgs = [algorithm_configs(load_raw(JOB, over + budget + args.overrides), list(COMPARE_DEFAULT))[algo]
                for _, algo, over in runs]
    except ConfigError as err:
        ap.error(str(err))
    print(header, flush=True)
    for (label, _, _), cfg in zip(runs, cfgs):
        r = raysoft.run(cfg, out=args.out)
        print(row(label, r.run_dir), flush=True)
        print(f"{label}: {r.run_dir}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
