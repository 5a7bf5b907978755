"""Heterogeneity scenarios (raysoft.data.scenarios) checked against their definitions: on a
Fashion-MNIST-format pool written here (600 train, 200 test images, labels known), a labelled
pool handed over by a dataset plug-in, and one small composed run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.images import write_idx

from raysoft.catalog import ScenarioData
from raysoft.data import Federation
from raysoft.data.scenarios import cluster_of, label_maps, power_law_sizes, transform
from raysoft.errors import Refusal

N_TRAIN, N_TEST = 600, 200


@pytest.fixture(scope="module")
def pool_root(tmp_path_factory) -> tuple[Path, np.ndarray, np.ndarray]:
    """Fashion-MNIST IDX files whose image i is filled with i % 256 (so a sample is recognised)
    and whose labels are shuffled classes 0..9, 60 / 20 of each."""
    root = tmp_path_factory.mktemp("pool")
    rng = np.random.default_rng(7)
    ys = {}
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        y = rng.permutation(np.arange(n) % 10).astype(np.uint8)
        x = np.repeat((np.arange(n) % 256).astype(np.uint8)[:, None, None], 28, axis=1).repeat(28, axis=2)
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", x, gz=True)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", y, gz=True)
        ys[prefix] = y.astype(np.int64)
    return root, ys["train"], ys["t10k"]


def scenario(root, **keys) -> ScenarioData:
    base = {"name": "scenario", "base": "fmnist", "root": str(root), "clients": 12, "distributions": 3}
    return ScenarioData(**{**base, **keys})


def all_counts(fed: Federation) -> np.ndarray:
    """[N, C]: each client's train + test label counts."""
    counts = fed.label_counts()
    assert counts is not None
    return np.stack([counts[k]["train"] + counts[k]["test"] for k in range(fed.num_clients)])


def test_clusters_are_contiguous_blocks_and_mixtures_one_hot(pool_root):
    fed = Federation(scenario(pool_root[0]), seed=0)
    assert cluster_of(12, 3).tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert cluster_of(5, 2).tolist() == [0, 0, 0, 1, 1]
    assert np.array_equal(fed.mixtures, np.eye(3)[cluster_of(12, 3)])


def test_iid_partition_is_disjoint_covers_the_pool_and_splits_a_fifth_off(pool_root):
    root, train_y, _ = pool_root
    fed = Federation(scenario(root), seed=0)
    lay = fed._gen.layout()
    every = np.concatenate([np.concatenate([lay.train[k], lay.test[k]]) for k in range(12)])
    assert sorted(every.tolist()) == list(range(N_TRAIN))  # disjoint, and all 600 are used
    for k in range(12):  # 50 each: 10 of them (floor of a fifth) the client's test split
        assert (len(lay.train[k]), len(lay.test[k])) == (40, 10) and fed.sizes[k] == 40
        d = fed.client_data(k)
        assert torch.equal(d.x[:, 0, 0, 0] * 255, torch.from_numpy(lay.train[k] % 256).float())  # its own images
        assert torch.equal(d.y, torch.from_numpy(train_y[lay.train[k]]))  # cluster 0 .. 2, no concept shift
        assert d.test_y is not None and np.array_equal(d.test_y.numpy(), train_y[lay.test[k]])


def test_dirichlet_counts_sum_to_sizes_and_each_class_is_shared_out(pool_root):
    root, train_y, _ = pool_root
    cfg = scenario(root, distributions=1, clients=6, label_skew="dirichlet", alpha=0.3, min_samples=5)
    fed = Federation(cfg, seed=1)
    counts = all_counts(fed)
    lay = fed._gen.layout()
    for k in range(6):
        assert counts[k].sum() == len(lay.train[k]) + len(lay.test[k])
        assert fed.sizes[k] == len(lay.train[k]) >= 4
    assert np.array_equal(counts.sum(axis=0), np.bincount(train_y, minlength=10))  # every class wholly given out
    shares = counts / counts.sum(axis=0)  # [client, class]: each class's Dirichlet(alpha) split
    assert np.allclose(shares.sum(axis=0), 1.0)
    # alpha = 0.3 concentrates each class on few clients: the largest share of a class averages
    # well above the 1/6 of an even split (E[max of Dir(0.3 x 6)] is about 0.55)
    assert shares.max(axis=0).mean() > 0.35
    iid = all_counts(Federation(scenario(root, distributions=1, clients=6), seed=1))
    assert (iid / iid.sum(axis=0)).max(axis=0).mean() < 0.3


def test_dirichlet_mean_proportions_follow_the_pool(pool_root):
    """Averaged over seeds, a client's share of each class is 1/N (the Dirichlet's mean)."""
    root, _, _ = pool_root
    shares = []
    for seed in range(8):
        counts = all_counts(Federation(scenario(root, distributions=1, clients=4, label_skew="dirichlet",
                                                alpha=1.0, min_samples=5), seed=seed))
        shares.append(counts / counts.sum(axis=0))
    mean = np.mean(shares, axis=0)
    assert np.abs(mean - 0.25).max() < 0.2 and abs(mean.mean() - 0.25) < 1e-9


def test_shards_give_exactly_c_classes_a_client(pool_root):
    root, _, _ = pool_root
    for c in (1, 2, 3):
        counts = all_counts(Federation(scenario(root, distributions=2, clients=10, label_skew="shards",
                                                classes_per_client=c), seed=2))
        assert ((counts > 0).sum(axis=1) == c).all(), counts


def test_power_law_sizes_are_bounded_and_skewed(pool_root):
    rng = np.random.default_rng(0)
    sizes = power_law_sizes(1000, 10, 1.0, 20, rng)
    assert sizes.min() >= 20 and sizes.sum() <= 1000 and sizes.sum() > 1000 - 10
    with pytest.raises(Refusal, match="min_samples"):
        power_law_sizes(100, 10, 1.0, 20, rng)
    root, _, _ = pool_root
    fed = Federation(scenario(root, distributions=1, clients=6, quantity="power_law", power=1.0, min_samples=10),
                     seed=3)
    lay = fed._gen.layout()
    total = np.array([len(lay.train[k]) + len(lay.test[k]) for k in range(6)])
    expected = power_law_sizes(N_TRAIN, 6, 1.0, 10, __import__("raysoft.rng").rng.numpy_rng(3, "scenario", "sizes", 0))
    assert np.array_equal(total, expected)


def test_a_clusters_permutation_applies_to_exactly_its_clients(pool_root):
    root, train_y, test_y = pool_root
    cfg = scenario(root, concept="permutation")
    fed = Federation(cfg, seed=4)
    maps = label_maps(cfg, 10, 4)
    assert np.array_equal(maps[0], np.arange(10))
    assert all(sorted(m.tolist()) == list(range(10)) for m in maps) and not np.array_equal(maps[1], maps[2])
    lay = fed._gen.layout()
    for k in range(12):
        s = k * 3 // 12
        assert np.array_equal(fed.client_data(k).y.numpy(), maps[s][train_y[lay.train[k]]])
    for s in range(3):
        x, y = fed.holdout(s)
        which = (x[:, 0, 0, 0] * 255).round().long().numpy()  # test image i is filled with i (i < 256)
        assert sorted(which.tolist()) == list(range(N_TEST))  # the whole test split, test_samples being 1000
        assert np.array_equal(y.numpy(), maps[s][test_y[which]])


def test_swap_exchanges_the_named_classes_only():
    cfg = ScenarioData(name="scenario", clients=6, distributions=3, concept="swap")
    maps = label_maps(cfg, 10, 0)
    assert maps[0].tolist() == list(range(10))
    assert maps[1].tolist() == [1, 0, 2, 3, 4, 5, 6, 7, 8, 9]
    assert maps[2].tolist() == [0, 1, 3, 2, 4, 5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="2\\(S-1\\)"):
        ScenarioData(name="scenario", clients=12, distributions=7, concept="swap")


def test_transforms_by_hand_on_tiny_images():
    x = torch.zeros(1, 1, 3, 3)
    x[0, 0, 0, 1] = 1.0  # the top middle pixel
    assert torch.equal(transform(x, "rotation", 90.0)[0, 0], torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 0, 0]]))
    assert torch.equal(transform(x * 0.5 + 0.2, "brightness", 0.5)[0, 0, 0], torch.tensor([0.1, 0.35, 0.1]))
    assert torch.equal(transform(x, "brightness", 3.0)[0, 0, 0, 1], torch.tensor(1.0))  # clamped
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    noisy = transform(torch.full((1, 1, 3, 3), 0.5), "noise", 0.1, g1)
    assert torch.allclose(noisy, (0.5 + 0.1 * torch.randn((1, 1, 3, 3), generator=g2)).clamp(0, 1))
    blurred = transform(x, "blur", 1.0)  # kernel 3 (capped at the image's size), sigma 1: weights e^-1/2 : 1 : e^-1/2
    w = torch.exp(torch.tensor([-0.5, 0.0, -0.5]))
    w = w / w.sum()
    # reflect padding: row 0's neighbour above is row 1; the centre column sees the pixel at weight w[1]
    assert torch.allclose(blurred[0, 0, 0, 1], w[1] * w[1], atol=1e-6)
    assert torch.equal(transform(x, "none", 0.0), x) and torch.equal(transform(x, "blur", 0.0), x)
    with pytest.raises(Refusal, match="image"):
        transform(torch.zeros(2, 5), "rotation", 90.0, image=False)


def test_each_cluster_gets_its_own_transform(pool_root):
    root, _, _ = pool_root
    fed = Federation(scenario(root, feature="brightness", shift=[1.0, 0.5, 0.25], test_fraction=0.0), seed=5)
    lay = fed._gen.layout()
    for k in (0, 4, 8):
        d = fed.client_data(k)
        factor = [1.0, 0.5, 0.25][k // 4]
        raw = torch.from_numpy(lay.train[k] % 256).float() / 255
        assert torch.allclose(d.x[:, 0, 5, 5], raw * factor) and d.test_x is None
    x0, _ = fed.holdout(0)
    x2, _ = fed.holdout(2)
    assert torch.allclose(x2, x0 * 0.25)


def test_reproducible_from_data_seed_and_different_for_another(pool_root):
    root, _, _ = pool_root
    keys = {"label_skew": "dirichlet", "concept": "permutation", "feature": "noise", "min_samples": 5}
    a = Federation(scenario(root, seed=11, **keys), seed=0)
    b = Federation(scenario(root, seed=11, **keys), seed=99)  # the run's seed does not draw the data
    c = Federation(scenario(root, seed=12, **keys), seed=0)
    assert np.array_equal(a.sizes, b.sizes) and torch.equal(a.client_data(5).x, b.client_data(5).x)
    assert torch.equal(a.holdout(1)[1], b.holdout(1)[1])
    assert not np.array_equal(all_counts(a), all_counts(c))


LABELLED = '''
import numpy as np
import torch
from raysoft.sdk import DataConfig, DataInfo


class Blobs:
    """Four classes of 2-d points: class c around (c, -c)."""

    Settings = DataConfig

    def __init__(self, cfg, seed):
        self.info = DataInfo(input_dim=2, num_outputs=4, task="classification")
        rng = np.random.default_rng(seed)
        self.y = np.arange(400) % 4
        self.x = np.stack([self.y, -self.y], axis=1) + 0.1 * rng.standard_normal((400, 2))

    def labelled_pool(self):
        return self.x[:300], self.y[:300], self.x[300:], self.y[300:]

    def client(self, k, n, shares):
        raise NotImplementedError("used only as a scenario's base")

    def holdout(self, dist):
        raise NotImplementedError
'''


def test_a_plugins_labelled_pool_feeds_a_scenario(tmp_path, monkeypatch):
    (tmp_path / "labelled_blobs.py").write_text(textwrap.dedent(LABELLED))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = ScenarioData(name="scenario", base="labelled_blobs:Blobs", clients=4, distributions=2, concept="swap",
                       feature="noise", shift=[0.0, 0.0])
    fed = Federation(cfg, seed=0)
    assert fed.info.num_outputs == 4 and fed.info.input_dim == 2
    d = fed.client_data(3)  # cluster 1 swaps classes 0 and 1
    truth = np.round(d.x[:, 0].numpy()).astype(int)
    assert np.array_equal(d.y.numpy(), np.array([1, 0, 2, 3])[truth])
    assert np.array_equal(np.round(fed.client_data(0).x[:, 0].numpy()).astype(int), fed.client_data(0).y.numpy())
    with pytest.raises(Refusal, match="needs image data"):
        Federation(cfg.model_copy(update={"feature": "rotation"}), seed=0)


def test_settings_refuse_what_cannot_be_built():
    with pytest.raises(ValueError, match="shift has 1 values"):
        ScenarioData(name="scenario", distributions=2, feature="blur", shift=[1.0])
    with pytest.raises(ValueError, match="shards fixes"):
        ScenarioData(name="scenario", label_skew="shards", quantity="power_law")
    with pytest.raises(ValueError, match="cannot fill"):
        ScenarioData(name="scenario", clients=2, distributions=3)


@pytest.mark.slow
def test_a_composed_run_writes_clusters_and_label_counts(pool_root, tmp_path):
    from raysoft import api

    root, _, _ = pool_root
    cfg = {
        "seed": 0,
        "algorithm": {"name": "ifca", "rounds": 2, "clients_per_round": 8, "eval_every": 1, "num_centers": 2},
        "data": {"name": "scenario", "base": "fmnist", "root": str(root), "clients": 8, "distributions": 2,
                 "concept": "permutation", "label_skew": "dirichlet", "alpha": 0.5, "min_samples": 5,
                 "test_samples": 50},
        "model": {"name": "cnn", "channels": [2, 4], "hidden": 8},
        "train": {"optimizer": "sgd", "lr": 0.05, "batch_size": 16, "local_epochs": 1},
        "ray": {"backend": "inprocess"},
        "output": {"progress": "none"},
    }
    res = api.run(cfg, out=tmp_path / "runs")
    clients = pd.read_parquet(res.run_dir / "clients.parquet")
    truth = clients[clients.share == 1.0].set_index("client").distribution
    assert truth.to_dict() == {k: k * 2 // 8 for k in range(8)}
    labels = pd.read_parquet(res.run_dir / "labels.parquet")
    fed = Federation(ScenarioData(**cfg["data"]), seed=0)
    counts = fed.label_counts()
    assert counts is not None
    for (k, split), rows in labels.groupby(["client", "split"]):
        expected = counts[int(k)][str(split)]
        assert dict(zip(rows.label, rows["count"])) == {int(c): int(expected[c]) for c in np.flatnonzero(expected)}
    train = labels[labels.split == "train"].groupby("client")["count"].sum()
    assert train.to_dict() == {k: int(fed.sizes[k]) for k in range(8)}
    assert set(labels.split) == {"train", "test"}


def test_every_listed_scenario_has_a_job_that_loads_with_its_settings():
    from raysoft.config import load_config
    from raysoft.listing import listing

    root = Path(__file__).resolve().parents[2]
    text = listing(["datasets"], ["scenario"])
    assert len(ScenarioData.SCENARIOS) == 7
    for name, keys, _, job in ScenarioData.SCENARIOS:
        assert f"      {name}: {keys}" in text and job in text
        data = load_config(root / job).data
        assert isinstance(data, ScenarioData) and data.base == "fmnist"
        for pair in keys.split(", "):
            key, value = pair.split(": ")
            if "|" not in value and "[" not in value:
                assert str(getattr(data, key)) == value, (job, key)


def test_a_plugin_base_is_checked_before_the_run_and_shipped(tmp_path, monkeypatch):
    from raysoft.api import check_data
    from raysoft.config import parse_config
    from raysoft.plugins import ship_paths

    (tmp_path / "shipped_blobs.py").write_text(textwrap.dedent(LABELLED))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    raw = {"algorithm": {"name": "fedavg", "clients_per_round": 4}, "model": {"name": "logistic"},
           "data": {"name": "scenario", "base": "shipped_blobs:Blobs", "clients": 4, "distributions": 2}}
    cfg = check_data(parse_config(raw))
    assert ship_paths(cfg) == [str((tmp_path / "shipped_blobs.py").resolve())]
    raw["data"]["base"] = "shipped_blobs:Missing"
    with pytest.raises(Exception, match="Missing"):
        check_data(parse_config(raw))


def test_the_rotated_mixtures_count_the_labels_their_clients_hold(pool_root):
    from raysoft.catalog import ImageData

    root, _, _ = pool_root
    cfg = ImageData(name="fmnist", root=str(root), clients=6, distributions=2, partition="random",
                    samples_min=30, samples_max=80)
    fed = Federation(cfg, seed=0)
    counts = fed.label_counts()
    assert counts is not None
    for k in range(6):
        held = np.bincount(fed.client_data(k).y.numpy(), minlength=10)
        assert set(counts[k]) == {"train"} and np.array_equal(counts[k]["train"], held)


@pytest.mark.slow  # a stream's first run of a session pre-trains its cluster models: ~10 s
def test_a_scenario_feeds_a_stream_with_its_truth_and_label_counts(tmp_path):
    """CCFL over 3 clusters by label permutation: the stream reads the scenario through the
    dataset contract, records each client's label counts, and scores its estimates against the
    scenario's clusters (client k in cluster k*3//6)."""
    from support.configs import stream_config
    from support.images import write_fmnist

    import raysoft

    write_fmnist(tmp_path / "fm")
    cfg = stream_config(tmp_path / "fm")
    cfg["data"] = {"name": "scenario", "base": "fmnist", "root": str(tmp_path / "fm"), "clients": 6,
                   "distributions": 3, "concept": "permutation", "test_samples": 8}
    run = raysoft.run(cfg, out=tmp_path / "out")
    clients = pd.read_parquet(run.run_dir / "clients.parquet")
    truth = clients[clients.share == 1.0].groupby("client").distribution.unique()  # at every upload
    assert [list(v) for v in truth.sort_index()] == [[k * 3 // 6] for k in range(6)]
    labels = pd.read_parquet(run.run_dir / "labels.parquet")
    assert set(labels.client) == set(range(6)) and set(labels.split) == {"train", "test"}
    fed = Federation(parse_scenario(cfg), cfg["seed"])
    for k, counts in fed.label_counts().items():
        mine = labels[(labels.client == k) & (labels.split == "train")].set_index("label")["count"]
        assert mine.to_dict() == {int(c): int(n) for c, n in enumerate(counts["train"]) if n}
    scored = pd.read_parquet(run.run_dir / "clustering.parquet")
    assert {"ari", "nmi", "mixture_mae"} <= set(scored.metric)


def parse_scenario(cfg: dict):
    from raysoft.config import parse_config

    return parse_config(cfg).data
