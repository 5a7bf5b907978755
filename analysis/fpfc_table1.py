"""Reproduce FPFC's Table 1 (FPFC, AAAI'23): FPFC (both pair schedules), FPFC-l1, IFCA (told
L = 4), FedAvg and Local on FPFC's synthetic data (m = 100 devices in L = 4 clusters), over
several seeds, each method at the reference code's own budget.

    .venv/bin/python analysis/fpfc_table1.py [--seeds 0 1 2 3 4] [--methods fpfc local ...] [--set k=v ...]

Every method uses jobs/fpfc_synthetic.yaml's data, model and local solver (10 full-batch
gradient steps, lr 0.1) for 2000 rounds (``--rounds`` changes it). The budgets are the reference
code's:

- fpfc: the reference schedule (``pairs: code``, every pair that touches A_k), 30% of the
  devices a round; fpfc_paper: the paper's schedule (``pairs: paper``, pairs inside A_k);
- fpfc_l1: the group-lasso penalty with the reference README's lambda 0.2 and clustering
  threshold 4 (``algorithm.lam=0.2``, ``algorithm.nu=4``), reference schedule;
  fpfc_l1_reference: the same with the reference code's final grouping
  (``algorithm.grouping=neighbourhoods``: each device's neighbours within nu, not connected components);
- ifca (told L = 4) and fedavg: 30% of the devices a round; ifca_code: the reference code's own
  IFCA baseline (``algorithm.option=fpfc_code``: one gradient step a round, each center's models
  averaged over all the selected devices, so it shrinks by its share of them);
- oracle: IFCA told each device's true cluster (``assignment: oracle``), i.e. FedAvg on exactly
  one cluster's devices, 30% a round: the ceiling of a clustering on this data;
- local: every device in every round (the reference LOCAL baseline ignores the participation
  ratio), i.e. 2000 x 10 full-batch steps per device.

Acc is the mean over devices of per-device test accuracy (on each device's own 20% test split),
after FPFC's final cluster averaging; "4 clusters" counts the seeds whose clustering found
exactly L = 4 clusters. Prints each seed's line as it finishes (to stderr) and one Markdown row
per method, mean +- std over seeds, as soon as the method is done.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import raysoft
from raysoft.config import ConfigError
from raysoft.options import add_overrides

JOB = Path(__file__).parent.parent / "jobs" / "fpfc_synthetic.yaml"
M = 100  # devices in the job
METHODS: dict[str, list[str]] = {
    "fpfc": ["algorithm.pairs=code"],
    "fpfc_paper": ["algorithm.pairs=paper"],
    "fpfc_l1": ["algorithm.name=fpfc_l1", "algorithm.lam=0.2", "algorithm.nu=4", "algorithm.pairs=code"],
    "fpfc_l1_reference": ["algorithm.name=fpfc_l1", "algorithm.lam=0.2", "algorithm.nu=4", "algorithm.pairs=code",
                          "algorithm.grouping=neighbourhoods"],
    "ifca": ["algorithm={name: ifca, num_centers: 4, clients_per_round: 30}"],
    "ifca_code": ["algorithm={name: ifca, num_centers: 4, clients_per_round: 30, option: fpfc_code}"],
    "fedavg": ["algorithm={name: fedavg, clients_per_round: 30}"],
    "oracle": ["algorithm={name: ifca, num_centers: 4, clients_per_round: 30, assignment: oracle}"],
    "local": [f"algorithm={{name: local, clients_per_round: {M}}}"],
}


def overrides(method: str, rounds: int) -> list[str]:
    """Config overrides of one method. Baselines evaluate once, at the end, like FPFC's table."""
    over = list(METHODS[method])
    if method.startswith("fpfc"):
        return over + [f"algorithm.rounds={rounds}"]
    return over + [f"algorithm.rounds={rounds}", f"algorithm.eval_every={rounds}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--rounds", type=int, default=raysoft.load_config(JOB).algorithm.rounds)
    ap.add_argument("--out", default="runs/fpfc_table1")
    add_overrides(ap)
    args = ap.parse_args()
    try:  # every run's config checked before the first run starts
        cfgs = {(method, seed): raysoft.load_config(JOB, [*overrides(method, args.rounds), f"seed={seed}",
                                                          "output.progress=none", *args.overrides])
                for method in args.methods for seed in args.seeds}
    except ConfigError as err:
        ap.error(str(err))
    print("| method | Acc | Num | 4 clusters | ARI | rounds | s/run |\n|---|---|---|---|---|---|---|", flush=True)
    for method in args.methods:
        accs, nums, aris, secs = [], [], [], []
        for seed in args.seeds:
            r = raysoft.run(cfgs[method, seed], out=args.out)
            accs.append(r.summary["local_mean"]["test_accuracy"])
            nums.append(r.summary.get("num_clusters", np.nan))
            aris.append(r.summary.get("ari", np.nan))
            secs.append(r.summary["wall_time_s"])
            print(f"{method} seed {seed}: acc {100 * accs[-1]:.2f}% num {nums[-1]} ari {aris[-1]} "
                  f"{secs[-1]:.0f} s {r.run_dir}", file=sys.stderr, flush=True)
        fmt = lambda xs, f: "×" if np.isnan(xs).all() else f"{np.mean(xs):{f}} ± {np.std(xs):{f}}"  # noqa: E731
        fused = "×" if np.isnan(nums).all() else f"{sum(n == 4 for n in nums)} of {len(nums)}"
        print(f"| {method} | {100 * np.mean(accs):.2f}% ± {100 * np.std(accs):.2f} | {fmt(nums, '.2f')} | "
              f"{fused} | {fmt(aris, '.2f')} | {args.rounds} | {np.mean(secs):.0f} |", flush=True)


if __name__ == "__main__":
    main()
