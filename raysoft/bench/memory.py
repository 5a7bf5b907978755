"""The memory of a process tree (psutil), and a thread that samples its peak."""

from __future__ import annotations

import threading
import time
from typing import Any

import psutil


def tree_memory_mb(root: int) -> tuple[float, float]:
    """(RSS, PSS) of ``root`` and all its descendants, summed, in MB. RSS counts a page shared by
    several processes (torch's libraries, Ray's object store) once per process; PSS splits it
    between them, so the PSS sum is the tree's real footprint. A process that ends while it is
    read counts nothing; a platform without PSS (not Linux) reports its RSS as the PSS."""
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return 0.0, 0.0
    rss = pss = 0
    for proc in procs:
        try:
            mem = proc.memory_full_info()
        except psutil.Error:  # gone, or not ours to read
            continue
        rss += mem.rss
        pss += getattr(mem, "pss", mem.rss)
    return rss / 2**20, pss / 2**20


class PeakSampler:
    """Samples :func:`tree_memory_mb` of a process every ``interval`` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 0.2, series: bool = False) -> None:
        self.pid, self.interval, self.peak, self.peak_pss = pid, interval, 0.0, 0.0
        # with ``series``: every sample, as (time.monotonic(), RSS MB, PSS MB)
        self.samples: list[tuple[float, float, float]] | None = [] if series else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss, pss = tree_memory_mb(self.pid)
            self.peak, self.peak_pss = max(self.peak, rss), max(self.peak_pss, pss)
            if self.samples is not None:
                self.samples.append((time.monotonic(), rss, pss))
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
