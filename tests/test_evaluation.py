"""raysoft.evaluation: centers scored on holdouts, the one-to-one matching of distributions to
centers, the importance-weight error and the summary, all by hand."""

import numpy as np
import pytest
import torch

from raysoft.evaluation import evaluate_centers, match_centers, summarize, weight_error
from raysoft.metrics import HEADLINE, LOWER_IS_BETTER
from raysoft.models import LinearRegression


def test_headline_metrics():
    assert HEADLINE == {"regression": "mse", "classification": "accuracy"}
    assert LOWER_IS_BETTER["mse"] and LOWER_IS_BETTER["loss"] and not LOWER_IS_BETTER["accuracy"]


def test_evaluate_centers_by_hand():
    """y = <x, w>; holdout 0: x = (1, 0), y = 1; holdout 1: x = (0, 1), y = 0 (two samples)."""
    centers = torch.tensor([[1.0, 0.0], [3.0, 2.0]])
    holdouts = [
        (torch.tensor([[1.0, 0.0]]), torch.tensor([1.0])),
        (torch.tensor([[0.0, 1.0], [0.0, 1.0]]), torch.tensor([0.0, 0.0])),
    ]
    got = evaluate_centers(LinearRegression(2), centers, holdouts, "regression")
    assert got == {
        (0, 0): {"mse": 0.0},  # 1 - 1
        (0, 1): {"mse": 0.0},  # 0 - 0
        (1, 0): {"mse": 4.0},  # 3 - 1
        (1, 1): {"mse": 4.0},  # 2 - 0
    }


def test_match_centers_is_exhaustive_not_greedy():
    """Greedy gives distribution 0 its best center 0 (1) and distribution 1 center 1 (10): 11.
    The best one-to-one assignment is 0 -> 1 (2) and 1 -> 0 (1): 3."""
    score = np.array([[1.0, 2.0], [1.0, 10.0]])
    assert match_centers(score, lower_is_better=True) == (1, 0)
    assert match_centers(score, lower_is_better=False) == (0, 1)  # 1 + 10 is the largest total


def test_match_centers_with_more_centers_than_distributions():
    score = np.array([[0.2, 0.9, 0.8], [0.3, 0.95, 0.1]])  # accuracies: higher is better
    assert match_centers(score, lower_is_better=False) == (2, 1)  # 0.8 + 0.95 beats 0.9 + 0.3
    assert match_centers(score, lower_is_better=True) == (0, 2)


def test_weight_error_by_hand():
    estimates = np.array([[0.2, 0.8], [0.6, 0.4]])  # [clients, centers]
    truth = np.array([[1.0, 0.0], [0.0, 1.0]])  # [clients, distributions]
    # matching (1, 0): distribution 0 is center 1: the columns [[0.8, 0.2], [0.4, 0.6]];
    # |differences| [[0.2, 0.2], [0.4, 0.4]], mean 0.3
    assert weight_error(estimates, truth, (1, 0)) == pytest.approx(0.3)
    # identity: [[0.8, 0.8], [0.6, 0.6]], mean 0.7
    assert weight_error(estimates, truth, (0, 1)) == pytest.approx(0.7)


def test_weight_error_picks_the_matched_centers_columns():
    estimates = np.array([[0.1, 0.0, 0.9]])
    assert weight_error(estimates, np.array([[0.0, 1.0]]), (1, 2)) == pytest.approx(0.05)  # |0 - 0|, |0.9 - 1|


def test_summarize_by_hand():
    scores = np.array([[0.5, 0.1], [0.2, 0.4]])  # mse of 2 distributions x 2 centers
    weights = np.array([[0.9, 0.1], [0.3, 0.7]])
    truth = np.array([[0.0, 1.0], [1.0, 0.0]])
    out = summarize(scores, "mse", {"mse": 0.3}, weights, truth)
    assert out == {
        "metric": "mse",
        "local_mean": {"mse": 0.3},
        "distributions": [
            {"distribution": 0, "best_center": 1, "mse": 0.1},
            {"distribution": 1, "best_center": 0, "mse": 0.2},
        ],
        "distinct_best_centers": True,
        "matching": {"0": 1, "1": 0},
        # columns (1, 0): [[0.1, 0.9], [0.7, 0.3]] - truth: |.| = [[0.1, 0.1], [0.3, 0.3]]
        "weight_mae": pytest.approx(0.2),
    }


def test_summarize_accuracy_prefers_the_highest():
    scores = np.array([[0.9, 0.8, 0.1], [0.95, 0.2, 0.3]])
    out = summarize(scores, "accuracy", {}, None, np.zeros((1, 2)))
    assert [d["best_center"] for d in out["distributions"]] == [0, 0]
    assert out["distinct_best_centers"] is False  # both distributions' best is center 0
    assert out["matching"] == {"0": 1, "1": 0}  # 0.8 + 0.95 beats 0.9 + 0.3
    assert "weight_mae" not in out  # no weights (a hard clustering)


def test_summarize_without_centers():
    out = summarize(np.zeros((2, 0)), "accuracy", {"accuracy": 0.7}, None, np.zeros((3, 2)))
    assert out == {"metric": "accuracy", "local_mean": {"accuracy": 0.7}}


def test_summarize_without_a_one_to_one_matching():
    fewer_centers = summarize(np.array([[1.0], [2.0]]), "mse", {}, np.ones((2, 1)), np.eye(2))
    assert "matching" not in fewer_centers and "weight_mae" not in fewer_centers
    assert fewer_centers["distinct_best_centers"] is False
    too_many = summarize(np.arange(10.0)[None, :], "mse", {}, np.ones((1, 10)), np.ones((1, 1)))
    assert "matching" not in too_many and too_many["distributions"][0]["best_center"] == 0
