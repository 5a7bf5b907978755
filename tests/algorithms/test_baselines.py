"""IFCA, FedEM, FedAvg and Local: sub-steps by hand, and small end-to-end runs."""

import numpy as np
import pytest
import torch
from support.configs import small_config
from support.paths import ANALYSIS

import raysoft
from raysoft.algorithms import WeightedMean
from raysoft.algorithms.fedem import aggregate_learners, e_step, m_step_pi, mixture_metrics
from raysoft.algorithms.ifca import CenterUpdate, assign_cluster, average_members, gradient_step, one_hot, true_cluster
from raysoft.params import add_terms


def test_ifca_assignment_is_the_lowest_average_loss():
    assert assign_cluster(torch.tensor([3.0, 1.0, 2.0])) == 1
    assert assign_cluster(np.array([1.0, 1.0])) == 0


def test_ifca_model_averaging_per_cluster_and_empty_cluster_keeps_its_model():
    old = torch.tensor([[0.0, 0.0], [5.0, 5.0], [9.0, 9.0]])
    models = {0: torch.tensor([1.0, 3.0]), 3: torch.tensor([3.0, 5.0]), 4: torch.tensor([7.0, 7.0])}
    new = average_members({0: 0, 3: 0, 4: 2}, models, old)
    torch.testing.assert_close(new, torch.tensor([[2.0, 4.0], [5.0, 5.0], [7.0, 7.0]]))


def test_ifca_gradient_step_divides_by_the_number_of_selected_clients():
    old = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    grads = {0: torch.tensor([4.0, 0.0]), 1: torch.tensor([0.0, 8.0]), 2: torch.tensor([2.0, 2.0])}
    new = gradient_step({0: 0, 1: 0, 2: 1}, grads, old, lr=0.3)
    # center 0: 1 - 0.1 * (4, 8); center 1: 2 - 0.1 * (2, 2)
    torch.testing.assert_close(new, torch.tensor([[0.6, 0.2], [1.8, 1.8]]))


def test_ifca_fpfc_code_averages_over_every_selected_client():
    """The FPFC reference code's IFCA: each center is scaled by its share of the m = 3 selected
    clients before the step, and a center nobody chose becomes zero."""
    old = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    grads = {0: torch.tensor([4.0, 0.0]), 1: torch.tensor([0.0, 8.0]), 2: torch.tensor([2.0, 2.0])}
    chosen = {0: {"center": 0}, 1: {"center": 0}, 2: {"center": 1}}
    new = CenterUpdate(old, "fpfc_code", 0.3).plan(chosen).apply(grads)
    # center 0: (2/3) * 1 - 0.1 * (4, 8); center 1: (1/3) * 2 - 0.1 * (2, 2); center 2: 0
    torch.testing.assert_close(new, torch.tensor([[2 / 3 - 0.4, 2 / 3 - 0.8], [2 / 3 - 0.2, 2 / 3 - 0.2], [0.0, 0.0]]))


def test_one_hot_with_unknown_clients_uniform():
    np.testing.assert_allclose(one_hot(np.array([1, -1]), 2), [[0.0, 1.0], [0.5, 0.5]])


def test_fedem_e_step_and_pi():
    log_pi = torch.log(torch.tensor([0.5, 0.5]))
    losses = torch.tensor([[0.0, 2.0], [float(np.log(3.0)), 2.0]])
    q = e_step(log_pi, losses)
    # sample 0: exp(0) : exp(-log 3) = 1 : 1/3 -> (0.75, 0.25); sample 1: equal losses -> (0.5, 0.5)
    torch.testing.assert_close(q, torch.tensor([[0.75, 0.5], [0.25, 0.5]]))
    torch.testing.assert_close(m_step_pi(q), torch.tensor([0.625, 0.375]))
    # prior matters: pi = (0.2, 0.8), equal losses -> q = pi
    q = e_step(torch.log(torch.tensor([0.2, 0.8])), torch.zeros(2, 3))
    torch.testing.assert_close(q[:, 0], torch.tensor([0.2, 0.8]))


def test_fedem_aggregation_non_sampled_clients_contribute_the_old_learner():
    old = torch.tensor([10.0, 0.0])
    sizes = np.array([100, 300, 600])  # n = 1000
    new = aggregate_learners(old, {1: torch.tensor([0.0, 10.0])}, sizes)
    # 0.3 * (0, 10) + 0.7 * (10, 0)
    torch.testing.assert_close(new, torch.tensor([7.0, 3.0]))


def test_fedem_mixture_prediction_mixes_probabilities():
    net = torch.nn.Linear(1, 2, bias=False)
    learners = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])  # logits (x, -x) and (-x, x)
    x = torch.tensor([[0.0], [10.0]])
    y = torch.tensor([0, 1])
    m = mixture_metrics(net, learners, torch.tensor([0.25, 0.75]), x, y, "classification")
    # x = 0: both learners (0.5, 0.5) -> argmax 0 (correct); x = 10: mix = .25 (1, 0) + .75 (0, 1) -> class 1
    assert m["accuracy"] == 1.0
    p_correct = torch.tensor(
        [0.5, 0.25 * torch.sigmoid(torch.tensor(-20.0)) + 0.75 * torch.sigmoid(torch.tensor(20.0))]
    )
    assert m["loss"] == pytest.approx(float(-torch.log(p_correct).mean()), rel=1e-5)


def test_fedavg_weights_by_samples():
    models = {2: torch.tensor([1.0]), 0: torch.tensor([4.0])}
    plan = WeightedMean(np.array([100, 0, 300])).plan({k: {} for k in models})
    avg = add_terms(plan.terms, models, plan.start)
    torch.testing.assert_close(avg, torch.tensor([0.25 * 4.0 + 0.75 * 1.0]))


def _twenty(name, **algo):
    return small_config(
        algorithm={"name": name, "rounds": 10, "clients_per_round": 12, "eval_every": 5, **algo},
        data={"clients": 20, "samples_min": 100, "samples_max": 200},
        train={"local_epochs": 10, "lr": 0.05},
    )


def _final_centers(result):
    m = result.metrics
    last = m[(m.scope == "cluster") & (m.metric == "mse") & (m.step == m.step.max())]
    return last.pivot(index="eval_dist", columns="entity", values="value").to_numpy()


@pytest.mark.parametrize("option", [pytest.param("model", marks=pytest.mark.slow), "gradient"])
def test_ifca_separates_the_two_distributions(tmp_path, option):
    # the reference code's find_good_initializer (threshold 0.35 for k = 2) guards against the
    # known IFCA failure where every client picks the same initial center
    cfg = _twenty("ifca", option=option, init_threshold=0.35)
    if option == "gradient":
        cfg["algorithm"].update(rounds=60, clients_per_round=20)
        cfg["train"]["lr"] = 0.3
    r = raysoft.run(cfg, out=tmp_path)
    assert r.summary["distinct_best_centers"]
    score = _final_centers(r)
    for d in (0, 1):
        own = r.summary["distributions"][d]["best_center"]
        assert score[d, own] < 0.3 * score[d, 1 - own]
    w = r.table("weights")
    assert set(w.estimate.unique()) <= {0.0, 0.5, 1.0}  # one-hot (uniform only if never seen)
    assert r.summary["weight_mae"] == pytest.approx(0.1, abs=0.02)  # one-hot vs 10:90 mixtures


@pytest.mark.slow
def test_fedem_recovers_the_components_and_the_mixture_weights(tmp_path):
    # 30 rounds: 10 sufficed only while the clients of a host trained one after the other from
    # the shared payload (see test_local_training_leaves_the_broadcast_models_unchanged); with
    # independent local updates the learners are still apart from theta_s after 10 rounds
    r = raysoft.run(_twenty("fedem", rounds=30, eval_every=10), out=tmp_path)
    score = _final_centers(r)
    for d in (0, 1):
        own = r.summary["distributions"][d]["best_center"]
        assert score[d, own] < 5.0  # noise variance is 1: the learners find theta_s
        assert score[d, 1 - own] > 100.0
    assert r.summary["weight_mae"] < 0.03
    m = r.metrics
    assert {"mse", "mse_best_learner"} <= set(m[m.scope == "client"].metric)


@pytest.mark.slow
def test_fedavg_and_local(tmp_path):
    fa = raysoft.run(_twenty("fedavg"), out=tmp_path)
    assert _final_centers(fa).shape == (2, 1)
    assert fa.table("weights").empty
    lo = raysoft.run(_twenty("local"), out=tmp_path)
    m = lo.metrics
    assert set(m.scope) == {"client"}
    local = m[m.metric == "mse"].groupby("step").value.mean()
    assert local.iloc[-1] < 0.5 * local.iloc[0]
    # a personalised local model fits a client's own mixture better than one global model
    assert lo.summary["local_mean"]["mse"] < fa.summary["local_mean"]["mse"]


def test_true_cluster_is_the_majority_distribution():
    assert true_cluster(np.array([1, 0, 1, 1, 2]), 3) == 1
    assert true_cluster(np.array([2, 0, 2, 0]), 3) == 0  # ties to the lowest index


def test_ifca_oracle_puts_each_client_in_its_true_cluster(tmp_path):
    """assignment: oracle, from the first draw that collapses IFCA (every client on one center,
    test below): each client's center is its majority distribution, and the centers fit theirs."""
    cfg = _twenty("ifca", option="gradient", rounds=30, clients_per_round=20, assignment="oracle")
    cfg["train"]["lr"] = 0.3
    r = raysoft.run(cfg, out=tmp_path)
    a = r.table("assignments")
    assert (a.predicted == a.truth).all() and r.summary["ari"] == 1.0
    score = _final_centers(r)
    assert score[0, 0] < 0.3 * score[0, 1] and score[1, 1] < 0.3 * score[1, 0]
    with pytest.raises(raysoft.ConfigError, match="oracle needs num_centers"):
        raysoft.run(_twenty("ifca", assignment="oracle", num_centers=3), out=tmp_path)


def test_ifca_good_initializer_rebalances_a_collapsed_first_draw(tmp_path):
    def first_round_sizes(threshold):
        cfg = _twenty("ifca", option="gradient", rounds=1, clients_per_round=20, init_threshold=threshold)
        w = raysoft.run(cfg, out=tmp_path).table("weights")
        return sorted(w[w.step == 0].groupby("center").estimate.sum().tolist())

    assert first_round_sizes(0.0) == [0.0, 20.0]  # this seed's first draw: every client picks one center
    smallest, _ = first_round_sizes(0.35)
    assert smallest >= 7


@pytest.mark.parametrize("name", ["ifca", "fedem"])
def test_local_training_leaves_the_broadcast_models_unchanged(name):
    # params.set_flat makes the scratch model's parameters views of the vector it is given, so
    # training from a row of the payload used to change the payload itself: the next client of
    # the same host started from the previous client's model (and, in-process, the server's
    # centers moved). For IFCA this made the first clients' center better for every later client.
    from raysoft.backends.host import ClientHost
    from raysoft.config import parse_config

    cfg = parse_config(small_config(algorithm={"name": name, "num_centers": 2}))
    models = torch.randn(2, 10, generator=torch.Generator().manual_seed(0))  # synthetic: Linear(10 -> 1)
    payload = {"centers": models} if name == "ifca" else {"learners": models}  # IFCA's option: the config's
    before = models.clone()
    together = ClientHost(cfg, [0, 1]).call("train", [0, 1], payload, 0)
    torch.testing.assert_close(models, before, rtol=0, atol=0)
    alone = ClientHost(cfg, [1]).call("train", [1], payload, 0)  # same update without client 0
    torch.testing.assert_close(together[1].summed, alone[1].summed)  # an Update: the update or the learners


def test_weights_by_majority_script_groups_clients_by_their_majority_distribution(tmp_path):
    import sys

    import pandas as pd

    sys.path.insert(0, str(ANALYSIS))
    from weights_by_majority import main, table

    r = raysoft.run(small_config(algorithm={"name": "fedem", "rounds": 2, "clients_per_round": 4}), out=tmp_path)
    t = table(r.run_dir, [1])
    w = pd.read_parquet(r.run_dir / "weights.parquet")
    c = pd.read_parquet(r.run_dir / "clients.parquet").pivot(index="client", columns="distribution", values="share")
    major = c.idxmax(axis=1)
    for g in (0, 1):
        ids = major.index[major == g]
        truth = t[(t.step == -1) & (t.majority == g)].set_index("center").weight
        assert truth.to_dict() == pytest.approx(c.loc[ids].mean().to_dict())
        got = t[(t.step == 1) & (t.majority == g)].set_index("center").weight
        want = w[(w.step == 1) & w.client.isin(ids)].groupby("center").estimate.mean()
        assert got.to_dict() == pytest.approx(want.to_dict())
        assert set(t[t.majority == g].clients) == {len(ids)}
    for bad in (["--steps", "99"], ["--steps", "x"]):  # one-line errors, exit code 2
        with pytest.raises(SystemExit) as err:
            main([str(r.run_dir), *bad])
        assert err.value.code == 2
