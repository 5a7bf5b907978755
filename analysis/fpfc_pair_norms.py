"""FPFC's pair norms near the end of a run: how far apart ||theta_ij|| are within and between the
true clusters, how many clusters each threshold nu gives, and the devices' mean test accuracy
after averaging within those clusters (docs/results.md#fpfc-synthetic-data).

    .venv/bin/python analysis/fpfc_pair_norms.py [--rounds 2000] [--nu 1 2 4] [--set k=v ...]

Runs jobs/fpfc_synthetic.yaml as FPFC-l1 with the reference README's lambda 0.2 and the reference
pair schedule (``--set algorithm.name=fpfc`` for SCAD), in-process, with a checkpoint one round
before the end, and reads theta and the models from that checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

import raysoft
from raysoft.algorithms.fpfc import all_pairs, cluster_models, clusters, row_norms
from raysoft.config import ConfigError
from raysoft.data import Federation
from raysoft.models import build_model
from raysoft.options import add_overrides
from raysoft.params import set_flat

JOB = Path(__file__).parent.parent / "jobs" / "fpfc_synthetic.yaml"


def mean_accuracy(fed: Federation, model: torch.nn.Module, w: np.ndarray) -> float:
    """Mean over devices of the test accuracy of device k's model w[k] on its own test split."""
    out = []
    for k in range(w.shape[0]):
        d = fed.client_data(k)
        set_flat(model, torch.as_tensor(w[k]))
        with torch.no_grad():
            out.append((model(d.test_x).argmax(1) == d.test_y).float().mean().item())
    return float(np.mean(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--nu", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--out", default="runs/fpfc_pair_norms")
    add_overrides(ap)
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error(f"--rounds must be at least 2 (the checkpoint is one round before the end), got {args.rounds}")
    over = ["algorithm.name=fpfc_l1", "algorithm.lam=0.2", "algorithm.nu=4", "algorithm.pairs=code",
            f"algorithm.rounds={args.rounds}", f"algorithm.eval_every={args.rounds}",
            f"output.checkpoint_every={args.rounds - 1}", "ray.backend=inprocess", "output.progress=none"]
    try:
        cfg = raysoft.load_config(JOB, over + args.overrides)
    except ConfigError as err:
        ap.error(str(err))
    run = raysoft.run(cfg, out=args.out)
    state = torch.load(run.run_dir / "checkpoint.pt", weights_only=False)["state"]
    fed = Federation(cfg.data, cfg.seed)
    truth = np.asarray(run.table("assignments").sort_values("client").truth)
    m = state.w.shape[0]
    iu, ju = all_pairs(m)
    norms = row_norms(state.theta)
    same = truth[iu] == truth[ju]
    q = lambda x: " / ".join(f"{v:.2f}" for v in np.percentile(x, [0, 50, 100]))  # noqa: E731
    print(f"{run.run_dir}: after {args.rounds - 1} rounds, ||theta_ij|| within a true cluster {q(norms[same])}, "
          f"between clusters {q(norms[~same])} (min / median / max)")
    model = build_model(cfg.model, fed.info)
    print(f"devices' own models: {100 * mean_accuracy(fed, model, state.w):.2f}%")
    print("| nu | clusters | accuracy after averaging within them |\n|---|---|---|")
    for nu in args.nu:
        labels = clusters(state.theta, m, nu)
        acc = mean_accuracy(fed, model, cluster_models(state.w, labels, state.sizes)[labels])
        print(f"| {nu:g} | {labels.max() + 1} | {100 * acc:.2f}% |")


if __name__ == "__main__":
    main()
