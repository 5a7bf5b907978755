"""Unseen clients: which clients ``data.held_out`` keeps out of training, and the summary of
their cold starts.

A held-out client is never selected, never trained and never counted in a training aggregate;
at the final evaluation (``data.held_out_eval: final``) or at every one (``every``) it gets the
algorithm's cold start from its own training data, run where its data lives by the client op
:data:`UNSEEN_OP` (docs/plugins.md#unseen-clients), and is scored on its own test split (on
its training data where the dataset has no test split of its own). Which clients are held out
is drawn from the data's seed (``data.seed``, else the run's) through a random stream of its
own, ``"held-out"``, so that no other draw moves. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .config.data import DataConfig
from .rng import numpy_rng

UNSEEN_OP = "unseen"
"""The client op of a cold start: ``op(ctx, None, payload, t) -> metrics`` (a dict or an
:class:`~raysoft.algorithms.base.EvalResult`), its payload the algorithm's
``unseen_payload(state)`` (else its ``eval_payload(state)``), ``t`` the round."""


def held_out_clients(data: DataConfig, run_seed: int) -> tuple[int, ...]:
    """The clients kept out of training (ascending): ``data.held_out_count()`` of them drawn
    uniformly without replacement from the stream (data seed, "held-out"); none when 0."""
    count = data.held_out_count()
    if count == 0:
        return ()
    rng = numpy_rng(data.draw_seed(run_seed), "held-out")
    return tuple(sorted(int(k) for k in rng.choice(data.clients, size=count, replace=False)))


def headline_name(names: Sequence[str], metric: str) -> str | None:
    """The metric a held-out client is summarised by: the headline ``metric`` of its served
    model on its test split (as every row of ``client_metrics.parquet``), else None."""
    return metric if metric in names else None


def unseen_summary(metrics: Mapping[int, Mapping[str, float]], metric: str, step: int) -> dict[str, object]:
    """The distribution over held-out clients of their headline metric (:func:`headline_name`):
    mean, p10 and median (numpy's linear percentiles), at evaluation ``step``."""
    out: dict[str, object] = {"step": step, "scored": len(metrics)}
    if not metrics:
        return out
    name = headline_name(list(next(iter(metrics.values()))), metric)
    if name is None:
        return out
    values = np.array([float(metrics[k][name]) for k in sorted(metrics)])
    out.update(metric=name, mean=float(values.mean()), p10=float(np.percentile(values, 10)),
               median=float(np.median(values)))
    return out
