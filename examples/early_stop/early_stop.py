"""A callback plug-in: stop a run once a metric has stopped improving.

Use it as ``callbacks: [{name: early_stop:EarlyStop, metric: mse, patience: 3}]`` from the
folder that holds this file. At every evaluation it reduces the new rows of ``metric`` in
``scope`` to one number: for each evaluation distribution the best entity (the best center on
that distribution's holdout set, for scope ``cluster``; or the entities' mean with
``entities: mean``), averaged over the distributions. After ``patience`` evaluations in a row
that do not beat the best value so far by more than ``min_delta``, it asks the run to stop: the
run is then written as complete, its summary.json saying ``stopped_early: true`` and
``stopped_at`` (the round).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Literal

import pandas as pd
from pydantic import Field

from raysoft.sdk import Callback, CallbackConfig


class EarlyStopSettings(CallbackConfig):
    metric: str = Field("mse", description="a metric of metrics.parquet (mse, accuracy, loss, ...)")
    scope: str = Field("cluster", description="its scope: cluster (the centers on the holdout sets) or client")
    mode: Literal["min", "max"] = Field("min", description="min: lower is better (mse, loss); max: accuracy")
    patience: int = Field(3, ge=1, description="evaluations without improvement before the run stops")
    min_delta: float = Field(0.0, ge=0.0, description="an improvement must beat the best value by more than this")
    entities: Literal["best", "mean"] = Field("best", description="how one evaluation's entities are combined per "
                                                                  "evaluation distribution")


class EarlyStop(Callback):
    """Returns True from ``on_rows`` after ``patience`` evaluations without improvement."""

    Settings = EarlyStopSettings
    settings: EarlyStopSettings

    def __init__(self, settings: EarlyStopSettings, run) -> None:
        super().__init__(settings, run)
        self.best: float | None = None
        self.best_step: int | None = None
        self.waited = 0
        self.history: list[tuple[int, float]] = []  # (step, value) of every evaluation seen

    def value(self, rows: pd.DataFrame) -> pd.Series:
        """The watched value of each evaluation step in ``rows`` (empty if none has the metric)."""
        s = self.settings
        mine = rows[(rows["scope"] == s.scope) & (rows["metric"] == s.metric)]
        if mine.empty:
            return pd.Series(dtype=float)
        per_dist = mine.groupby(["step", "eval_dist"])["value"]
        combined = per_dist.mean() if s.entities == "mean" else per_dist.min() if s.mode == "min" else per_dist.max()
        return combined.groupby(level="step").mean().sort_index()

    def on_rows(self, rows: pd.DataFrame) -> bool:
        s = self.settings
        for step, v in self.value(rows).items():
            self.history.append((int(step), float(v)))
            if self.best is None:
                better = True
            else:
                better = v < self.best - s.min_delta if s.mode == "min" else v > self.best + s.min_delta
            if better:
                self.best, self.best_step, self.waited = float(v), int(step), 0
                continue
            self.waited += 1
            if self.waited >= s.patience:
                print(f"early_stop: {s.scope} {s.metric} has not improved for {self.waited} evaluations (best "
                      f"{self.best:.4g} at round {self.best_step}); stopping at round {int(step)}", file=sys.stderr)
                return True
        return False


if TYPE_CHECKING:  # mypy checks EarlyStop against the callback protocol (pyproject.toml: [tool.mypy] files)
    from raysoft.sdk import CallbackHooks

    _: type[CallbackHooks] = EarlyStop
