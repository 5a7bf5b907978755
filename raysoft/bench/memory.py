"""The memory of a process tree (psutil), per process and summed, and a thread that samples it."""

from __future__ import annotations

import threading
import time
from pathlib import PurePath

import psutil

MB = 2**20


def role(proc: psutil.Process, root: int) -> str:
    """What a process of the tree is: ``driver`` (the root), a Ray worker by its title without
    the method it is running (``ray::ClientActor``, ``ray::CoordinatorActor``, ``ray::IDLE``), a
    Python process by its script (``dashboard.py``), anything else by its program (``raylet``,
    ``gcs_server``)."""
    if proc.pid == root:
        return "driver"
    try:
        cmd = proc.cmdline()
        if not cmd:  # a kernel thread or a zombie: no command line
            return proc.name()
    except psutil.Error:
        return "gone"
    if cmd[0].startswith("ray::"):
        return cmd[0].split()[0].split(".", 1)[0]
    scripts = [a for a in cmd[1:] if a.endswith(".py")]
    if scripts:
        return PurePath(scripts[0]).name
    if "-m" in cmd[1:-1]:
        return cmd[cmd.index("-m") + 1]
    return PurePath(cmd[0]).name


def tree_processes(root: int) -> list[tuple[int, str, float, float]]:
    """(pid, :func:`role`, RSS MB, PSS MB) of ``root`` and each of its descendants. A process
    that ends while it is read is left out; a platform without PSS (not Linux) reports its RSS as
    the PSS."""
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return []
    found = []
    for proc in procs:
        try:
            mem = proc.memory_full_info()
        except psutil.Error:  # gone, or not ours to read
            continue
        found.append((proc.pid, role(proc, root), mem.rss / MB, getattr(mem, "pss", mem.rss) / MB))
    return found


def tree_memory_mb(root: int) -> tuple[float, float]:
    """(RSS, PSS) of ``root`` and all its descendants, summed, in MB. RSS counts a page shared by
    several processes (torch's libraries, Ray's object store) once per process; PSS splits it
    between them, so the PSS sum is the tree's real footprint."""
    procs = tree_processes(root)
    return sum(p[2] for p in procs), sum(p[3] for p in procs)


class PeakSampler:
    """Samples the process tree of ``pid`` every ``interval`` seconds in a thread: its peak RSS
    and PSS, and with ``series`` every sample, summed (``samples``: time.monotonic(), RSS MB,
    PSS MB) and per process (``processes``: time.monotonic(), pid, role, PSS MB)."""

    def __init__(self, pid: int, interval: float = 0.2, series: bool = False) -> None:
        self.pid, self.interval, self.peak, self.peak_pss = pid, interval, 0.0, 0.0
        self.samples: list[tuple[float, float, float]] | None = [] if series else None
        self.processes: list[tuple[float, int, str, float]] | None = [] if series else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            procs = tree_processes(self.pid)
            rss, pss = sum(p[2] for p in procs), sum(p[3] for p in procs)
            self.peak, self.peak_pss = max(self.peak, rss), max(self.peak_pss, pss)
            if self.samples is not None and self.processes is not None:
                now = time.monotonic()
                self.samples.append((now, rss, pss))
                self.processes += [(now, pid, name, p) for pid, name, _, p in procs]
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
