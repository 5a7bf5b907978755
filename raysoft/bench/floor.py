"""The workloads' arithmetic floors: the seconds a round needs at this sitting's matrix-multiply rate.

A round of W2 trains the selected clients' samples (one epoch each) through the CNN; its
floating-point work is the FLOP of one training step per sample (forward and backward,
counted by ``torch.utils.flop_counter`` on real W2 client images) times the samples the
round's selection trains (the same selection stream as FedAvg's). The floor is that work at
the rate of a large fp32 matrix product on all of this process's threads, measured in the same
sitting as the other systems: no system that does the arithmetic can be faster. With ``--device
cuda`` the rate is the GPU's (:func:`raysoft.bench.gpu.cuda_matrix_rate`: a timed fp32
``torch.mm`` on the device); the FLOP are the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..algorithms.common import uniform_selection
from ..config import Config, parse_config
from ..data import Federation
from ..models import DataInfo, build_model
from ..rng import numpy_rng

if TYPE_CHECKING:
    from .runner import Measurement


def _images(cfg: Config, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` real client images of the workload and their labels."""
    if hasattr(cfg.algorithm, "public_samples"):  # a stream's data: the server's validation images
        from ..data.drift import DriftingImages

        a: Any = cfg.algorithm  # a stream's settings
        x, y = DriftingImages(cfg.data, cfg.seed, a.public_samples, a.rest_split, a.validation).validation(0)
        return x[:batch], y[:batch]
    fed = Federation(cfg.data, cfg.seed)
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    k = 0
    while sum(len(y) for y in ys) < batch:
        d = fed.client_data(k)
        xs.append(d.x)
        ys.append(d.y)
        k += 1
    return torch.cat(xs)[:batch], torch.cat(ys)[:batch]


def _model(cfg: Config, x: torch.Tensor) -> torch.nn.Module:
    info = DataInfo(int(np.prod(x.shape[1:])), 10, "classification", tuple(x.shape[1:]))
    return build_model(cfg.model, info)


def step_fn(cfg: Config, batch: int) -> Callable[[], None]:
    """One SGD training step of the workload's CNN on ``batch`` real client images (the step's
    cost depends on the pixel values: random inputs ran slower in unscripted trials)."""
    x, y = _images(cfg, batch)
    model = _model(cfg, x)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def flop_per_sample(cfg: Config, batch: int = 32) -> float:
    """FLOP of one training step per sample (forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    step = step_fn(cfg, batch)
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops() / batch


def forward_flop_per_sample(cfg: Config, batch: int = 500) -> float:
    """FLOP of one forward pass per sample (an evaluation or a loss), without gradients."""
    from torch.utils.flop_counter import FlopCounterMode

    x, _ = _images(cfg, batch)
    model = _model(cfg, x).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops() / len(x)


def round_samples(cfg: Config, rounds: int) -> list[int]:
    """Samples trained in each of rounds 0..rounds-1 (FedAvg's uniform selection stream)."""
    sizes = np.asarray(Federation(cfg.data, cfg.seed).sizes)
    out = []
    for t in range(rounds):
        sel = uniform_selection(cfg.data.clients, cfg.algorithm.clients_per_round, numpy_rng(cfg.seed, "select", t))
        out.append(int(sizes[sel].sum()) * cfg.train.local_epochs)
    return out


def matmul_gflops(threads: int | None = None, n: int = 2048, repeats: int = 10) -> float:
    """GFLOP/s of an n x n fp32 matrix product on ``threads`` torch threads (None: all)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        began = time.perf_counter()
        for _ in range(repeats):
            a @ b
        return 2 * n**3 * repeats / (time.perf_counter() - began) / 1e9
    finally:
        torch.set_num_threads(before)


MATRIX_SAMPLES = 7  # matrix-rate measurements a floor row takes the median of


def matrix_rate(samples: int = MATRIX_SAMPLES) -> float:
    """This sitting's matrix-multiply rate on all threads: the median of ``samples``
    measurements (:func:`matmul_gflops`, about a second each). On a shared machine one
    measurement can be a quarter off the next."""
    if samples < 1:
        raise ValueError(f"matrix_rate needs at least one measurement (got {samples})")
    return float(np.median([matmul_gflops() for _ in range(samples)]))


def floor_seconds(samples: list[int], flop_per_sample: float, gflops: float) -> list[float]:
    """Each round's floor: its samples' FLOP at ``gflops`` GFLOP/s."""
    if not gflops > 0:
        raise ValueError(f"a matrix rate must be above 0 GFLOP/s (got {gflops:g})")
    return [s * flop_per_sample / 1e9 / gflops for s in samples]


def device_rate(device: str = "cpu") -> tuple[float, str]:
    """This sitting's matrix rate on ``device`` (GFLOP/s) and how a floor row names it: the
    CPU's on all threads (:func:`matrix_rate`), or the GPU's fp32 rate
    (:func:`raysoft.bench.gpu.cuda_matrix_rate`)."""
    if device == "cuda":
        from .gpu import cuda_matrix_rate

        rate = cuda_matrix_rate()
        return rate, f"{rate:.1f} GFLOP/s (cuda fp32)"
    rate = matrix_rate()
    return rate, f"{rate:.1f} GFLOP/s"


def floor_w2(raw: Mapping[str, object], device: str = "cpu") -> dict[str, object]:
    """The bench worker's result for the ``floor`` system of a FedAvg workload (W2, W5): each
    round's floor in seconds, from FedAvg's selection stream, at ``device``'s matrix rate."""
    began = time.monotonic()
    cfg = parse_config(raw)
    per_sample = flop_per_sample(cfg)
    rate, rate_text = device_rate(device)
    samples = round_samples(cfg, cfg.algorithm.rounds)
    return {"sec_per_round_all": floor_seconds(samples, per_sample, rate),
            "updates": [cfg.algorithm.clients_per_round] * len(samples), "quality": float("nan"),
            "quality_metric": f"{per_sample / 1e6:.1f} MFLOP/sample at {rate_text}",
            "total_s": time.monotonic() - began}


def floor_of_run(workload: str, raw: Mapping[str, object], run: Measurement, device: str = "cpu") -> dict[str, object]:
    """The floor of W3 and W4 from the work of raysoft's run of the same workload (``run``: its
    bench result, whose ``work_all`` holds, per timed round, the samples of each client op the
    algorithm called, of its evaluations, and for a stream the samples trained and passed
    forward): a training op's samples cost a training step each (per local epoch), FedSoft's
    ``estimate`` one forward pass per center, every other op and evaluation one forward pass;
    at this sitting's matrix-multiply rate on ``device``."""
    began = time.monotonic()
    cfg = parse_config(raw)
    train, forward = flop_per_sample(cfg), forward_flop_per_sample(cfg)
    rate, rate_text = device_rate(device)
    per_round = []
    for work in run["work_all"]:
        flop = 0.0
        for op, samples in work.items():
            if op == "train":  # a round's op counts its clients' samples once; a stream's, every epoch
                flop += samples * train * (1 if workload == "W3" else cfg.train.local_epochs)
            elif op == "estimate":  # FedSoft: every center's loss on every sample
                flop += samples * forward * int(getattr(cfg.algorithm, "num_centers", 1))
            else:
                flop += samples * forward
        per_round.append(flop / 1e9 / rate)
    return {"sec_per_round_all": per_round, "updates": run["updates"][: len(per_round)], "quality": float("nan"),
            "quality_metric": f"{train / 1e6:.1f} / {forward / 1e6:.1f} MFLOP per sample trained / passed forward "
                              f"at {rate_text}",
            "total_s": time.monotonic() - began}
