"""The names of the metrics and which way is better: shared by the runs that record them and
the reports that read them (no torch here, so a report does not import it)."""

from __future__ import annotations

HEADLINE = {"regression": "mse", "classification": "accuracy"}  # a task's headline metric
LOWER_IS_BETTER = {"mse": True, "loss": True, "accuracy": False}


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of ``metric`` is better: the known metrics, else any name that
    ends in ``mse`` or ``loss`` (a plug-in's own metrics)."""
    return LOWER_IS_BETTER.get(metric, metric.endswith("mse") or metric.endswith("loss"))


def headline_dists(what: str, values) -> dict[str, float]:
    """A progress line's figures per distribution, labelled as they read: ``{"best center mse dist
    0": v0, "dist 1": v1, ...}`` (what the figures are, once, then each distribution)."""
    return {(f"{what} dist {s}" if s == 0 else f"dist {s}"): float(v) for s, v in enumerate(values)}
