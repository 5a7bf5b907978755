"""Multi-node Ray on this machine (issue: scale out): a 3-node ``ray.cluster_utils.Cluster``,
logical GPUs, a worker node removed mid-run, and a Ray Job submitted to a head on 127.0.0.1.
Each test runs its own cluster in a subprocess, apart from the session's Ray."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import raysoft

from conftest import small_config
from test_images import write_fmnist

pytestmark = pytest.mark.slow  # every test starts its own multi-node Ray cluster in a subprocess

ROOT = Path(__file__).resolve().parent.parent

CLUSTER_SCRIPT = r"""
import json, os, sys, threading, time
os.environ["RAY_AUTH_MODE"] = "token"
import ray
from ray.cluster_utils import Cluster
import raysoft

spec = json.loads(sys.argv[1])
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": spec["cpus"], "num_gpus": spec.get("gpus", 0)})
workers = [cluster.add_node(num_cpus=spec["cpus"]) for _ in range(spec["workers"])]
ray.init(address=cluster.address, log_to_driver=False)
cluster.wait_for_nodes()
out = sys.argv[2]
if spec.get("remove_at"):
    def remove():  # take a worker node away once the run has checkpointed past the given round
        import glob, torch
        while True:
            found = glob.glob(os.path.join(out, "*", "checkpoint.pt"))
            if found and torch.load(found[0], weights_only=False)["round"] >= spec["remove_at"]:
                cluster.remove_node(workers[0])
                return
            time.sleep(0.1)
    threading.Thread(target=remove, daemon=True).start()
r = raysoft.run(spec["config"], out=out)
print(r.run_dir)
ray.shutdown()
cluster.shutdown()
"""


def _on_cluster(tmp_path, config, **spec):
    spec = {"cpus": 1, "workers": 2, "config": config, **spec}
    proc = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT, json.dumps(spec), str(tmp_path / "cl")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def _metrics(run_dir):
    return pd.read_parquet(Path(run_dir) / "metrics.parquet").drop(columns=["run_id", "time_s"])


def _same(a, b):
    pd.testing.assert_frame_equal(_metrics(a).reset_index(drop=True), _metrics(b).reset_index(drop=True),
                                  check_exact=True)


def test_fedsoft_on_three_nodes_places_actors_everywhere_and_matches_one_node(tmp_path):
    cfg = small_config(ray={"backend": "ray", "clients_per_actor": 4, "num_cpus_per_actor": 1})
    run_dir = _on_cluster(tmp_path, cfg)
    placement = pd.read_parquet(run_dir / "placement.parquet")
    assert placement.node_id.nunique() == 3  # SPREAD: one actor on each node
    assert sorted(placement.client) == list(range(10))
    single = raysoft.run(small_config(), out=tmp_path / "single").run_dir
    _same(run_dir, single)


def test_ccfl_on_three_nodes_matches_one_node(tmp_path):
    write_fmnist(tmp_path / "fm")
    cfg = small_config(
        algorithm={"name": "ccfl", "rounds": 18, "eval_every": 9, "public_samples": 6, "pretrain_epochs": 1,
                   "l_bar": "min"},
        data={"name": "fmnist", "clients": 6, "distributions": 3, "partition": "random", "samples_min": 10,
              "samples_max": 20, "root": str(tmp_path / "fm"), "test_samples": 8},
        model={"name": "cnn", "channels": [2, 4], "hidden": 8},
        train={"optimizer": "sgd", "lr": 0.05, "batch_size": 8, "local_epochs": 1},
    )
    multi = _on_cluster(tmp_path, {**cfg, "ray": {"backend": "ray", "clients_per_actor": 2}})
    assert pd.read_parquet(multi / "placement.parquet").node_id.nunique() == 3
    _same(multi, raysoft.run(cfg, out=tmp_path / "single").run_dir)


def test_fractional_logical_gpus_admit_100_clients_and_run_on_the_cpu(tmp_path):
    cfg = small_config(
        algorithm={"rounds": 1, "clients_per_round": 20, "eval_every": 1},
        data={"clients": 100, "samples_min": 20, "samples_max": 30, "test_samples": 50},
        train={"local_epochs": 1},
        ray={"backend": "ray", "clients_per_actor": 10, "num_cpus_per_actor": 0.1, "num_gpus_per_actor": 0.04},
    )
    run_dir = _on_cluster(tmp_path, cfg, cpus=2, workers=0, gpus=1)
    placement = pd.read_parquet(run_dir / "placement.parquet")
    assert len(placement) == 100 and placement.actor.nunique() == 10
    cpu = {**cfg, "ray": {"backend": "inprocess"}}
    _same(run_dir, raysoft.run(cpu, out=tmp_path / "cpu").run_dir)  # the same numbers: it ran on the CPU


def test_a_worker_node_removed_mid_run_is_survived(tmp_path):
    cfg = small_config(algorithm={"rounds": 8, "eval_every": 2},
                       ray={"backend": "ray", "clients_per_actor": 4, "num_cpus_per_actor": 1},
                       output={"checkpoint_every": 1, "progress": "none"})
    run_dir = _on_cluster(tmp_path, cfg, cpus=2, remove_at=3)
    events = pd.read_parquet(run_dir / "events.parquet")
    assert "actor_died" in set(events.kind) and "restored" in set(events.kind)
    clean = raysoft.run({**cfg, "ray": {"backend": "inprocess"}, "output": {"progress": "none"}},
                        out=tmp_path / "clean").run_dir
    _same(run_dir, clean)


def test_ray_job_submitted_to_a_local_head_completes(tmp_path):
    # Ray's socket paths must stay short (Unix sockets: 107 bytes): a short temp dir, not tmp_path
    ray_tmp = tempfile.mkdtemp(prefix="rs-", dir="/tmp")
    env = {**os.environ, "RAYSOFT_HEAD_PORT": "6412", "RAYSOFT_RAY_TMP": ray_tmp,
           "RAYSOFT_AGENT_PORT": "52480", "RAY_AUTH_MODE": "token"}
    script = str(ROOT / "cluster_configs" / "local.sh")
    subprocess.run([script, "start", "1", "1"], env=env, check=True, timeout=180, capture_output=True)
    try:
        out = tmp_path / "runs"
        for attempt in range(10):  # the job agent needs a moment after start
            proc = subprocess.run(
                [sys.executable, str(ROOT / "jobs" / "submit.py"), "--address", "http://127.0.0.1:8265", "--",
                 "raysoft", "run", "jobs/fedsoft_synthetic.yaml", "--set", "algorithm.rounds=2", "--set",
                 "data.clients=12", "--set", "algorithm.clients_per_round=6", "--out", str(out), "--progress", "none"],
                env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
            if "No available agent" not in proc.stderr:
                break
            time.sleep(2)
        assert proc.returncode == 0, proc.stderr[-2000:]
        (run_dir,) = list(out.iterdir())
        m = pd.read_parquet(run_dir / "metrics.parquet")
        assert m.step.max() == 2 and np.isfinite(m.value).all()
        # the same through the CLI: an http:// address submits a Ray Job
        out2 = tmp_path / "runs2"
        proc = subprocess.run(
            [sys.executable, "-m", "raysoft", "run", "jobs/fedsoft_synthetic.yaml", "--address", "http://127.0.0.1:8265",
             "--set", "algorithm.rounds=1", "--set", "data.clients=8", "--set", "algorithm.clients_per_round=4",
             "--out", str(out2)], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        (run_dir,) = list(out2.iterdir())
        assert pd.read_parquet(run_dir / "metrics.parquet").step.max() == 1
    finally:
        subprocess.run([script, "stop"], env=env, timeout=60, capture_output=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
