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
import yaml
from support.configs import small_config
from support.images import write_fmnist
from support.paths import ROOT
from support.runs import assert_same

import raysoft

pytestmark = pytest.mark.slow  # every test starts its own multi-node Ray cluster in a subprocess


CLUSTER_SCRIPT = r"""
import json, os, sys, threading, time
os.environ["RAY_AUTH_MODE"] = "token"
import ray
import torch  # here, before the thread below: two threads importing it at once see it half-made
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
        import glob
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


def _without_noise(stderr: str) -> str:
    """``stderr`` without what the interpreter prints at exit as torch's finalizers outlive its
    modules (each an "Exception ignored in: <finalize ...>" block ending in a TypeError): never
    the cause, and enough of it hides the cause."""
    kept, skipping = [], False
    for line in stderr.splitlines():
        if line.startswith("Exception ignored in: <finalize object"):
            skipping = True
        elif skipping and line.startswith("TypeError: 'NoneType'"):
            skipping = False
        elif not skipping:
            kept.append(line)
    return "\n".join(kept)


def _on_cluster(tmp_path, config, **spec):
    spec = {"cpus": 1, "workers": 2, "config": config, **spec}
    proc = subprocess.run([sys.executable, "-c", CLUSTER_SCRIPT, json.dumps(spec), str(tmp_path / "cl")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, _without_noise(proc.stderr)[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def _raysoft_actors() -> list:
    """The processes of raysoft's actors on this machine (Ray titles them ray::<Class>...)."""
    import psutil

    return [p for p in psutil.process_iter(["cmdline"])
            if any(f"ray::{c}" in " ".join(p.info["cmdline"] or []) for c in ("ClientActor", "CoordinatorActor"))]


def _metrics(run_dir):
    return pd.read_parquet(Path(run_dir) / "metrics.parquet").drop(columns=["run_id", "time_s"])


def _same(a, b):
    assert_same(a, b, tables=("metrics",))


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


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_a_worker_node_removed_mid_run_is_survived(tmp_path, shape):
    # FedSoft's sums are made in the client actors, actor to actor (chain) or pairwise (tree):
    # losing a node loses the partial sums on it too
    cfg = small_config(algorithm={"rounds": 8, "eval_every": 2},
                       ray={"backend": "ray", "clients_per_actor": 4, "num_cpus_per_actor": 1, "sum_shape": shape,
                            "sum_group": 2},
                       output={"checkpoint_every": 1, "progress": "none"})
    run_dir = _on_cluster(tmp_path, cfg, cpus=2, remove_at=3)
    events = pd.read_parquet(run_dir / "events.parquet")
    assert "actor_died" in set(events.kind) and "restored" in set(events.kind)
    clean = raysoft.run({**cfg, "ray": {"backend": "inprocess", "sum_shape": shape, "sum_group": 2},
                         "output": {"progress": "none"}},
                        out=tmp_path / "clean").run_dir
    _same(run_dir, clean)


def test_ray_job_submitted_to_a_local_head_completes(tmp_path):
    # Ray's socket paths must stay short (Unix sockets: 107 bytes): a short temp dir, not tmp_path
    ray_tmp = tempfile.mkdtemp(prefix="rs-", dir="/tmp")
    env = {**os.environ, "RAYSOFT_HEAD_PORT": "6412", "RAYSOFT_RAY_TMP": ray_tmp, "RAYSOFT_AGENT_PORT": "52480",
           "RAYSOFT_DASHBOARD_PORT": "8312", "RAYSOFT_CLIENT_PORT": "6413", "RAY_AUTH_MODE": "token"}
    plain = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
    script = str(ROOT / "cluster_configs" / "local.sh")
    subprocess.run([script, "start", "1", "1"], env=env, check=True, timeout=180, capture_output=True)
    try:
        # as docs/running.md writes it, without --out: the job's relative output.dir (runs) is made
        # absolute from the folder it is submitted from (the Job refused it before)
        work = tmp_path / "work"
        shutil.copytree(ROOT / "jobs", work / "jobs", ignore=shutil.ignore_patterns("__pycache__"))
        out = work / "runs"
        for _attempt in range(10):  # the job agent needs a moment after start
            proc = subprocess.run(
                [sys.executable, str(ROOT / "jobs" / "submit.py"), "--address", "http://127.0.0.1:8312", "--",
                 "raysoft", "run", "jobs/fedsoft_synthetic.yaml", "--set", "algorithm.rounds=2", "--set",
                 "data.clients=12", "--set", "algorithm.clients_per_round=6", "--progress", "none"],
                env=env, capture_output=True, text=True, timeout=300, cwd=work)
            if "No available agent" not in proc.stderr:
                break
            time.sleep(2)
        assert proc.returncode == 0, proc.stderr[-2000:]
        (run_dir,) = list(out.iterdir())
        m = pd.read_parquet(run_dir / "metrics.parquet")
        assert m.step.max() == 2 and np.isfinite(m.value).all()
        assert "packaging.py" not in proc.stderr, proc.stderr  # Ray's INFO lines of the upload, off unless asked
        # a job that fails says why, in one line: Ray's status message and the job's last log line
        proc = subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "submit.py"), "--address", "http://127.0.0.1:8312", "--",
             "python", "-c", 'print("the last words"); raise SystemExit(3)'],  # the words a shell passes
            env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 1 and last.startswith("job raysubmit_") and ": FAILED: " in last, proc.stderr
        assert "exit code 3" in last and last.endswith("its last log line: the last words"), last
        # `ray job stop` on a checkpointed run: no actor of it is left behind, and it resumes to
        # the numbers of an uninterrupted run
        out_stop = tmp_path / "stopped"
        slow = ["--set", "algorithm.rounds=12", "--set", "data.clients=12", "--set", "algorithm.clients_per_round=6",
                "--set", "train.local_epochs=100", "--set", "output.checkpoint_every=1",
                "--set", "ray.clients_per_actor=6", "--set", "ray.num_cpus_per_actor=0.5"]
        proc = subprocess.run(
            [sys.executable, str(ROOT / "jobs" / "submit.py"), "--address", "http://127.0.0.1:8312", "--no-follow",
             "--", "raysoft", "run", "jobs/fedsoft_synthetic.yaml", *slow, "--out", str(out_stop),
             "--progress", "none"], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        job = proc.stdout.strip().splitlines()[-1]
        deadline = time.time() + 300
        while time.time() < deadline and not list(out_stop.glob("*/checkpoint.pt")):
            time.sleep(0.5)
        (run_dir,) = [p.parent for p in out_stop.glob("*/checkpoint.pt")]
        ray_cli = str(ROOT / ".venv" / "bin" / "ray")
        subprocess.run([ray_cli, "job", "stop", "--address", "http://127.0.0.1:8312", job], env=env, check=True,
                       timeout=120, capture_output=True)
        deadline = time.time() + 120
        while time.time() < deadline and _raysoft_actors():
            time.sleep(0.5)
        assert not _raysoft_actors()
        done = subprocess.run([sys.executable, "-m", "raysoft", "run", "--resume", str(run_dir), "--progress", "none"],
                              env=plain, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
        cfg_clean = {**yaml.safe_load((run_dir / "config.yaml").read_text()), "ray": {"backend": "inprocess"}}
        _same(run_dir, raysoft.run(cfg_clean, out=tmp_path / "clean_stop").run_dir)
        # the same through the CLI: an http:// address submits a Ray Job; from an example's folder, with
        # its plug-in (fedprox:FedProx) in the job's working directory, the current one, and the
        # job's own relative output.dir (runs), which lands in that folder (the cluster is on this machine)
        example = tmp_path / "fedprox"
        shutil.copytree(ROOT / "examples" / "fedprox", example, ignore=shutil.ignore_patterns("runs", "__pycache__"))
        out2 = example / "runs"
        proc = subprocess.run(
            [sys.executable, "-m", "raysoft", "run", "job.yaml", "--address", "http://127.0.0.1:8312",
             "--set", "algorithm.rounds=1", "--set", "data.clients=8", "--set", "algorithm.clients_per_round=4"],
            env=env, capture_output=True, text=True, timeout=300, cwd=example)
        assert proc.returncode == 0, proc.stderr[-2000:]
        (run_dir,) = list(out2.iterdir())
        assert pd.read_parquet(run_dir / "metrics.parquet").step.max() == 1
        # joining the head by its GCS address works without exporting RAY_AUTH_MODE: raysoft
        # finds the token itself, and Ray's token warning is not printed; the plug-in's module is
        # uploaded to the joined cluster's actors
        out3 = tmp_path / "runs3"
        proc = subprocess.run(
            [sys.executable, "-m", "raysoft", "run", "job.yaml", "--address", "127.0.0.1:6412",
             "--set", "algorithm.rounds=1", "--set", "data.clients=8", "--set", "algorithm.clients_per_round=4",
             "--set", "ray.placement_timeout_s=60", "--out", str(out3), "--progress", "none"],
            env=plain, capture_output=True, text=True, timeout=300, cwd=example)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "InvalidAuthToken" not in proc.stderr and "Token authentication is enabled" not in proc.stderr
        (run_dir,) = list(out3.iterdir())
        assert pd.read_parquet(run_dir / "metrics.parquet").step.max() == 1
    finally:
        subprocess.run([script, "stop"], env=env, timeout=60, capture_output=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)


# --- cluster_configs/local.sh stop: exactly its own cluster ---------------------------------------

def _proc_stat(pid):
    """(ppid, state) of a process from /proc, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), fields[0]


def _live(pid):
    st = _proc_stat(pid)
    return st is not None and st[1] != "Z"


def _listeners():
    """(pid, ip, port) of every listening TCP socket on the machine, from /proc."""
    import ipaddress
    sockets = {}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":  # LISTEN
                continue
            hexip, hexport = f[1].split(":")
            raw = bytes.fromhex(hexip)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            if v6 and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            sockets[f[9]] = (str(ip), int(hexport, 16))
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in sockets:
                out.append((int(proc.name), *sockets[target[8:-1]]))
    return out


def _cluster(head_port):
    """A local.sh cluster as seen from outside the script: the session of the process that
    listens on its head port, every live process of that session and their descendants, and the
    sockets they listen on."""
    (head,) = {pid for pid, _, port in _listeners() if port == head_port}
    sid = os.getsid(head)
    procs = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and (st := _proc_stat(int(proc.name))) and st[1] != "Z":
            procs[int(proc.name)] = st[0]
    keep = set()
    for pid in procs:
        try:
            if os.getsid(pid) == sid:
                keep.add(pid)
        except OSError:
            pass
    grown = True
    while grown:
        new = {pid for pid, ppid in procs.items() if ppid in keep} - keep
        keep |= new
        grown = bool(new)
    listening = {(ip, port) for pid, ip, port in _listeners() if pid in keep}
    return sid, keep, listening


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_local_sh_stop_ends_its_cluster_and_nothing_else(tmp_path):
    """local.sh stop ends every process of its cluster -- the agents, the job entrypoints (which
    open sessions of their own) included -- and frees its ports; a second cluster whose temp dir
    has the first's as a prefix (which `pkill -f <temp dir>` would have hit) lives on."""
    script = str(ROOT / "cluster_configs" / "local.sh")
    tmp_a = tempfile.mkdtemp(prefix="rs-", dir="/tmp")
    tmp_b = tmp_a + "-b"  # the first's path is a prefix of the second's
    ports_a = {"RAYSOFT_HEAD_PORT": "6431", "RAYSOFT_DASHBOARD_PORT": "8331", "RAYSOFT_CLIENT_PORT": "6432",
               "RAYSOFT_AGENT_PORT": "52431"}
    ports_b = {"RAYSOFT_HEAD_PORT": "6441", "RAYSOFT_DASHBOARD_PORT": "8341", "RAYSOFT_CLIENT_PORT": "6442",
               "RAYSOFT_AGENT_PORT": "52441"}
    env_a = {**os.environ, **ports_a, "RAYSOFT_RAY_TMP": tmp_a, "RAY_AUTH_MODE": "token"}
    env_b = {**os.environ, **ports_b, "RAYSOFT_RAY_TMP": tmp_b, "RAY_AUTH_MODE": "token"}
    try:
        subprocess.run([script, "start", "1", "1"], env=env_a, check=True, timeout=300, capture_output=True)
        subprocess.run([script, "start", "0", "1"], env=env_b, check=True, timeout=300, capture_output=True)
        again = subprocess.run([script, "start", "1", "1"], env=env_a, timeout=60, capture_output=True, text=True)
        assert again.returncode == 1 and "already running" in again.stderr

        # a job whose entrypoint sleeps: Ray runs it in a session of its own
        marker = f"rs-stop-test-{os.getpid()}"
        subprocess.run([str(ROOT / ".venv" / "bin" / "ray"), "job", "submit", "--no-wait", "--address",
                        "http://127.0.0.1:8331", "--", "python", "-c", "import time; time.sleep(600)", marker],
                       env=env_a, check=True, timeout=120, capture_output=True)
        deadline = time.time() + 120
        while True:
            sleepers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and marker in _cmdline(p.name)]
            if sleepers or time.time() > deadline:
                break
            time.sleep(1)
        assert sleepers, "the job's entrypoint did not start"

        sid_a, pids_a, listening_a = _cluster(6431)
        sid_b, pids_b, listening_b = _cluster(6441)
        assert sid_a != sid_b and not pids_a & pids_b
        assert set(sleepers) <= pids_a and all(os.getsid(p) != sid_a for p in sleepers)
        # what local.sh recorded at start is this cluster
        assert (Path(tmp_a) / "local-cluster.sid").read_text().strip() == str(sid_a)
        recorded = {int(x) for x in (Path(tmp_a) / "local-cluster.pids").read_text().split()}
        assert len(recorded) > 5 and recorded - pids_a == {p for p in recorded if not _live(p)}
        # the dashboard on 127.0.0.1 only; no Ray Client server
        assert {ip for ip, port in listening_a if port == 8331} == {"127.0.0.1"}
        assert not [x for x in _listeners() if x[2] == 6432]
        assert {ip for ip, port in listening_a if port in (52431, 52432)} >= {"127.0.0.1"}

        stop = subprocess.run([script, "stop"], env=env_a, timeout=120, capture_output=True, text=True)
        assert stop.returncode == 0, stop.stderr
        deadline = time.time() + 15  # a process still in its exit path (no cmdline yet, not yet a zombie)
        while (survivors := sorted(p for p in pids_a | recorded if _live(p))) and time.time() < deadline:
            time.sleep(0.2)
        assert not survivors, [(p, _cmdline(p)[:120]) for p in survivors]
        still = [x for x in _listeners() if (x[1], x[2]) in listening_a or x[2] in (6431, 8331, 6432, 52431, 52432)]
        assert not still, still
        assert not (Path(tmp_a) / "local-cluster.sid").exists()
        # the other cluster: untouched
        assert all(_live(p) for p in pids_b)
        assert {(ip, port) for pid, ip, port in _listeners() if pid in pids_b} == listening_b
        assert (
            subprocess.run([script, "stop"], env=env_a, timeout=60, capture_output=True).returncode == 0
        )  # again: no-op
    finally:
        for env in (env_a, env_b):
            subprocess.run([script, "stop"], env=env, timeout=120, capture_output=True)
        for d in (tmp_a, tmp_b):
            shutil.rmtree(d, ignore_errors=True)
    deadline = time.time() + 15  # as above: a process may still be in its exit path
    while (left := [p for p in pids_b if _live(p)]) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, [(p, _cmdline(p)[:120]) for p in left]
