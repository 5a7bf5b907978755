"""How two one-thread processes share this machine's cores (docs/performance.md#what-two-one-thread-actors-can-do).

    .venv/bin/python analysis/two_actor_rates.py [--repeats 3]

The floors of W3 and W4 price their work at the fp32 matrix-multiply rate of all the machine's
threads; raysoft runs it in one-thread actors, one per core. This script measures what two such
actors can do at once: each kernel below runs in one process on one thread alone, in one
process on two threads, and in two one-thread processes side by side (started together at a
barrier). The kernels are the ones a W3 upload and a W4-FedSoft estimation are
made of, on the workloads' own models and images:

- ``matmul``: a 2048 x 2048 fp32 product (the floor's rate);
- ``W3 epoch``: one local epoch of a W3 client (CCFL's objective, Adam, batch 128);
- ``W3 forward``: F(w; D_k) on W3's K = 4 validation sets;
- ``W4 epoch``: one local epoch of a W4 client (its 150 images, W4's optimiser and batch);
- ``W4 estimate``: FedSoft's estimation of one W4 client (2 centers on its 150 images).

Each row prints the GFLOP/s of one process alone on one thread, of one process on two threads,
of each of two one-thread processes side by side and their sum, and the floor's two-thread
matrix rate (the median of one measurement before each row: it moves from minute to minute
here) over the better of the two ways to use both cores: the lowest floor ratio the kernel
allows on this machine, however an engine places the work.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

KERNELS = ("matmul", "W3 epoch", "W3 forward", "W4 epoch", "W4 estimate")


def build(kernel: str) -> tuple[Callable[[], None], float]:
    """The kernel as a call, and its FLOP per call."""
    from raysoft.bench import floor, workload_config
    from raysoft.config import parse_config

    if kernel == "matmul":
        a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)

        def product() -> None:
            a @ b

        return product, 2 * 2048**3
    if kernel.startswith("W3"):
        from raysoft.algorithms.ccfl import cluster_losses
        from raysoft.algorithms.stream import client_update
        from raysoft.data.drift import DriftingImages
        from raysoft.models import build_model
        from raysoft.params import get_flat
        from raysoft.rng import numpy_rng
        from raysoft.training import make_optimizer

        cfg = parse_config(workload_config("W3", 2))
        s: Any = cfg.algorithm  # a stream's settings
        drift = DriftingImages(cfg.data, cfg.seed, s.public_samples, s.rest_split, s.validation)
        model = build_model(cfg.model, drift.info)
        start = get_flat(model)
        if kernel == "W3 epoch":
            data = drift.cycle(0, 0)

            def epoch() -> None:
                opt = make_optimizer(cfg.train, model.parameters())
                client_update(
                    model,
                    opt,
                    data.x,
                    data.y,
                    "classification",
                    cfg.train,
                    start,
                    s.rho,
                    rng=numpy_rng(cfg.seed, "shuffle", 0, 0),
                )

            return epoch, len(data) * floor.flop_per_sample(cfg)
        val_sets = [drift.validation(k) for k in range(drift.num_clusters)]
        n = sum(len(y) for _, y in val_sets)

        def forward() -> None:
            cluster_losses(model, start, val_sets, "classification", s.loss_reduction, s.loss_batch_size)

        return forward, n * floor.forward_flop_per_sample(cfg)
    from raysoft.data import Federation
    from raysoft.models import build_model
    from raysoft.params import get_flat
    from raysoft.training import make_optimizer, model_losses, proximal_train

    w4 = parse_config(workload_config("W4:fedsoft", 2))
    fed = Federation(w4.data, w4.seed)
    d = fed.client_data(0)
    net = build_model(w4.model, fed.info)
    if kernel == "W4 epoch":

        def train() -> None:
            proximal_train(
                net,
                make_optimizer(w4.train, net.parameters()),
                d.x,
                d.y,
                "classification",
                w4.train,
                rng=np.random.default_rng(0),
            )

        return train, len(d.y) * w4.train.local_epochs * floor.flop_per_sample(w4)
    two = torch.stack([get_flat(build_model(w4.model, fed.info)) for _ in range(2)])

    def estimate() -> None:
        model_losses(net, two, d.x, d.y, "classification")

    return estimate, 2 * len(d.y) * floor.forward_flop_per_sample(w4)


def worker(kernel: str, threads: int, repeats: int, barrier: Any, out: Any) -> None:
    torch.set_num_threads(threads)
    fn, flop = build(kernel)
    fn()  # warm-up
    barrier.wait(timeout=600)
    began = time.perf_counter()
    for _ in range(repeats):
        fn()
    out.put(flop * repeats / (time.perf_counter() - began) / 1e9)


def rates(kernel: str, processes: int, threads: int, repeats: int) -> list[float]:
    """GFLOP/s of each of ``processes`` processes running ``kernel`` on ``threads`` threads at once."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(kernel, threads, repeats, barrier, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        return [out.get(timeout=900) for _ in procs]
    finally:  # a process that failed or hangs is not left behind
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="calls timed per process (x10 but W3)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: calls timed per process, at least 1 (got {args.repeats})")
    rows, matrix = [], []
    for kernel in KERNELS:
        n = args.repeats * (1 if kernel in ("W3 epoch", "W3 forward") else 10)
        matrix.append(rates("matmul", 1, 2, 10 * args.repeats)[0])  # the floor's rate, between the rows
        alone, wide, pair = rates(kernel, 1, 1, n)[0], rates(kernel, 1, 2, n)[0], rates(kernel, 2, 1, n)
        rows.append((kernel, alone, wide, pair))
    rate = float(np.median(matrix))
    print(
        f"matrix rate on two threads: median {rate:.1f} GFLOP/s of {len(matrix)} ({min(matrix):.1f}-{max(matrix):.1f})"
    )
    print(
        "| kernel | one thread | one process, two threads | two one-thread processes (each) | their sum "
        "| best floor ratio |"
    )
    print("|---|---|---|---|---|---|")
    for kernel, alone, wide, pair in rows:
        total = sum(pair)
        print(
            f"| {kernel} | {alone:.1f} | {wide:.1f} | {pair[0]:.1f} / {pair[1]:.1f} | {total:.1f} | "
            f"{rate / max(total, wide):.2f}x |"
        )


if __name__ == "__main__":
    main()
