"""raysoft bench: the workloads, the timing and memory arithmetic, and a quick end-to-end run."""

import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from support.images import write_learnable_fmnist
from support.paths import ROOT

from raysoft.bench import COLUMNS, WORKLOADS, markdown, round_stats, tree_memory_mb, workload_config
from raysoft.bench.workloads import variants
from raysoft.cli import main as cli_main
from raysoft.config import ConfigError, parse_config


@pytest.mark.parametrize("name", WORKLOADS)
@pytest.mark.parametrize("quick", [False, True])
def test_every_workload_is_a_valid_config(name, quick):
    cfg = parse_config(workload_config(name, 4, quick))
    if name == "W3":
        assert cfg.algorithm.rounds == 4 * cfg.data.clients
    else:
        assert cfg.algorithm.rounds == 4 and cfg.algorithm.eval_every == 4
    if not quick:  # the reference sizes
        assert cfg.data.clients == {"W1": 100, "W2": 100, "W3": 80, "W4": 1000}[name]
    assert parse_config(workload_config("W3", 0)).algorithm.rounds == 200


def test_w4_is_w2_with_a_thousand_clients_as_fedsoft_and_as_fedavg():
    assert variants("W4") == ["W4:fedsoft", "W4:fedavg"] and variants("W2") == ["W2"]
    w2 = parse_config(workload_config("W2", 4))
    soft, avg = (parse_config(workload_config(f"W4:{a}", 4)) for a in ("fedsoft", "fedavg"))
    assert soft.data.clients == avg.data.clients == 1000
    assert avg.model == soft.model == w2.model and avg.train == soft.train == w2.train
    assert avg.algorithm == w2.algorithm  # 60 clients a round
    assert (soft.algorithm.name, soft.algorithm.clients_per_round, soft.algorithm.estimation_interval) == (
        "fedsoft",
        60,
        2,
    )
    assert soft.ray.client_state == "disk"
    with pytest.raises(ConfigError, match="W4 runs as fedsoft or fedavg"):
        workload_config("W4:ifca", 4)
    assert parse_config(workload_config("W4:fedavg@300", 4)).data.clients == 300  # the scaling table
    for bad in ("W2@300", "W4:fedavg@30", "W4@many"):
        with pytest.raises(ConfigError, match="--clients: only W4's population"):
            workload_config(bad, 4)


def test_round_stats_skip_the_warm_up_round():
    sec, ups = round_stats([9.0, 2.0, 4.0, 3.0], [60, 60, 30, 60])
    assert sec == 3.0  # median of 2, 4, 3
    assert ups == pytest.approx(150 / 9.0)
    assert round_stats([5.0], [10]) == (5.0, 2.0)
    with pytest.raises(ValueError):
        round_stats([], [])


def test_tree_rss_counts_the_children():
    code = "import time; b = bytearray(300 * 2**20); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        import os

        alone = tree_memory_mb(proc.pid)[0]
        deadline = time.monotonic() + 20
        while alone < 300 and time.monotonic() < deadline:
            time.sleep(0.1)
            alone = tree_memory_mb(proc.pid)[0]
        assert alone >= 300
        assert tree_memory_mb(os.getpid())[0] > alone  # this process plus its child
        assert tree_memory_mb(proc.pid)[1] >= 290  # its bytearray is private: all of it in PSS
    finally:
        proc.kill()
        proc.wait()


def test_markdown_gives_the_speed_up_of_raysoft():
    table = pd.DataFrame([
        {"workload": "W2", "system": "raysoft", "sec_per_round": 2.0, "updates_per_s": 30.0, "peak_rss_mb": 900.0,
         "peak_pss_mb": 700.0, "quality": 0.8, "quality_metric": "accuracy"},
        {"workload": "W2", "system": "flower", "sec_per_round": 11.0, "updates_per_s": 5.5, "peak_rss_mb": 2000.0,
         "peak_pss_mb": 1500.0, "quality": 0.8, "quality_metric": "accuracy"},
    ])
    table["algorithm"] = "fedavg"
    table["clients"] = 100
    table["coordinator_busy_s"] = [0.12, float("nan")]
    table["coordinator_mb"] = [2.5, float("nan")]
    floor = {"workload": "W2", "system": "floor", "algorithm": "fedavg", "sec_per_round": 1.6, "updates_per_s": 37.5,
             "peak_rss_mb": 400.0, "peak_pss_mb": 300.0, "quality": float("nan"),
             "quality_metric": "11.2 MFLOP/sample at 120.0 GFLOP/s"}
    text = markdown(pd.concat([table, pd.DataFrame([floor])], ignore_index=True))
    assert "| W2 | flower | fedavg | 100 | 11.000 | 5.5 | 2000 | 1500 | 0.8 (accuracy) | 5.50× | – | – |" in text
    assert "| W2 | raysoft | fedavg | 100 | 2.000 | 30.0 | 900 | 700 | 0.8 (accuracy) | – | 0.120 | 2.5 |" in text
    assert (
        "| W2 | floor | fedavg | – | 1.600 | 37.5 | 400 | 300 | – (11.2 MFLOP/sample at 120.0 GFLOP/s) | 0.80× "
        "| – | – |" in text
    )


def test_an_unknown_workload_is_a_one_line_error():
    proc = subprocess.run([sys.executable, "-m", "raysoft", "bench", "--workload", "W9", "--flower", "skip"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "raysoft bench: --workload: unknown workload 'W9' (known: W1, W2, W3, W4)"
    ]


@pytest.mark.parametrize("extra", [[], ["--long-run"]])
def test_a_timeout_that_is_not_positive_is_a_one_line_error(extra):
    proc = subprocess.run([sys.executable, "-m", "raysoft", "bench", "--workload", "W1", "--flower", "skip",
                           "--pfl", "skip", "--timeout", "0", *extra], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    line = "raysoft bench: --timeout: seconds a measurement may take, above 0 (got 0)"
    assert proc.stderr.strip().splitlines() == [line]


def test_a_measurement_past_its_deadline_is_stopped(tmp_path):
    from raysoft.bench.runner import _measure

    with pytest.raises(RuntimeError, match=r"^W1 raysoft: timed out after 2 s \(--timeout\)$"):
        _measure("W1 raysoft", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "x.json", 2.0)


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--rounds", "x"], "raysoft bench: error: argument --rounds: invalid int value: 'x'"),
        (["--bogus"], "raysoft bench: error: unrecognized arguments: --bogus"),
        (["--rounds", "1", "--flower", "skip"], "raysoft bench: --rounds: needs at least 2 (the first is the warm-up)"),
        (
            ["--worker", "raysoft", "W1"],
            "raysoft bench: error: --worker takes SYSTEM WORKLOAD ROUNDS QUICK OUT_JSON [EXPORT]",
        ),
    ],
)
def test_bad_bench_arguments_are_one_line_and_exit_2(argv, line, capsys):
    try:
        code = cli_main(["bench", *argv])
    except SystemExit as exit_:  # argparse's errors
        code = exit_.code
    assert code == 2 and capsys.readouterr().err.splitlines() == [line]


@pytest.mark.slow
def test_bench_quick_runs_raysoft_and_the_bare_loop(tmp_path):
    """The smoke test of the benchmark (no timing assertions): every workload's systems run,
    bench.parquet has the contract's columns, and raysoft's FedAvg reaches the bare loop's
    accuracy (the same clients, selections, initial model and batch orders)."""
    out = tmp_path / "bench"
    write_learnable_fmnist(tmp_path / "fmnist")
    env = {**os.environ, "RAYSOFT_DATA": str(tmp_path / "fmnist")}
    proc = subprocess.run([sys.executable, "-m", "raysoft", "bench", "--quick", "--flower", "skip", "--pfl", "skip",
                           "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out.resolve())
    table = pd.read_parquet(out / "bench.parquet")
    assert list(table.columns) == COLUMNS
    assert [tuple(r) for r in table[["workload", "system", "algorithm"]].values] == [
        ("W1", "raysoft", "fedsoft"), ("W1", "bare", "fedsoft"), ("W2", "raysoft", "fedavg"), ("W2", "bare", "fedavg"),
        ("W2", "floor", "fedavg"), ("W3", "raysoft", "ccfl"), ("W3", "floor", "ccfl")]
    assert (table["sec_per_round"] > 0).all() and (table["updates_per_s"] > 0).all()
    w2 = table[table["workload"] == "W2"].set_index("system")
    assert np.isnan(w2.loc["floor", "quality"]) and "MFLOP/sample" in w2.loc["floor", "quality_metric"]
    assert w2.loc["raysoft", "coordinator_busy_s"] >= 0 and w2.loc["raysoft", "coordinator_mb"] > 0
    assert np.isnan(w2.loc["bare", "coordinator_mb"])
    assert (table["peak_rss_mb"] > 100).all()  # a Python process with torch at least
    assert (table["peak_pss_mb"] > 50).all() and (table["peak_pss_mb"] <= table["peak_rss_mb"]).all()
    w2 = table[table["workload"] == "W2"].set_index("system")
    assert w2.loc["raysoft", "updates_per_round"] == w2.loc["bare", "updates_per_round"] == 6
    assert abs(w2.loc["raysoft", "quality"] - w2.loc["bare", "quality"]) < 0.02
    w1 = table[table["workload"] == "W1"].set_index("system")
    assert np.isfinite(w1["quality"]).all()
    assert "| W2 | bare |" in (out / "bench.md").read_text()
