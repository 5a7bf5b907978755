"""Batched multi-client training against the per-client loop, in one client host (one process,
one torch thread, as inside a client actor): the measurement behind `train.batched_clients:
auto` (docs/performance.md).

    .venv/bin/python analysis/batched_clients_speed.py [--repeats 3]

For W1's linear regression (FedSoft, 50 clients: one actor's block of 100 on 2 actors; and 10)
and W2's CNN (FedAvg, 10 clients), it times one `train` call of the host with
`batched_clients: on` and `off` (best of ``--repeats``, after a warm-up call) and prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from raysoft.backends.host import ClientHost
from raysoft.bench import workload_config
from raysoft.config import parse_config
from raysoft.params import get_flat


def time_call(workload: str, clients: int, mode: str, repeats: int) -> float:
    raw = workload_config(workload, 4)
    raw["train"]["batched_clients"] = mode
    cfg = parse_config(raw)
    host = ClientHost(cfg, list(range(clients)))
    ids = list(range(clients))
    if workload == "W1":  # FedSoft: the clients' proximal training towards S centers
        centers = get_flat(host.scratch).repeat(cfg.data.distributions, 1)
        u = np.full((clients, cfg.data.distributions), 1.0 / cfg.data.distributions)
        payload = {"centers": centers, "u": u, "prox_weight": 1.0}
    else:
        payload = {"model": get_flat(host.scratch)}
    host.call("train", ids, payload, 1)  # warm-up
    best = float("inf")
    for r in range(repeats):
        began = time.perf_counter()
        host.call("train", ids, payload, 2 + r)
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    print("| workload | model | clients | loop (s) | batched (s) | batched speed-up |")
    print("|---|---|---|---|---|---|")
    for workload, model, clients in (("W1", "linear", 50), ("W1", "linear", 10), ("W2", "cnn", 10)):
        loop = time_call(workload, clients, "off", args.repeats)
        batched = time_call(workload, clients, "on", args.repeats)
        print(f"| {workload} | {model} | {clients} | {loop:.3f} | {batched:.3f} | {loop / batched:.2f}× |", flush=True)


if __name__ == "__main__":
    main()
