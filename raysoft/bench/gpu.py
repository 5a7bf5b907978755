"""``raysoft bench --device cuda``: the GPU's side of a measurement.

* :func:`cuda_available` (whether this process has CUDA: ``--device cuda`` is refused without);
* :func:`cuda_matmul_gflops` / :func:`cuda_matrix_rate`: the GPU's fp32 matrix-multiply rate in
  this sitting (a timed ``torch.mm`` on the device, bracketed by ``torch.cuda.synchronize``,
  TF32 off), the rate of the GPU floor row;
* :class:`GpuSampler`: ``nvidia-smi --query-gpu=utilization.gpu,memory.used`` read in a
  background thread every ``interval`` seconds while a measurement runs (nothing, and NaN
  columns, where there is no ``nvidia-smi``); :func:`parse_smi_line` reads one of its lines and
  :func:`gpu_summary` turns the samples into a row's columns: the GPU's mean and highest
  utilisation over the row's timed rounds and its peak memory above what was in use before
  the row started.

``nvidia-smi`` sees the whole GPU: memory and utilisation of every process on it, a CUDA
context (some hundreds of MB a process) included. On the bench's machine the bench is alone on
the GPU, so that is the row's.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence

import numpy as np

SMI_QUERY = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]


def cuda_available() -> bool:
    """Whether torch finds CUDA in this process."""
    import torch

    return bool(torch.cuda.is_available())


def parse_smi_line(line: str) -> tuple[float, float] | None:
    """(utilisation %, memory used MiB) from one line of ``nvidia-smi --query-gpu=
    utilization.gpu,memory.used --format=csv,noheader,nounits`` (``"37, 1234"``); a field the
    GPU does not report (``[N/A]``, ``[Not Supported]``) is NaN. None for a line that is no
    such sample (blank, a header, an error message)."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != 2:
        return None
    values = []
    for p in parts:
        if p.startswith("[") and p.endswith("]"):  # [N/A], [Not Supported], [Unknown Error]
            values.append(float("nan"))
            continue
        try:
            values.append(float(p))
        except ValueError:
            return None
    return values[0], values[1]


def gpu_index(visible: str | None = None) -> str:
    """The ``nvidia-smi -i`` of the GPU a measurement uses: the first of ``CUDA_VISIBLE_DEVICES``
    (``visible``; default: this process's environment), else GPU 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    first = (visible or "").split(",")[0].strip()
    return first or "0"


def gpu_summary(samples: Sequence[tuple[float, float, float]], baseline_mb: float,
                window: tuple[float, float] | None = None) -> dict[str, float]:
    """A row's GPU columns from its samples (time.monotonic(), utilisation %, memory MiB):
    ``gpu_util_pct`` and ``gpu_util_max_pct``, the mean and the highest utilisation of the
    samples inside ``window`` (the row's timed rounds, as time.monotonic(); None, or a window
    no sample fell in: all samples), and ``peak_gpu_mb``, the highest memory used less
    ``baseline_mb`` (in use before the row started). NaN where there are no samples."""
    nan = float("nan")
    if not samples:
        return {"gpu_util_pct": nan, "gpu_util_max_pct": nan, "peak_gpu_mb": nan}
    inside = [s for s in samples if window is not None and window[0] <= s[0] <= window[1]] or list(samples)
    util = np.array([s[1] for s in inside], dtype=float)
    mem = np.array([s[2] for s in samples], dtype=float)
    finite_util, finite_mem = util[np.isfinite(util)], mem[np.isfinite(mem)]
    base = baseline_mb if math.isfinite(baseline_mb) else 0.0
    return {
        "gpu_util_pct": float(finite_util.mean()) if finite_util.size else nan,
        "gpu_util_max_pct": float(finite_util.max()) if finite_util.size else nan,
        "peak_gpu_mb": max(0.0, float(finite_mem.max()) - base) if finite_mem.size else nan,
    }


class GpuSampler:
    """``nvidia-smi`` every ``interval`` seconds (its own loop, ``-lms``) read in a thread:
    ``samples`` (time.monotonic(), utilisation %, memory MiB) and ``baseline_mb``, the memory
    in use when it started (waited for, up to ``first_wait`` seconds, on entering). Where
    ``nvidia-smi`` is missing (``available`` False) it samples nothing. Ends the nvidia-smi it
    started on leaving."""

    def __init__(self, interval: float = 0.2, index: str | None = None, first_wait: float = 5.0,
                 smi: str | None = None) -> None:
        self.interval, self.index, self.first_wait = interval, gpu_index() if index is None else index, first_wait
        self.smi = smi if smi is not None else shutil.which("nvidia-smi")
        self.available = self.smi is not None
        self.samples: list[tuple[float, float, float]] = []
        self.baseline_mb = float("nan")
        self._first = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            parsed = parse_smi_line(line)
            if parsed is None:
                continue
            self.samples.append((time.monotonic(), *parsed))
            if not self._first.is_set():
                self.baseline_mb = parsed[1]
                self._first.set()

    def __enter__(self) -> GpuSampler:
        if self.smi is None:
            return self
        cmd = [self.smi, *SMI_QUERY, "-i", self.index, "-lms", str(max(1, int(self.interval * 1000)))]
        try:
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.available = False
            return self
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self._first.wait(self.first_wait)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self, window: tuple[float, float] | None = None) -> dict[str, float]:
        """:func:`gpu_summary` of the samples so far."""
        return gpu_summary(list(self.samples), self.baseline_mb, window)


def cuda_matmul_gflops(n: int = 8192, repeats: int = 20) -> float:
    """GFLOP/s of an n x n fp32 matrix product on the current CUDA device: ``repeats`` products
    after a warm-up one, timed between two ``torch.cuda.synchronize()``, TF32 off (real fp32)."""
    import torch

    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        c = torch.empty(n, n, device="cuda")
        torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        return 2 * n**3 * repeats / (time.perf_counter() - began) / 1e9
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def cuda_matrix_rate(samples: int = 7) -> float:
    """The GPU's fp32 matrix rate in this sitting: the median of ``samples`` measurements
    (:func:`cuda_matmul_gflops`, well under a second each on a data-centre GPU)."""
    if samples < 1:
        raise ValueError(f"cuda_matrix_rate needs at least one measurement (got {samples})")
    return float(np.median([cuda_matmul_gflops() for _ in range(samples)]))
