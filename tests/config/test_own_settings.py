"""Each dataset and model owns its settings (issue #46): the base sections hold only the keys
the engine reads of every dataset or model, a plug-in dataset declares its own keys and
partitions, a run saved with the old bases' keys still resumes, a new ``name`` drops the old
plug-in's keys, and ``raysoft list`` shows each setting's bounds."""

from __future__ import annotations

import sys
import textwrap

import pandas as pd
import pytest
import yaml
from support.configs import small_config

import raysoft
from raysoft.algorithms.settings import FedSoftConfig
from raysoft.catalog import CNNModel, ConvModel, FPFCSyntheticData, ImageData, SyntheticData
from raysoft.config import (
    ConfigError,
    DataConfig,
    ModelConfig,
    apply_overrides,
    load_config,
    load_saved_config,
    parse_config,
)
from raysoft.config.loading import RETIRED
from raysoft.listing import setting_lines
from raysoft.plugins import clear_cache

# A regression dataset whose clients sit at sites: its own keys (spread, site_noise) and its own
# partitions (by_site: client k wholly in distribution k % S; mixed: half in two neighbours).
SITES = '''
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from raysoft.sdk import DataConfig, DataInfo


class SiteSettings(DataConfig):
    """Clients at sites."""

    partition: Literal["by_site", "mixed"] = Field("by_site", description="by_site or mixed")
    spread: float = Field(3.0, gt=0.0, description="std of the sites' true weights")
    site_noise: float = Field(0.1, ge=0.0)
    dim: int = Field(4, ge=1)


class SiteData:
    """Linear regression per site."""

    Settings = SiteSettings

    def __init__(self, settings, seed):
        self.s = settings
        rng = np.random.default_rng(seed)
        self.w = rng.normal(0.0, settings.spread, size=(settings.distributions, settings.dim))
        self.info = DataInfo(input_dim=settings.dim, num_outputs=1, task="regression")
        self.seed = seed

    def client_mixtures(self, num_clients, distributions, rng):
        out = np.zeros((num_clients, distributions))
        for k in range(num_clients):
            out[k, k % distributions] = 1.0 if self.s.partition == "by_site" else 0.5
            if self.s.partition == "mixed":
                out[k, (k + 1) % distributions] += 0.5
        return out

    def _draw(self, rng, s, n):
        x = rng.standard_normal((n, self.s.dim))
        y = x @ self.w[s] + self.s.site_noise * rng.standard_normal(n)
        return torch.from_numpy(x).float(), torch.from_numpy(y).float()

    def client(self, k, n, shares):
        rng = np.random.default_rng([self.seed, k])
        counts = np.floor(np.asarray(shares) * n).astype(int)
        counts[int(np.argmax(shares))] += n - counts.sum()
        parts = [self._draw(rng, s, int(c)) for s, c in enumerate(counts)]
        comps = np.concatenate([np.full(int(c), s) for s, c in enumerate(counts)])
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), comps

    def holdout(self, s):
        return self._draw(np.random.default_rng([self.seed, 1000 + s]), s, self.s.test_samples)
'''


@pytest.fixture
def sites(tmp_path, monkeypatch):
    """The module ``sites_own.py`` in the current directory, imported fresh."""
    d = tmp_path / "plug"
    d.mkdir()
    (d / "sites_own.py").write_text(textwrap.dedent(SITES))
    monkeypatch.chdir(d)
    clear_cache()
    yield "sites_own:SiteData"
    sys.modules.pop("sites_own", None)
    clear_cache()


def test_the_builtins_keys_are_gone_from_the_base_sections():
    for key in ("dim", "classes", "theta_std", "noise_std", "generator", "alpha", "beta", "root", "rotations"):
        assert key not in DataConfig.model_fields, key
    assert set(DataConfig.model_fields) == {"name", "clients", "distributions", "partition", "samples_min",
                                            "samples_max", "test_samples", "seed", "join_schedule", "held_out",
                                            "held_out_eval"}
    assert set(ModelConfig.model_fields) == {"name", "init"}
    # each key lives with the dataset or model that reads it
    assert {"dim", "theta_std", "noise_std"} <= set(SyntheticData.model_fields)
    assert {"dim", "classes", "noise_std", "generator", "alpha", "beta"} <= set(FPFCSyntheticData.model_fields)
    assert {"root", "rotations"} <= set(ImageData.model_fields) and "dim" not in ImageData.model_fields
    assert {"channels", "hidden", "memory_format"} <= set(CNNModel.model_fields)
    assert issubclass(CNNModel, ConvModel) and "channels" not in ConvModel.model_fields
    assert set(RETIRED["data"]) | set(RETIRED["model"]) >= {"theta_std", "rotations", "channels"}


def test_the_sections_are_the_named_datasets_and_models_settings():
    cfg = parse_config({"data": {"name": "fpfc_synthetic", "partition": None, "dim": None}, "model": {"name": "cnn"}})
    assert type(cfg.data) is FPFCSyntheticData and (cfg.data.partition, cfg.data.dim) == ("clusters", 60)
    assert type(cfg.model) is CNNModel and cfg.model.channels == [32, 64]
    with pytest.raises(ConfigError, match=r"^model\.hidden: unknown key \(hidden is a key of the models cnn\)$"):
        parse_config({"model": {"name": "linear", "hidden": 8}})
    with pytest.raises(ConfigError, match=r"^data\.partition: Input should be '10:90', '30:70', 'linear', 'random' "
                                          r"or 'clusters' \(got '50:50'\)$"):
        parse_config({"data": {"name": "fmnist", "partition": "50:50"}})


def test_a_plugin_dataset_declares_its_own_keys_and_partitions_and_runs(sites, tmp_path):
    data = {"name": sites, "clients": 6, "distributions": 3, "partition": "mixed", "spread": 2.0,
            "samples_min": 20, "samples_max": 30, "test_samples": 50}
    run = raysoft.run(small_config(data=data, algorithm={"name": "fedavg", "clients_per_round": 4}),
                      out=tmp_path / "runs")
    saved = yaml.safe_load((run.run_dir / "config.yaml").read_text())["data"]
    assert saved["partition"] == "mixed" and saved["spread"] == 2.0 and "theta_std" not in saved
    assert run.summary["algorithm"] == "fedavg"
    assert pd.read_parquet(run.run_dir / "metrics.parquet")["value"].notna().all()
    cfg = parse_config(small_config(data={**data, "partition": None}))
    assert cfg.data.partition == "by_site"  # the dataset's own default
    with pytest.raises(ConfigError, match=r"^data\.partition: Input should be 'by_site' or 'mixed' "
                                          r"\(got '10:90'\)$"):
        parse_config(small_config(data={**data, "partition": "10:90"}))
    with pytest.raises(ConfigError, match=r"^data\.theta_std: unknown key \(theta_std is a key of the datasets "
                                          r"synthetic\)$"):
        parse_config(small_config(data={**data, "theta_std": 1.0}))
    with pytest.raises(ConfigError, match=r"^data\.spread: Input should be greater than 0"):
        parse_config(small_config(data={**data, "spread": 0.0}))


def test_a_plugin_dataset_that_keeps_the_base_partition_gets_the_engines_five(tmp_path, monkeypatch):
    (tmp_path / "sites_base.py").write_text(textwrap.dedent(SITES).replace(
        '    partition: Literal["by_site", "mixed"] = Field("by_site", description="by_site or mixed")\n', ""))
    monkeypatch.chdir(tmp_path)
    clear_cache()
    try:
        data = {"name": "sites_base:SiteData", "clients": 6, "distributions": 3, "partition": "random"}
        assert parse_config(small_config(data=data)).data.partition == "random"
        with pytest.raises(ConfigError, match=r"^data\.partition: Input should be '10:90', '30:70', 'linear', "
                                              r"'random' or 'clusters' \(got 'by_site'\)$"):
            parse_config(small_config(data={**data, "partition": "by_site"}))
        with pytest.raises(ConfigError, match=r"^data\.partition: got the number 7; quote it"):
            parse_config(small_config(data={**data, "partition": 7}))
    finally:
        sys.modules.pop("sites_base", None)
        clear_cache()


def test_a_new_name_drops_the_old_plugins_keys_saying_which(capsys):
    notes: list[str] = []
    raw = {"algorithm": {"name": "fedsoft", "sigma": 0.1, "rounds": 3}, "data": {"theta_std": 2.0}}
    out = apply_overrides(raw, ["algorithm.name=fedavg", "data.name=fmnist"], note=notes.append)
    assert out["algorithm"] == {"name": "fedavg", "rounds": 3} and out["data"] == {"name": "fmnist"}
    assert notes == ["algorithm.name=fedavg: dropped fedsoft's keys sigma",
                     "data.name=fmnist: dropped synthetic's keys theta_std"]
    assert raw["algorithm"]["sigma"] == 0.1  # the mapping given is left as it was
    cfg = load_config(None, ["model.name=cnn", "model.hidden=16", "model.name=resnet18", "algorithm.name=ifca"])
    assert cfg.model.name == "resnet18" and cfg.algorithm.name == "ifca"
    assert capsys.readouterr().err == "model.name=resnet18: dropped cnn's keys hidden\n"
    # the keys the new one has stay; an unknown new name drops nothing (its validation names it)
    kept = apply_overrides({"algorithm": {"name": "fedsoft", "num_centers": 3}}, ["algorithm.name=ifca"])
    assert kept["algorithm"] == {"name": "ifca", "num_centers": 3}
    with pytest.raises(ConfigError, match=r"^algorithm\.name: unknown algorithm 'fedsfot'"):
        load_config(None, ["algorithm.sigma=0.5", "algorithm.name=fedsfot"])
    assert capsys.readouterr().err == ""


def test_a_run_saved_with_the_old_bases_keys_still_resumes(tmp_path):
    first = raysoft.run(small_config(), out=tmp_path / "a")
    old = yaml.safe_load((first.run_dir / "config.yaml").read_text())
    # what the bases held before each dataset and model owned its settings, all at their defaults
    old["data"].update(dim=10, classes=10, theta_std=10.0, noise_std=1.0, generator="fpfc", alpha=1.0, beta=1.0,
                       root=None, rotations=None)
    old["model"].update(channels=[32, 64], hidden=512, memory_format="contiguous")
    run_dir = tmp_path / "old" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    with pytest.raises(ConfigError, match=r"^data\.classes: unknown key"):
        parse_config(old)  # a config written by hand gets no such leniency
    assert load_saved_config(run_dir / "config.yaml") == load_config(first.run_dir / "config.yaml")
    again = raysoft.resume(run_dir)
    assert again.run_dir == run_dir
    pd.testing.assert_frame_equal(_values(again.run_dir), _values(first.run_dir))


def _values(run_dir) -> pd.DataFrame:
    m = pd.read_parquet(run_dir / "metrics.parquet")
    return m[["step", "scope", "entity", "eval_dist", "metric", "value"]].reset_index(drop=True)


def test_raysoft_list_shows_each_settings_bounds():
    data = setting_lines(SyntheticData)
    assert "    clients: int = 100 (>= 1)  # N" in data
    assert any(line.startswith("    theta_std: float = 10.0 (> 0.0)  # sigma_0") for line in data)
    assert any(line.startswith("    seed: int | None = None  # ") for line in data)  # no bounds: none shown
    algo = setting_lines(FedSoftConfig)
    assert any(line.startswith("    sigma: float = 0.0001 (>= 0.0, <= 1.0)  # ") for line in algo)
