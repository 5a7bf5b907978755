"""raysoft bench --long-run: samples tagged with rounds, the growth measure, and a short run
whose memory must stay flat."""

import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
from support.paths import ROOT

from raysoft.bench.floor import floor_of_run
from raysoft.bench.longrun import PROCESS_COLUMNS, growth, role_growth, tag_rounds
from raysoft.bench.memory import tree_processes
from raysoft.bench.workloads import workload_config


def test_samples_are_tagged_with_the_round_reached_and_the_shutdown_with_minus_one():
    samples = [(10.0, 1, 5), (10.5, 1, 6), (11.2, 1, 7), (12.0, 1, 8), (13.5, 1, 9)]
    marks = [(10.4, 1), (11.2, 2), (12.9, 3)]
    tagged = tag_rounds(samples, marks)
    assert [t[1] for t in tagged] == [0, 1, 2, 2, -1]
    assert [t[0] for t in tagged] == pytest.approx([0.0, 0.5, 1.2, 2.0, 3.5])
    assert [t[3] for t in tagged] == [5, 6, 7, 8, 9]


def test_growth_compares_the_last_tenth_with_the_tenth_after_the_warm_up():
    rounds = np.arange(0, 100)
    flat = np.full(100, 1000.0)
    flat[:10] = 5000.0  # the warm-up's spike does not count
    assert growth(rounds, flat, 100) == (1000.0, 0.0, 1000.0)
    leak = 1000.0 + 10.0 * rounds  # 10 MB a round
    start, grew, end = growth(rounds, leak, 100)
    assert (start, end) == (1190.0, 1990.0) and grew == pytest.approx(1990 / 1190 - 1)
    with pytest.raises(ValueError, match="too few samples"):
        growth(np.array([0, 1]), np.array([1.0, 2.0]), 100)
    # a stream's warm-up until every client has joined (here round 37): the window after it is
    # rounds 37-46, whose peak is 1460
    assert growth(rounds, leak, 100, warmup=37) == (1460.0, pytest.approx(1990 / 1460 - 1), 1990.0)
    assert growth(rounds, leak, 100, warmup=5)[0] == 1190.0  # never shorter than 10% of the rounds


def test_a_growth_is_attributed_to_the_role_whose_processes_grow():
    """Two actors that leak 1 MB a round each and a flat driver: the actors' role grows from
    2 x 119 to 2 x 199 MB, the driver by 0; a role gone after the warm-up is left out."""
    rows = []
    for r in range(100):
        rows.append(("W3", float(r), r, 1, "driver", 500.0))
        rows += [("W3", float(r), r, pid, "ray::ClientActor", 100.0 + r) for pid in (2, 3)]
        if r < 10:
            rows.append(("W3", float(r), r, 4, "ray::IDLE", 50.0))
    procs = pd.DataFrame(rows, columns=PROCESS_COLUMNS)
    got = role_growth("W3", procs, 100)
    assert [(g["role"], g["processes"]) for g in got] == [("driver", 1), ("ray::ClientActor", 2)]
    assert (got[0]["pss_after_warmup_mb"], got[0]["growth"]) == (500.0, 0.0)
    assert (got[1]["pss_after_warmup_mb"], got[1]["pss_end_mb"]) == (238.0, 398.0)
    assert got[1]["growth"] == pytest.approx(398 / 238 - 1)


def test_processes_are_named_by_ray_title_script_module_or_program(tmp_path):
    script = tmp_path / "worker_script.py"
    script.write_text("import time\ntime.sleep(30)\n")
    nap = "import time; time.sleep(30)"
    procs = [subprocess.Popen(["bash", "-c", 'exec -a "ray::ClientActor.train_step" sleep 30']),
             subprocess.Popen([sys.executable, str(script)]),
             subprocess.Popen([sys.executable, "-m", "timeit", "-n", "1", nap]),
             subprocess.Popen(["sleep", "30"])]
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            found = {pid: name for pid, name, _, _ in tree_processes(os.getpid())}
            if len(found) == 5 and "bash" not in found.values() and "python3" not in found.values():
                break
            time.sleep(0.1)
        assert found[os.getpid()] == "driver"
        assert [found.get(p.pid) for p in procs] == ["ray::ClientActor", "worker_script.py", "timeit", "sleep"]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_floor_of_a_run_prices_training_per_epoch_and_estimation_per_center(monkeypatch):
    """W4-FedSoft's floor: a train op's samples times the epochs times a training step's FLOP,
    FedSoft's estimate times the centers times a forward pass, anything else one forward pass."""
    import raysoft.bench.floor as floor

    monkeypatch.setattr(floor, "flop_per_sample", lambda cfg: 3e6)
    monkeypatch.setattr(floor, "forward_flop_per_sample", lambda cfg: 1e6)
    monkeypatch.setattr(floor, "matmul_gflops", lambda: 100.0)
    raw = workload_config("W4:fedsoft", 4, quick=True)
    raw["train"] = {**raw["train"], "local_epochs": 2}
    run = {"work_all": [{"train": 1000, "estimate": 500}, {"train": 2000, "evaluate": 300, "holdout": 100}],
           "updates": [6, 6]}
    res = floor_of_run("W4", raw, run)
    # (1000*2*3e6 + 500*2 centers*1e6) / 1e9 / 100 = 0.07; (2000*2*3e6 + 400*1e6) / 1e11 = 0.124
    assert res["sec_per_round_all"] == pytest.approx([0.07, 0.124])
    w3 = floor_of_run("W3", workload_config("W3", 2, quick=True), {"work_all": [{"train": 1000, "forward": 500}],
                                                                     "updates": [8]})
    assert w3["sec_per_round_all"] == pytest.approx([(1000 * 3e6 + 500 * 1e6) / 1e11])  # a stream counts epochs itself


@pytest.mark.slow
def test_a_short_long_run_writes_its_memory_and_stays_flat(tmp_path):
    out = tmp_path / "long"
    proc = subprocess.run([sys.executable, "-m", "raysoft", "bench", "--long-run", "--quick", "--workload", "W1",
                           "--rounds", "20", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out.resolve())
    table = pd.read_parquet(out / "memory.parquet")
    assert list(table.columns) == ["workload", "elapsed_s", "round", "rss_mb", "pss_mb"]
    assert table["round"].max() >= 1 and table["round"].min() == -1  # samples during the rounds and the shut-down
    assert (out / "memory.png").stat().st_size > 0
    procs = pd.read_parquet(out / "processes.parquet")
    assert list(procs.columns) == ["workload", "elapsed_s", "round", "pid", "role", "pss_mb"]
    roles = set(procs.role)
    assert {"driver", "ray::CoordinatorActor", "ray::ClientActor", "raylet"} <= roles, roles
    # the per-process rows add up to the tree's samples
    summed = procs.groupby("elapsed_s").pss_mb.sum()
    assert np.allclose(summed.to_numpy(), table.set_index("elapsed_s").loc[summed.index, "pss_mb"].to_numpy())
    assert "| W1 | ray::ClientActor |" in (out / "memory.md").read_text()
    row = [ln for ln in (out / "memory.md").read_text().splitlines() if ln.startswith("| W1 |")][0]
    assert row.split("|")[3].strip() == "2"  # the warm-up: 10% of 20 rounds
    grew = float(row.split("|")[6].strip().rstrip("%")) / 100
    assert grew <= 0.05, row


def _first_upload_of_all(raw: dict) -> int:
    """From the stream's clock alone: client m ticks at join_m + the sum of its exponential gaps
    (rate drawn once per client), every tick an upload; the upload at which the last client
    makes its first."""
    from raysoft.config import parse_config
    from raysoft.rng import numpy_rng

    cfg = parse_config(raw)
    lo, hi = cfg.algorithm.upload_rate
    ticks = []
    for m in range(cfg.data.clients):
        rate, t = numpy_rng(cfg.seed, "clock-rate", m).uniform(lo, hi), 0.0
        for c in range(100):
            t += numpy_rng(cfg.seed, "clock", m, c).exponential(1.0 / rate)
            ticks.append((t, m))
    seen: set[int] = set()
    for i, (_, m) in enumerate(sorted(ticks)):
        seen.add(m)
        if len(seen) == cfg.data.clients:
            return i + 1
    raise AssertionError("some client never uploads")


@pytest.mark.slow
def test_a_streams_warm_up_ends_when_every_client_has_uploaded(monkeypatch):
    from raysoft.bench.worker import run_raysoft

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    raw = workload_config("W3", 4, quick=True)  # 8 clients, 32 uploads
    raw["ray"] = {**raw.get("ray", {}), "backend": "inprocess"}
    assert raw["algorithm"].get("upload_policy", "clock") == "clock" and not raw["data"].get("join_schedule")
    res = run_raysoft("W3", raw)
    assert res["joined"] == _first_upload_of_all(raw) == 29


def test_long_run_refuses_too_few_rounds(capsys):
    from raysoft.cli import main

    assert main(["bench", "--long-run", "--workload", "W1", "--rounds", "5"]) == 2
    assert "at least 20 rounds" in capsys.readouterr().err


def test_a_streams_rounds_group_steps_until_n_uploads():
    from raysoft.bench.worker import stream_rounds

    marks = [(0.0, 0), (2.0, 30), (3.0, 80), (7.0, 100), (9.0, 200), (10.0, 210)]
    work = [{}, {"train": 30}, {"train": 50}, {"train": 20}, {"train": 100}, {"train": 10}]
    times, done = stream_rounds(marks, work, 80)
    # steps 1-2: 80 uploads in 3 s; steps 3-4: 120 uploads in 6 s -> 4 s per 80; step 5: 10 in 1 s -> 8 s per 80
    assert times == pytest.approx([3.0, 4.0, 8.0])
    assert [d["train"] for d in done] == pytest.approx([80.0, 80.0, 80.0])


def test_a_floor_row_is_compared_with_raysoft_of_its_own_algorithm():
    from raysoft.bench import markdown

    rows = [{"workload": "W4", "system": s, "algorithm": a, "clients": 1000, "sec_per_round": sec, "updates_per_s": 1.0,
             "peak_rss_mb": 1.0, "peak_pss_mb": 1.0, "quality": float("nan"), "quality_metric": "-"}
            for s, a, sec in (("raysoft", "fedsoft", 80.0), ("floor", "fedsoft", 40.0), ("raysoft", "fedavg", 10.0),
                              ("floor", "fedavg", 5.0))]
    floors = [ln for ln in markdown(pd.DataFrame(rows)).splitlines() if "| floor |" in ln]
    assert all("| 0.50× |" in ln for ln in floors), floors


def test_a_floor_rows_matrix_rate_is_the_median_of_its_measurements(monkeypatch):
    """One slow or fast measurement of the matrix rate does not move the floor: the median of
    seven (80, 150, 120, 60, 130, 125, 118 -> 120), and a bad count is refused."""
    import raysoft.bench.floor as floor

    rates = iter([80.0, 150.0, 120.0, 60.0, 130.0, 125.0, 118.0])
    monkeypatch.setattr(floor, "matmul_gflops", lambda: next(rates))
    assert floor.matrix_rate() == 120.0
    with pytest.raises(ValueError, match="at least one measurement"):
        floor.matrix_rate(0)


def _double(x: int) -> int:
    return 2 * x


def _fail() -> None:
    raise ValueError("no such thing")


def _sleep() -> None:
    time.sleep(60)


@pytest.mark.slow
def test_a_call_in_a_fresh_process_returns_its_value_its_error_or_times_out():
    from raysoft.bench.worker import call_in_fresh_process

    assert call_in_fresh_process(_double, 21, timeout=120) == 42
    with pytest.raises(RuntimeError, match="ValueError: no such thing"):
        call_in_fresh_process(_fail, timeout=120)
    with pytest.raises(TimeoutError, match="_sleep did not answer within 1 s"):
        call_in_fresh_process(_sleep, timeout=1)
