"""Hugging Face datasets split by Flower Datasets' partitioners (``data.name: hf``, issue #52),
read from local Parquet files and a folder ``save_to_disk`` wrote: never the hub."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from support.configs import small_config

import raysoft
from raysoft.catalog import LEAF_CHARS
from raysoft.config import ConfigError, parse_config
from raysoft.data import Federation

datasets = pytest.importorskip("datasets")
pytest.importorskip("flwr_datasets")


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


def config(data: dict, **sections) -> dict:
    out = small_config(**sections)
    out["data"] = {"name": "hf", **data}
    out["algorithm"]["clients_per_round"] = min(out["algorithm"]["clients_per_round"], data.get("clients", 100))
    return out


def femnist_like(path, writers=(4, 6, 3, 5)):
    """A FEMNIST-shaped Parquet file (flwrlabs/femnist's columns): writer w's i-th image has every
    pixel w * 20 + i, its character (w + i) % 62."""
    from PIL import Image

    images, chars, ids = [], [], []
    for w, n in enumerate(writers):
        for i in range(n):
            images.append(Image.fromarray(np.full((28, 28), w * 20 + i, np.uint8)))
            chars.append((w + i) % 62)
            ids.append(f"f{w:04d}_00")
    features = datasets.Features({"image": datasets.Image(), "character": datasets.ClassLabel(num_classes=62),
                                  "writer_id": datasets.Value("string")})
    datasets.Dataset.from_dict({"image": images, "character": chars, "writer_id": ids},
                               features=features).to_parquet(str(path))
    return path


def test_natural_id_partitioner_makes_a_client_per_writer(tmp_path):
    path = femnist_like(tmp_path / "femnist.parquet")
    cfg = parse_config(config({"path": str(path), "features": "image", "label": "character", "clients": 3,
                               "partitioner": "NaturalIdPartitioner", "select": "largest",
                               "partitioner_args": {"partition_by": "writer_id"}, "client_test": 0.25,
                               "test_samples": 3})).data
    fed = Federation(cfg, seed=0)
    assert fed.info.input_shape == (1, 28, 28) and fed.info.num_outputs == 62
    # the 3 largest writers (4, 6, 5 images: writers 0, 1, 3), each less int(0.25 * n) test samples
    assert fed.sizes.tolist() == [3, 5, 4]
    for k, (w, n) in enumerate([(0, 4), (1, 6), (3, 5)]):
        d = fed.client_data(k)
        pixels = sorted(round(float(v) * 255) for v in torch.cat([d.x, d.test_x])[:, 0, 0, 0])
        assert pixels == [w * 20 + i for i in range(n)]  # exactly the writer's images, split train/test
        labels = {round(float(v) * 255) - w * 20: int(c) for v, c in zip(torch.cat([d.x, d.test_x])[:, 0, 0, 0],
                                                                        torch.cat([d.y, d.test_y]))}
        assert labels == {i: (w + i) % 62 for i in range(n)}
    assert len(fed.holdout(0)[1]) == 3


def test_dirichlet_partitioner_over_a_saved_folder_with_a_test_split(tmp_path):
    rng = np.random.default_rng(0)
    def split(n):
        return datasets.Dataset.from_dict({"x": rng.normal(size=(n, 5)).astype(np.float32).tolist(),
                                           "label": rng.integers(0, 3, n).tolist()})
    folder = tmp_path / "saved"
    datasets.DatasetDict({"train": split(300), "test": split(40)}).save_to_disk(str(folder))
    data = {"path": str(folder), "features": "x", "clients": 5, "partitioner": "DirichletPartitioner",
            "partitioner_args": {"alpha": 1.0, "min_partition_size": 5}, "test_split": "test", "test_samples": 30}
    fed = Federation(parse_config(config(data, model={"name": "logistic"})).data, seed=4)
    from flwr_datasets.partitioner import DirichletPartitioner

    ref = DirichletPartitioner(num_partitions=5, partition_by="label", alpha=1.0, min_partition_size=5, seed=4)
    ref.dataset = datasets.load_from_disk(str(folder))["train"]
    expected = [len(ref.load_partition(i)) for i in range(5)]
    assert (fed.sizes + np.array([int(0.2 * n) for n in expected])).tolist() == expected  # Flower's own partitions
    assert fed.info.input_shape == () and fed.info.input_dim == 5 and fed.info.num_outputs == 3
    d = fed.client_data(2)
    assert d.x.shape == (fed.sizes[2], 5) and d.x.dtype == torch.float32
    hx, hy = fed.holdout(0)
    assert hx.shape == (30, 5)
    run = raysoft.run(config(data, model={"name": "logistic"}, algorithm={"name": "fedavg", "rounds": 2,
                                                                          "clients_per_round": 5}),
                      out=tmp_path / "runs")
    assert pd.read_parquet(run.run_dir / "metrics.parquet")["value"].notna().all()


def test_text_columns_become_leaf_characters(tmp_path):
    line = ("Now is the winter of our discontent " * 3)[:80]
    ds = datasets.Dataset.from_dict({"x": [line, line[1:] + "M", line[::-1]], "y": ["M", "a", "w"],
                                     "character_id": ["GLOUCESTER", "GLOUCESTER", "ANNE"]})
    ds.to_parquet(str(tmp_path / "shakespeare.parquet"))
    cfg = parse_config(config({"path": str(tmp_path / "shakespeare.parquet"), "features": "x", "label": "y",
                               "clients": 1, "select": "largest", "partitioner": "NaturalIdPartitioner",
                               "partitioner_args": {"partition_by": "character_id"}, "client_test": 0.0},
                              model={"name": "char_lstm"})).data
    fed = Federation(cfg, seed=0)
    assert fed.info.input_shape == (80,) and fed.info.num_outputs == 80
    d = fed.client_data(0)
    assert d.x.dtype == torch.int64 and "".join(LEAF_CHARS[i] for i in d.x[0].tolist()) == line
    assert [LEAF_CHARS[i] for i in d.y.tolist()] == ["M", "a"]
    assert d.test_x.shape == (0, 80) and d.test_x.dtype == torch.int64
    cfg = parse_config(config({**cfg.model_dump(), "name": "hf", "client_test": 0.5, "client_test_from": "end"},
                              model={"name": "char_lstm"})).data
    d = Federation(cfg, seed=0).client_data(0)  # the role's last line is its test split: no text ahead leaks
    assert [LEAF_CHARS[i] for i in d.y.tolist()] == ["M"] and [LEAF_CHARS[i] for i in d.test_y.tolist()] == ["a"]


def test_bad_settings_are_one_line(tmp_path, monkeypatch):
    path = femnist_like(tmp_path / "f.parquet")
    base = {"path": str(path), "label": "character", "clients": 2}
    with pytest.raises(ValueError, match=r"data.partitioner: 'Nope' is not one of flwr_datasets.partitioner's "
                                         r"\(ContinuousPartitioner, DirichletPartitioner"):
        Federation(parse_config(config({**base, "partitioner": "Nope"})).data, 0)
    with pytest.raises(ValueError, match=r"hf: .* has no column 'pixels' \(columns: image, character, writer_id\)"):
        Federation(parse_config(config({**base, "features": "pixels"})).data, 0)
    with pytest.raises(ValueError, match=r"hf: data.clients is 9 but there are only 4 to choose from"):
        Federation(parse_config(config({**base, "clients": 9, "partitioner": "NaturalIdPartitioner",
                                        "partitioner_args": {"partition_by": "writer_id"}})).data, 0)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "flwr_datasets" else real(n, *a))
    with pytest.raises(ConfigError, match=r"^data: needs flwr_datasets: pip install 'raysoft\[hf\]'$"):
        parse_config(config(base))
