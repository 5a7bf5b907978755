"""Reproduce FedSoft's synthetic tables (FedSoft, AAAI'22: Table 1, S = 2; Table 3, S = 8).

    .venv/bin/python analysis/fedsoft_synthetic_tables.py [--seeds 0 1 2] [--out runs/tables] [--set k=v ...]

Runs each jobs/fedsoft_synthetic*.yaml once per seed on local Ray and prints Markdown tables:
the final test MSE of every center on every distribution's holdout set (averaged over seeds after
matching centers to distributions, so column j is "the center matched to distribution j"), and
the mean absolute error of the clients' importance weights against their true mixtures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import raysoft
from raysoft.config import ConfigError
from raysoft.options import add_overrides

JOBS = Path(__file__).parent.parent / "jobs"  # the job configs, beside this folder
TABLE1 = ["fedsoft_synthetic.yaml", "fedsoft_synthetic_30_70.yaml", "fedsoft_synthetic_linear.yaml",
          "fedsoft_synthetic_random.yaml"]
TABLE3 = ["fedsoft_synthetic_s8.yaml"]


def final_scores(result) -> np.ndarray:
    """[distribution, center] MSE at the last step, columns reordered by the matching."""
    m = result.metrics
    last = m[(m.scope == "cluster") & (m.metric == "mse") & (m.step == m.step.max())]
    score = last.pivot(index="eval_dist", columns="entity", values="value").to_numpy()
    order = [int(result.summary["matching"][str(d)]) for d in range(score.shape[0])]
    return score[:, order]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/tables")
    ap.add_argument("--jobs", nargs="+", default=TABLE1 + TABLE3)
    add_overrides(ap)
    args = ap.parse_args()
    try:  # every run's config checked before the first run starts
        cfgs = {(job, seed): raysoft.load_config(JOBS / job, [f"seed={seed}", "output.progress=none", *args.overrides])
                for job in args.jobs for seed in args.seeds}
    except ConfigError as err:
        ap.error(str(err))
    for job in args.jobs:
        scores, maes, locals_, distinct, secs = [], [], [], [], []
        for seed in args.seeds:
            r = raysoft.run(cfgs[job, seed], out=args.out)
            scores.append(final_scores(r))
            maes.append(r.summary["weight_mae"])
            locals_.append(r.summary["local_mean"]["mse"])
            distinct.append(r.summary["distinct_best_centers"])
            secs.append(r.summary["wall_time_s"])
        mean = np.mean(scores, axis=0)
        s = mean.shape[0]
        print(f"\n### {job} (seeds {args.seeds}; {np.mean(secs):.0f} s per run)\n")
        print("| test dist | " + " | ".join(f"c*({j})" for j in range(s)) + " |")
        print("|---" * (s + 1) + "|")
        for d in range(s):
            print(f"| {d} | " + " | ".join(f"{mean[d, j]:.1f}" for j in range(s)) + " |")
        print(f"\nweight MAE {np.mean(maes):.4f} (per seed {', '.join(f'{x:.4f}' for x in maes)}); "
              f"mean local-model MSE {np.mean(locals_):.1f}; distinct best centers in "
              f"{sum(distinct)}/{len(distinct)} runs", flush=True)


if __name__ == "__main__":
    main()
