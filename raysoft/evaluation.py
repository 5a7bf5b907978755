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

from .metrics import LOWER_IS_BETTER
from .params import set_flat
from .training import evaluate


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
) -> dict[str, Any]:
    """Final figures: per distribution the best center and its metric, the matching, the mean
    local-model metrics and, when centers can be matched one-to-one, the importance-weight error."""
    lower = LOWER_IS_BETTER[metric]
    out: dict[str, Any] = {
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
