"""Reading a run directory: its summary.json and parquet tables as one :class:`RunData`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import ReportError, first_line
from ..metrics import lower_is_better
from .shape import Shape, describe

REQUIRED = ("summary.json", "metrics.parquet")
_WEIGHT_COLUMNS = ["run_id", "step", "client", "center", "estimate"]
_CLIENT_COLUMNS = ["run_id", "step", "client", "distribution", "share", "samples"]


def _stream_algorithm(name: str) -> bool:
    """A run whose summary has no ``kind`` (an older run): its algorithm says whether it was a
    stream; an algorithm this process does not know was not."""
    from ..config import ConfigError
    from ..plugins import PluginError, is_stream_algorithm

    try:
        return is_stream_algorithm(name)
    except (ConfigError, PluginError):
        return False


@dataclass(frozen=True)
class RunData:
    """One run directory's summary and tables (optional tables empty / ``None`` when absent)."""

    path: Path
    summary: dict[str, Any]
    metrics: pd.DataFrame
    weights: pd.DataFrame
    clients: pd.DataFrame
    assignments: pd.DataFrame | None
    # the tables only some runs write (None when absent): an algorithm's own per-round figures,
    # its clusterings scored against the truth, every client's personalised metric, the bytes sent
    diagnostics: pd.DataFrame | None = None
    clustering: pd.DataFrame | None = None
    client_metrics: pd.DataFrame | None = None
    comm: pd.DataFrame | None = None

    @cached_property
    def shape(self) -> Shape:
        """What the run's algorithm has (:mod:`.shape`): what the report draws and says."""
        return describe(self.metrics, self.weights, self.assignments, self.is_stream, self.summary_matching)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def algorithm(self) -> str:
        algo = self.summary.get("algorithm")
        if algo:
            return str(algo)
        return str(self.metrics.algorithm.iloc[0]) if len(self.metrics) else "?"

    @property
    def metric(self) -> str:
        """The headline metric (``mse`` or ``accuracy``)."""
        metric = self.summary.get("metric")
        if metric:
            return str(metric)
        names = set(self.metrics.metric)
        return "mse" if "mse" in names else "accuracy"

    @property
    def lower_is_better(self) -> bool:
        return lower_is_better(self.metric)

    @property
    def is_stream(self) -> bool:
        """An asynchronous stream run: its summary's ``kind`` says so (or, for runs written before
        it had one, a built-in stream algorithm), or client rows named ``accuracy_before``."""
        if self.summary.get("kind") == "stream" or _stream_algorithm(self.algorithm):
            return True
        m = self.metrics
        return bool(((m.scope == "client") & (m.metric == "accuracy_before")).any())

    @property
    def summary_matching(self) -> dict[int, int] | None:
        """Distribution -> center as summary.json has it (by the final scores), if it has one."""
        m = self.summary.get("matching")
        return {int(d): int(c) for d, c in m.items()} if m else None

    @property
    def matching(self) -> dict[int, int] | None:
        """Distribution -> center: the summary's one-to-one matching; for streams whose cluster
        model k is distribution k's by construction (:attr:`Shape.by_construction`), the identity
        over the cluster models. None for a run without cluster models (one global model: nothing
        to match)."""
        shape = self.shape
        if not shape.clustered:
            return None
        if shape.by_construction:
            c = self.center_scores()
            both = set(c.entity.unique()) & set(c.eval_dist.unique())
            return {int(k): int(k) for k in sorted(both)} or None
        return self.summary_matching

    def center_scores(self) -> pd.DataFrame:
        """The cluster rows of the headline metric (step, entity = center, eval_dist, value)."""
        m = self.metrics
        return m[(m.scope == "cluster") & (m.metric == self.metric)]


def load_run(path: str | Path) -> RunData:
    """Read a run directory; :class:`ReportError` (naming the path and what is missing) if it is
    not one."""
    p = Path(path)
    if not p.is_dir():
        why = "not a directory" if p.exists() else "no such directory"
        raise ReportError(f"{path}: not a run directory ({why})")
    missing = [name for name in REQUIRED if not (p / name).is_file()]
    if missing:
        raise ReportError(f"{path}: not a run directory (missing {', '.join(missing)})")

    def table(name: str) -> pd.DataFrame | None:
        f = p / f"{name}.parquet"
        if not f.is_file():
            return None
        try:
            return pd.read_parquet(f)
        except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds
            raise ReportError(f"{path}: unreadable {f.name} ({first_line(err)})") from None

    try:
        summary = json.loads((p / "summary.json").read_text())
    except (OSError, ValueError) as err:
        raise ReportError(f"{path}: unreadable summary.json ({first_line(err)})") from None
    if not isinstance(summary, dict):
        raise ReportError(f"{path}: unreadable summary.json (not a JSON object)")
    metrics = table("metrics")
    weights = table("weights")
    clients = table("clients")
    return RunData(
        path=p,
        summary=summary,
        metrics=metrics,
        weights=weights if weights is not None else pd.DataFrame(columns=_WEIGHT_COLUMNS),
        clients=clients if clients is not None else pd.DataFrame(columns=_CLIENT_COLUMNS),
        assignments=table("assignments"),
        diagnostics=table("diagnostics"),
        clustering=table("clustering"),
        client_metrics=table("client_metrics"),
        comm=table("comm"),
    )

