"""How a run's estimated weights (FedEM's pi, FedSoft's u, IFCA's one-hot choice) move, client
group by client group: the clients are grouped by their majority distribution, and for every
step recorded in ``weights.parquet`` this prints each group's mean weight of every center,
beside the group's true mean shares (``clients.parquet``). The FedEM figures of docs/results.md come
from it.

    .venv/bin/python analysis/weights_by_majority.py RUN_DIR [--steps 0,10,30]

Centers are not matched to distributions here: read center c of a group against the share of
the distribution that center serves (the comparison table's best-center indices).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def table(run_dir: Path, steps: list[int] | None = None) -> pd.DataFrame:
    """Rows (step, majority, clients, center, mean weight), plus one row per (majority,
    distribution) of true mean shares with step = -1 and center = distribution."""
    for name in ("weights.parquet", "clients.parquet"):
        if not (run_dir / name).is_file():
            raise ValueError(f"{run_dir} has no {name}")
    weights = pd.read_parquet(run_dir / "weights.parquet")
    clients = pd.read_parquet(run_dir / "clients.parquet")
    clients = clients[clients.step == clients.step.min()]
    shares = clients.pivot(index="client", columns="distribution", values="share")
    majority = shares.idxmax(axis=1).rename("majority")
    if steps is not None:
        missing = sorted(set(steps) - set(weights.step))
        if missing:
            raise ValueError(f"no weights recorded at step(s) {missing} (recorded: {sorted(set(weights.step))})")
        weights = weights[weights.step.isin(steps)]
    w = weights.join(majority, on="client")
    out = (w.groupby(["step", "majority", "center"])
           .agg(clients=("client", "nunique"), weight=("estimate", "mean")).reset_index())
    truth = pd.DataFrame([
        {"step": -1, "majority": int(g), "clients": int((majority == g).sum()), "center": int(s),
         "weight": float(shares.loc[majority == g, s].mean())}
        for g in sorted(majority.unique()) for s in shares.columns
    ])
    return pd.concat([truth, out], ignore_index=True)[["step", "majority", "clients", "center", "weight"]]


def _steps(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", type=_steps, help="comma-separated steps (default: every recorded step)")
    args = p.parse_args(argv)
    try:
        t = table(args.run_dir, args.steps)
    except ValueError as err:  # a one-line error and exit code 2, like argparse's
        p.error(str(err))
    wide = t.pivot_table(index=["step", "majority", "clients"], columns="center", values="weight")
    wide.columns = [f"center {c}" for c in wide.columns]
    print("step -1: the true mean shares of each group's distributions")
    print(wide.round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
