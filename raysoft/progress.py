"""Round progress on stderr: a bar with ETA on a terminal, plain lines otherwise.

The ETA is measured from the first report (the initial evaluation, which comes after Ray's and
the actors' start-up), so start-up time does not inflate it; every line names the algorithm.
What the run survives (an injected fault, a client actor that died and its restart, a
non-finite or late update) is said as it happens, one line each, below the bar; ``none`` is
silent (``events.parquet`` and ``summary.json``'s ``events`` keep them)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _fmt_time(sec: float) -> str:
    sec = int(round(sec))
    return f"{sec // 3600}h{sec // 60 % 60:02d}m" if sec >= 3600 else f"{sec // 60}m{sec % 60:02d}s"


def _fmt_headline(head: dict[str, float] | None) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in head.items()) if head else ""


def event_line(label: str, ev: dict[str, Any]) -> str:
    """An event as the line said on stderr: ``fedsoft round 2: late_update, client 7: op train: …``."""
    who = f", client {ev['client']}" if ev.get("client", -1) >= 0 else ""
    detail = f": {ev['detail']}" if ev.get("detail") else ""
    return f"{label}round {ev['step']}: {ev['kind']}{who}{detail}"


class Progress:
    """Call with each progress dict ({"round": r, "headline": {...} or None})."""

    def __init__(self, total: int, mode: str = "auto", stream: TextIO | None = None, label: str = "") -> None:
        self.total = total
        self.label = f"{label} " if label else ""
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "lines"
        self.mode = mode
        self.start = time.monotonic()
        self.first: tuple[float, int] | None = None  # (time, round) of the first report
        self.head = ""
        self.bar_open = False  # the bar is on the current line (a line said now starts a new one)

    def say(self, line: str) -> None:
        """One line of its own (below the bar, which the next report redraws)."""
        self.stream.write(("\n" if self.bar_open else "") + line + "\n")
        self.stream.flush()
        self.bar_open = False

    def eta(self, r: int) -> float:
        """Seconds left, from the pace since the first report."""
        now = time.monotonic()
        if self.first is None:
            self.first = (now, r)
        t0, r0 = self.first
        return (now - t0) / (r - r0) * (self.total - r) if r > r0 else 0.0

    def __call__(self, info: dict[str, Any]) -> None:
        r = info["round"]
        if info.get("headline"):
            self.head = _fmt_headline(info["headline"])
        if self.mode == "none":
            return
        for ev in info.get("events") or ():  # what the run survived, one line each, as it happens
            self.say(event_line(self.label, ev))
        elapsed = time.monotonic() - self.start
        eta = self.eta(r)
        if self.mode == "bar":
            width = 30
            filled = int(width * r / max(self.total, 1))
            bar = f"[{'#' * filled}{'.' * (width - filled)}]"
            line = f"\r{self.label}{bar} {r}/{self.total} ETA {_fmt_time(eta)}  {self.head}"
            self.stream.write(line[:200].ljust(80))
            self.bar_open = r != self.total
            if r == self.total:
                self.stream.write("\n")
            self.stream.flush()
        elif info.get("headline") is not None:
            self.stream.write(
                f"{self.label}round {r}/{self.total}  elapsed {_fmt_time(elapsed)}  ETA {_fmt_time(eta)}  {self.head}\n"
            )
            self.stream.flush()
