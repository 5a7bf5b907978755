"""LEAF's natural partitions (issue #52): FEMNIST and Shakespeare from LEAF's own JSON files, a
client per writer (role) holding exactly its samples, LEAF's CNN and character LSTM, and a run."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from support.configs import small_config

import raysoft
from raysoft.batched import can_batch
from raysoft.catalog import LEAF_CHARS
from raysoft.config import ConfigError, parse_config
from raysoft.data import Federation
from raysoft.data.leaf import choose, read_leaf
from raysoft.models import CharLSTM, build_model
from raysoft.protocols import DataInfo
from raysoft.training import make_optimizer, proximal_train


def config(data: dict, **sections) -> dict:
    """A small config whose data section is ``data`` alone (not merged into the synthetic one's)."""
    out = small_config(**sections)
    out["data"] = dict(data)
    out["algorithm"]["clients_per_round"] = min(out["algorithm"]["clients_per_round"], data.get("clients", 100))
    return out


def write_leaf(root, users: dict[str, tuple[list, list, list, list]], files: int = 2) -> None:
    """LEAF's train/ and test/ folders: ``users`` maps a user to (train x, train y, test x, test y),
    spread over ``files`` JSON files per split, as LEAF's preprocessing writes them."""
    names = list(users)
    for split, (xi, yi) in (("train", (0, 1)), ("test", (2, 3))):
        (root / split).mkdir(parents=True, exist_ok=True)
        for f in range(files):
            part = names[f::files]
            doc = {"users": part, "num_samples": [len(users[u][yi]) for u in part],
                   "user_data": {u: {"x": users[u][xi], "y": users[u][yi]} for u in part}}
            (root / split / f"all_data_{f}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))


def femnist_users(count: int = 5, seed: int = 0) -> dict[str, tuple[list, list, list, list]]:
    """Writers f0000..: writer i has 3 + i train and 2 test samples; pixel values say whose
    sample it is (writer i, sample j: all pixels (i * 10 + j) / 255)."""
    users = {}
    rng = np.random.default_rng(seed)
    for i in range(count):
        n = 3 + i
        x = [[(i * 10 + j) / 255] * 784 for j in range(n)]
        tx = [[(i * 10 + 9 - j) / 255] * 784 for j in range(2)]
        users[f"f{i:04d}_{i % 3}"] = (x, rng.integers(0, 62, n).tolist(), tx, rng.integers(0, 62, 2).tolist())
    return users


def test_clients_are_the_chosen_writers_holding_exactly_their_samples(tmp_path):
    users = femnist_users()
    write_leaf(tmp_path, users)
    cfg = parse_config(config(data={"name": "femnist", "root": str(tmp_path), "clients": 3, "select": "first",
                                          "test_samples": 4}, model={"name": "leaf_cnn"})).data
    fed = Federation(cfg, seed=1)
    files = read_leaf("femnist", str(tmp_path))
    # the files' order: file 0 holds users 0, 2, 4 and file 1 users 1, 3
    assert files.users == ["f0000_0", "f0002_2", "f0004_1", "f0001_1", "f0003_0"]
    assert fed.info == DataInfo(784, 62, "classification", (1, 28, 28))
    assert fed.sizes.tolist() == [3, 5, 7]
    assert fed.mixtures.tolist() == [[1.0]] * 3
    for k, (user, i) in enumerate([("f0000_0", 0), ("f0002_2", 2), ("f0004_1", 4)]):
        d = fed.client_data(k)
        x, y, tx, ty = users[user]
        assert d.x.shape == (len(y), 1, 28, 28) and d.x.dtype == torch.float32
        assert torch.allclose(d.x[:, 0, 0, 0], torch.tensor([(i * 10 + j) / 255 for j in range(len(y))]))
        assert d.y.tolist() == y and d.test_y.tolist() == ty
        assert torch.allclose(d.test_x[:, 0, 5, 5], torch.tensor([(i * 10 + 9) / 255, (i * 10 + 8) / 255]))
        assert (d.components == 0).all()
    hx, hy = fed.holdout(0)  # 4 of the chosen writers' 6 test samples
    pool = {round(float(v) * 255) for v in hx[:, 0, 0, 0]}
    assert len(hy) == 4 and pool <= {9, 8, 29, 28, 49, 48}


def test_which_writers_are_chosen():
    sizes = np.array([5, 9, 1, 9, 7])
    assert choose(sizes, 3, "first", np.random.default_rng(0)).tolist() == [0, 1, 2]
    assert choose(sizes, 3, "largest", np.random.default_rng(0)).tolist() == [1, 3, 4]
    drawn = choose(sizes, 3, "random", np.random.default_rng(0))
    assert drawn.tolist() == sorted(drawn.tolist()) and len(set(drawn.tolist())) == 3
    assert drawn.tolist() == choose(sizes, 3, "random", np.random.default_rng(0)).tolist()
    with pytest.raises(ValueError, match="data.clients is 6 but there are only 5"):
        choose(sizes, 6, "first", np.random.default_rng(0))


def test_random_writers_follow_the_data_seed_and_min_samples(tmp_path):
    write_leaf(tmp_path, femnist_users(count=8))
    data = {"name": "femnist", "root": str(tmp_path), "clients": 4, "min_samples": 5}
    a = Federation(parse_config(config(data={**data, "seed": 7})).data, seed=1)
    b = Federation(parse_config(config(data={**data, "seed": 7})).data, seed=2)
    assert a._gen.writers() == b._gen.writers()  # data.seed alone draws them
    assert all(int(u[1:5]) >= 2 for u in a._gen.writers())  # writers 0, 1 have 3, 4 < 5 samples
    with pytest.raises(ValueError, match=r"femnist: data.clients is 7 but there are only 6 .*at least 5 train"):
        Federation(parse_config(config(data={**data, "clients": 7})).data, seed=1)


def test_shakespeare_lines_become_leaf_character_indices(tmp_path):
    line = ("To be, or not to be: that is the question" * 2)[:80]
    users = {"THE_TRAGEDY_OF_HAMLET_HAMLET": ([line, line[1:] + "Q"], ["W", "h"], [line], ["x"]),
             "THE_TEMPEST_ARIEL": ([line[::-1]], ["a"], [], [])}
    write_leaf(tmp_path, users, files=1)
    fed = Federation(parse_config(config(data={"name": "shakespeare", "root": str(tmp_path), "clients": 2,
                                                     "select": "largest"}), ).data, seed=0)
    assert fed.info == DataInfo(80, 80, "classification", (80,))
    d = fed.client_data(0)
    assert d.x.dtype == torch.int64 and d.x.shape == (2, 80)
    assert "".join(LEAF_CHARS[i] for i in d.x[0].tolist()) == line
    assert [LEAF_CHARS[i] for i in d.y.tolist()] == ["W", "h"]
    assert fed.client_data(1).test_x.shape == (0, 80)
    bad = tmp_path / "bad"
    write_leaf(bad, {"A": (["é" * 80], ["a"], [], [])}, files=1)
    with pytest.raises(ValueError, match=r"bad/train/all_data_0_niid_0_keep_0_train_9.json: user 'A': character 'é' "
                                         r"is not one of LEAF's 80$"):
        Federation(parse_config(config(data={"name": "shakespeare", "root": str(bad), "clients": 1})).data, 0)


def test_missing_files_and_bad_settings_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^data: femnist: expected LEAF's train/\*\.json files in .*train \(run "
                                          r"LEAF's data/femnist/preprocess.sh"):
        raysoft.run(config(data={"name": "femnist", "root": str(tmp_path)}, model={"name": "leaf_cnn"}))
    with pytest.raises(ConfigError, match=r"^data\.distributions: Input should be less than or equal to 1"):
        parse_config(config(data={"name": "femnist", "distributions": 2}))
    with pytest.raises(ConfigError, match=r"^model\.name: model 'char_lstm' needs token sequences"):
        write_leaf(tmp_path, femnist_users(count=2))
        raysoft.run(config(data={"name": "femnist", "root": str(tmp_path), "clients": 2},
                                 model={"name": "char_lstm"}))
    with pytest.raises(ConfigError, match=r"^model\.name: model 'logistic' does not read token sequences"):
        raysoft.run(config(data={"name": "shakespeare", "root": str(tmp_path)}, model={"name": "logistic"}))


@pytest.mark.slow  # LEAF's CNN has 6.6M parameters, the LSTM two layers of 256
def test_leaf_models_shapes_and_one_training_step():
    from raysoft.config import TrainConfig

    g = torch.Generator().manual_seed(0)
    cnn = build_model(parse_config(small_config(model={"name": "leaf_cnn"})).model,
                      DataInfo(784, 62, "classification", (1, 28, 28)), g)
    sizes = [tuple(p.shape) for p in cnn.parameters()]
    assert sizes == [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (2048, 7 * 7 * 64), (2048,), (62, 2048), (62,)]
    assert cnn(torch.rand(3, 1, 28, 28)).shape == (3, 62)
    lstm_cfg = parse_config(small_config(model={"name": "char_lstm"})).model
    info = DataInfo(80, 80, "classification", (80,))
    lstm = build_model(lstm_cfg, info, torch.Generator().manual_seed(0))
    again = build_model(lstm_cfg, info, torch.Generator().manual_seed(0))
    assert isinstance(lstm, CharLSTM) and lstm.lstm.num_layers == 2 and lstm.lstm.hidden_size == 256
    assert lstm.embedding.weight.shape == (80, 8)
    assert all(torch.equal(a, b) for a, b in zip(lstm.parameters(), again.parameters()))  # from the generator
    x = torch.randint(0, 80, (4, 80))
    y = torch.randint(0, 80, (4,))
    assert lstm(x).shape == (4, 80)
    assert can_batch(lstm) == "LSTM layers" and can_batch(cnn) is None  # no vmap rule: trained one by one
    before = [p.detach().clone() for p in lstm.parameters()]
    train = TrainConfig(optimizer="sgd", lr=0.5, local_epochs=1, batch_size=4)
    proximal_train(lstm, make_optimizer(train, lstm.parameters()), x, y, "classification", train,
                   rng=np.random.default_rng(0))
    assert all(not torch.equal(a, b) for a, b in zip(before, lstm.parameters()))


@pytest.mark.slow
def test_a_small_femnist_run_with_the_leaf_cnn(tmp_path):
    write_leaf(tmp_path / "leaf", femnist_users(count=6))
    cfg = config(data={"name": "femnist", "root": str(tmp_path / "leaf"), "clients": 4, "select": "largest",
                             "test_samples": 8},
                       algorithm={"name": "fedavg", "rounds": 2, "clients_per_round": 4, "eval_every": 1},
                       model={"name": "leaf_cnn"}, train={"optimizer": "sgd", "lr": 0.05, "batch_size": 4,
                                                          "local_epochs": 1})
    run = raysoft.run(cfg, out=tmp_path / "runs")
    metrics = pd.read_parquet(run.run_dir / "metrics.parquet")
    assert metrics["value"].notna().all() and "accuracy" in set(metrics["metric"])
    assert {"test_loss", "test_accuracy"} <= set(metrics["metric"])  # the writers' own test samples
    clients = pd.read_parquet(run.run_dir / "clients.parquet")
    # the 4 largest of writers of 3, 5, 7 | 4, 6, 8 samples (two files), in the files' order
    assert clients["samples"].tolist() == [5, 7, 6, 8] and (clients["share"] == 1.0).all()


@pytest.mark.parametrize("job", ["femnist", "shakespeare", "hf_femnist", "hf_shakespeare", "hf_cifar10_dirichlet"])
def test_the_jobs_validate(job):
    from support.paths import JOBS

    from raysoft.config import load_config

    if job.startswith("hf_"):
        pytest.importorskip("flwr_datasets")
    cfg = load_config(JOBS / f"{job}.yaml")
    assert cfg.data.name in ("femnist", "shakespeare", "hf") and cfg.ray.backend == "inprocess"
