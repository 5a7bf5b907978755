"""CCFL's Table 1 (ICLR 2024 submission) at laptop scale: CCFL, FedSoft-Async and Local on identical
rotated Fashion-MNIST streams for K = 2, 3, 4, 6, each K with its Table 2 row
(jobs/ccfl_fmnist_k{K}.yaml) but fewer clients and cycles and smaller server sets, and the two
departures of jobs/ccfl_fmnist_k4_small.yaml.

    .venv/bin/python analysis/ccfl_table1.py [--ks 2 3 4 6] [--clients-per-cluster 4] [--cycles 25]
                                         [--public 400] [--set k=v ...] [--out runs/ccfl_table1]

Each K is one ``raysoft compare`` (its comparison directory holds the three runs); one Markdown
row per K is printed as soon as it is done: Cli Bfr, Cli Aft and Cluster per method (summary.json's
cli_bfr, cli_aft: means over clients at their final cycle; cluster_acc: averaged over every
cluster evaluation), Local's Cli Bfr, the mean KL of CCFL and FedSoft-Async,
the bytes each downloads per client, and the minutes the comparison took.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from raysoft.compare import algorithm_configs, compare
from raysoft.config import ConfigError, load_raw
from raysoft.options import add_overrides

JOBS = Path(__file__).parent.parent / "jobs"  # the job configs, beside this folder
# as jobs/ccfl_fmnist_k4_small.yaml (which says why): F on the paper's scale, Adam lr 0.001, the
# smaller CNN
DEPARTURES = ["algorithm.loss_reduction=paper_scale", "train.lr=0.001", "model.channels=[16, 32]",
              "model.hidden=128"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 6], choices=[2, 3, 4, 6])
    ap.add_argument("--clients-per-cluster", type=int, default=4, help="the paper: 20")
    ap.add_argument("--cycles", type=int, default=25, help="the paper: 25")
    ap.add_argument("--public", type=int, default=400, help="server images per cluster; the paper: 2000")
    ap.add_argument("--out", default="runs/ccfl_table1")
    add_overrides(ap)
    args = ap.parse_args()
    over = lambda k: [f"data.clients={args.clients_per_cluster * k}", f"algorithm.cycles={args.cycles}",  # noqa: E731
                      f"algorithm.public_samples={args.public}",
                      f"algorithm.eval_every={2 * args.clients_per_cluster * k}",
                      *DEPARTURES, "output.progress=none", *args.overrides]
    try:  # every K's configs checked before the first run starts
        raws = {k: load_raw(JOBS / f"ccfl_fmnist_k{k}.yaml", over(k)) for k in args.ks}
        for raw in raws.values():
            algorithm_configs(raw, ["ccfl", "fedsoft_async", "local"])
    except ConfigError as err:
        ap.error(str(err))
    print("| K | CCFL Cli Bfr | CCFL Cli Aft | CCFL Cluster | FS-Async Cli Bfr | FS-Async Cli Aft | "
          "FS-Async Cluster | Local | KL CCFL / FS-Async | MB down / client CCFL / FS-Async | min |",
          flush=True)
    print("|---" * 11 + "|", flush=True)
    for k in args.ks:
        path = compare(raws[k], ["ccfl", "fedsoft_async", "local"], out=args.out)
        s = {a: json.loads((path / a / "summary.json").read_text()) for a in ("ccfl", "fedsoft_async", "local")}
        c, f = s["ccfl"], s["fedsoft_async"]
        minutes = sum(x["wall_time_s"] for x in s.values()) / 60
        print(f"| {k} | {c['cli_bfr']:.3f} | {c['cli_aft']:.3f} | {c['cluster_acc']:.3f} | {f['cli_bfr']:.3f} | "
              f"{f['cli_aft']:.3f} | {f['cluster_acc']:.3f} | {s['local']['cli_bfr']:.3f} | "
              f"{c['kl']:.3f} / {f['kl']:.3f} | {c['bytes_down_per_client'] / 1e6:.0f} / "
              f"{f['bytes_down_per_client'] / 1e6:.0f} | {minutes:.1f} |", flush=True)


if __name__ == "__main__":
    main()
