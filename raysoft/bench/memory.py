"""The memory of a process tree (Linux /proc), and a thread that samples its peak."""

from __future__ import annotations

import os
import threading
import time
from typing import Any


def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree_memory_mb(root: int) -> tuple[float, float]:
    """(RSS, PSS) of ``root`` and all its descendants, summed, in MB (Linux /proc). RSS counts a
    page shared by several processes (torch's libraries, Ray's object store) once per process;
    PSS splits it between them, so the PSS sum is the tree's real footprint."""
    kids = children_map()
    todo, rss, pss, page = [root], 0, 0, os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        todo.extend(kids.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * page
            with open(f"/proc/{pid}/smaps_rollup") as f:
                pss += next(int(ln.split()[1]) for ln in f if ln.startswith("Pss:")) * 1024
        except (OSError, StopIteration):
            continue
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
