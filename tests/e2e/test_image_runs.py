"""Every algorithm on image data through the whole engine, on tiny IDX files written here.
(Claims on real rotated Fashion-MNIST are checked by ``raysoft compare jobs/compare_fmnist.yaml``,
reported in docs/results.md: at test-sized budgets they are not yet stable.)"""

import pytest
from support.configs import small_config
from support.images import write_fmnist

import raysoft


def _image_config(root, name, **algo):
    return small_config(
        algorithm={"name": name, "rounds": 2, "clients_per_round": 4, "eval_every": 1, **algo},
        data={"name": "fmnist", "clients": 6, "samples_min": 10, "samples_max": 14, "root": str(root),
              "test_samples": 8, "rotations": [0, 180]},
        model={"name": "cnn", "channels": [2, 4], "hidden": 8},
        train={"optimizer": "sgd", "lr": 0.05, "batch_size": 4, "local_epochs": 1},
    )


@pytest.mark.parametrize("name", ["fedsoft", "ifca", "fedem", "fedavg", "local"])
def test_every_algorithm_runs_on_rotated_images(tmp_path, name):
    write_fmnist(tmp_path / "fm")
    r = raysoft.run(_image_config(tmp_path / "fm", name), out=tmp_path / "runs")
    m = r.metrics
    assert set(m[m.scope == "client"].metric) >= {"accuracy", "loss"}
    assert m.step.max() == 2
    assert ((m[m.metric == "accuracy"].value >= 0) & (m[m.metric == "accuracy"].value <= 1)).all()
    if name != "local":
        assert set(m[m.scope == "cluster"].eval_dist) == {0, 1}


def test_missing_image_data_is_a_config_error_and_writes_nothing(tmp_path):
    with pytest.raises(raysoft.ConfigError, match="data: fmnist: expected"):
        raysoft.run(_image_config(tmp_path / "nothing", "fedsoft"), out=tmp_path / "runs")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
