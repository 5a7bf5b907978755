"""FPFC (AAAI'23, Algorithm 1; docs/algorithms.md#fpfc-and-fpfc-l1): the SCAD prox against brute force,
the pair bookkeeping and zeta by hand, clustering, and a small run that finds the clusters."""

import numpy as np
import pytest

import raysoft
from raysoft.algorithms.fpfc import (
    FPFCConfig,
    all_pairs,
    cluster_models,
    clusters,
    l1_prox_scale,
    neighbourhood_models,
    neighbourhoods,
    pair_index,
    round_pairs,
    scad,
    scad_prox_scale,
    scad_surrogate,
    update_pairs,
    zeta,
)


def test_scad_values():
    lam, a = 0.6, 3.7
    np.testing.assert_allclose(scad(np.array([0.3, 1.0, 5.0]), lam, a),
                               [0.18, (3.7 * 0.6 * 1.0 - 0.5 * (1.0 + 0.36)) / 2.7, 0.36 * 4.7 / 2])
    # the surrogate is quadratic below xi and continuous there
    xi = 1e-3
    assert scad_surrogate(np.array(xi), lam, a, xi) == pytest.approx(lam * xi)
    assert scad_surrogate(np.array(0.0), lam, a, xi) == pytest.approx(xi * lam / 2)


@pytest.mark.parametrize("seed", range(5))
def test_scad_prox_matches_brute_force_minimisation(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        lam = rng.uniform(0.05, 2.0)
        a = rng.uniform(2.5, 5.0)
        xi = rng.uniform(0.01, 0.9) * lam
        rho = rng.uniform(1.05 / (a - 1), 5.0)
        r = rng.uniform(0.0, 1.5 * a * lam + 1.0)
        s = np.linspace(0.0, r, 200001)
        phi = scad_surrogate(s, lam, a, xi) + rho / 2 * (s - r) ** 2
        brute = s[np.argmin(phi)]
        ours = scad_prox_scale(np.array([r]), lam, a, xi, rho)[0] * r
        assert ours == pytest.approx(brute, abs=2e-4 * max(r, 1.0))


def test_l1_prox_is_group_soft_threshold():
    np.testing.assert_allclose(l1_prox_scale(np.array([0.2, 1.0, 4.0]), lam=0.6, rho=2.0), [0.0, 0.7, 0.925])


def test_pair_index_is_the_row_of_triu_indices():
    m = 6
    iu, ju = all_pairs(m)
    np.testing.assert_array_equal(pair_index(iu, ju, m), np.arange(len(iu)))
    np.testing.assert_array_equal(pair_index(ju, iu, m), np.arange(len(iu)))  # symmetric


def test_zeta_by_hand():
    # m = 3, d = 1; theta_01 = 1, theta_02 = 2, theta_12 = 3; v = 0 except v_01 = 2; rho = 2
    w = np.array([[1.0], [2.0], [6.0]])
    theta = np.array([[1.0], [2.0], [3.0]])
    v = np.array([[2.0], [0.0], [0.0]])
    z = zeta(w, theta, v, rho=2.0, devices=[0, 1, 2])
    # zeta_0 = (9 + (1 - 1) + 2) / 3; zeta_1 = (9 + (-1 + 1) + 3) / 3; zeta_2 = (9 - 2 - 3) / 3
    np.testing.assert_allclose(z[:, 0], [11 / 3, 4.0, 4 / 3])


def test_update_pairs_by_hand():
    cfg = FPFCConfig(lam=0.6, a=3.7, xi=1e-3, rho=1.0)
    w = np.array([[3.0, 4.0], [0.0, 0.0], [0.3, 0.4]], dtype=np.float32)
    theta = np.zeros((3, 2), np.float32)
    v = np.zeros((3, 2), np.float32)
    update_pairs(w, theta, v, np.array([0, 1]), np.array([1, 2]), cfg)
    # pair (0, 1): ||delta|| = 5 > a lambda: no shrinkage, v unchanged
    np.testing.assert_allclose(theta[0], [3.0, 4.0])
    np.testing.assert_allclose(v[0], [0.0, 0.0])
    # pair (1, 2): delta = (-0.3, -0.4), r = 0.5 <= xi + lambda/rho: theta = xi rho/(lambda + xi rho) delta
    k = 1e-3 / 0.601
    np.testing.assert_allclose(theta[2], [-0.3 * k, -0.4 * k], rtol=1e-5)
    np.testing.assert_allclose(v[2], [-0.3 * (1 - k), -0.4 * (1 - k)], rtol=1e-5)
    np.testing.assert_allclose(theta[1], [0.0, 0.0])  # pair (0, 2) untouched


def test_round_pairs_paper_and_code():
    (i, j), = round_pairs([1, 3], 4, "paper")
    assert list(zip(i, j)) == [(1, 3)]
    touching, inside = round_pairs([1, 3], 4, "code")
    assert sorted(zip(*touching)) == [(0, 1), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert list(zip(*inside)) == [(1, 3)]  # updated a second time, as the reference double loop


def test_clusters_are_connected_components():
    m = 4
    theta = np.full((6, 1), 5.0)
    theta[pair_index(np.array([0]), np.array([1]), m)] = 0.05  # 0 ~ 1
    theta[pair_index(np.array([1]), np.array([2]), m)] = 0.1  # 1 ~ 2 (<= nu), although 0 !~ 2
    np.testing.assert_array_equal(clusters(theta, m, nu=0.1), [0, 0, 0, 1])


def test_the_reference_grouping_by_hand():
    """The reference code's final step on a chain 0 ~ 1 ~ 2 (0 !~ 2) and a lone 3: the sets
    {0,1}, {0,1,2}, {1,2}, {3} in turn average their members' current models."""
    m = 4
    theta = np.full((6, 1), 5.0)
    theta[pair_index(np.array([0]), np.array([1]), m)] = 0.05
    theta[pair_index(np.array([1]), np.array([2]), m)] = 0.05
    theta[pair_index(np.array([0]), np.array([2]), m)] = 0.5
    assert neighbourhoods(theta, m, 0.1) == [[0, 1], [0, 1, 2], [1, 2], [3]]
    assert neighbourhoods(theta, m, 0.05) == [[0], [1], [2], [3]]  # strictly below nu, as the code
    w, sizes = np.array([[0.0], [3.0], [6.0], [9.0]]), np.array([1, 1, 2, 1])
    # {0,1}: (0 + 3) / 2 = 1.5; {0,1,2}: (1.5 + 1.5 + 2*6) / 4 = 3.75; {1,2}: 3.75; {3}: 9
    models, labels, sets = neighbourhood_models(w, theta, 0.1, sizes)
    np.testing.assert_allclose(models, [[3.75], [3.75], [3.75], [9.0]])
    # labels: the last set holding a device (sets 1, 2, 2, 3), renumbered
    np.testing.assert_array_equal(labels, [0, 1, 1, 2])
    assert sets == 4
    # the connected components would average all three: (0 + 3 + 12) / 4
    np.testing.assert_allclose(cluster_models(w, clusters(theta, m, 0.1), sizes), [[3.75], [9.0]])


def test_the_reference_grouping_in_a_run(tmp_path):
    over = ["ray.backend=inprocess", "algorithm.rounds=3", "algorithm.eval_every=3", "data.clients=8",
            "data.distributions=2", "algorithm.clients_per_round=4", "output.progress=none", "algorithm.nu=1000"]
    runs = {g: raysoft.run(raysoft.load_config("jobs/fpfc_synthetic.yaml", over + [f"algorithm.grouping={g}"]),
                           out=tmp_path) for g in ("components", "neighbourhoods")}
    # every pair within nu: one set holding every device, the same as one component
    for r in runs.values():
        assert r.summary["num_clusters"] == 1
    assert runs["neighbourhoods"].table("diagnostics").set_index("name").value["neighbourhood_sets"] == 1
    assert runs["neighbourhoods"].summary["local_mean"] == pytest.approx(runs["components"].summary["local_mean"])


def test_cluster_models_are_sample_weighted():
    w = np.array([[0.0], [4.0], [10.0]])
    np.testing.assert_allclose(cluster_models(w, np.array([0, 0, 1]), np.array([3, 1, 7])), [[1.0], [10.0]])


@pytest.mark.slow
def test_fpfc_finds_the_clusters_without_being_told_how_many(tmp_path):
    cfg = raysoft.load_config("jobs/fpfc_synthetic.yaml", [
        "ray.backend=inprocess", "algorithm.rounds=200", "algorithm.eval_every=100", "data.clients=20",
        "data.distributions=2", "algorithm.clients_per_round=6", "output.progress=none"])
    r = raysoft.run(cfg, out=tmp_path)
    assert r.summary["num_clusters"] == 2 and r.summary["ari"] == pytest.approx(1.0)
    a = r.table("assignments")
    assert list(a.columns) == ["run_id", "client", "predicted", "truth"]
    assert (a.truth == np.arange(20) * 2 // 20).all()
    m = r.metrics
    final = m[(m.scope == "client") & (m.step == 200)]
    assert set(final.metric) == {"loss", "accuracy", "test_loss", "test_accuracy"}
    # after the last round every member holds its cluster's model: one model per cluster
    assert r.summary["local_mean"]["test_accuracy"] > 0.6


def _local_on_fpfc_data(tmp_path, rounds, epochs, per_round, batched="auto"):
    cfg = raysoft.load_config("jobs/fpfc_synthetic.yaml", [
        f"algorithm={{name: local, rounds: {rounds}, clients_per_round: {per_round}, eval_every: {rounds}}}",
        "data.clients=12", "data.distributions=2", f"train.local_epochs={epochs}",
        f"train.batched_clients='{batched}'", "ray.backend=inprocess", "output.progress=none"])
    return raysoft.run(cfg, out=tmp_path).summary["local_mean"]["loss"]


@pytest.mark.parametrize("batched", ["on", "off"])
def test_the_reference_local_baseline_trains_every_device_every_round(tmp_path, batched):
    """FPFC's Local baseline at the reference budget (analysis/fpfc_table1.py: clients_per_round = m)
    gives every device rounds x local steps of full-batch gradient descent: 3 rounds of 2 steps
    are one round of 6 steps (plain SGD, full batch: no state, no randomness). Drawing half of
    the devices a round is a different, smaller budget. The batched run's lognormal device
    sizes train in several buckets."""
    every = _local_on_fpfc_data(tmp_path, 3, 2, 12, batched)
    assert every == pytest.approx(_local_on_fpfc_data(tmp_path, 1, 6, 12, batched), rel=1e-5)
    assert every < _local_on_fpfc_data(tmp_path, 3, 2, 6, batched)


def test_the_final_clusters_are_also_counted_at_other_thresholds(tmp_path):
    cfg = raysoft.load_config("jobs/fpfc_synthetic.yaml", [
        "ray.backend=inprocess", "algorithm.rounds=3", "algorithm.eval_every=3", "data.clients=8",
        "data.distributions=2", "algorithm.clients_per_round=4", "output.progress=none",
        "algorithm.report_thresholds=[0.1, 1000.0]"])
    r = raysoft.run(cfg, out=tmp_path)
    d = r.table("diagnostics").set_index("name").value
    assert d["clusters_nu=0.1"] == r.summary["num_clusters"]  # the run's own nu
    assert d["clusters_nu=1000"] == 1  # every pair within 1000: one cluster
