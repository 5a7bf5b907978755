"""raysoft bench: the workloads, the timing and memory arithmetic, and a quick end-to-end run."""

import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch
from support.images import write_learnable_fmnist
from support.paths import ROOT

from raysoft.bench import COLUMNS, WORKLOADS, markdown, round_stats, tree_memory_mb, workload_config
from raysoft.bench.bare import timed_window
from raysoft.bench.runner import check_device, peer_skip, row
from raysoft.bench.workloads import gpu_actors, gpu_rows, on_gpu, variants
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
        assert cfg.data.clients == {"W1": 100, "W2": 100, "W3": 80, "W4": 1000, "W5": 10_000}[name]
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


def test_w5_is_fedavg_with_ten_thousand_small_clients():
    w2, w5 = parse_config(workload_config("W2", 4)), parse_config(workload_config("W5", 4))
    assert (w5.algorithm.name, w5.data.clients, w5.algorithm.clients_per_round) == ("fedavg", 10_000, 100)
    assert (w5.data.samples_min, w5.data.samples_max) == (8, 16)
    assert w5.model == w2.model and w5.train == w2.train and w5.data.rotations == w2.data.rotations
    quick = parse_config(workload_config("W5", 2, quick=True))
    assert (quick.data.clients, quick.algorithm.clients_per_round) == (200, 10)


@pytest.mark.parametrize("share, actors", [(0.125, 8), (0.25, 4), (0.3, 3), (1 / 3, 3), (0.5, 2), (1.0, 1)])
def test_on_the_gpu_raysofts_actors_share_it(share, actors):
    assert gpu_actors(share) == actors
    for name in ("W1", "W2", "W3", "W4:fedsoft", "W5"):
        raw = workload_config(name, 3, quick=True)
        cfg = parse_config(on_gpu(raw, share))
        assert (cfg.ray.num_gpus_per_actor, cfg.ray.num_cpus_per_actor, cfg.ray.num_cpus) == (share, 1.0, actors)
        assert raw.get("ray", {}).get("num_gpus_per_actor") is None  # the CPU config is left as it was
        assert "gpu_rows" not in raw["train"]
    assert parse_config(workload_config("W4:fedsoft", 3)).ray.client_state == "disk"  # on the CPU
    assert parse_config(on_gpu(workload_config("W4:fedsoft", 3))).ray.client_state == "memory"  # on the GPU
    w2 = parse_config(on_gpu(workload_config("W2", 3), share))  # 60 clients a round over the actors
    assert w2.train.gpu_rows == {8: 8, 4: 16, 3: 24, 2: 32, 1: 64}[actors]


@pytest.mark.parametrize("clients, actors, rows", [(60, 8, 8), (60, 1, 64), (100, 1, 104), (100, 8, 16),
                                                    (6, 8, 8), (1, 1, 8), (65, 1, 72)])
def test_the_benchs_gpu_rows_hold_an_actors_clients_in_multiples_of_8(clients, actors, rows):
    assert gpu_rows(clients, actors) == rows


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5, float("nan")])
def test_a_gpu_share_outside_0_to_1_is_refused(share):
    with pytest.raises(ConfigError, match=r"^--gpu-share: a GPU's share per client actor, above 0 and at most 1"):
        gpu_actors(share)


def test_cuda_is_refused_where_torch_finds_none():
    with pytest.raises(ConfigError, match=r"^--device cuda: torch finds no CUDA on this machine"):
        check_device("cuda", 0.125, has_cuda=lambda: False)
    check_device("cuda", 0.125, has_cuda=lambda: True)
    check_device("cpu", 0.125, has_cuda=lambda: False)
    with pytest.raises(ConfigError, match="--device: cpu or cuda"):
        check_device("tpu", 0.125, has_cuda=lambda: True)
    with pytest.raises(ConfigError, match="--gpu-share"):
        check_device("cuda", 2.0, has_cuda=lambda: True)


def test_peers_on_the_gpu(tmp_path):
    assert peer_skip("flower", "skip", "cpu") == peer_skip("pfl", "skip", "cuda") == "skip"
    assert peer_skip("flower", str(tmp_path / "none"), "cpu") is None  # on the CPU it is made on first use
    assert peer_skip("pfl", ".venv-pfl", "cuda") == "pfl's script trains on the CPU: not a GPU peer"
    assert peer_skip("flower", str(tmp_path / "none"), "cuda").startswith("no complete Flower venv at ")


def test_the_timed_window_leaves_the_warm_up_round_out():
    assert timed_window([(1.0, 2.0), (2.0, 2.5), (2.5, 3.25)]) == (2.0, 3.25)
    assert timed_window([(1.0, 2.0)]) == (1.0, 2.0)
    assert timed_window([]) is None


def test_a_row_carries_its_device_and_gpu_columns():
    cfg = workload_config("W2", 3)
    res = {"sec_per_round_all": [3.0, 1.0, 2.0], "updates": [60, 60, 60], "quality": 0.5,
           "quality_metric": "accuracy", "total_s": 9.0}
    cpu = row("W2", "bare", cfg, res, 900.0, 700.0)
    assert list(cpu) == COLUMNS
    assert cpu["device"] == "cpu" and all(np.isnan(cpu[c]) for c in ("gpu_util_pct", "gpu_util_max_pct",
                                                                        "peak_gpu_mb"))
    assert (cpu["sec_per_round"], cpu["updates_per_s"], cpu["clients"]) == (1.5, 40.0, 100)
    gpu = row("W2", "raysoft", cfg, res, 900.0, 700.0, "cuda",
              {"gpu_util_pct": 71.5, "gpu_util_max_pct": 99.0, "peak_gpu_mb": 7600.0})
    assert (gpu["device"], gpu["gpu_util_pct"], gpu["gpu_util_max_pct"], gpu["peak_gpu_mb"]) == (
        "cuda", 71.5, 99.0, 7600.0)


def test_markdown_on_the_gpu_has_the_gpu_columns():
    cfg = workload_config("W2", 3)
    res = {"sec_per_round_all": [1.0, 0.5], "updates": [60, 60], "quality": 0.5, "quality_metric": "accuracy",
           "total_s": 3.0}
    floor = {**res, "sec_per_round_all": [0.01, 0.01], "quality": float("nan"),
             "quality_metric": "11.2 MFLOP/sample at 51234.5 GFLOP/s (cuda fp32)"}
    table = pd.DataFrame([
        row("W2", "raysoft", cfg, res, 3000.0, 2000.0, "cuda",
            {"gpu_util_pct": 71.5, "gpu_util_max_pct": 99.0, "peak_gpu_mb": 7600.0}),
        row("W2", "floor", cfg, floor, 900.0, 800.0, "cuda",
            {"gpu_util_pct": float("nan"), "gpu_util_max_pct": float("nan"), "peak_gpu_mb": 1200.0}),
    ], columns=COLUMNS)
    lines = markdown(table).splitlines()
    assert lines[0].endswith("| GPU busy (%, mean / max) | peak GPU memory (MB) |")
    assert lines[1].count("---") == 14
    assert lines[2].endswith("| 0.500 | 120.0 | 3000 | 2000 | 0.5 (accuracy) | – | – | – | 72 / 99 | 7600 |")
    assert lines[3].endswith("(11.2 MFLOP/sample at 51234.5 GFLOP/s (cuda fp32)) | 0.02× | – | – | – | 1200 |")
    assert "GPU" not in markdown(table.assign(device="cpu")).splitlines()[0]  # a CPU table is as it was


def test_the_rows_so_far_are_kept_when_a_later_system_fails(tmp_path, monkeypatch):
    """bench.parquet and bench.md are written after every row: a failure (or a timeout) of a
    later measurement, as on a GPU session's scarce minutes, keeps what was measured."""
    from types import SimpleNamespace

    from raysoft.bench import runner

    def measure(label, cmd, out_json, timeout, series=False):
        if label.endswith("bare"):
            raise RuntimeError(f"{label}: exit 1: boom")
        res = {"sec_per_round_all": [2.0, 1.0], "updates": [6, 6], "quality": 0.5, "quality_metric": "accuracy",
               "total_s": 3.0}
        return res, SimpleNamespace(peak=500.0, peak_pss=400.0)

    monkeypatch.setattr(runner, "_measure", measure)
    with pytest.raises(RuntimeError, match="W2 bare: exit 1: boom"):
        runner.bench(["W2"], 2, tmp_path, True, "skip", pfl="skip")
    kept = pd.read_parquet(tmp_path / "bench.parquet")
    assert list(kept["system"]) == ["raysoft"] and kept["sec_per_round"].tolist() == [1.0]
    assert "| W2 | raysoft |" in (tmp_path / "bench.md").read_text()


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
        "raysoft bench: --workload: unknown workload 'W9' (known: W1, W2, W3, W4, W5)"
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
        (["--gpu-share", "0", "--flower", "skip"],
         "raysoft bench: --gpu-share: a GPU's share per client actor, above 0 and at most 1 (got 0)"),
        (["--device", "cuda", "--long-run"],
         "raysoft bench: --device cuda: not with --long-run (it measures raysoft on the CPU)"),
    ],
)
def test_bad_bench_arguments_are_one_line_and_exit_2(argv, line, capsys):
    try:
        code = cli_main(["bench", *argv])
    except SystemExit as exit_:  # argparse's errors
        code = exit_.code
    assert code == 2 and capsys.readouterr().err.splitlines() == [line]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: --device cuda would run")
def test_cuda_without_cuda_is_one_line_before_anything_starts(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "raysoft", "bench", "--device", "cuda", "--workload", "W2",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "raysoft bench: --device cuda: torch finds no CUDA on this machine (torch.cuda.is_available() is False); "
        "run it on a machine with an NVIDIA GPU, or use --device cpu"
    ]
    assert not out.exists()  # nothing ran, nothing was written


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


@pytest.mark.slow
def test_w5_runs_small_on_the_cpu(tmp_path):
    """W5 at its quick size (200 clients, 10 a round): raysoft, the bare loop and the floor run;
    on the CPU the GPU columns are empty and the table has none."""
    out = tmp_path / "bench"
    write_learnable_fmnist(tmp_path / "fmnist")
    env = {**os.environ, "RAYSOFT_DATA": str(tmp_path / "fmnist")}
    proc = subprocess.run([sys.executable, "-m", "raysoft", "bench", "--workload", "W5", "--quick", "--rounds", "2",
                           "--flower", "skip", "--pfl", "skip", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pd.read_parquet(out / "bench.parquet")
    assert list(table.columns) == COLUMNS
    assert list(table["system"]) == ["raysoft", "bare", "floor"] and set(table["workload"]) == {"W5"}
    assert (table["clients"] == 200).all() and (table["updates_per_round"] == 10).all()
    assert (table["device"] == "cpu").all() and table[["gpu_util_pct", "peak_gpu_mb"]].isna().all().all()
    w5 = table.set_index("system")
    assert (w5["sec_per_round"] > 0).all() and w5.loc["floor", "sec_per_round"] < w5.loc["bare", "sec_per_round"]
    assert abs(w5.loc["raysoft", "quality"] - w5.loc["bare", "quality"]) < 0.02  # the same FedAvg
    assert (table["quality_metric"].iloc[:2] == "accuracy").all()
    assert "GPU" not in (out / "bench.md").read_text()
