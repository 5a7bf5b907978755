"""How much of CCFL's cluster accuracy is its pre-training: the same stream run with the cluster
models pre-trained for different numbers of epochs (``algorithm.pretrain_epochs``, which the
paper does not give; the jobs use 5).

    .venv/bin/python analysis/ccfl_pretraining_epochs.py [--job jobs/ccfl_fmnist_k4_small.yaml]
        [--epochs 5 20 50] [--uploads N] [--set k=v ...] [--out runs/ccfl_pretraining_epochs]

One Markdown row per value, printed as soon as its run is done: the cluster models' accuracy on
their own distribution straight after pre-training (the evaluation at upload 0) and at the end,
summary.json's cluster_acc (averaged over every evaluation, the figure the results tables give),
Cli Bfr, Cli Aft, the mean KL, and the run's wall time. ``--uploads`` cuts the stream (0 leaves it
as the job sets it), e.g. to read only the pre-trained accuracy of the paper-scale job.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import raysoft
from raysoft.config import ConfigError
from raysoft.options import add_overrides


def own_accuracy(metrics: pd.DataFrame, step: int) -> float:
    """Mean over clusters k of cluster model k's accuracy on distribution k at ``step``."""
    c = metrics[(metrics.scope == "cluster") & (metrics.metric == "accuracy") & (metrics.step == step)]
    return float(c[c.entity == c.eval_dist].value.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default=str(Path(__file__).parent.parent / "jobs" / "ccfl_fmnist_k4_small.yaml"))
    ap.add_argument("--epochs", type=int, nargs="+", default=[5, 20, 50])
    ap.add_argument("--uploads", type=int, default=0, help="uploads T of each run; 0: the job's")
    ap.add_argument("--out", default="runs/ccfl_pretraining_epochs")
    add_overrides(ap)
    args = ap.parse_args()
    if args.uploads < 0 or min(args.epochs) < 0:
        ap.error("--uploads and --epochs must be >= 0")
    cut = [f"algorithm.rounds={args.uploads}", f"algorithm.eval_every={args.uploads}"] if args.uploads else []
    try:  # every run's config checked before the first run starts
        cfgs = {e: raysoft.load_config(args.job, [f"algorithm.pretrain_epochs={e}", *cut, "output.progress=none",
                                                  *args.overrides]) for e in args.epochs}
    except ConfigError as err:
        ap.error(str(err))
    print("| pretrain epochs | cluster after pre-training | cluster at the end | cluster_acc (mean) | Cli Bfr | "
          "Cli Aft | KL | uploads | s |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    for e, cfg in cfgs.items():
        run = raysoft.run(cfg, out=args.out)
        m, s = run.metrics, run.summary
        last = int(m[m.scope == "cluster"].step.max())
        print(f"| {e} | {own_accuracy(m, 0):.3f} | {own_accuracy(m, last):.3f} | {s['cluster_acc']:.3f} | "
              f"{s['cli_bfr']:.3f} | {s['cli_aft']:.3f} | {s['kl']:.3f} | {s['rounds']} | "
              f"{s['wall_time_s']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
