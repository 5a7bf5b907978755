"""CCFL's sub-steps against numbers computed by hand (CCFL, ICLR 2024 submission: Algorithms 1
and 2, equation (3), section 5.3; the readings in docs/algorithms.md#ccfl)."""

import math

import numpy as np
import pytest
import torch

from raysoft.algorithms.ccfl import (
    CCFLConfig,
    CCFLServerState,
    adjustment_active,
    adjustment_rejects,
    alpha1,
    alpha2,
    amplify,
    client_objective_gradient,
    client_start,
    client_update,
    cluster_losses,
    combine_scores,
    estimate_distribution,
    init_server_state,
    initial_reply,
    is_stale,
    kl_floor,
    largest_weight,
    model_distances,
    on_upload,
    personalised_model,
    reduce_losses,
    self_losses,
    staleness_gaps,
    subtract_bar,
    table2_settings,
    update_clusters,
    update_ratios,
)
from raysoft.config import TrainConfig
from raysoft.models import Logistic
from raysoft.optim import SGD
from raysoft.params import set_flat


class Linear(torch.nn.Module):
    """y = <x, w>, Linear(d -> 1) without bias, squeezed to [n]."""

    def __init__(self, d: int = 2) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(d, 1, bias=False)

    def forward(self, x):
        return self.inner(x).squeeze(-1)


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


# Two clusters in d = 2: w_0 = [1, 0], w_1 = [0, 2]; D_k = (I, X w_k), so F(w_k; D_k) = 0.
MODELS = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
VAL = [(torch.eye(2), torch.tensor([1.0, 0.0])), (torch.eye(2), torch.tensor([0.0, 2.0]))]
W_M = torch.tensor([1.0, 1.0])
# w_m's squared errors: on D_0 (0, 1), on D_1 (1, 1). Mean: l = (0.5, 1); d1 = l; d2 = (1, sqrt 2).


def mean_params(**kw) -> CCFLConfig:
    base = dict(loss_reduction="mean", l_bar=0.0, d1_bar=0.0, d2_bar=0.0, adjust_start=None, tau0=100)
    base.update(kw)
    return CCFLConfig(**base)


# ----------------------------------------------------------------------------- staleness
def test_is_stale_is_t_minus_tau_strictly_above_tau0():
    assert is_stale(10, 4, 5)  # 6 > 5
    assert not is_stale(10, 5, 5)  # 5 == tau0: Algorithm 2's ">" keeps it fresh
    assert not is_stale(10, 9, 5)


# ----------------------------------------------------------------------------- F, l, d1, d2
def test_reduce_losses_mean_and_sum_of_batch_means():
    per = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert reduce_losses(per, "mean", 2) == pytest.approx(3.0)
    # batches (1, 2), (3, 4), (5): 1.5 + 3.5 + 5 = 10
    assert reduce_losses(per, "batch_sum", 2) == pytest.approx(10.0)
    # paper_scale: the mean (3) times the batches of 2000 samples (ceil(2000 / 128) = 16)
    assert reduce_losses(per, "paper_scale", 128) == pytest.approx(48.0)


def test_cluster_losses_of_a_known_vector_mean_and_batch_sum():
    scratch = Linear()
    np.testing.assert_allclose(cluster_losses(scratch, W_M, VAL, "regression", "mean"), [0.5, 1.0])
    # batch size 1: the sum of the per-sample losses, (0 + 1, 1 + 1)
    np.testing.assert_allclose(cluster_losses(scratch, W_M, VAL, "regression", "batch_sum", 1), [1.0, 2.0])


def test_cluster_losses_two_class_logistic_with_zero_weights_is_log_2_per_sample():
    scratch = Logistic(2, 2)
    w = torch.zeros(6)  # 2x2 weights + 2 biases: every logit 0, CE = ln 2
    val = [(torch.randn(3, 2), torch.tensor([0, 1, 1])), (torch.randn(5, 2), torch.tensor([1, 0, 0, 1, 1]))]
    np.testing.assert_allclose(cluster_losses(scratch, w, val, "classification", "mean"), [math.log(2)] * 2)
    # batch 2: batches of sizes (2, 1) and (2, 2, 1) -> 2 and 3 batch means of ln 2
    np.testing.assert_allclose(cluster_losses(scratch, w, val, "classification", "batch_sum", 2),
                               [2 * math.log(2), 3 * math.log(2)], rtol=1e-6)


def test_model_distances_d1_is_the_loss_gap_on_d_k_and_d2_the_l2_distance():
    scratch = Linear()
    own = self_losses(scratch, MODELS, VAL, "regression", "mean")
    np.testing.assert_allclose(own, [0.0, 0.0])
    l = cluster_losses(scratch, W_M, VAL, "regression", "mean")
    d1, d2 = model_distances(W_M, MODELS, l, own)
    np.testing.assert_allclose(d1, [0.5, 1.0])
    np.testing.assert_allclose(d2, [1.0, math.sqrt(2)])
    # d1 is an absolute value: a cluster model worse than the upload on its own set
    d1, _ = model_distances(W_M, MODELS, np.array([0.5, 1.0]), np.array([2.0, 0.25]))
    np.testing.assert_allclose(d1, [1.5, 0.75])


def test_self_losses_reuse_cached_entries_and_fill_nan():
    scratch = Linear()
    out = self_losses(scratch, MODELS, VAL, "regression", "mean", cached=np.array([7.0, np.nan]))
    np.testing.assert_allclose(out, [7.0, 0.0])


# ----------------------------------------------------------------------------- bars, combination, amplifier
def test_subtract_fixed_bar_with_and_without_the_floor():
    v = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(subtract_bar(v, 1.5, floor=0.0), [0.0, 0.5, 1.5])
    np.testing.assert_allclose(subtract_bar(v, 1.5, floor=None), [-0.5, 0.5, 1.5])


def test_subtract_min_bar_gives_the_best_cluster_zero():
    np.testing.assert_allclose(subtract_bar(np.array([3.0, 1.0, 2.0]), "min"), [2.0, 0.0, 1.0])


def test_combine_scores_by_hand_three_clusters():
    # u_k = (1/2)[1 - .5 l_k/6 - .3 d1_k/2 - .2 d2_k/8]
    u = combine_scores(np.array([1.0, 2.0, 3.0]), np.array([0.0, 1.0, 1.0]), np.array([2.0, 2.0, 4.0]), c1=0.5, c2=0.3)
    np.testing.assert_allclose(u, [13 / 30, 19 / 60, 1 / 4])
    assert u.sum() == pytest.approx(1.0)


def test_combine_scores_all_zero_term_is_uniform_and_one_cluster_is_certain():
    # S(l) = (1/2, 1/2) (all zero), S(d1) = (3/4, 1/4); c2 = .5 -> (.25 + .375, .25 + .125)
    u = combine_scores(np.zeros(2), np.array([1.0, 3.0]), np.array([2.0, 2.0]), c1=0.5, c2=0.5)
    np.testing.assert_allclose(u, [0.625, 0.375])
    np.testing.assert_allclose(combine_scores(np.ones(1), np.ones(1), np.ones(1), 0.5, 0.2), [1.0])


def test_floor_prevents_the_ranking_inversion_of_a_too_large_l_bar():
    l = np.array([1.0, 2.0])  # cluster 0 is better
    # paper-literal: (-7, -6); S = (-6/-13, -7/-13) = (6/13, 7/13) -> cluster 1 wins (inverted)
    np.testing.assert_allclose(combine_scores(subtract_bar(l, 8.0, None), np.ones(2), np.ones(2), 1.0, 0.0),
                               [6 / 13, 7 / 13])
    # clamped at 0: both zero, the term carries no information
    np.testing.assert_allclose(combine_scores(subtract_bar(l, 8.0, 0.0), np.ones(2), np.ones(2), 1.0, 0.0),
                               [0.5, 0.5])


def test_amplify_is_a_softmax_of_a_times_u_once_per_value_of_a():
    p = sigmoid(2 * 0.75 - 2 * 0.25)  # softmax([1.5, 0.5])
    np.testing.assert_allclose(amplify(np.array([0.75, 0.25]), (2.0,)), [p, 1 - p])
    q = sigmoid(2 * p - 2 * (1 - p))  # the second pass on the first's output
    np.testing.assert_allclose(amplify(np.array([0.75, 0.25]), (2.0, 2.0)), [q, 1 - q])
    u = amplify(np.array([0.5, 0.3, 0.2]), (10.0,))
    e = np.exp(10 * np.array([0.5, 0.3, 0.2]))
    np.testing.assert_allclose(u, e / e.sum())


def test_estimate_distribution_by_hand():
    est = estimate_distribution(Linear(), W_M, MODELS, VAL, mean_params(c1=0.5, c2=0.25, amplifier=[1.0]),
                                task="regression")
    # S(l) = S(d1) = (2/3, 1/3); S(d2) = (sqrt2, 1)/(1 + sqrt2) = (2 - sqrt2, sqrt2 - 1)
    s0 = 0.75 * 2 / 3 + 0.25 * (2 - math.sqrt(2))
    np.testing.assert_allclose(est.scores, [s0, 1 - s0])
    u0 = sigmoid(s0 - (1 - s0))
    np.testing.assert_allclose(est.u, [u0, 1 - u0])
    np.testing.assert_allclose(est.l, [0.5, 1.0])
    np.testing.assert_allclose(est.d2, [1.0, math.sqrt(2)])


# ----------------------------------------------------------------------------- update ratios
def test_alpha1_ave_threshold_then_max_normalised():
    u = np.array([0.5, 0.35, 0.15])  # ave = 1/3
    np.testing.assert_allclose(alpha1(u, "ave"), [1.0, 0.7, 0.0])
    np.testing.assert_allclose(alpha1(u, 0.4), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(alpha1(u, 0.1), [1.0, 0.7, 0.3])
    np.testing.assert_allclose(alpha1(np.full(3, 1 / 3), "ave"), [1.0, 1.0, 1.0])  # equal: all pass


def test_alpha2_fresh_below_b_and_decayed_from_the_gap():
    # gap t_k - tau = (-3, 2, 5, 10) with a = 10, b = 5
    np.testing.assert_allclose(alpha2(np.array([-3, 2, 5, 10]), a=10.0, b=5.0), [1.0, 1.0, 1 / 51, 1 / 101])


def test_update_ratios_combine_alpha0_alpha1_alpha2():
    u, t_k, tau = np.array([0.5, 0.35, 0.15]), np.array([12, 15, 20]), 10  # t_k - tau = (2, 5, 10)
    p = CCFLConfig(alpha0=0.025, a=10.0, b=5.0, alpha1_bar="ave")
    state = CCFLServerState(models=torch.zeros(3, 2), t=20, t_k=t_k)
    alpha = update_ratios(u, staleness_gaps(state, tau, p), p)
    np.testing.assert_allclose(alpha, [0.025, 0.025 * 0.7 / 51, 0.0])
    alpha = update_ratios(u, t_k - tau, CCFLConfig(alpha0=0.025, a=10.0, b=5.0, alpha1_bar=0.1))
    np.testing.assert_allclose(alpha, [0.025, 0.025 * 0.7 / 51, 0.025 * 0.3 / 101])
    # the same client, fresh against every cluster (t_k - tau < b): alpha2 = 1
    alpha = update_ratios(u, np.array([0, 1, 4]), CCFLConfig(alpha0=0.025, alpha1_bar=0.1))
    np.testing.assert_allclose(alpha, [0.025, 0.025 * 0.7, 0.025 * 0.3])


def test_staleness_clocks_by_hand():
    """One state read on the three clocks: an upload stamped tau = 2 at t = 10, clusters last
    updated at t_k = (9, 4, 0), cluster 0 updated at epochs 3, 5, 9, cluster 1 at 1 and 4,
    cluster 2 never."""
    versions = np.zeros((11, 3), dtype=np.int64)
    for k, epochs in enumerate([(3, 5, 9), (1, 4), ()]):
        for e in epochs:
            versions[e:, k] += 1
    state = CCFLServerState(models=torch.zeros(3, 2), t=10, t_k=np.array([9, 4, 0]), versions=versions)
    uploads = CCFLConfig(staleness_clock="uploads")
    np.testing.assert_allclose(staleness_gaps(state, 2, uploads), [7.0, 2.0, -2.0])
    cycles = CCFLConfig(staleness_clock="client_cycles", cycle_uploads=4)
    np.testing.assert_allclose(staleness_gaps(state, 2, cycles), [1.75, 0.5, -0.5])
    updates = CCFLConfig(staleness_clock="cluster_updates")
    np.testing.assert_allclose(staleness_gaps(state, 2, updates), [3.0, 1.0, 0.0])  # after epoch 2: 3, 5, 9; 4
    np.testing.assert_allclose(staleness_gaps(state, 5, updates), [1.0, 0.0, 0.0])
    # alpha2 with a = 10, b = 2: only the uploads clock throttles cluster 0 (7 >= 2), the cluster
    # clock throttles it less (3 >= 2), the cycle clock not at all (1.75 < 2)
    np.testing.assert_allclose(alpha2(staleness_gaps(state, 2, uploads), 10.0, 2.0), [1 / 71, 1 / 21, 1.0])
    np.testing.assert_allclose(alpha2(staleness_gaps(state, 2, cycles), 10.0, 2.0), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(alpha2(staleness_gaps(state, 2, updates), 10.0, 2.0), [1 / 31, 1.0, 1.0])
    with pytest.raises(ValueError, match="version log"):
        staleness_gaps(CCFLServerState(models=torch.zeros(3, 2), t=10, t_k=np.zeros(3)), 2, updates)


def test_on_upload_keeps_the_version_log():
    """Row t of ``versions`` counts each cluster's updates after epoch t: a fresh upload adds its
    updated clusters, a stale one a copy of the last row."""
    p = mean_params(c1=0.5, c2=0.25, amplifier=[1.0], alpha0=0.5, tau0=1)
    state = init_server_state(MODELS)
    state, _, diag = on_upload(state, p, 7, W_M, 0, Linear(), VAL, task="regression")
    assert diag["updated"].tolist() == [True, False]
    assert state.versions.tolist() == [[0, 0], [1, 0]]
    state, _, _ = on_upload(state, p, 7, W_M, 1, Linear(), VAL, task="regression")
    state, _, diag = on_upload(state, p, 8, W_M, 0, Linear(), VAL, task="regression")  # t - tau = 3 > tau0
    assert diag["stale"] and state.versions.tolist() == [[0, 0], [1, 0], [2, 0], [2, 0]]
    assert "gap" not in diag
    # a fresh upload stamped tau = 1 on the cluster clock: cluster 0 changed once since (epoch 2)
    clock = mean_params(c1=0.5, c2=0.25, amplifier=[1.0], alpha0=0.5, staleness_clock="cluster_updates", a=10.0, b=1.0)
    _, _, diag = on_upload(state, clock, 9, W_M, 1, Linear(), VAL, task="regression")
    np.testing.assert_allclose(diag["gap"], [1.0, 0.0])
    np.testing.assert_allclose(diag["alpha2"], [1 / 11, 1.0])
    np.testing.assert_allclose(diag["alpha"], [0.5 / 11, 0.0])


# ----------------------------------------------------------------------------- equation (3), reply
def test_update_clusters_equation_3_only_where_alpha_positive():
    models = torch.tensor([[0.0, 0.0], [2.0, 2.0]])
    t_k = np.array([3, 4])
    new, new_t_k = update_clusters(models, t_k, torch.tensor([4.0, 8.0]), np.array([0.25, 0.0]), t=9)
    torch.testing.assert_close(new, torch.tensor([[1.0, 2.0], [2.0, 2.0]]))
    assert new_t_k.tolist() == [9, 4]
    torch.testing.assert_close(models, torch.tensor([[0.0, 0.0], [2.0, 2.0]]))  # input untouched
    assert t_k.tolist() == [3, 4]


def test_personalised_model_is_the_u_weighted_sum():
    torch.testing.assert_close(personalised_model(MODELS, np.array([0.25, 0.75])), torch.tensor([0.25, 1.5]))
    torch.testing.assert_close(initial_reply(init_server_state(MODELS)), torch.tensor([0.5, 1.0]))


# ----------------------------------------------------------------------------- the server step
def test_on_upload_fresh_path_by_hand():
    p = mean_params(c1=0.5, c2=0.25, amplifier=[1.0], alpha0=0.5)
    state = init_server_state(MODELS)
    new, reply, diag = on_upload(state, p, 7, W_M, 0, Linear(), VAL, task="regression")
    s0 = 0.75 * 2 / 3 + 0.25 * (2 - math.sqrt(2))
    u0 = sigmoid(2 * s0 - 1)
    # alpha1 = (1, 0) (u_1 < 1/2), alpha2 = 1: w_0 <- .5 [1, 0] + .5 [1, 1]; w_1 kept
    np.testing.assert_allclose(diag["alpha"], [0.5, 0.0])
    torch.testing.assert_close(new.models, torch.tensor([[1.0, 0.5], [0.0, 2.0]]))
    assert new.t == 1 and new.t_k.tolist() == [1, 0]
    torch.testing.assert_close(reply, torch.tensor([u0, 0.5 * u0 + 2 * (1 - u0)]))
    np.testing.assert_allclose(new.last_u[7], [u0, 1 - u0])
    assert new.history.shape == (1, 2, 3)
    np.testing.assert_allclose(new.history[0], [[0.5, 0.5, 1.0], [1.0, 1.0, math.sqrt(2)]])
    assert np.isnan(new.self_losses[0]) and new.self_losses[1] == 0.0  # w_0 changed: recompute
    assert state.t == 0 and not state.last_u  # the old state is untouched
    torch.testing.assert_close(state.models, MODELS)


def test_on_upload_stale_path_reuses_the_last_estimate_and_changes_no_cluster():
    state = CCFLServerState(models=MODELS.clone(), t=10, t_k=np.array([4, 6]),
                            last_u={3: np.array([0.2, 0.8])}, history=np.zeros((0, 2, 3)),
                            self_losses=np.full(2, np.nan))
    p = mean_params(tau0=5)
    new, reply, diag = on_upload(state, p, 3, torch.tensor([9.0, 9.0]), 2, Linear(), VAL, task="regression")
    assert diag["stale"] and diag["staleness"] == 9
    torch.testing.assert_close(reply, torch.tensor([0.2, 1.6]))
    torch.testing.assert_close(new.models, MODELS)
    assert new.t == 11 and new.t_k.tolist() == [4, 6] and new.history.shape == (0, 2, 3)
    np.testing.assert_allclose(new.last_u[3], [0.2, 0.8])
    # a client with no estimate yet gets the uniform mixture, i.e. the initial reply
    _, reply, _ = on_upload(state, p, 4, torch.tensor([9.0, 9.0]), 2, Linear(), VAL, task="regression")
    torch.testing.assert_close(reply, torch.tensor([0.5, 1.0]))


def test_on_upload_rejects_an_upload_stamped_in_the_future():
    with pytest.raises(ValueError):
        on_upload(init_server_state(MODELS), mean_params(), 0, W_M, 1, Linear(), VAL, task="regression")


# ----------------------------------------------------------------------------- global adjustment
def test_adjustment_active_only_after_the_given_fraction():
    p = CCFLConfig(adjust_start=0.5, rounds=10)
    assert not adjustment_active(5, p) and adjustment_active(6, p)
    assert not adjustment_active(10, CCFLConfig(adjust_start=None, rounds=10))


def test_adjustment_rejects_any_quantity_above_the_percentile_per_cluster():
    history = np.zeros((10, 3, 3))
    history[:, :, 0] = np.arange(1, 11)[:, None]  # l: 1..10 in every cluster; 70th pct = 7.3
    history[:, 1, 1:] = np.arange(1, 11)[:, None]  # cluster 1's d1, d2: 1..10 too
    values = np.array([[7.0, 0.0, 0.0], [1.0, 1.0, 7.5], [8.0, 0.0, 0.0]])
    assert adjustment_rejects(history, values, 70.0).tolist() == [False, True, True]
    assert adjustment_rejects(np.zeros((0, 3, 3)), values, 70.0).tolist() == [False] * 3


@pytest.mark.parametrize("t_before, rejected", [(4, False), (5, True)])
def test_on_upload_global_adjustment_only_after_the_fraction(t_before, rejected):
    history = np.full((10, 2, 3), 10.0)
    history[:, 0, 0] = 0.01 * np.arange(10)  # cluster 0's l history is tiny: l_0 = .5 is an outlier
    state = CCFLServerState(models=MODELS.clone(), t=t_before, t_k=np.zeros(2, dtype=np.int64), last_u={},
                            history=history, self_losses=np.full(2, np.nan))
    p = mean_params(alpha0=0.5, adjust_start=0.5, rounds=10, adjust_percentile=70.0)
    new, _, diag = on_upload(state, p, 0, W_M, t_before, Linear(), VAL, task="regression")
    assert diag["rejected"].tolist() == [rejected, False]
    assert diag["updated"].tolist() == [not rejected, False]  # cluster 1 is below "ave" anyway
    assert new.history.shape == (11, 2, 3)  # recorded either way
    expected = MODELS if rejected else torch.tensor([[1.0, 0.5], [0.0, 2.0]])
    torch.testing.assert_close(new.models, expected)


# ----------------------------------------------------------------------------- params
def test_defaults_are_the_fmnist_4_row_and_table2_rows_load():
    assert CCFLConfig() == table2_settings("fmnist", 4)
    p = table2_settings("miniimagenet", 6)
    assert p.amplifier == [10.0, 10.0] and p.l_bar == "min" and (p.c1, p.c2) == (0.6, 0.3)
    assert p.tau0 == 120 and p.rounds == 2400
    with pytest.raises(ValueError):
        CCFLConfig(c1=0.7, c2=0.5)
    with pytest.raises(ValueError):
        table2_settings("fmnist", 5)


# ----------------------------------------------------------------------------- client half
def test_client_objective_gradient_equation_2():
    g = client_objective_gradient(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 2.0]), 0.5)
    torch.testing.assert_close(g, torch.tensor([1.5, 0.5]))


def test_client_update_one_sgd_step_on_objective_2():
    net = Linear()
    with torch.no_grad():
        net.inner.weight.copy_(torch.tensor([[1.0, 1.0]]))
    cfg = TrainConfig(optimizer="sgd", lr=0.1, batch_size=2, local_epochs=1)
    w = client_update(net, SGD(net.parameters(), lr=0.1), torch.eye(2), torch.zeros(2), "regression", cfg,
                      anchor=torch.tensor([0.0, 2.0]), rho=0.5, rng=None)
    # grad f = mean 2 (x.w - y) x = (1, 1); + .5 ((1, 1) - (0, 2)) = (1.5, .5); w - .1 grad
    torch.testing.assert_close(w, torch.tensor([0.85, 0.95]))


def test_client_start_follows_the_flag():
    local, reply = torch.tensor([1.0]), torch.tensor([2.0])
    assert client_start(local, reply, CCFLConfig()).item() == 2.0
    assert client_start(local, reply, CCFLConfig(client_starts_from_reply=False)).item() == 1.0


# ----------------------------------------------------------------------------- behaviour
def test_upload_trained_on_cluster_0_is_estimated_as_cluster_0():
    gen = torch.Generator().manual_seed(0)
    truth = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    val = []
    for k in range(2):
        x = torch.randn(200, 2, generator=gen)
        val.append((x, x @ truth[k]))
    # the client's data: 90% cluster 0, 10% cluster 1
    x = torch.randn(100, 2, generator=gen)
    y = torch.cat([x[:90] @ truth[0], x[90:] @ truth[1]])
    state = init_server_state(truth + 0.05 * torch.randn(2, 2, generator=gen))
    anchor = initial_reply(state)
    net = Linear()
    set_flat(net, anchor)
    cfg = TrainConfig(optimizer="sgd", lr=0.1, batch_size=None, local_epochs=30)
    w_m = client_update(net, SGD(net.parameters(), lr=0.1), x, y, "regression", cfg, anchor, rho=0.1)
    p = CCFLConfig(loss_reduction="mean", l_bar=0.0, amplifier=[5.0], adjust_start=None)
    new, reply, diag = on_upload(state, p, 0, w_m, 0, Linear(), val, task="regression")
    u = diag["u"]
    assert u[0] > u[1]
    assert (reply - new.models[0]).norm() < (reply - new.models[1]).norm()
    assert diag["updated"].tolist() == [True, False]


def test_the_amplified_estimate_is_capped_well_below_a_dominant_share():
    """Why CCFL's estimates stay soft (docs/algorithms.md#ccfl-estimate-cap): each bracket of Algorithm
    1 lies in [0, 1], so a score is at most 1/(K-1) and at least (K-2)/(K-1)^2 when one cluster
    wins every term; after softmax(A u) with K = 4, A = 7 the largest weight is
    e^(7/9) / (e^(7/9) + 3) = 0.4205, however clear the evidence (the true main share is 0.4-0.9)."""
    best = combine_scores(np.array([0.0, 1, 1, 1]), np.array([0.0, 2, 2, 2]), np.array([0.0, 5, 5, 5]), 0.5, 0.25)
    np.testing.assert_allclose(best, [1 / 3, 2 / 9, 2 / 9, 2 / 9])
    u = amplify(best, [7.0])
    assert u[0] == pytest.approx(np.exp(7 / 9) / (np.exp(7 / 9) + 3)) == pytest.approx(0.4205, abs=1e-4)
    assert largest_weight(4, [7.0]) == pytest.approx(u[0])
    # Table 2's other FMNIST rows: K = 2, A = 3 scores [1, 0]; K = 3, A = 3 scores [1/2, 1/4, 1/4]
    assert largest_weight(2, [3.0]) == pytest.approx(np.exp(3) / (np.exp(3) + 1))
    assert largest_weight(3, [3.0]) == pytest.approx(1 / (1 + 2 * np.exp(-3 / 4)))
    assert largest_weight(1, [7.0]) == 1.0
    # no non-negative input does better, whatever c1 and c2
    rng = np.random.default_rng(0)
    for _ in range(2000):
        l, d1, d2 = rng.exponential(size=(3, 4)) * (rng.random((3, 4)) < 0.8)
        c1 = rng.random()
        u = amplify(combine_scores(l, d1, d2, c1, (1 - c1) * rng.random()), [7.0])
        assert u.max() <= largest_weight(4, [7.0]) + 1e-12


def test_the_kl_floor_of_a_capped_estimator():
    """The least mean KL(true || estimate) when no weight may exceed the cap and the main share
    is uniform on [0.4, 0.9]: the closed form equals a numerical mean of the binary KL."""
    s = np.linspace(0.4, 0.9, 200001)
    for cap in (0.2671, 0.4205, 0.5142, 0.75):
        binary = np.where(s > cap, s * np.log(s / cap) + (1 - s) * np.log((1 - s) / (1 - cap)), 0.0)
        trapezoid = float((binary[:-1] + binary[1:]).mean() / 2)
        assert kl_floor(cap) == pytest.approx(trapezoid, rel=1e-6, abs=1e-12)
    assert kl_floor(0.9) == kl_floor(0.95) == 0.0  # every share fits under the cap
    # one share, by hand: s in [0.5, 0.5 + eps] against cap 0.25 -> KL(0.5 || 0.25) = ln 2 / 2 + ln(2/3) / 2
    assert kl_floor(0.25, 0.5, 0.5 + 1e-7) == pytest.approx(0.5 * np.log(2) + 0.5 * np.log(0.5 / 0.75), rel=1e-5)
    with pytest.raises(ValueError, match="cap"):
        kl_floor(0.0)
