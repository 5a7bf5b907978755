"""What a run's algorithm has, read from what the run wrote: a stream or rounds; no model, one
global model or several cluster models; no clustering, a hard one or a soft one; and whether the
number of clusters changed (clusters split or merged). The report draws only what a run has,
so a plug-in gets a truthful report without writing report code.

Nothing here asks the algorithm: a run directory is read without importing its plug-in. The rules:

* **models**: no cluster rows in metrics.parquet: ``none`` (Local). Every evaluation's cluster
  rows equal for every center (the same model evaluated once per center, as a stream plug-in
  with one global model shows it: FedAsync, FedBuff) or a single center (FedAvg): ``global``.
  Otherwise ``clusters``.
* **clustering**: assignments.parquet, or weights.parquet whose rows are one-hot (IFCA, FPFC,
  CFL): ``hard``; other weights (FedSoft's importance weights, FedEM's pi, a stream's mixture
  estimates): ``soft``; neither: ``none``.
* **changes**: the evaluations at which the number of evaluated centers differs from the
  evaluation before (CFL's splits, FPFC's merges): a center index names a cluster between two
  changes only.
* **by construction**: a stream with cluster models whose summary matches center k to
  distribution k and that records mixture estimates (CCFL, FedSoft-Async: cluster model k is
  pre-trained on distribution k's public set and the estimates compare u_k with share k).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

Models = Literal["none", "global", "clusters"]
Clustering = Literal["none", "hard", "soft"]


@dataclass(frozen=True)
class Shape:
    """What a run has (see the module's rules)."""

    stream: bool
    models: Models
    clustering: Clustering
    centers: dict[int, int]  # evaluation step -> number of centers evaluated then
    changes: tuple[int, ...]  # evaluation steps whose number of centers differs from the one before
    by_construction: bool

    @property
    def global_model(self) -> bool:
        return self.models == "global"

    @property
    def clustered(self) -> bool:
        return self.models == "clusters"


def _models(scores: pd.DataFrame) -> Models:
    if scores.empty:
        return "none"
    if scores.entity.nunique() == 1:
        return "global"
    spread = scores.groupby(["step", "eval_dist", "metric"]).value.agg(lambda v: float(np.ptp(v.to_numpy())))
    return "global" if bool((spread == 0).all()) else "clusters"


def hard_weights(weights: pd.DataFrame) -> bool:
    """Whether every recorded weight vector is one-hot (a hard clustering recorded as weights)."""
    if weights.empty:
        return False
    est = weights.estimate.to_numpy()
    if not np.isin(est, (0.0, 1.0)).all():
        return False
    return bool((weights.groupby(["step", "client"]).estimate.sum() == 1.0).all())


def _clustering(weights: pd.DataFrame, assignments: pd.DataFrame | None, stream: bool) -> Clustering:
    if stream:  # a stream's weights are per-upload mixture estimates
        return "soft" if not weights.empty else "none"
    if hard_weights(weights) or (assignments is not None and not assignments.empty):
        return "hard"
    return "soft" if not weights.empty else "none"


def describe(metrics: pd.DataFrame, weights: pd.DataFrame, assignments: pd.DataFrame | None, stream: bool,
             summary_matching: dict[int, int] | None) -> Shape:
    """The :class:`Shape` of a run with these tables (``RunData.shape`` passes its own), a stream
    or not, and its summary's matching of distributions to centers."""
    m = metrics
    cluster = m[m.scope == "cluster"]
    models = _models(cluster)
    counts = cluster.groupby("step").entity.nunique().sort_index() if not cluster.empty else pd.Series(dtype=int)
    centers = {int(s): int(n) for s, n in counts.items()}
    steps = list(centers)
    changes = tuple(b for a, b in zip(steps, steps[1:]) if centers[a] != centers[b]) if models == "clusters" else ()
    identity = summary_matching is not None and all(d == c for d, c in summary_matching.items())
    by_construction = stream and models == "clusters" and identity and not weights.empty
    return Shape(stream=stream, models=models, clustering=_clustering(weights, assignments, stream), centers=centers,
                 changes=changes, by_construction=by_construction)
