"""raysoft compare: identical clients for every algorithm, Table-2-shaped output."""

import subprocess
import sys

import pandas as pd
import pytest
import yaml
from support.configs import small_config

from raysoft.cli import main as cli_main
from raysoft.compare import algorithm_configs, compare
from raysoft.config import ConfigError
from raysoft.report import comparison_markdown, load_run


def test_algorithm_keys_go_to_the_algorithms_that_have_them():
    raw = small_config(algorithm={"estimation_interval": 3, "num_centers": 2, "init_threshold": 0.2})
    cfgs = algorithm_configs(raw, ["fedsoft", "ifca", "fedavg"])
    assert cfgs["ifca"].algorithm.init_threshold == 0.2
    assert cfgs["fedsoft"].algorithm.estimation_interval == 3
    assert cfgs["ifca"].algorithm.num_centers == 2
    assert not hasattr(cfgs["fedavg"].algorithm, "num_centers")
    assert {c.algorithm.rounds for c in cfgs.values()} == {4}
    assert len({c.data for c in cfgs.values()}) == 1 and len({c.seed for c in cfgs.values()}) == 1


def test_bad_algorithm_lists():
    cfg = small_config(algorithm={"name": "fedsoft", "estimation_interval": 3})
    with pytest.raises(ConfigError, match="unknown algorithm 'fedx'"):
        algorithm_configs(cfg, ["fedsoft", "fedx"])
    with pytest.raises(ConfigError, match="algorithm.estimation_interval: none of ifca, fedavg has this key"):
        algorithm_configs(cfg, ["ifca", "fedavg"])
    with pytest.raises(ConfigError, match="algorithm.rounds: Input should be greater than or equal to 1"):
        algorithm_configs(small_config(algorithm={"rounds": 0}), ["fedavg"])


def test_each_algorithm_runs_in_its_own_regime():
    raw = small_config(algorithm={"estimation_interval": 3}, train={"optimizer": "sgd", "lr": 0.05, "momentum": 0.9})
    raw["regimes"] = {"fedsoft": {"train": {"optimizer": "adam", "lr": 5e-4, "momentum": 0.0},
                                  "algorithm": {"start": "mixture", "prox_weight": 0.01}}}
    cfgs = algorithm_configs(raw, ["fedsoft", "fedavg"])
    assert (cfgs["fedsoft"].train.optimizer, cfgs["fedsoft"].train.lr) == ("adam", 5e-4)
    assert (cfgs["fedsoft"].algorithm.start, cfgs["fedsoft"].algorithm.prox_weight) == ("mixture", 0.01)
    assert cfgs["fedsoft"].algorithm.estimation_interval == 3  # the shared keys still reach it
    assert (cfgs["fedavg"].train.optimizer, cfgs["fedavg"].train.lr) == ("sgd", 0.05)
    assert cfgs["fedsoft"].train.batch_size == cfgs["fedavg"].train.batch_size  # the rest is shared
    assert "regimes" not in cfgs["fedsoft"].to_dict()  # the resolved config holds what ran


@pytest.mark.parametrize("regimes, message", [
    ({"fedx": {}}, "regimes.fedx: unknown algorithm"),
    ({"fedsoft": {"data": {"clients": 3}}}, "regimes.fedsoft.data: a regime sets only algorithm, train, model keys"),
    ({"fedsoft": {"algorithm": {"name": "ifca"}}}, "regimes.fedsoft.algorithm: must be a mapping of keys"),
    ({"fedsoft": {"train": {"lr": -1.0}}}, "train.lr"),
    ([1], "regimes: must be a mapping"),
])
def test_bad_regimes_are_one_line_errors(regimes, message):
    raw = small_config()
    raw["regimes"] = regimes
    with pytest.raises(ConfigError, match=message) as err:
        algorithm_configs(raw, ["fedsoft", "fedavg"])
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_compare_writes_one_run_per_algorithm_and_the_table(tmp_path):
    path = compare(small_config(), ["fedsoft", "ifca", "fedem", "fedavg", "local"], out=tmp_path)
    assert sorted(p.name for p in path.iterdir()) == [
        "comparison.md", "comparison.parquet", "fedavg", "fedem", "fedsoft", "ifca", "local"]
    t = pd.read_parquet(path / "comparison.parquet")
    assert set(t.algorithm) == {"fedsoft", "ifca", "fedem", "fedavg", "local"}
    assert len(t[t.algorithm == "fedsoft"]) == 2  # one row per distribution
    clients = [pd.read_parquet(path / a / "clients.parquet").drop(columns="run_id") for a in ("fedsoft", "local")]
    pd.testing.assert_frame_equal(*clients)  # identical clients
    fem = t[t.algorithm == "fedem"].iloc[0]
    assert fem.local_mean != fem.local_mean_mixture  # best learner and mixture are both reported
    md = (path / "comparison.md").read_text()
    assert "| fedsoft |" in md and "c*[0]" in md and "w̄" in md
    # the one comparison writer, raysoft report's (no report.md in the runs yet: no links)
    assert md == comparison_markdown([load_run(path / a) for a in t.run_dir.unique()], path)
    fedem_row = next(line for line in md.splitlines() if line.startswith("| fedem |"))
    assert f"{fem.local_mean_mixture:.2f}" in fedem_row  # FedEM's pi-mixture in its own column
    soft = t[t.algorithm == "fedsoft"].iloc[0]  # the regime each ran with, in both outputs
    assert (soft.optimizer, soft.local_epochs) == ("adam", 2) and "λ 1.0, start local" in soft.regime
    assert soft.regime in next(line for line in md.splitlines() if line.startswith("| fedsoft |"))


@pytest.mark.slow
def test_cli_compare_prints_the_directory_last(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(small_config()))
    proc = subprocess.run([sys.executable, "-m", "raysoft", "compare", str(cfg), "--algorithms", "fedsoft,fedavg",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert (tmp_path / "o").resolve() == __import__("pathlib").Path(last).resolve().parent
    bad = subprocess.run([sys.executable, "-m", "raysoft", "compare", str(cfg), "--algorithms", "nope",
                          "--out", str(tmp_path / "o2")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_report_on_a_compare_directory_reports_its_runs(tmp_path, capsys):
    path = compare(small_config(), ["fedsoft", "fedavg"], out=tmp_path)
    assert cli_main(["report", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [str(path / "comparison_report.md"), str(path)]  # beside comparison.md
    assert {"fedsoft/report.md", "fedavg/report.md", "comparison.md"} <= {
        p.relative_to(path).as_posix() for p in path.rglob("*.md")}
    rows = [line for line in (path / "comparison_report.md").read_text().splitlines() if line.startswith("| [")]
    assert [r.split(" | ")[1] for r in rows] == ["fedsoft", "fedavg"]  # the comparison's order, not by name
    assert rows[0].startswith("| [fedsoft](fedsoft/report.md) |")
