"""FedSoft's sub-steps against numbers computed by hand (FedSoft, AAAI'22, Algorithm 1)."""

import numpy as np
import pytest
import torch
from support.configs import small_config

import raysoft
from raysoft.algorithms.fedsoft import (
    aggregate_full,
    aggregate_selected,
    importance_weights,
    prox_gradient,
    select_clients,
    selection_probabilities,
)
from raysoft.config import TrainConfig
from raysoft.optim import SGD
from raysoft.training import proximal_train


def test_importance_weights_count_argmin_samples():
    # columns are samples; argmin centers: 0, 1, 0, 0 -> counts (3, 1) of n = 4
    losses = np.array([[1.0, 5.0, 2.0, 0.0], [3.0, 1.0, 4.0, 2.0]])
    np.testing.assert_allclose(importance_weights(losses, sigma=1e-4), [0.75, 0.25])


def test_importance_weights_sigma_floor_for_a_center_that_wins_nothing():
    losses = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 0.5]])
    np.testing.assert_allclose(importance_weights(losses, sigma=0.01), [1.0, 0.01, 0.01])


def test_importance_weights_ties_go_to_the_lowest_center():
    losses = np.array([[1.0, 2.0], [1.0, 2.0]])
    np.testing.assert_allclose(importance_weights(losses, sigma=0.0), [1.0, 0.0])


def test_selection_probabilities_equation_6():
    u = np.array([[0.5, 0.5], [1.0, 1e-4], [0.2, 0.8]])
    n = np.array([100, 200, 50])
    v = selection_probabilities(u, n)
    np.testing.assert_allclose(v[0], np.array([50.0, 200.0, 10.0]) / 260.0)
    np.testing.assert_allclose(v[1], np.array([50.0, 0.02, 40.0]) / 90.02)


def test_selection_probabilities_zero_column_is_uniform():
    v = selection_probabilities(np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([10, 30]))
    np.testing.assert_allclose(v[1], [0.5, 0.5])


@pytest.mark.slow
def test_select_clients_inclusion_probabilities():
    # K = 2 drawn without replacement with p = (.7, .2, .1, 0): inclusion probabilities by hand
    # client 0: .7 + .2*(.7/.8) + .1*(.7/.9) = .95278; client 1: .2 + .7*(.2/.3) + .1*(.2/.9)
    # = .68889; client 2: .1 + .7*(.1/.3) + .2*(.1/.8) = .35833; client 3: never.
    v = np.array([[0.7, 0.2, 0.1, 0.0]])
    rng = np.random.default_rng(0)
    counts = np.zeros(4)
    draws = 20000
    for _ in range(draws):
        (sel,) = select_clients(v, 2, rng)
        assert len(set(sel.tolist())) == 2
        counts[sel] += 1
    np.testing.assert_allclose(counts / draws, [0.95278, 0.68889, 0.35833, 0.0], atol=0.015)


def test_select_clients_with_too_few_positive_probabilities_takes_all_of_them():
    (sel,) = select_clients(np.array([[0.5, 0.5, 0.0]]), 3, np.random.default_rng(0))
    assert sel.tolist() == [0, 1]


def test_prox_gradient_equation_5():
    g = prox_gradient(
        torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0]),
        torch.tensor([[0.0, 0.0], [2.0, 4.0]]), torch.tensor([0.25, 0.75]), lam=2.0,
    )
    # 2 * (1 * w - (.25 c0 + .75 c1)) = 2 * ([1, 1] - [1.5, 3]) = [-1, -4]
    torch.testing.assert_close(g, torch.tensor([0.0, -2.0]))


def test_proximal_train_one_sgd_step_matches_equation_5():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 1.0]]))
    x = torch.eye(2)
    y = torch.zeros(2)
    centers = torch.tensor([[0.0, 0.0], [2.0, 4.0]])
    u = torch.tensor([0.25, 0.75])
    lam = 2.0
    cfg = TrainConfig(optimizer="sgd", lr=0.1, batch_size=2, local_epochs=1)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, xb):
            return self.inner(xb).squeeze(-1)

    net = Wrap()
    proximal_train(net, SGD(net.parameters(), lr=0.1), x, y, "regression", cfg,
                   pull_scale=lam * float(u.sum()), pull_target=lam * (u @ centers))
    # grad f = mean of 2 (x.w - y) x = [1, 1]; grad h = [1, 1] + 2([1, 1] - [1.5, 3]) = [0, -3]
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[1.0, 1.3]]))


def test_aggregate_selected_is_the_uniform_average_and_empty_clusters_keep_their_center():
    models = {0: torch.tensor([1.0, 2.0]), 1: torch.tensor([3.0, 3.0]), 2: torch.tensor([3.0, 4.0])}
    old = torch.tensor([[9.0, 9.0], [8.0, 8.0], [7.0, 7.0]])
    c = aggregate_selected([np.array([0, 2]), np.array([1]), np.array([], dtype=int)], models, old)
    torch.testing.assert_close(c, torch.tensor([[2.0, 3.0], [3.0, 3.0], [7.0, 7.0]]))


def test_aggregate_full_weights_by_v():
    models = {0: torch.tensor([4.0, 0.0]), 1: torch.tensor([0.0, 4.0])}
    old = torch.tensor([[9.0, 9.0], [8.0, 8.0]])
    c = aggregate_full(np.array([[0.25, 0.75], [1.0, 0.0]]), models, old)
    torch.testing.assert_close(c, torch.tensor([[1.0, 3.0], [4.0, 0.0]]))
    torch.testing.assert_close(aggregate_full(np.array([[0.25, 0.75], [1.0, 0.0]]), {}, old), old)


def test_center_sums_add_a_client_to_every_cluster_that_selected_it():
    """Client 1 is in Sel_0 and Sel_1; client 3's update was excluded (not finite), so Sel_1
    averages over 2; Sel_2 = {3} has no finite model and keeps its center. The plan adds each
    row's terms in ascending client id, wherever the sum runs."""
    from raysoft.algorithms.fedsoft import CenterSums

    old = torch.tensor([[9.0], [8.0], [7.0]])
    sums = CenterSums(old, (np.array([0, 1]), np.array([1, 2, 3]), np.array([3])))
    plan = sums.plan({0: {}, 1: {}, 2: {}})
    assert plan.terms == {0: [(0, 0.5)], 1: [(0, 0.5), (1, 0.5)], 2: [(1, 0.5)]}
    torch.testing.assert_close(plan.start, torch.tensor([[0.0], [0.0], [7.0]]))
    c = plan.apply({0: torch.tensor([2.0]), 1: torch.tensor([4.0]), 2: torch.tensor([10.0])})
    torch.testing.assert_close(c, torch.tensor([[3.0], [7.0], [7.0]]))
    assert old[0].item() == 9.0  # the old centers are not written


@pytest.mark.parametrize("sigma", [0.0, 1e-4, 0.3])
def test_importance_weights_never_below_sigma(sigma):
    losses = np.random.default_rng(1).random((3, 50))
    u = importance_weights(losses, sigma)
    assert (u >= sigma).all() and u.shape == (3,)


def test_coupling_by_hand():
    from raysoft.algorithms.fedsoft import coupling

    centers = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    u = np.array([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]])
    models = {0: torch.tensor([1.0, 3.0]), 2: torch.tensor([2.0, 4.0])}  # client 1 did not train
    # client 0: mixture (1, 0), distance 3; client 2: mixture (2, 0), distance 4
    assert coupling(models, u, centers) == pytest.approx(3.5)


def test_start_from_the_mixture_and_the_coupling_diagnostic(tmp_path):
    import pandas as pd

    runs = {start: raysoft.run(small_config(algorithm={"start": start}), out=tmp_path / start)
            for start in ("local", "mixture")}
    diag = {start: pd.read_parquet(r.run_dir / "diagnostics.parquet") for start, r in runs.items()}
    for d in diag.values():  # one coupling figure per round
        assert list(d.step) == [0, 1, 2, 3] and set(d.name) == {"coupling"} and (d.value > 0).all()
    # restarting from sum_s u_ks c_s keeps the local models coupled to the centers; the
    # persisting local models (the reference code's reading) drift away from them
    assert diag["mixture"].value.mean() < diag["local"].value.mean()
    assert not runs["mixture"].metrics.value.equals(runs["local"].metrics.value)
