"""How close can CCFL's estimate get to the truth? (CCFL, ICLR 2024 submission: Algorithm 1,
Table 2, Appendix A.1; docs/algorithms.md#ccfl-estimate-cap)

    .venv/bin/python analysis/ccfl_estimate_cap.py [RUN_DIR ...]

For each row of Table 2 (dataset, K, A) it prints the largest weight Algorithm 1 can give
one cluster while every bar-shifted value is non-negative (raysoft.algorithms.ccfl.
largest_weight) and the least mean KL(true || estimate) such a capped estimator can reach on the
paper's drift, whose main share is uniform on 40-90% (kl_floor). For each CCFL run directory,
or comparison directory of `raysoft compare` (holding ccfl/ and, optionally, fedsoft_async/), it
then prints what the run measured: CCFL's largest estimate, its smallest l_k, how many fresh
uploads had a loss l_k below l_bar (a negative shifted value: the only way past the cap), how
often the largest weight was on the upload's true main cluster, and the mean KL of CCFL (over
all uploads, and over the fresh ones whose estimate was made for them); for FedSoft-Async the
same hit rate and mean KL.
A missing or unreadable directory is a one-line error with exit code 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import yaml

from raysoft.algorithms.ccfl import TABLE2, kl_floor, largest_weight


def fail(message: str) -> None:
    print(f"ccfl_estimate_cap: {message}", file=sys.stderr)
    raise SystemExit(2)


def main_first(run: Path, weights: pd.DataFrame) -> float:
    """The fraction of uploads whose largest estimated weight (``weights``: the run's
    weights.parquet) is on their true main cluster."""
    w = weights.pivot(index=["step", "client"], columns="center", values="estimate")
    truth = pd.read_parquet(run / "clients.parquet").pivot(index=["step", "client"], columns="distribution",
                                                          values="share")
    return float((w.to_numpy().argmax(axis=1) == truth.loc[w.index].to_numpy().argmax(axis=1)).mean())


def measured(path: Path) -> str:
    ccfl = path / "ccfl" if (path / "ccfl").is_dir() else path  # a comparison or one CCFL run
    other = path / "fedsoft_async"
    try:
        summary = json.loads((ccfl / "summary.json").read_text())
        config = yaml.safe_load((ccfl / "config.yaml").read_text())
        est = pd.read_parquet(ccfl / "estimation.parquet")
        weights = pd.read_parquet(ccfl / "weights.parquet")
        metrics = pd.read_parquet(ccfl / "metrics.parquet", filters=[("metric", "==", "kl")])
        a = config["algorithm"]
        k, bar = int(config["data"]["distributions"]), a["l_bar"]
        first = main_first(ccfl, weights)
        fs = (f"{main_first(other, pd.read_parquet(other / 'weights.parquet')):.3f} | "
              f"{json.loads((other / 'summary.json').read_text())['kl']:.3f}" if other.is_dir() else "- | -")
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path} is not a CCFL run (or comparison) that wrote estimation.parquet ({e})")
    below = est.groupby("step").l.min() < float(bar) if bar != "min" else pd.Series(False, index=est.step.unique())
    cap = largest_weight(k, a["amplifier"])
    fresh = metrics[metrics.step.isin(est.step)].value.mean()  # stale uploads reuse an estimate
    return (f"| {path} | {k} | {a['amplifier']} | {cap:.3f} | {weights.estimate.max():.3f} | {est.l.min():.1f} | "
            f"{int(below.sum())} of {len(below)} | {first:.3f} | {summary['kl']:.3f} | {fresh:.3f} | "
            f"{kl_floor(cap):.3f} | {fs} |")


def main(argv: list[str]) -> None:
    rows = [measured(Path(name)) for name in argv]  # every directory is read before anything prints
    print("| Table 2 row | K | A | largest weight | least mean KL (main share 40-90%) |")
    print("|---|---|---|---|---|")
    for (dataset, k), row in TABLE2.items():
        cap = largest_weight(k, row["amplifier"])
        print(f"| {dataset}({k}) | {k} | {list(row['amplifier'])} | {cap:.3f} | {kl_floor(cap):.3f} |")
    if rows:
        print()
        print("| run | K | A | cap | largest estimate | smallest l_k | uploads with l_k < l_bar | "
              "main cluster first | KL CCFL | KL CCFL, fresh estimates | floor | "
              "FedSoft-Async: main cluster first | KL FedSoft-Async |")
        print("|---" * 13 + "|")
        print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
