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
    with pytest.raises(ConfigError, match="algorithm.estimation_intervall: none of ifca, fedavg has this key"):
        algorithm_configs(small_config(algorithm={"estimation_intervall": 3}), ["ifca", "fedavg"])
    with pytest.raises(ConfigError, match="algorithm.rounds: Input should be greater than or equal to 1"):
        algorithm_configs(small_config(algorithm={"rounds": 0}), ["fedavg"])


def test_a_comparison_config_runs_for_any_subset_of_its_algorithms(capsys):
    # issue #55: `--algorithms fedsoft,fedavg` on jobs/compare_fmnist.yaml was refused
    # ("algorithm.init_threshold: none of fedsoft, fedavg has this key")
    from support.paths import JOBS

    from raysoft.config import load_raw

    raw = load_raw(JOBS / "compare_fmnist.yaml")
    assert "init_threshold" in raw["algorithm"]
    cfgs = algorithm_configs(raw, ["fedsoft", "fedavg"])
    assert sorted(cfgs) == ["fedavg", "fedsoft"] and not hasattr(cfgs["fedavg"].algorithm, "init_threshold")
    line = capsys.readouterr().err.strip()
    assert line.startswith("--algorithms fedsoft,fedavg: dropped the other algorithms' keys ")
    assert "init_threshold" in line and "\n" not in line


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
        "compare.yaml", "comparison.md", "comparison.parquet", "comparison_center_metric.png",
        "comparison_client_cdf.png", "comparison_clients.parquet", "comparison_clustering.png",
        "comparison_metric_vs_bytes.png", "fedavg", "fedem", "fedsoft", "ifca", "local"]  # figures: what runs have
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
    table, served = md.split("\n## Clients served\n")
    figures = {name: path / f"comparison_{name}.png" for name in ("center_metric", "client_cdf", "clustering",
                                                                  "metric_vs_bytes")}
    assert table == comparison_markdown([load_run(path / a) for a in t.run_dir.unique()], path, figures)
    assert "](comparison_center_metric.png)" in md
    # how each algorithm serves its clients: the gains over Local and FedAvg, by hand from client_metrics.parquet
    c = pd.read_parquet(path / "comparison_clients.parquet").set_index("algorithm")
    final = {}
    for a in ("fedsoft", "fedavg", "local"):
        m = pd.read_parquet(path / a / "client_metrics.parquet")
        final[a] = m[(m.metric == "mse") & (m.step == 4)].set_index("client").value.sort_index()
    assert len(final["local"]) == 10
    over_local = final["local"] - final["fedsoft"]  # mse: the decrease is the gain
    assert c.loc["fedsoft", "gain_over_local"] == pytest.approx(over_local.mean())
    assert c.loc["fedsoft", "gain_over_fedavg"] == pytest.approx((final["fedavg"] - final["fedsoft"]).mean())
    assert c.loc["fedsoft", "worse_than_local"] == pytest.approx((over_local < 0).mean())
    assert c.loc["fedsoft", "mean"] == pytest.approx(final["fedsoft"].mean())
    assert pd.isna(c.loc["local", "gain_over_local"]) and pd.isna(c.loc["fedavg", "gain_over_fedavg"])
    assert f"| fedsoft | mse | {c.loc['fedsoft', 'mean']:.4g} |" in served
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


# --------------------------------------------------------------------------- nothing lost
def _files(run_dir):
    """Every file of a run directory with its bytes and modification time (a rerun changes them)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(run_dir.iterdir())}


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "raysoft", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_a_compare_failing_in_its_second_algorithm_keeps_the_first_and_continues(tmp_path):
    from support.runs import assert_same

    raw = small_config()
    raw["regimes"] = {"ifca": {"train": {"lr": 1e30}}}  # IFCA's updates are not finite: the run stops
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    proc = _cli("compare", cfg, "--algorithms", "fedsoft,ifca,fedavg", "--out", tmp_path / "o")
    (d,) = (tmp_path / "o").iterdir()
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("raysoft: run stopped: round 0: client 0 returned a non-finite update")
    assert proc.stderr.strip().endswith(
        f"(train.nan_policy: stop). The comparison is kept in {d} (finished: fedsoft); continue with: "
        f"raysoft compare --resume {d}.")
    assert sorted(p.name for p in d.iterdir()) == ["compare.yaml", "fedsoft"]  # IFCA had no checkpoint
    fedsoft = _files(d / "fedsoft")
    assert "summary.json" in fedsoft
    # the cause fixed in the comparison's config, --resume runs only what is missing
    manifest = yaml.safe_load((d / "compare.yaml").read_text())
    del manifest["config"]["regimes"]
    (d / "compare.yaml").write_text(yaml.safe_dump(manifest))
    done = _cli("compare", "--resume", d)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(d)
    assert _files(d / "fedsoft") == fedsoft  # kept, not run again
    assert set(pd.read_parquet(d / "comparison.parquet").algorithm) == {"fedsoft", "ifca", "fedavg"}
    assert (d / "comparison.md").is_file()
    clean = compare(small_config(), ["fedsoft", "ifca", "fedavg"], out=tmp_path / "clean")
    for a in ("fedsoft", "ifca", "fedavg"):
        assert_same(d / a, clean / a)
    again = _cli("compare", "--resume", d)
    assert (again.returncode, again.stderr) == (2, f"raysoft: error: --resume: {str(d)!r} is already complete\n")


@pytest.mark.slow
def test_an_interrupted_compare_keeps_its_runs_and_resumes_the_checkpointed_one(tmp_path):
    import signal
    import time

    from support.runs import assert_same

    raw = small_config(algorithm={"rounds": 30, "eval_every": 5}, data={"samples_max": 150},
                       output={"checkpoint_every": 1})
    raw["regimes"] = {"fedsoft": {"train": {"local_epochs": 1}}, "fedavg": {"train": {"local_epochs": 10}}}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "o"
    # Ctrl-C's KeyboardInterrupt even if this test process ignores SIGINT (a child inherits that)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from raysoft.cli import main; sys.exit(main(sys.argv[1:]))",
         "compare", str(cfg), "--algorithms", "fedsoft,fedavg", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not any(out.glob("*/fedavg/checkpoint.pt")):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    (d,) = out.iterdir()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert err.strip().splitlines()[-1] == (
        f"raysoft: comparison stopped by SIGINT; the comparison is kept in {d} (finished: fedsoft; "
        f"resumable: fedavg); continue with: raysoft compare --resume {d}")
    assert (d / "fedavg" / "checkpoint.pt").is_file() and not (d / "fedavg" / "summary.json").exists()
    fedsoft = _files(d / "fedsoft")
    done = _cli("compare", "--resume", d)
    assert done.returncode == 0, done.stderr
    assert _files(d / "fedsoft") == fedsoft
    assert list(pd.read_parquet(d / "comparison.parquet").algorithm.unique()) == ["fedsoft", "fedavg"]
    clean = algorithm_configs(raw, ["fedavg"])["fedavg"]
    import raysoft

    assert_same(d / "fedavg", raysoft.run(clean, out=tmp_path / "clean", progress="none").run_dir)


def test_compare_resume_refuses_what_is_not_a_comparison(tmp_path, capsys):
    assert cli_main(["compare", "--resume", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"raysoft: error: --resume: {str(tmp_path)!r} is not a comparison directory (no compare.yaml)\n")
    assert cli_main(["compare", "--resume", str(tmp_path), "--algorithms", "fedavg"]) == 2
    assert capsys.readouterr().err == (
        "raysoft: error: --resume takes the comparison directory only (its compare.yaml is the config)\n")
    assert cli_main(["compare"]) == 2
    assert "give a CONFIG file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_compare_that_kept_nothing_is_removed(tmp_path):
    # the first algorithm fails, without checkpoints: no run to keep, no comparison left behind
    from raysoft.errors import UpdateError

    raw = small_config()
    raw["regimes"] = {"fedsoft": {"train": {"lr": 1e30}}}
    with pytest.raises(UpdateError) as err:
        compare(raw, ["fedsoft", "fedavg"], out=tmp_path)
    assert list(tmp_path.iterdir()) == [] and "comparison is kept" not in str(err.value)


def test_a_comparisons_manifest_gives_back_its_configs(tmp_path, monkeypatch):
    import raysoft.compare

    monkeypatch.setattr(raysoft.compare, "_run_all", lambda d, *a, **k: d)  # the manifest alone
    raw = small_config(clock={"speeds": "equal", "round_deadline_s": 5.0}, algorithm={"estimation_interval": 3})
    raw["regimes"] = {"fedavg": {"train": {"lr": 0.01}}}
    d = compare(raw, ["fedsoft", "fedavg"], out=tmp_path)
    manifest = yaml.safe_load((d / "compare.yaml").read_text())
    assert manifest["algorithms"] == ["fedsoft", "fedavg"]
    assert algorithm_configs(manifest["config"], manifest["algorithms"]) == algorithm_configs(raw, ["fedsoft",
                                                                                                    "fedavg"])
