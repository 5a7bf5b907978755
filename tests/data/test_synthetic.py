"""Partitions and the synthetic generator (FedSoft, AAAI'22, Experiments)."""

import numpy as np
import torch

from raysoft.catalog import SyntheticData
from raysoft.data import Federation
from raysoft.data.partition import component_counts, mixtures


def test_10_90_and_30_70_halves():
    m = mixtures("10:90", 100, 2, np.random.default_rng(0))
    np.testing.assert_allclose(m[:50], [[0.1, 0.9]] * 50)
    np.testing.assert_allclose(m[50:], [[0.9, 0.1]] * 50)
    m = mixtures("30:70", 4, 2, np.random.default_rng(0))
    np.testing.assert_allclose(m, [[0.3, 0.7], [0.3, 0.7], [0.7, 0.3], [0.7, 0.3]])


def test_linear_partition_is_k_plus_half_percent():
    m = mixtures("linear", 100, 2, np.random.default_rng(0))
    np.testing.assert_allclose(m[0], [0.005, 0.995])
    np.testing.assert_allclose(m[37], [0.375, 0.625])
    np.testing.assert_allclose(m[99], [0.995, 0.005])


def test_random_partition_rows_are_segments_of_the_unit_interval():
    m = mixtures("random", 50, 8, np.random.default_rng(0))
    assert m.shape == (50, 8)
    assert (m >= 0).all()
    np.testing.assert_allclose(m.sum(axis=1), 1.0)


def test_component_counts_remainder_goes_to_the_last():
    assert component_counts(150, np.array([0.1, 0.9])).tolist() == [15, 135]
    assert component_counts(7, np.array([1 / 3, 1 / 3, 1 / 3])).tolist() == [2, 2, 3]


def test_synthetic_clients_follow_their_distribution_and_are_reproducible():
    cfg = SyntheticData(clients=6, distributions=2, partition="10:90", noise_std=0.0)
    fed = Federation(cfg, seed=5)
    assert ((fed.sizes >= 100) & (fed.sizes <= 200)).all()
    d = fed.client_data(4)
    assert len(d) == fed.sizes[4]
    assert (d.components == 0).sum() == int(0.9 * fed.sizes[4])  # client 4 is in the 90% A half
    theta = torch.tensor(fed._gen.thetas, dtype=torch.float32)
    for s in (0, 1):
        sel = torch.from_numpy(d.components == s)
        torch.testing.assert_close(d.y[sel], d.x[sel] @ theta[s], rtol=1e-4, atol=1e-3)
    again = Federation(cfg, seed=5).client_data(4)
    torch.testing.assert_close(again.x, d.x)
    other = Federation(cfg, seed=6).client_data(4)
    assert not torch.equal(other.x[:5], d.x[:5])


def test_data_seed_alone_draws_the_data():
    """data.seed fixes the dataset whatever the run's seed; unset, the run's seed draws it."""
    fixed = SyntheticData(clients=6, distributions=2, partition="random", seed=7)
    a, b = Federation(fixed, seed=0), Federation(fixed, seed=1)
    assert a.seed == b.seed == 7 and a.sizes.tolist() == b.sizes.tolist()
    torch.testing.assert_close(a.client_data(3).x, b.client_data(3).x)
    torch.testing.assert_close(a.holdout(1)[1], b.holdout(1)[1])
    free = SyntheticData(clients=6, distributions=2, partition="random")
    torch.testing.assert_close(Federation(free, seed=7).client_data(3).x, a.client_data(3).x)
    assert not torch.equal(Federation(free, seed=0).client_data(3).x[:5], a.client_data(3).x[:5])


def test_theta_scale_follows_sigma0():
    big = Federation(SyntheticData(distributions=8, partition="random", theta_std=10.0), seed=0)._gen.thetas
    small = Federation(SyntheticData(distributions=8, partition="random", theta_std=10**0.5), seed=0)._gen.thetas
    assert 7 < big.std() < 13 and 2.2 < small.std() < 4.2
