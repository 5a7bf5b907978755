"""Evaluation helpers: centers on holdout sets, matching centers to distributions, summaries.

Centers are numbered arbitrarily and distributions by the data; :func:`match_centers` finds
the one-to-one assignment of distributions to centers with the best total metric, which is
how the summary compares estimated importance weights with the true mixtures.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from .metrics import LOWER_IS_BETTER, lower_is_better
from .params import set_flat
from .training import evaluate, outputs, per_sample_loss


def evaluate_centers(
    scratch: nn.Module, centers: torch.Tensor, holdouts: Sequence[tuple[torch.Tensor, torch.Tensor]], task: str
) -> dict[tuple[int, int], dict[str, float]]:
    """{(center, distribution): metrics} of every center on every holdout set."""
    out = {}
    for c, vec in enumerate(centers):
        set_flat(scratch, vec)
        for s, (x, y) in enumerate(holdouts):
            out[(c, s)] = evaluate(scratch, x, y, task)
    return out


def match_centers(score: np.ndarray, lower_is_better: bool) -> tuple[int, ...]:
    """For a [S distributions, C centers] score matrix, the distinct center of each distribution
    that optimises the total score (exhaustive search over assignments; S <= C <= 9)."""
    cost = score if lower_is_better else -score
    s, c = cost.shape
    best, best_perm = np.inf, tuple(range(s))
    for perm in itertools.permutations(range(c), s):
        total = float(sum(cost[i, j] for i, j in enumerate(perm)))
        if total < best:
            best, best_perm = total, perm
    return best_perm


def weight_error(estimates: np.ndarray, truth: np.ndarray, matching: tuple[int, ...]) -> float:
    """Mean |u_k,match(s) - true share_ks| over clients and distributions."""
    return float(np.abs(estimates[:, list(matching)] - truth).mean())


def summarize(
    center_scores: np.ndarray,
    metric: str,
    local_means: dict[str, float],
    weights: np.ndarray | None,
    truth: np.ndarray,
) -> dict[str, object]:
    """Final figures: per distribution the best center and its metric, the matching, the mean
    local-model metrics and, when centers can be matched one-to-one, the importance-weight error."""
    lower = LOWER_IS_BETTER[metric]
    out: dict[str, object] = {
        "metric": metric,
        "local_mean": local_means,  # mean over clients of each local-model metric
    }
    s, c = center_scores.shape
    if c == 0:  # no centers (Local)
        return out
    best = center_scores.argmin(axis=1) if lower else center_scores.argmax(axis=1)
    out["distributions"] = [
        {"distribution": d, "best_center": int(best[d]), metric: float(center_scores[d, best[d]])} for d in range(s)
    ]
    out["distinct_best_centers"] = len(set(best.tolist())) == s
    if s <= c <= 9:
        matching = match_centers(center_scores, lower)
        out["matching"] = {str(d): int(m) for d, m in enumerate(matching)}
        if weights is not None:
            out["weight_mae"] = weight_error(weights, truth, matching)
    return out


# ----------------------------------------------------------------------------- per client
def score_client(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str) -> dict[str, float]:
    """The metrics of the model served to one client on that client's test split ``(x, y)``:
    ``mse`` (regression) or ``loss`` and ``accuracy`` (classification), as
    :func:`~raysoft.training.evaluate`. What ``client_metrics.parquet`` records for every
    client, training or held out, at every evaluation."""
    return evaluate(model, x, y, task)


SCORE_BATCH = 4096  # samples of several clients concatenated at most, when scored together


def score_clients(model: nn.Module, splits: Sequence[tuple[torch.Tensor, torch.Tensor]],
                  task: str) -> list[dict[str, float]]:
    """:func:`score_client` of one model on several clients' splits at once: forward passes over
    their concatenation (runs of clients of about :data:`SCORE_BATCH` samples, each in chunks,
    as :func:`~raysoft.training.outputs` does), the per-sample losses and hits then averaged per
    client. A sample's output does not depend on the others in its batch (no batch statistics
    in evaluation mode), so each client's figures are its own alone; many small clients cost a
    few large forward passes instead of one each."""
    out: list[dict[str, float]] = []
    run: list[tuple[torch.Tensor, torch.Tensor]] = []
    for split in [*splits, None]:
        if run and (split is None or sum(len(s[1]) for s in run) >= SCORE_BATCH):
            out += _score_run(model, run, task)
            run = []
        if split is not None:
            run.append(split)
    return out


@torch.no_grad()
def _score_run(model: nn.Module, splits: list[tuple[torch.Tensor, torch.Tensor]], task: str) -> list[dict[str, float]]:
    """:func:`score_clients` of one run of clients: one concatenation."""
    model.eval()
    x = torch.cat([s[0] for s in splits])
    y = torch.cat([s[1] for s in splits])
    out = outputs(model, x)
    losses = per_sample_loss(out, y, task)
    hits = None if task == "regression" else (out.argmax(-1) == y).float()
    result, start = [], 0
    for sx, _ in splits:
        end = start + len(sx)
        loss = float(losses[start:end].clone().mean())
        result.append({"mse": loss} if hits is None else
                      {"loss": loss, "accuracy": float(hits[start:end].clone().mean())})
        start = end
    return result


def worse_percentile(values: np.ndarray, metric: str) -> float:
    """The value that a tenth of the clients are served worse than: the 10th percentile of a
    metric where higher is better (accuracy), the 90th where lower is (mse, loss)."""
    return float(np.percentile(values, 90 if lower_is_better(metric) else 10))


def client_summary(values: np.ndarray, metric: str) -> dict[str, float]:
    """The distribution of one per-client metric: ``mean``, ``p10``, ``median``, ``p90`` (plain
    percentiles) and ``worst10_mean``, the mean of the worst tenth of the clients (at least one:
    the lowest accuracies, the highest losses)."""
    v = np.sort(np.asarray(values, dtype=float))
    if lower_is_better(metric):
        v = v[::-1]
    worst = v[: max(1, int(np.ceil(0.1 * len(v))))]
    return {"mean": float(v.mean()), "p10": float(np.percentile(v, 10)), "median": float(np.median(v)),
            "p90": float(np.percentile(v, 90)), "worst10_mean": float(worst.mean())}


def reached(value: float, target: float, metric: str) -> bool:
    """Whether ``value`` of ``metric`` reaches ``target`` (at most it where lower is better)."""
    return value <= target if lower_is_better(metric) else value >= target


def time_to_target(history: Sequence[dict[str, Any]], target: float, metric: str) -> dict[str, object]:
    """When the personalised metric first reached ``target``. ``history``: one entry per
    evaluation, in order, with ``step`` (the round, or a stream's upload), ``virtual_time``
    (None without a clock), ``mean`` and ``worse`` (:func:`worse_percentile`). Returns, for
    ``mean`` and ``p10`` (the worse tenth), ``{"step", "virtual_time"}`` of the first evaluation
    that reached it, or None where none did."""
    out: dict[str, object] = {"target": float(target), "metric": metric}
    for key, field in (("mean", "mean"), ("p10", "worse")):
        first = next((h for h in history if reached(h[field], target, metric)), None)
        out[key] = None if first is None else {"step": int(first["step"]), "virtual_time": first["virtual_time"]}
    return out


# ----------------------------------------------------------------------------- clusterings
def clustering_rows(truth: np.ndarray, predicted: np.ndarray, previous: np.ndarray | None) -> dict[str, float]:
    """A hard clustering of the clients against their true clusters: ``ari`` and ``nmi``
    (scikit-learn's ``adjusted_rand_score`` and ``normalized_mutual_info_score``) and, when the
    previous evaluation's clustering is given, ``changed``: the clients whose cluster changed.
    Cluster labels are arbitrary: "changed" compares labels as the algorithm numbers them."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    out = {"ari": float(adjusted_rand_score(truth, predicted)),
           "nmi": float(normalized_mutual_info_score(truth, predicted))}
    if previous is not None and len(previous) == len(predicted):
        out["changed"] = float(np.count_nonzero(np.asarray(previous) != np.asarray(predicted)))
    return out
