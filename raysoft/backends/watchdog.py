"""Ends a local Ray when the driver that started it is gone, however it went (SIGKILL included).

Run as a script (it imports nothing of raysoft, torch or Ray)::

    python watchdog.py DRIVER_PID PID [PID ...]

While DRIVER_PID runs it keeps a list of the given processes (the local Ray's own: GCS, raylet,
dashboard, monitors) and of every process descended from them (agents, workers); once the
driver is gone it ends those still alive, with SIGTERM and, after a grace period, SIGKILL. The
list is kept during the run because Ray's own processes die with the driver and orphan their
children, which then can no longer be found as descendants; a process is recognised by its id
and start time, so a recycled id is never hit. Processes are found through /proc (Linux); without
/proc it only waits. ``ray_backend.connect`` starts it for every local Ray raysoft starts and
stops it after a clean ``ray.shutdown``.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(name))
    return out


def tree(roots: list[int]) -> list[int]:
    """``roots`` and their descendants that are alive."""
    kids, seen, todo = children(), [], list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen and alive(pid):
            seen.append(pid)
            todo.extend(kids.get(pid, []))
    return seen


def started(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), which tells a recycled id apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def end(pids: list[int], grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)


def main(argv: list[str]) -> int:
    driver, *ray_pids = (int(a) for a in argv)
    if not os.path.isdir("/proc"):
        return 0
    known: dict[int, str] = {}
    while alive(driver):
        for pid in tree(ray_pids):
            known.setdefault(pid, started(pid) or "")
        time.sleep(0.5)
    end(tree([pid for pid, t in known.items() if started(pid) == t]))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the driver
    raise SystemExit(main(sys.argv[1:]))
