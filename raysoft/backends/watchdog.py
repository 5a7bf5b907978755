"""Ends a local Ray when the driver that started it is gone, however it went (SIGKILL included).

Run as a script (it imports psutil and nothing of raysoft, torch or Ray)::

    python watchdog.py DRIVER_PID PID [PID ...]

While DRIVER_PID runs it keeps a list of the given processes (the local Ray's own: GCS, raylet,
dashboard, monitors) and of every process descended from them (agents, workers); once the
driver is gone it ends those still alive, with SIGTERM and, after a grace period, SIGKILL. The
list is kept during the run because Ray's own processes die with the driver and orphan their
children, which then can no longer be found as descendants; a process is recognised by its id
and start time (psutil's identity check), so a recycled id is never hit. ``session.connect``
starts it for every local Ray raysoft starts and stops it after a clean ``ray.shutdown``.
"""

from __future__ import annotations

import signal
import sys
import time

import psutil


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tree(roots: list[int]) -> list[int]:
    """``roots`` and their descendants that are alive."""
    seen: list[int] = []
    for root in roots:
        try:
            top = psutil.Process(root)
            procs = [top, *top.children(recursive=True)]
        except psutil.Error:
            continue
        seen.extend(p.pid for p in procs if p.pid not in seen and alive(p.pid))
    return seen


def end(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM to ``pids``, then SIGKILL to those still alive after ``grace`` seconds."""
    end_processes([p for p in map(_process, pids) if p is not None], grace)


def end_processes(procs: list[psutil.Process], grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                proc.send_signal(sig)  # refused (NoSuchProcess) if its id now names another process
            except psutil.Error:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p.pid) for p in procs if p.is_running()):
            time.sleep(0.1)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def main(argv: list[str]) -> int:
    driver, *ray_pids = (int(a) for a in argv)
    known: dict[int, psutil.Process] = {}  # each with its start time, so a recycled id is told apart
    while alive(driver):
        for pid in tree(ray_pids):
            if pid not in known and (proc := _process(pid)) is not None:
                known[pid] = proc
        time.sleep(0.5)
    ending = [p for p in known.values() if p.is_running()]
    for pid in tree([p.pid for p in ending]):  # and what they started since the last look
        if pid not in known and (proc := _process(pid)) is not None:
            ending.append(proc)
    end_processes(ending)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the driver
    raise SystemExit(main(sys.argv[1:]))
