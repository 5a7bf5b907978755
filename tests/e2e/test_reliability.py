"""Checkpoint and resume (also after kill -9 of the driver), client-actor failures, and
non-finite client updates."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from support.configs import small_config
from support.runs import assert_same as _assert_same

import raysoft
from raysoft.errors import UpdateError


def _cfg(**sections):
    base = dict(algorithm={"rounds": 8, "eval_every": 2}, data={"clients": 10})
    for k, v in sections.items():
        base.setdefault(k, {}).update(v) if isinstance(v, dict) else base.__setitem__(k, v)
    return small_config(**base)




@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return raysoft.run(_cfg(), out=tmp_path_factory.mktemp("clean")).run_dir


def test_checkpoints_write_results_so_far_and_do_not_change_them(tmp_path, clean):
    r = raysoft.run(_cfg(output={"checkpoint_every": 3}), out=tmp_path)
    _assert_same(r.run_dir, clean)
    ckpt = torch.load(r.run_dir / "checkpoint.pt", weights_only=False)
    assert ckpt["round"] == 6 and set(ckpt["clients"]) == set(range(10))
    ev = pd.read_parquet(r.run_dir / "events.parquet")
    assert ev[ev.kind == "checkpoint"].step.tolist() == [3, 6]


def test_a_checkpoint_on_disk_always_has_its_rounds_rows_beside_it(tmp_path, monkeypatch):
    """The tables are written before the checkpoint: a process that dies between the two writes
    (here: the checkpoint's write fails) leaves tables at least as far as the checkpoint."""
    import raysoft.runtime.checkpoint as checkpoint

    saved = []

    def save_then_fail(blob, path):
        metrics = pd.read_parquet(path.parent / "metrics.parquet")
        saved.append((blob["round"], int(metrics.step.max())))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", save_then_fail)
    with pytest.raises(OSError, match="No space left"):
        raysoft.run(_cfg(output={"checkpoint_every": 4}), out=tmp_path)
    assert saved == [(4, 4)]  # round 4's evaluation is in the tables when its checkpoint is written


def _running_past(tmp_path, cfg, past: int, within_s: float):
    """``raysoft run`` of ``cfg`` in a subprocess, once it has checkpointed past round ``past``:
    (the process, still running; its run directory)."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "raysoft", "run", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + within_s
    while time.time() < deadline:
        dirs = list(out.glob("*/checkpoint.pt")) if out.exists() else []
        if dirs and torch.load(dirs[0], weights_only=False)["round"] >= past:
            assert proc.poll() is None, "the run finished before it could be killed"
            return proc, dirs[0].parent
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint past round {past} within {within_s} s")


@pytest.mark.slow
def test_resume_after_kill_minus_9_of_the_driver_equals_an_uninterrupted_run(tmp_path):
    cfg = _cfg(algorithm={"rounds": 30, "eval_every": 5, "clients_per_round": 8},
               data={"clients": 20, "samples_min": 100, "samples_max": 150},
               train={"local_epochs": 10}, output={"checkpoint_every": 2, "progress": "lines"})
    clean = raysoft.run({**cfg, "output": {"progress": "none"}}, out=tmp_path / "clean").run_dir
    proc, run_dir = _running_past(tmp_path, cfg, 6, within_s=120)
    os.kill(proc.pid, signal.SIGKILL)  # the driver
    proc.wait()
    # what the killed run left is readable: results up to its last checkpoint, no summary
    partial = pd.read_parquet(run_dir / "metrics.parquet")
    assert 0 < partial.step.max() < 30 and not (run_dir / "summary.json").exists()
    done = subprocess.run([sys.executable, "-m", "raysoft", "run", "--resume", str(run_dir), "--progress", "none"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(run_dir)
    _assert_same(run_dir, clean)
    assert pd.read_parquet(run_dir / "metrics.parquet").run_id.nunique() == 1


@pytest.mark.slow
def test_a_killed_coordinator_ends_the_run_in_one_line_and_it_resumes_to_the_same_numbers(tmp_path):
    import psutil

    cfg = _cfg(algorithm={"rounds": 30, "eval_every": 5, "clients_per_round": 8},
               data={"clients": 20, "samples_min": 100, "samples_max": 150}, train={"local_epochs": 10},
               ray={"backend": "ray", "num_cpus": 2, "clients_per_actor": 10, "num_cpus_per_actor": 0.5},
               output={"checkpoint_every": 2, "progress": "none"})
    clean = raysoft.run({**cfg, "ray": {"backend": "inprocess"}}, out=tmp_path / "clean").run_dir
    proc, run_dir = _running_past(tmp_path, cfg, 6, within_s=300)  # then kill -9 the coordinator actor
    coordinators = [p for p in psutil.Process(proc.pid).children(recursive=True)
                    if "CoordinatorActor" in " ".join(p.cmdline())]
    assert len(coordinators) == 1
    coordinators[0].kill()
    _, err = proc.communicate(timeout=300)
    lines = err.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, err
    assert lines[0].startswith("raysoft: run stopped: the coordinator actor died during 'advance'") and \
        f"continue with: raysoft run --resume {run_dir}" in lines[0], lines[0]
    done = subprocess.run([sys.executable, "-m", "raysoft", "run", "--resume", str(run_dir), "--progress", "none"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    _assert_same(run_dir, clean)


def test_resume_refuses_complete_and_foreign_directories(tmp_path, clean):
    with pytest.raises(raysoft.ConfigError, match="already complete"):
        raysoft.resume(clean)
    with pytest.raises(raysoft.ConfigError, match="not a run directory"):
        raysoft.resume(tmp_path)


@pytest.mark.parametrize("checkpoint_every", [0, 3])
def test_in_process_host_failure_recovers_with_identical_metrics(tmp_path, clean, checkpoint_every):
    cfg = _cfg(faults=[{"kind": "kill_actor", "at_round": 5}], output={"checkpoint_every": checkpoint_every})
    r = raysoft.run(cfg, out=tmp_path)
    _assert_same(r.run_dir, clean)
    ev = pd.read_parquet(r.run_dir / "events.parquet")
    assert {"fault_injected", "actor_died", "restored"} <= set(ev.kind)
    assert r.summary["events"] == {"actor_died": 1, "fault_injected": 1, "restored": 1}  # what it survived
    restored = ev[ev.kind == "restored"].detail.iloc[0]
    assert restored == f"continuing from round {3 if checkpoint_every else 0}"


@pytest.mark.slow
@pytest.mark.ray
def test_killed_client_actor_is_restarted_and_the_run_matches_a_clean_one(ray_session, tmp_path, clean, capsys):
    cfg = _cfg(ray={"backend": "ray", "clients_per_actor": 5, "num_cpus_per_actor": 0.5},
               faults=[{"kind": "kill_actor", "at_round": 4, "actor": 1}],
               output={"checkpoint_every": 2, "progress": "lines"})
    r = raysoft.run(cfg, out=tmp_path)
    _assert_same(r.run_dir, clean)
    ev = pd.read_parquet(r.run_dir / "events.parquet")
    died = ev[ev.kind == "actor_died"]
    assert len(died) == 1 and died.step.iloc[0] == 4
    # said on the driver's stderr as it happened (the coordinator actor's own log never reaches it)
    said = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("fedsoft round 0/")
            and "/8" not in line]
    assert said[:3] == ["fedsoft round 4: fault_injected: kill actor 1", said[1], "fedsoft round 4: restored: "
                        "continuing from round 4"] and said[1].startswith("fedsoft round 4: actor_died: ")


@pytest.mark.slow
@pytest.mark.ray
def test_a_hung_client_actor_is_killed_at_its_deadline_and_the_run_matches_a_clean_one(ray_session, tmp_path, clean):
    # alive and silent (before: the round waited forever); after ray.call_timeout_s its first call
    # of the round (FedSoft's estimate) gives up, and the actor is killed,
    # restarted and the run restored from its checkpoint, as for a dead actor
    cfg = _cfg(ray={"backend": "ray", "clients_per_actor": 5, "num_cpus_per_actor": 0.5, "call_timeout_s": 5},
               faults=[{"kind": "hang_actor", "at_round": 4, "actor": 1, "factor": 1e6}],
               output={"checkpoint_every": 2})
    r = raysoft.run(cfg, out=tmp_path)
    _assert_same(r.run_dir, clean)
    ev = pd.read_parquet(r.run_dir / "events.parquet")
    died = ev[ev.kind == "actor_died"].detail.tolist()
    assert died == ["client actor 1 did not answer 'estimate' within 5 s (ray.call_timeout_s): killed as hung"]
    assert r.summary["events"] == {"actor_died": 1, "fault_injected": 1, "restored": 1}


@pytest.mark.slow
@pytest.mark.ray
def test_a_chaos_run_of_random_client_actor_kills_matches_a_clean_run(ray_session, tmp_path):
    """Client actors' processes killed with SIGKILL at random moments (inside a round's
    training, a sum, an evaluation, a checkpoint or a recovery itself): every kill is survived
    and the metrics are those of an uninterrupted run, to the bit."""
    import random
    import threading

    import psutil

    cfg = _cfg(algorithm={"rounds": 40, "eval_every": 4, "clients_per_round": 12},
               data={"clients": 20, "samples_min": 100, "samples_max": 150}, train={"local_epochs": 5},
               output={"checkpoint_every": 1})
    clean = raysoft.run(cfg, out=tmp_path / "clean")
    kills: list[str] = []
    stop = threading.Event()

    def actors(doing: str = "") -> list:
        return [p for p in psutil.process_iter(["cmdline"])
                if f"ray::ClientActor{doing}" in " ".join(p.info["cmdline"] or [])]

    def chaos():
        rng = random.Random(0)
        while not stop.is_set() and not actors(".start"):  # one kill while the clients are built
            stop.wait(0.2)
        if not stop.is_set():
            rng.choice(actors(".start")).kill()
            kills.append("start")
        while not stop.is_set() and not list((tmp_path / "chaos").glob("*/checkpoint.pt")):
            stop.wait(0.2)
        while not stop.is_set() and len(kills) < 7:  # then at random moments of the rounds
            stop.wait(rng.uniform(0.5, 3.0))
            found = actors()
            if found and not stop.is_set():
                victim = rng.choice(found)
                kills.append(" ".join(victim.info["cmdline"] or []).split(".")[-1].strip())
                victim.kill()

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        hit = raysoft.run({**cfg, "ray": {"backend": "ray", "clients_per_actor": 5, "num_cpus_per_actor": 0.5}},
                          out=tmp_path / "chaos")
    finally:
        stop.set()
        thread.join()
    assert kills[0] == "start" and len(kills) >= 4, kills
    ev = pd.read_parquet(hit.run_dir / "events.parquet")
    # kills during a recovery are survived by the recovery's next attempt: fewer restores than kills
    assert (ev.kind == "actor_died").sum() >= 2 and (ev.kind == "restored").sum() >= 1, (kills, hit.summary["events"])
    _assert_same(hit.run_dir, clean.run_dir)


def test_deadlines_derive_from_the_waits_measured():
    from raysoft.backends.deadlines import FIRST_S, FLOOR_S, Deadlines

    d = Deadlines()
    assert d.limit("train") == FIRST_S  # nothing measured yet
    d.measured("train", 12.0)
    d.measured("train", 50.0)
    d.measured("train", 3.0)
    assert d.limit("train") == 500.0 and d.limit("sum") == FIRST_S  # 10 x the longest, per kind
    d.measured("sum", 0.2)
    assert d.limit("sum") == FLOOR_S
    fixed = Deadlines(7.0)
    assert fixed.limit("train") == 7.0 and fixed.limit("start") == FIRST_S
    assert fixed.say("train") == "7 s (ray.call_timeout_s)"


def test_a_hang_needs_an_actor():
    with pytest.raises(raysoft.ConfigError, match="hang_actor needs ray.backend: ray"):
        raysoft.run(_cfg(faults=[{"kind": "hang_actor", "at_round": 1}]), out="unused")


def test_nan_update_is_excluded_and_reported(tmp_path):
    cfg = _cfg(faults=[{"kind": "nan_update", "at_round": 2, "client": 3}], train={"nan_policy": "exclude"},
               algorithm={"clients_per_round": 10})  # every client trains: client 3 is selected
    r = raysoft.run(cfg, out=tmp_path)
    ev = pd.read_parquet(r.run_dir / "events.parquet")
    bad = ev[ev.kind == "nan_update"]
    assert bad[["step", "client"]].values.tolist() == [[2, 3]]
    assert np.isfinite(r.metrics.value).all()  # never averaged into a center


@pytest.mark.parametrize("values, finite", [
    ([1.0, -2.0, 3.0], True),
    ([3e38, 3e38], True),  # the sum overflows to inf, every value is finite
    ([1.0, float("nan")], False),
    ([float("inf"), -1.0], False),
    ([float("inf"), float("-inf")], False),  # the sum is NaN
])
def test_finite_check_of_updates(values, finite):
    from raysoft.runtime.executor import finite as _finite

    t = torch.tensor(values, dtype=torch.float32)
    assert _finite(t) is finite
    assert _finite(t.numpy()) is finite
    assert _finite({"model": t, "loss": [1.0]}) is finite


def test_nan_update_stops_the_run_by_default(tmp_path):
    cfg = _cfg(faults=[{"kind": "nan_update", "at_round": 1, "client": 2}], algorithm={"clients_per_round": 10})
    with pytest.raises(UpdateError, match="round 1: client 2 returned a non-finite update"):
        raysoft.run(cfg, out=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("algorithm", ["fedsoft", "fedavg"])  # FedAvg: its mean is summed in the actors
def test_round_deadline_drops_and_counts_a_stragglers_updates(ray_session, tmp_path, algorithm):
    cfg = _cfg(ray={"backend": "ray", "clients_per_actor": 5, "num_cpus_per_actor": 0.5, "round_deadline_s": 0.3},
               algorithm={"name": algorithm, "clients_per_round": 10, "rounds": 4},
               faults=[{"kind": "slow_client", "at_round": 2, "client": 7, "factor": 3000.0}])
    r = raysoft.run(cfg, out=tmp_path)
    ev = pd.read_parquet(r.run_dir / "events.parquet")
    late = ev[ev.kind == "late_update"]
    # only the straggler is late, not the other clients of its actor (5..9)
    assert late[["step", "client"]].values.tolist() == [[2, 7], [3, 7]]
    assert np.isfinite(r.metrics.value).all() and r.summary["rounds"] == 4


@pytest.mark.slow
@pytest.mark.ray
def test_a_round_with_every_client_late_on_the_clock_works_with_a_wall_clock_deadline(ray_session, tmp_path):
    # the simulated clock leaves every client out: the actors are asked for nothing (no empty max)
    from support.runs import assert_same

    clock = {"speeds": "equal", "round_deadline_s": 1e-9}
    algo = {"name": "fedavg", "rounds": 2, "clients_per_round": 10}
    r = raysoft.run(_cfg(ray={"backend": "ray", "clients_per_actor": 5, "num_cpus_per_actor": 0.5,
                              "round_deadline_s": 30.0}, algorithm=algo, clock=clock), out=tmp_path / "ray")
    ev = pd.read_parquet(r.run_dir / "events.parquet")
    assert (ev.kind == "late_update").sum() == 20 and r.summary["rounds"] == 2
    assert_same(r, raysoft.run(_cfg(algorithm=algo, clock=clock), out=tmp_path / "inprocess"))


@pytest.mark.slow
@pytest.mark.ray
def test_a_stopped_run_releases_its_client_actors_during_a_round(ray_session, tmp_path):
    """The coordinator's shutdown is not queued behind the step in progress (a straggler
    sleeping for hours here) but runs beside it, so a stopped run ends at once."""
    import ray

    from raysoft.backends.ray_backend import CoordinatorActor
    from raysoft.config import parse_config

    cfg = parse_config(_cfg(ray={"backend": "ray", "clients_per_actor": 5, "num_cpus_per_actor": 0.5},
                            faults=[{"kind": "slow_client", "at_round": 0, "client": 7, "factor": 1e7}]))
    coord = CoordinatorActor.remote()
    try:
        ray.get(coord.start.remote(cfg.to_dict(), "stop", str(tmp_path), False, [list(range(5)), list(range(5, 10))],
                                   None), timeout=600)  # deadlines, not timings: a loaded machine starts actors slowly
        advance = coord.advance.remote()
        assert ray.wait([advance], timeout=3)[0] == []  # the straggler holds the step
        ray.get(coord.shutdown.remote(), timeout=300)  # before: queued behind the step, for hours
    finally:
        ray.kill(coord)
    with pytest.raises(ray.exceptions.RayError) as err:  # the step ends with its actor
        ray.get(advance, timeout=300)
    assert not isinstance(err.value, ray.exceptions.GetTimeoutError)


@pytest.mark.slow
@pytest.mark.ray
def test_a_nan_update_is_left_out_of_a_mean_summed_in_the_actors(ray_session, tmp_path):
    # FedAvg's mean is summed in the client actors: the NaN is found there, reported, and the
    # mean over the other clients is the coordinator's, to the bit
    algo = {"name": "fedavg", "clients_per_round": 10, "eval_every": 1}
    fault = [{"kind": "nan_update", "at_round": 2, "client": 3}]
    here = raysoft.run(_cfg(algorithm=algo, faults=fault, train={"nan_policy": "exclude"},
                            ray={"reduce_in_actors": False}), out=tmp_path)
    there = raysoft.run(_cfg(algorithm=algo, faults=fault, train={"nan_policy": "exclude"},
                             ray={"backend": "ray", "clients_per_actor": 5, "num_cpus_per_actor": 0.5}), out=tmp_path)
    for r in (here, there):
        ev = pd.read_parquet(r.run_dir / "events.parquet")
        assert ev[ev.kind == "nan_update"][["step", "client"]].values.tolist() == [[2, 3]]
        assert r.summary["events"] == {"nan_update": 1}
    m_here, m_there = (r.metrics.drop(columns=["run_id", "time_s"]) for r in (here, there))
    assert np.isfinite(m_there.value).all()
    pd.testing.assert_frame_equal(m_there, m_here, check_exact=True)
    with pytest.raises(UpdateError, match="round 2: client 3 returned a non-finite update"):
        raysoft.run(_cfg(algorithm=algo, faults=fault, ray={"backend": "ray", "clients_per_actor": 5,
                                                            "num_cpus_per_actor": 0.5}), out=tmp_path)


# --------------------------------------------------------------------------- after training
def test_a_failure_after_training_keeps_the_results_and_says_where(tmp_path, monkeypatch):
    import raysoft.api
    from raysoft.errors import RunStopped

    real = os.replace

    def no_rename(src, dst):  # the run directory's rename fails (e.g. its parent went away)
        if str(src).endswith(".partial"):
            raise FileNotFoundError(2, "No such file or directory")
        real(src, dst)

    monkeypatch.setattr(raysoft.api.os, "replace", no_rename)
    with pytest.raises(RunStopped) as err:
        raysoft.run(_cfg(), out=tmp_path)
    (kept,) = tmp_path.iterdir()
    assert kept.name.endswith(".partial") and (kept / "summary.json").is_file()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("the run finished but could not be moved to ")
    assert msg.endswith(f"its complete results are kept in {kept}")
    assert len(pd.read_parquet(kept / "metrics.parquet")) > 0


def test_a_failure_writing_a_checkpointed_run_says_how_to_resume(tmp_path, monkeypatch):
    import raysoft.api
    from raysoft.errors import RunStopped

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(raysoft.api, "write_run", full_disk)
    with pytest.raises(RunStopped) as err:
        raysoft.run(_cfg(output={"checkpoint_every": 3}), out=tmp_path)
    (kept,) = tmp_path.iterdir()
    assert (kept / "checkpoint.pt").is_file()
    assert str(err.value).endswith(f"is kept in {kept} (continue with: raysoft run --resume {kept})")
    monkeypatch.undo()
    _assert_same(raysoft.resume(kept).run_dir, raysoft.run(_cfg(), out=tmp_path / "clean").run_dir)


# --------------------------------------------------------------------------- signals
def _start(tmp_path, cfg):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "raysoft", "run", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, out


def _wait_for(proc, ready, what):
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ready():
            return
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the run ended before {what}: {proc.communicate()[1][-2000:]}")


@pytest.mark.slow
def test_sigterm_stops_a_run_and_removes_its_partial_directory(tmp_path):
    proc, out = _start(tmp_path, _cfg(algorithm={"rounds": 100000, "eval_every": 1000}))
    _wait_for(proc, lambda: out.exists() and any(out.glob(".*.partial/config.yaml")), "it started")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines()[-1] == (
        "raysoft: run stopped by SIGTERM; its partial results were removed (a run without checkpoints cannot be "
        "resumed: output.checkpoint_every makes it resumable)")
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("checkpoint_every, said", [
    (0, "run stopped by SIGTERM; its partial results were removed (a run without checkpoints cannot be resumed: "
        "output.checkpoint_every makes it resumable)"),
    (2, "run stopped by SIGTERM before its first round; its directory {work} was removed (nothing to resume)"),
])
def test_sigterm_while_the_run_writes_its_config_says_what_was_removed(tmp_path, monkeypatch, checkpoint_every, said):
    """A signal in the seconds before training (the run's provenance may import torch) removes
    the new directory and says so, as a signal during training does (it said only "stopped by
    SIGTERM" before)."""
    from raysoft import provenance

    made = []

    def write(work, cfg):
        made.append(work)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives here, in the main thread
        time.sleep(5)  # never reached: the handler raises first

    monkeypatch.setattr(provenance, "write", write)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt) as err:
        raysoft.run(_cfg(output={"checkpoint_every": checkpoint_every, "progress": "none"}), out=out)
    (work,) = made
    assert str(err.value) == said.format(work=work)
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_sigterm_keeps_a_checkpointed_run_resumable(tmp_path):
    cfg = _cfg(algorithm={"rounds": 30, "eval_every": 5}, data={"clients": 10, "samples_max": 150},
               train={"local_epochs": 10}, output={"checkpoint_every": 1})
    proc, out = _start(tmp_path, cfg)
    _wait_for(proc, lambda: any(out.glob("*/checkpoint.pt")) if out.exists() else False, "its first checkpoint")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    (run_dir,) = out.iterdir()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == (
        f"raysoft: run stopped by SIGTERM; kept in {run_dir} up to its last checkpoint; continue with: "
        f"raysoft run --resume {run_dir}")
    assert not (run_dir / "summary.json").exists()
    done = subprocess.run([sys.executable, "-m", "raysoft", "run", "--resume", str(run_dir)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _assert_same(run_dir, raysoft.run({**cfg, "output": {"progress": "none"}}, out=tmp_path / "clean").run_dir)


# --------------------------------------------------------------------------- checkpoints are data
from support.configs import stream_config  # noqa: E402
from support.digests import STREAMS, SYNC, digest, expected_or_clean  # noqa: E402


@pytest.fixture(scope="module")
def fm_root(tmp_path_factory):
    from support.images import write_fmnist

    root = tmp_path_factory.mktemp("fm-ckpt")
    write_fmnist(root)
    return root


def _digest_config(case, fm_root):
    if case in SYNC:
        return small_config(**SYNC[case])
    algo = dict(STREAMS[case])
    return stream_config(fm_root, algo.pop("name", "ccfl"), **algo)


@pytest.mark.parametrize("case", sorted(SYNC) + sorted(STREAMS))
def test_every_algorithms_checkpoint_loads_as_data_and_resumes_to_the_same_numbers(case, fm_root, tmp_path):
    from raysoft.runtime.checkpoint import load_checkpoint

    cfg = _digest_config(case, fm_root)
    rounds = cfg["algorithm"]["rounds"]
    every = rounds - 1 if case in SYNC else rounds // 3 + 1  # the last checkpoint is before the end
    r = raysoft.run({**cfg, "output": {**cfg["output"], "checkpoint_every": every}}, out=tmp_path)
    with torch.serialization.safe_globals([]):  # weights_only with raysoft's types, nothing else
        blob = load_checkpoint(r.run_dir)
    assert blob["recorder"]["metrics"]["run_id"][0] == r.run_id
    # as if stopped after its last checkpoint: resuming ends with the uninterrupted run's numbers
    (r.run_dir / "summary.json").unlink()
    want = expected_or_clean(case, lambda: raysoft.run(cfg, out=tmp_path / "clean"))
    assert digest(raysoft.resume(r.run_dir)) == want


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_that_would_run_code(tmp_path):
    r = raysoft.run(_cfg(output={"checkpoint_every": 3}), out=tmp_path / "out")
    (r.run_dir / "summary.json").unlink()
    marker = tmp_path / "ran"
    torch.save({"round": 3, "recorder": _Payload(marker)}, r.run_dir / "checkpoint.pt")
    proc = subprocess.run([sys.executable, "-m", "raysoft", "run", "--resume", str(r.run_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"raysoft: error: {r.run_dir / 'checkpoint.pt'}: not a raysoft checkpoint (it asks for posix.mkdir, which a "
        "checkpoint never holds); refused, nothing in it was run"]
    assert not marker.exists()
    (r.run_dir / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(raysoft.ConfigError, match=r"checkpoint\.pt: not a raysoft checkpoint \(Unsupported operand"):
        raysoft.resume(r.run_dir)
