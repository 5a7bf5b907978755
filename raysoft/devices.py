"""Where a host's tensors live, and the one way from a tensor back to numpy.

A client host (a Ray client actor, or the in-process backend's one host) runs its clients on
one device: their data, their states and the payloads they receive are moved there, and their
results come back to the CPU. Client code that makes a tensor of its own makes it on
``ctx.device``; client code that needs numpy converts with :func:`to_numpy`, which copies a
device tensor to the host first (``tensor.numpy()`` refuses a CUDA tensor). Every tensor to
numpy conversion of raysoft goes through :func:`to_numpy`; a test checks that no other remains,
so this class of GPU bug is caught on a machine without one.

``train.device`` chooses the device: ``auto`` is CUDA where the process has it (in-process) or
where Ray gave the actor a GPU share and the actor's torch finds CUDA; ``cpu`` and ``cuda``
force it (``cuda`` without CUDA is an error, never a silent fallback).

On CUDA a host makes its kernels deterministic (:func:`deterministic`): the same seed gives the
same numbers on any packing of clients into actors and on resume, as on the CPU.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from .errors import ConfigError

# cuBLAS needs a fixed workspace for deterministic results; read when CUDA first starts
CUBLAS_WORKSPACE = ":4096:8"


def to_numpy(value: Any) -> np.ndarray:
    """``value`` as a numpy array: a tensor on any device is detached and copied to the host
    (the only tensor -> numpy conversion in raysoft); anything else goes through ``np.asarray``."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def choose(spec: str, gpu_share: bool | None = None) -> torch.device:
    """The device ``train.device`` = ``spec`` gives a host. ``gpu_share``: on a Ray actor,
    whether Ray gave it a GPU share (None in-process). ``auto``: CUDA where this process has it
    (and, on an actor, a GPU share); ``cuda`` where CUDA is missing, or on an actor without a
    share, raises :class:`~raysoft.errors.ConfigError`."""
    if spec == "cpu":
        return torch.device("cpu")
    has_cuda = torch.cuda.is_available()
    if spec == "cuda":
        if gpu_share is False:
            raise ConfigError("train.device: cuda, but this client actor has no GPU share "
                              "(set ray.num_gpus_per_actor > 0)")
        if not has_cuda:
            raise ConfigError("train.device: cuda, but torch finds no CUDA device in this process "
                              f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        return torch.device("cuda")
    if spec != "auto":
        raise ConfigError(f"train.device: {spec!r} is not one of auto, cpu, cuda")
    return torch.device("cuda") if has_cuda and gpu_share is not False else torch.device("cpu")


def prepare_cuda() -> None:
    """Before CUDA starts in this process: cuBLAS's deterministic workspace (a user's own
    setting is kept)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def deterministic(device: torch.device) -> None:
    """Deterministic kernels on ``device`` (nothing to do on the CPU): no cuDNN autotuning
    (it picks kernels by timing), no TF32 (convolutions would round to 10-bit mantissas, far from
    the CPU's numbers), and torch's deterministic algorithms (a warning, not an error, for an op
    that has none)."""
    if device.type != "cuda":
        return
    prepare_cuda()
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
