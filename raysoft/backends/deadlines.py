"""Deadlines for waits on actors that are alive but may not answer (hung), derived from the
waits measured so far in the run.

A wait of kind ``op`` (a client op, a sum, a state transfer, a coordinator step) may last
``ray.call_timeout_s`` when it is set (but for the actors' start-up); otherwise ``FACTOR`` times
the longest wait of that kind measured so far in this run, but at least ``FLOOR_S``, and
``FIRST_S`` before one was measured (a first round may build models, load data and compile).
Pure bookkeeping: no Ray.
"""

from __future__ import annotations

FACTOR = 10.0
FLOOR_S = 300.0
FIRST_S = 3600.0


class Deadlines:
    def __init__(self, fixed_s: float | None = None) -> None:
        self.fixed_s = fixed_s
        self.longest: dict[str, float] = {}

    def limit(self, op: str) -> float:
        """Seconds a wait of kind ``op`` may last (the actors' start-up, which builds their
        clients' data, is never held to ``ray.call_timeout_s``)."""
        if self.fixed_s is not None and op != "start":
            return self.fixed_s
        if op not in self.longest:
            return FIRST_S
        return max(FLOOR_S, FACTOR * self.longest[op])

    def measured(self, op: str, seconds: float) -> None:
        """A wait of kind ``op`` that ended after ``seconds``."""
        self.longest[op] = max(self.longest.get(op, 0.0), seconds)

    def say(self, op: str) -> str:
        """How the limit of ``op`` was set, for the message of a wait that passed it."""
        if self.fixed_s is not None and op != "start":
            return f"{self.fixed_s:g} s (ray.call_timeout_s)"
        if op not in self.longest:
            return f"{FIRST_S:g} s (ray.call_timeout_s unset; nothing of {op!r} measured yet)"
        return (f"{self.limit(op):g} s ({FACTOR:g} x the longest {op!r} so far, {self.longest[op]:.3g} s, at least "
                f"{FLOOR_S:g} s; ray.call_timeout_s sets it)")
