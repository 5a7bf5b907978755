"""Where a W3 upload's time goes, and a W4-FedSoft estimation (docs/performance.md).

    .venv/bin/python analysis/ccfl_upload_anatomy.py [--clients 6]

On one torch thread (as a client actor runs), for the first ``--clients`` clients of W3 (CCFL,
K = 4, the 16/32/128 CNN, Adam, batch 128, one epoch) it times the parts of one upload: the
local epoch, F(w_m; D_k) on the K validation sets (made on the client's actor), Cli Bfr and
Cli Aft (the test set, twice), and the server's re-scoring F(w_k; D_k) of the K cluster
models; then W4-FedSoft's estimation of one client (2 centers on its 150 images, the 32/64/512
CNN). Each part's FLOP (``torch.utils.flop_counter``, as the bench's floor counts them) over
its seconds is its rate, beside the one-thread fp32 matrix-multiply rate of the same moment.
Every part is measured with raysoft's 2x2 pooling and with PyTorch's ``nn.MaxPool2d`` (the
NCHW kernel), alternately, so the two columns share the machine's state.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import raysoft.models as models
from raysoft.algorithms.ccfl import cluster_losses, self_losses
from raysoft.algorithms.stream import client_update, pretrain
from raysoft.bench import floor, workload_config
from raysoft.config import parse_config
from raysoft.data import Federation
from raysoft.data.drift import DriftingImages
from raysoft.models import build_model
from raysoft.params import get_flat
from raysoft.rng import numpy_rng
from raysoft.training import evaluate, make_optimizer, model_losses

FAST = models.MaxPool2x2.forward


def stock(self, x):  # PyTorch's kernel whatever the layout
    return torch.nn.functional.max_pool2d(x, 2)


def timed(fn) -> dict[str, float]:
    """Seconds of fn() with raysoft's pooling and with PyTorch's, best of two alternations."""
    out = {"raysoft": float("inf"), "stock": float("inf")}
    for _ in range(2):
        for name, forward in (("raysoft", FAST), ("stock", stock)):
            models.MaxPool2x2.forward = forward
            began = time.perf_counter()
            fn()
            out[name] = min(out[name], time.perf_counter() - began)
    models.MaxPool2x2.forward = FAST
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = parse_config(workload_config("W3", 2))
    a = cfg.algorithm
    drift = DriftingImages(cfg.data, cfg.seed, a.public_samples, a.rest_split, a.validation)
    info = drift.info
    train_flop, fwd_flop = floor.flop_per_sample(cfg), floor.forward_flop_per_sample(cfg)
    centers = pretrain(cfg, drift, a.pretrain_epochs, a.shared_init)
    val_sets = [drift.validation(s) for s in range(drift.num_clusters)]
    scratch = build_model(cfg.model, info)
    parts: dict[str, list] = {"local epoch": [], "F(w_m; D_k), K sets": [], "Cli Bfr + Cli Aft": [],
                              "re-score K cluster models": []}
    for m in range(args.clients):
        data = drift.cycle(m, 0)
        model = build_model(cfg.model, info)
        opt = make_optimizer(cfg.train, model.parameters())
        start = get_flat(model)

        def train(data=data, start=start, m=m) -> None:  # bound now (timed calls it at once)
            models_ = build_model(cfg.model, info)
            o = make_optimizer(cfg.train, models_.parameters())
            client_update(models_, o, data.x, data.y, "classification", cfg.train, start, a.rho,
                          rng=numpy_rng(cfg.seed, "shuffle", m, 0))

        w = get_flat(model)
        parts["local epoch"].append((timed(train), len(data) * train_flop))
        val = sum(len(y) for _, y in val_sets)
        parts["F(w_m; D_k), K sets"].append((timed(lambda w=w: cluster_losses(scratch, w, val_sets, "classification",
                                                                          a.loss_reduction, a.loss_batch_size)),
                                             val * fwd_flop))
        scores = lambda data=data: [evaluate(scratch, data.test_x, data.test_y, "classification") for _ in range(2)]  # noqa: E731
        parts["Cli Bfr + Cli Aft"].append((timed(scores), 2 * len(data.test_y) * fwd_flop))
        parts["re-score K cluster models"].append((timed(lambda: self_losses(scratch, centers, val_sets,
                                                                             "classification", a.loss_reduction,
                                                                             a.loss_batch_size)), val * fwd_flop))
        del opt
    rate = floor.matmul_gflops(1)
    print(f"W3, {args.clients} clients, one thread; matmul {rate:.1f} GFLOP/s; "
          f"{train_flop / 1e6:.1f} / {fwd_flop / 1e6:.1f} MFLOP per sample trained / passed forward")
    print("| part | s per upload (raysoft) | GFLOP/s | of matmul | s (PyTorch's pooling) | pooling's share |")
    print("|---|---|---|---|---|---|")
    total = {"raysoft": 0.0, "stock": 0.0}
    for name, rows in parts.items():
        fast = float(np.mean([r[0]["raysoft"] for r in rows]))
        slow = float(np.mean([r[0]["stock"] for r in rows]))
        flop = float(np.mean([r[1] for r in rows]))
        total["raysoft"] += fast
        total["stock"] += slow
        print(f"| {name} | {fast:.3f} | {flop / fast / 1e9:.1f} | {flop / fast / 1e9 / rate:.0%} | {slow:.3f} | "
              f"{1 - fast / slow:.0%} |")
    print(
        f"| upload | {total['raysoft']:.3f} | | | {total['stock']:.3f} | {1 - total['raysoft'] / total['stock']:.0%} |"
    )

    w4 = parse_config(workload_config("W4:fedsoft", 2))
    fed = Federation(w4.data, w4.seed)
    d = fed.client_data(0)
    net = build_model(w4.model, fed.info)
    two = torch.stack([get_flat(build_model(w4.model, fed.info)) for _ in range(2)])
    t = timed(lambda: model_losses(net, two, d.x, d.y, "classification"))
    flop = 2 * len(d.y) * floor.forward_flop_per_sample(w4)
    print(f"W4-FedSoft estimation of one client ({len(d.y)} images, 2 centers): {t['raysoft']:.3f} s "
          f"({flop / t['raysoft'] / 1e9:.1f} GFLOP/s, {flop / t['raysoft'] / 1e9 / rate:.0%} of matmul); "
          f"with PyTorch's pooling {t['stock']:.3f} s")


if __name__ == "__main__":
    main()
