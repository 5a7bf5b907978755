"""Write a small demo folder for the npz_clients plug-in: 12 clients holding mixtures of two
linear-regression distributions y = <x, theta_s> + noise (x in R^5), and a holdout set of each.

    python make_files.py            # writes data/ next to this file
    python make_files.py --out DIR  # elsewhere

The same seed always writes the same files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

DIM, DISTRIBUTIONS, CLIENTS, HOLDOUT = 5, 2, 12, 300


def write(out: Path, seed: int = 0, clients: int = CLIENTS) -> None:
    rng = np.random.default_rng(seed)
    thetas = rng.normal(0.0, 3.0, size=(DISTRIBUTIONS, DIM))

    def draw(dist: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.standard_normal((count, DIM))
        return x, x @ thetas[dist] + 0.5 * rng.standard_normal(count)

    def samples(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = [draw(s, int(c)) for s, c in enumerate(counts)]
        comp = np.concatenate([np.full(int(c), s) for s, c in enumerate(counts)])
        order = rng.permutation(len(comp))
        x = np.concatenate([p[0] for p in parts])[order]
        y = np.concatenate([p[1] for p in parts])[order]
        return x, y, comp[order]

    out.mkdir(parents=True, exist_ok=True)
    for k in range(clients):
        n = int(rng.integers(40, 81))
        main = rng.uniform(0.75, 0.95)  # clients 0..5 mostly distribution 0, 6..11 mostly 1
        first = int(main * n) if k < clients // 2 else n - int(main * n)
        counts = np.array([first, n - first])
        x, y, comp = samples(counts)
        tx, ty, _ = samples(np.array([first // 4, (n - first) // 4]))
        np.savez(out / f"client_{k}.npz", x=x, y=y, component=comp, mixture=counts / n, test_x=tx, test_y=ty)
    for s in range(DISTRIBUTIONS):
        x, y = draw(s, HOLDOUT)
        np.savez(out / f"holdout_{s}.npz", x=x, y=y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    write(Path(args.out), args.seed)
    print(f"wrote {CLIENTS} clients and {DISTRIBUTIONS} holdout sets to {args.out}")


if __name__ == "__main__":
    main()
