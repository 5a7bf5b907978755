"""Reproduce FPFC's Table 1 (FPFC, AAAI'23): FPFC, FPFC-l1, IFCA (told L = 4), FedAvg and Local
on FPFC's synthetic data (m = 100 devices in L = 4 clusters), over several seeds.

    .venv/bin/python jobs/fpfc_table.py [--seeds 0 1 2] [--methods fpfc ifca ...] [--set k=v ...]

Every method uses jobs/fpfc_synthetic.yaml's data, model, local solver (10 full-batch gradient
steps, lr 0.1) and participation (30 devices a round); ``--rounds-baselines`` sets the rounds of
IFCA/FedAvg/Local (default: the job's 2000). Acc is the mean over devices of per-device test
accuracy (on each device's own 20% test split), after FPFC's final cluster averaging. Prints one
Markdown row per method as mean +- std over seeds, as soon as the method is done.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import raysoft

JOB = Path(__file__).parent / "fpfc_synthetic.yaml"
METHODS = {"fpfc": "", "fpfc_l1": "", "ifca": "num_centers: 4, ", "fedavg": "", "local": ""}


def overrides(method: str, rounds_baselines: int | None) -> list[str]:
    """Config overrides of one method; baselines evaluate once, at the end, like FPFC's table."""
    if method.startswith("fpfc"):
        return [f"algorithm.name={method}"]
    rounds = rounds_baselines or raysoft.load_config(JOB).algorithm.rounds
    return [f"algorithm={{name: {method}, {METHODS[method]}clients_per_round: 30, rounds: {rounds}, "
            f"eval_every: {rounds}}}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--rounds-baselines", type=int, default=None)
    ap.add_argument("--out", default="runs/fpfc_table")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    print("| method | Acc | Num | ARI | rounds | s/run |\n|---|---|---|---|---|---|", flush=True)
    for method in args.methods:
        accs, nums, aris, secs, rounds = [], [], [], [], 0
        for seed in args.seeds:
            over = [*overrides(method, args.rounds_baselines), f"seed={seed}", "output.progress=none"]
            r = raysoft.run(raysoft.load_config(JOB, over + args.overrides), out=args.out)
            rounds = r.summary["rounds"]
            accs.append(r.summary["local_mean"]["test_accuracy"])
            nums.append(r.summary.get("num_clusters", np.nan))
            aris.append(r.summary.get("ari", np.nan))
            secs.append(r.summary["wall_time_s"])
        fmt = lambda xs, f: "x" if np.isnan(xs).all() else f"{np.mean(xs):{f}} ± {np.std(xs):{f}}"  # noqa: E731
        print(f"| {method} | {100 * np.mean(accs):.2f}% ± {100 * np.std(accs):.2f} | {fmt(nums, '.2f')} | "
              f"{fmt(aris, '.2f')} | {rounds} | {np.mean(secs):.0f} |", flush=True)


if __name__ == "__main__":
    main()
