"""raysoft sweep: a grid of tiny runs as Ray Tune trials, their table, resuming, and bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from support.configs import small_config

import raysoft
from raysoft.config import ConfigError
from raysoft.sweep import bundles, load_spec, sweep, trial_config, trial_points

BASE = small_config(algorithm={"rounds": 2, "eval_every": 1}, data={"clients": 4}, train={"local_epochs": 1})
BASE["algorithm"]["clients_per_round"] = 2


def write_sweep(tmp_path, **extra) -> str:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    spec = {"config": "base.yaml", "grid": {"algorithm.prox_weight": [0.1, 1.0], "seed": [0, 1]}, **extra}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_the_grid_and_each_trial_config(tmp_path):
    spec, base = load_spec(write_sweep(tmp_path, trial={"actors": 2}))
    points = trial_points(spec)
    assert points == [{"algorithm.prox_weight": 0.1, "seed": 0}, {"algorithm.prox_weight": 0.1, "seed": 1},
                      {"algorithm.prox_weight": 1.0, "seed": 0}, {"algorithm.prox_weight": 1.0, "seed": 1}]
    cfg = trial_config(base, points[3], actors=2)
    assert (cfg.seed, cfg.algorithm.prox_weight) == (1, 1.0)
    assert (cfg.ray.backend, cfg.ray.placement, cfg.ray.clients_per_actor) == ("ray", "trial", 2)
    assert bundles(cfg, 2) == [{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}]


@pytest.mark.parametrize("spec, message", [
    ({"config": "base.yaml", "grid": {"algorithm.prox_weight": [-1.0]}}, "algorithm.prox_weight"),
    ({"config": "base.yaml", "grid": {"seed": []}}, "grid must give at least one value"),
    ({"config": "base.yaml", "grid": {"seed": [0]}, "bogus": 1}, "bogus: unknown key"),
    ({"config": "missing.yaml", "grid": {"seed": [0]}}, "not found"),
])
def test_bad_sweeps_are_refused_before_ray_starts(tmp_path, spec, message):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=message):
        sweep(tmp_path / "s.yaml", out=tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.slow
def test_a_run_outside_a_trial_cannot_ask_for_the_trials_bundles(tmp_path):
    cfg = small_config(ray={"backend": "ray", "placement": "trial"})
    with pytest.raises(ConfigError, match="ray.placement: trial"):
        raysoft.run(cfg, out=tmp_path)


@pytest.mark.slow
def test_a_two_by_two_sweep_runs_four_trials_and_writes_its_table(tmp_path, ray_session, capsys):
    path = sweep(write_sweep(tmp_path), out=tmp_path / "out")
    table = pd.read_parquet(path / "sweep.parquet")
    # it says how far it is while the trials run (it was silent), and writes a table like compare's
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sweep: ")]
    assert said[0] == "sweep: 0 of 4 trials done, 0 running, 4 left"
    assert said[-1].startswith("sweep: 4 of 4 trials done, 0 running, 0 left; best so far: trial ")
    assert table["best_center.mse"].notna().all()
    assert (path / "sweep.md").read_text().startswith("# Sweep: 4 trials")
    assert list(table.trial) == [0, 1, 2, 3]
    assert list(table["grid.seed"]) == [0, 1, 0, 1]
    assert list(table["grid.algorithm.prox_weight"]) == [0.1, 0.1, 1.0, 1.0]
    assert table["rounds"].tolist() == [2, 2, 2, 2]
    assert any(c.startswith("final.mse.c0.d") for c in table.columns)
    for row in table.itertuples():
        summary = json.loads((path / "runs" / f"trial-{row.trial:03d}" / "summary.json").read_text())
        assert summary["weight_mae"] == pytest.approx(row.weight_mae)
    # a trial is the same run as a plain one with the same config: the seed decides, not the sweep
    alone = raysoft.run(small_config(**{**BASE, "seed": 1, "algorithm": {**BASE["algorithm"], "prox_weight": 1.0}}),
                        out=tmp_path / "alone")
    assert alone.summary["weight_mae"] == pytest.approx(table.weight_mae[3], rel=0, abs=0)
    # a finished sweep is not resumed; a sweep without its table is, reusing the finished runs
    with pytest.raises(ConfigError, match="already complete"):
        sweep(resume=path)
    (path / "sweep.parquet").unlink()
    before = (path / "runs" / "trial-002" / "summary.json").stat().st_mtime_ns
    sweep(resume=path)
    assert (path / "runs" / "trial-002" / "summary.json").stat().st_mtime_ns == before
    assert pd.read_parquet(path / "sweep.parquet").equals(table)


def test_a_trial_reservation_the_cluster_can_never_hold_is_refused_in_one_line():
    from raysoft.backends.plan import Cluster
    from raysoft.sweep import fits

    two = Cluster(({"CPU": 2.0},), name="the local Ray")
    assert fits([{"CPU": 1.0}, {"CPU": 1.0}], two) is None
    why = fits([{"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}], two)
    assert "a trial reserves 3 CPUs" in why and "the local Ray (2 CPUs, no GPU)" in why and "\n" not in why
    # every bundle on one node: two 1-CPU nodes cannot hold a 2-CPU actor bundle
    assert fits([{"CPU": 1.0}, {"CPU": 2.0}], Cluster(({"CPU": 2.0}, {"CPU": 1.0}))) is None
    assert fits([{"CPU": 2.0}, {"CPU": 2.0}], Cluster(({"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 1.0}))) is not None
    assert "and 1 GPUs" in fits([{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}], two)
    # fractions of a GPU within one GPU, as Ray hands them out
    gpu = Cluster(({"CPU": 8.0, "GPU": 1.0},))
    assert fits([{"CPU": 1.0}] + [{"CPU": 1.0, "GPU": 0.25}] * 4, gpu) is None
    assert fits([{"CPU": 1.0}] + [{"CPU": 1.0, "GPU": 0.25}] * 5, gpu) is not None
    two_gpus = Cluster(({"CPU": 8.0, "GPU": 2.0},))  # 0.4 GPU: two per GPU, never one across two GPUs
    assert fits([{"CPU": 1.0}] + [{"CPU": 1.0, "GPU": 0.4}] * 4, two_gpus) is None
    assert fits([{"CPU": 1.0}] + [{"CPU": 1.0, "GPU": 0.4}] * 5, two_gpus) is not None


def test_a_sweep_too_big_for_the_local_ray_is_refused_before_it_starts(tmp_path, capsys):
    from raysoft.cli import main

    path = write_sweep(tmp_path, trial={"actors": 3}, set=["ray.num_cpus=2"])
    assert main(["sweep", path, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "a trial reserves 4 CPUs" in err[0]


def test_a_grid_that_switches_the_algorithm_says_what_it_dropped_once(tmp_path, capsys):
    """Six trials switch FedSoft to FedAvg in three of them: FedSoft's own keys are dropped from
    those, said in one line, not one per trial."""
    from raysoft.cli import main

    path = write_sweep(tmp_path, trial={"actors": 3}, set=["ray.num_cpus=2", "algorithm.sigma=0.001"])
    spec = yaml.safe_load(open(path))
    spec["grid"] = {"algorithm.name": ["fedsoft", "fedavg"], "seed": [0, 1, 2]}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", path, "--out", str(tmp_path / "out")]) == 2  # refused after every config's check
    err = capsys.readouterr().err.splitlines()
    dropped = [line for line in err if "dropped" in line]
    assert len(dropped) == 1 and dropped[0].startswith('algorithm.name="fedavg": dropped fedsoft\'s keys'), err
    assert "a trial reserves 4 CPUs" in err[-1]


GROW_SCRIPT = r"""
import os, sys
os.environ["RAY_AUTH_MODE"] = "token"
import ray
from ray.cluster_utils import Cluster
from raysoft.errors import RaysoftError, exit_code
from raysoft.sweep import sweep

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
try:
    sweep(sys.argv[1], out=sys.argv[2], address=cluster.address)
    print("finished")
except RaysoftError as err:
    print(exit_code(err), err)
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.slow
def test_trials_waiting_for_a_cluster_that_does_not_grow_give_up_after_the_deadline(tmp_path):
    # a cluster raysoft did not start may grow (an autoscaler), so a trial it cannot hold yet is
    # not refused at once: Tune waits for it, at most ray.placement_timeout_s with no trial running
    # (before: for ever)
    import subprocess
    import sys

    path = write_sweep(tmp_path, trial={"actors": 3}, set=["ray.placement_timeout_s=5"])
    proc = subprocess.run([sys.executable, "-c", GROW_SCRIPT, path, str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=600)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("1 sweep: no trial could start for 5 s (ray.placement_timeout_s): the cluster (2 CPUs"), \
        proc.stdout + proc.stderr[-2000:]
    assert "has no room for a trial's 4 CPUs and did not grow; `raysoft sweep --resume " in last


@pytest.mark.slow
def test_ctrl_c_stops_a_sweep_with_exit_130_one_resume_line_and_keeps_its_trials(tmp_path):
    # (Tune stops a running trial within about 5 s; trial 1 needs far longer to finish)
    # a sweep stopped with Ctrl-C printed Tune's Tuner.restore(...) line, then "its error is in .../tune" though
    # nothing failed, and exited 1; its resume deleted the checkpointed trial and started it again
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(small_config(
        algorithm={"eval_every": 50}, train={"local_epochs": 2},
        ray={"num_cpus": 2}, output={"checkpoint_every": 5})))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(
        {"config": "base.yaml", "grid": {"algorithm.rounds": [2, 600, 2]}, "trial": {"max_concurrent": 1}}))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "raysoft", "sweep", str(tmp_path / "sweep.yaml"), "--out",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and not list(out.glob("*/runs/trial-001/checkpoint.pt")):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground process group
    stdout, stderr = proc.communicate(timeout=120)
    sweep_dir = next(out.iterdir())
    runs = sweep_dir / "runs"
    assert proc.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert lines[-1] == (f"raysoft: sweep stopped by SIGINT; 1 of 3 trials finished, 1 checkpointed, kept in {runs}; "
                         f"continue with: raysoft sweep --resume {sweep_dir}"), stderr
    for chatter in ("Tuner.restore", "its error is in", "TensorboardX", "Stop signal received"):
        assert chatter not in stderr
    assert stdout == ""  # no Tune table
    assert (runs / "trial-000" / "summary.json").is_file()
    assert (runs / "trial-001" / "checkpoint.pt").is_file() and not (runs / "trial-001" / "summary.json").exists()
    run_id = pd.read_parquet(runs / "trial-001" / "metrics.parquet").run_id.unique().tolist()
    first = (runs / "trial-000" / "summary.json").stat().st_mtime_ns
    # resumed: the checkpointed trial continues its own run (a new run would have a run id of its own), the finished
    # one is left alone
    done = subprocess.run([sys.executable, "-m", "raysoft", "sweep", "--resume", str(sweep_dir)], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("sweep: resuming")]
    assert len(said) == 1 and said[0].startswith(f"sweep: resuming {sweep_dir}: 1 of 3 trials finished; trial 1 "
                                                 f"from round "), done.stderr
    assert said[0].endswith(" of 600 (its last checkpoint); trial 2 from the start")
    assert (runs / "trial-000" / "summary.json").stat().st_mtime_ns == first
    assert pd.read_parquet(runs / "trial-001" / "metrics.parquet").run_id.unique().tolist() == run_id
    assert len(run_id) == 1 and pd.read_parquet(sweep_dir / "sweep.parquet").trial.tolist() == [0, 1, 2]


@pytest.mark.slow
def test_a_failed_trial_keeps_the_finished_and_checkpointed_trials_and_resume_continues_it(tmp_path):
    # issue #45: no command deletes a finished or checkpointed run; a sweep's resume deleted the checkpointed
    # trial and started it again
    import subprocess
    import sys

    (tmp_path / "base.yaml").write_text(yaml.safe_dump(small_config(
        algorithm={"clients_per_round": 10}, ray={"num_cpus": 2}, output={"checkpoint_every": 2})))
    fault = [{"kind": "nan_update", "at_round": 3, "client": 0}]  # train.nan_policy: stop
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(
        {"config": "base.yaml", "grid": {"faults": [[], fault]}, "trial": {"max_concurrent": 1}}))
    out = tmp_path / "out"
    ran = subprocess.run([sys.executable, "-m", "raysoft", "sweep", str(tmp_path / "sweep.yaml"), "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    sweep_dir = next(out.iterdir())
    runs = sweep_dir / "runs"
    assert ran.returncode == 1, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("raysoft: run stopped: sweep: trial 1 did not finish (1 of 2)"), ran.stderr
    assert last.endswith(f"`raysoft sweep --resume {sweep_dir}` runs the unfinished trials again")
    assert "Tuner.restore" not in ran.stderr and "TensorboardX" not in ran.stderr
    assert (runs / "trial-000" / "summary.json").is_file()
    assert (runs / "trial-001" / "checkpoint.pt").is_file() and not (runs / "trial-001" / "summary.json").exists()
    run_id = pd.read_parquet(runs / "trial-001" / "metrics.parquet").run_id.unique().tolist()
    again = subprocess.run([sys.executable, "-m", "raysoft", "sweep", "--resume", str(sweep_dir)], capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 1  # the same fault, again at round 3: continued from its checkpoint, not redone
    assert f"sweep: resuming {sweep_dir}: 1 of 2 trials finished; trial 1 from round 2 of 4 (its last checkpoint)" \
        in again.stderr.splitlines(), again.stderr
    assert (runs / "trial-001" / "checkpoint.pt").is_file()
    assert pd.read_parquet(runs / "trial-001" / "metrics.parquet").run_id.unique().tolist() == run_id
