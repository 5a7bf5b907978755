"""Torch thread counts: float results of convolutions and matrix products can depend on the
number of intra-op threads, so client work always runs with ``ray.num_cpus_per_actor``
threads and coordinator work with one, on either backend."""

from __future__ import annotations

import contextlib

import torch

from ..config import Config


@contextlib.contextmanager
def torch_threads(n: int):
    """Run with ``n`` intra-op torch threads."""
    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if before != n:
            torch.set_num_threads(before)


def client_threads(cfg: Config) -> int:
    return max(1, int(cfg.ray.num_cpus_per_actor))
