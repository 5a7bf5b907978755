"""How FPFC's server state grows with the number of devices m and the model size d.

    .venv/bin/python analysis/fpfc_server_memory.py [--m 50 100 200 400] [--classes 10] [--dims 60 600]

For each (m, d) it builds the server state the way FPFC does (w [m, d]; theta and v, one row per
unordered pair, [m(m-1)/2, d] float32 each), runs one server update (zeta for 30% of the
devices, the pair updates of the paper's convention, the clustering) and prints the bytes held
by the arrays and the peak traced Python/numpy allocation during that update (tracemalloc).
"""

from __future__ import annotations

import argparse
import tracemalloc

import numpy as np

from raysoft.algorithms.fpfc import FPFCConfig, clusters, round_pairs, update_pairs, zeta


def measure(m: int, d: int) -> tuple[int, int]:
    rng = np.random.default_rng(0)
    pairs = m * (m - 1) // 2
    w = rng.standard_normal((m, d)).astype(np.float32)
    theta = np.zeros((pairs, d), np.float32)
    v = np.zeros((pairs, d), np.float32)
    held = w.nbytes + theta.nbytes + v.nbytes
    cfg = FPFCConfig()
    selected = sorted(rng.choice(m, size=max(2, int(0.3 * m)), replace=False).tolist())
    tracemalloc.start()
    zeta(w, theta, v, cfg.rho, selected)
    for i, j in round_pairs(selected, m, "paper"):
        update_pairs(w, theta, v, i, j, cfg)
    clusters(theta, m, cfg.nu)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return held, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, nargs="+", default=[50, 100, 200, 400])
    ap.add_argument("--dims", type=int, nargs="+", default=[610, 6100], help="d (610 = Linear(60 -> 10) with bias)")
    args = ap.parse_args()
    print("| m | d | pairs | state held (MB) | peak extra during a server update (MB) |\n|---|---|---|---|---|")
    for d in args.dims:
        for m in args.m:
            held, peak = measure(m, d)
            print(f"| {m} | {d} | {m * (m - 1) // 2} | {held / 2**20:.1f} | {peak / 2**20:.1f} |", flush=True)


if __name__ == "__main__":
    main()
