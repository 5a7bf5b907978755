"""Round progress on stderr: a bar with ETA on a terminal (tqdm's, which fits the terminal's
width and keeps the lines said below it), plain lines otherwise (logs, Ray Jobs).

The ETA is measured from the first report (the initial evaluation, which comes after Ray's and
the actors' start-up), so start-up time does not inflate it, and is shown once a round has been
timed; every line names the algorithm. Its figures say what they are (``best center mse dist 0
269.8  dist 1 287.1  local models mse 210.9``; streams ``cluster accuracy dist 0 ...  local
models accuracy ...``), each in one format (:func:`_fmt_value`).
What the run survives (an injected fault, a client actor that died and its restart, a
non-finite or late update) is said as it happens, below the bar: a run-wide event one line each,
a client's events one line a round for each kind (``round 4: late_update, 27 clients (3, 8, …)``:
a straggling clock can make dozens a round); ``none`` is silent (``events.parquet`` keeps every
one, and ``summary.json``'s ``events`` counts them)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO, TypedDict

from tqdm import tqdm


def _fmt_time(sec: float) -> str:
    sec = int(round(sec))
    return f"{sec // 3600}h{sec // 60 % 60:02d}m" if sec >= 3600 else f"{sec // 60}m{sec % 60:02d}s"


def _fmt_value(value: float, share: bool) -> str:
    """One format for every figure: an accuracy as a percentage with one decimal, anything else
    with one decimal (three significant digits below 1): ``445.0`` beside ``363.3``, not ``445``."""
    if share:
        return f"{100 * value:.1f}%"
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"


def _fmt_headline(head: dict[str, float] | None) -> str:
    """``best center mse dist 0 269.8  dist 1 287.1  local models mse 210.9``: a label that names
    its metric sets the format of the figures after it."""
    parts, share = [], False
    for k, v in (head or {}).items():
        if "accuracy" in k:
            share = True
        elif "mse" in k or "loss" in k:
            share = False
        parts.append(f"{k} {_fmt_value(v, share)}")
    return "  ".join(parts)


class Event(TypedDict):
    """An event a coordinator hands the driver to say on stderr (a row of events.parquet)."""

    step: int
    kind: str
    detail: str
    client: int  # -1: no client's


def event_line(label: str, ev: Event) -> str:
    """An event as the line said on stderr: ``fedsoft round 2: late_update, client 7: op train: …``."""
    who = f", client {ev['client']}" if ev.get("client", -1) >= 0 else ""
    detail = f": {ev['detail']}" if ev.get("detail") else ""
    return f"{label}round {ev['step']}: {ev['kind']}{who}{detail}"


SHOWN_CLIENTS = 5
"""How many of a round's clients a summarised event line names."""


def event_lines(label: str, events: list[Event]) -> list[str]:
    """The lines said for a round's events: one each for events of no client (an actor that
    died, its recovery, an injected fault), and for a client's events one line per (round, kind),
    naming the first clients; a kind that hit one client keeps its own line, detail included."""
    lines: list[str] = []
    groups: dict[tuple[int, str], list[Event]] = {}
    for ev in events:
        if ev.get("client", -1) < 0:
            lines.append(event_line(label, ev))
            continue
        key = (ev["step"], ev["kind"])
        if key not in groups:
            groups[key] = []
            lines.append("")  # its place, filled below
        groups[key].append(ev)
    said = iter(groups.items())
    for i, line in enumerate(lines):
        if line:
            continue
        (step, kind), evs = next(said)
        if len(evs) == 1:
            lines[i] = event_line(label, evs[0])
            continue
        clients = sorted({ev["client"] for ev in evs})
        shown = ", ".join(map(str, clients[:SHOWN_CLIENTS])) + (", ..." if len(clients) > SHOWN_CLIENTS else "")
        details = {ev.get("detail") for ev in evs}
        detail = f": {details.pop()}" if len(details) == 1 and None not in details and "" not in details else ""
        lines[i] = (f"{label}round {step}: {kind}, {len(clients)} clients ({shown}){detail}; each one in "
                    "events.parquet")
    return lines


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
        self.bar: tqdm | None = None  # made at the first report, so that its rate leaves out start-up
        self.said: int | None = None  # the last round a line was said for (lines: each round once)

    def say(self, line: str) -> None:
        """One line of its own (below the bar, which is redrawn under it)."""
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()

    def eta(self, r: int) -> float | None:
        """Seconds left, from the pace since the first report; None until there is a pace."""
        now = time.monotonic()
        if self.first is None:
            self.first = (now, r)
        t0, r0 = self.first
        return (now - t0) / (r - r0) * (self.total - r) if r > r0 else None

    def __call__(self, info: dict[str, Any]) -> None:
        r = info["round"]
        if info.get("headline"):
            self.head = _fmt_headline(info["headline"])
        if self.mode == "none":
            return
        for line in event_lines(self.label, list(info.get("events") or ())):  # what the run survived, as it happens
            self.say(line)
        if self.mode == "bar":
            self._draw(r)
            return
        eta = self.eta(r)  # from the first report, with or without a headline
        # one line a round: rounds replayed after a recovery from the last checkpoint, or a
        # stream step that evaluated at the upload count already said, are not said again
        if info.get("headline") is not None and (self.said is None or r > self.said):
            self.said = r
            elapsed = _fmt_time(time.monotonic() - self.start)
            left = f"  ETA {_fmt_time(eta)}" if eta is not None else ""  # none before a round has been timed
            self.stream.write(f"{self.label}round {r}/{self.total}  elapsed {elapsed}{left}  {self.head}\n")
            self.stream.flush()

    def close(self) -> None:
        """End the bar where it is (a stopped run's bar stays as it was, with the line after it
        free for the stop message: nothing is drawn again below that)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _draw(self, r: int) -> None:
        if self.bar is None:
            self.bar = tqdm(total=self.total, initial=r, desc=self.label.strip() or None, file=self.stream,
                            dynamic_ncols=True, leave=True, mininterval=0.0,
                            bar_format="{desc} {bar} {n_fmt}/{total_fmt} ETA {remaining}{postfix}")
        self.bar.set_postfix_str(self.head, refresh=False)
        self.bar.update(r - self.bar.n)
        self.bar.refresh()
        if r >= self.total:
            self.bar.close()
            self.bar = None
