"""raysoft on a GPU: every algorithm on CUDA, in-process and on Ray's fractional shares, its
numbers beside the CPU run's, identical for any packing and on resume.

Marked ``gpu``: skipped where torch finds no CUDA (CI has none), run by ``make test-gpu`` (or
``pytest -m gpu``). ``RAYSOFT_FAKE_GPU=1`` rehearses them on a CPU machine (Ray told of one GPU
with ``RAY_OVERRIDE_RESOURCES='{"GPU": 1}'``; the actors get their shares, torch finds no CUDA
and they train on the CPU), so the script that runs them on a GPU machine is tried before it
spends the machine's time. ``RAYSOFT_GPU_REPORT=FILE`` appends each algorithm's largest
GPU/CPU difference to FILE (JSON lines), the table docs/running.md#on-gpus quotes.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from support.configs import small_config, stream_config
from support.digests import STREAMS, SYNC
from support.images import write_fmnist
from support.runs import assert_same, values

import raysoft

FAKE = os.environ.get("RAYSOFT_FAKE_GPU") == "1"
CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (CUDA or FAKE), reason="needs CUDA (RAYSOFT_FAKE_GPU=1 "
                                                                             "rehearses on a CPU)")]
DEVICE = "cuda" if CUDA else "auto"  # the rehearsal's hosts fall back to the CPU
# The largest difference of a final metric between the GPU and the CPU run, relative to the CPU's
# value (floored at 1e-2): the kernels differ (cuDNN's convolutions, cuBLAS's sums) and a few rounds
# of training amplify rounding; a hard choice near a tie (IFCA's argmin, FedSoft's counts) can flip.
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def fm_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fm-gpu")
    write_fmnist(root)
    return root


def _config(case: str, fm_root, **sections) -> dict:
    if case in SYNC:
        cfg = small_config(**SYNC[case])
    else:
        algo = dict(STREAMS[case])
        cfg = stream_config(fm_root, algo.pop("name", "ccfl"), **algo)
    for name, keys in sections.items():
        cfg[name] = {**cfg.get(name, {}), **keys}
    return cfg


def _final(run) -> pd.Series:
    """Each (scope, entity, eval_dist, metric)'s value at the last step it was measured."""
    m = values(run).dropna(subset=["value"])
    last = m[m.step == m.step.max()]
    return last.set_index(["scope", "entity", "eval_dist", "metric"])["value"].sort_index()


def _report(**row) -> None:
    path = os.environ.get("RAYSOFT_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("case", sorted(SYNC) + sorted(STREAMS))
def test_every_algorithm_runs_on_cuda_in_process_near_its_cpu_numbers(case, fm_root, tmp_path):
    gpu = raysoft.run(_config(case, fm_root, train={"device": DEVICE}), out=tmp_path / "gpu")
    cpu = raysoft.run(_config(case, fm_root, train={"device": "cpu"}), out=tmp_path / "cpu")
    g, c = _final(gpu), _final(cpu)
    assert list(g.index) == list(c.index)
    rel = (g - c).abs() / np.maximum(c.abs(), 1e-2)
    _report(test="in_process", case=case, device=DEVICE, metrics=len(rel), max_rel_diff=float(rel.max()),
            worst=str(rel.idxmax()), identical=bool((g == c).all()))
    assert rel.max() <= TOLERANCE, rel.sort_values().tail(3)


PACKINGS = [  # (GPU share of an actor, its clients): 10 clients
    (0.25, 3), (0.125, 2), (1.0, 10),
]


@pytest.mark.ray
@pytest.mark.parametrize("case", ["fedsoft", "fedavg_cnn"])
def test_any_packing_into_gpu_actors_gives_identical_numbers(ray_session, case, fm_root, tmp_path):
    """FedSoft (linear model, batched) and FedAvg on a CNN (batched with vmap on a GPU): the same
    numbers in-process and on actors of a quarter, an eighth and a whole GPU, with the round's sums
    made on the actors' GPUs or on the coordinator's CPU."""
    cnn = {"model": {"name": "cnn", "channels": [2, 4], "hidden": 8},
           "data": {"name": "fmnist", "root": str(fm_root), "partition": "random", "test_samples": 8,
                    "samples_min": 10, "samples_max": 20},
           "train": {"optimizer": "sgd", "lr": 0.05, "batch_size": 4}}

    def config(**ray):
        cfg = _config("fedavg" if case == "fedavg_cnn" else "fedsoft", fm_root, ray=ray,
                      **(cnn if case == "fedavg_cnn" else {}))
        cfg["train"].update(device=DEVICE, batched_clients="auto")
        return cfg

    ref = raysoft.run(config(backend="inprocess"), out=tmp_path / "inprocess")
    for share, per_actor in PACKINGS:
        run = raysoft.run(config(backend="ray", num_gpus_per_actor=share, clients_per_actor=per_actor,
                                 num_cpus_per_actor=0.1), out=tmp_path / f"ray-{share}")
        assert_same(ref, run)
        _report(test="packing", case=case, share=share, clients_per_actor=per_actor, identical=True)
    # the sums made on the actors' GPUs (the default) or, every update sent, on the coordinator's CPU
    run = raysoft.run(config(backend="ray", num_gpus_per_actor=0.25, clients_per_actor=3, num_cpus_per_actor=0.1,
                             reduce_in_actors=False), out=tmp_path / "ray-coordinator-sums")
    assert_same(ref, run)
    _report(test="packing", case=f"{case}, sums on the coordinator", share=0.25, clients_per_actor=3, identical=True)


@pytest.mark.parametrize("case", ["fedsoft", "fedem", "ccfl"])
def test_a_run_resumed_on_the_gpu_ends_with_the_uninterrupted_runs_numbers(case, fm_root, tmp_path):
    cfg = _config(case, fm_root, train={"device": DEVICE})
    rounds = cfg["algorithm"]["rounds"]
    every = rounds - 1 if case in SYNC else rounds // 3 + 1  # the last checkpoint is before the end
    r = raysoft.run({**cfg, "output": {**cfg["output"], "checkpoint_every": every}}, out=tmp_path)
    (r.run_dir / "summary.json").unlink()  # as if stopped after its last checkpoint
    clean = raysoft.run(cfg, out=tmp_path / "clean")
    assert_same(clean, raysoft.resume(r.run_dir))


EXAMPLE_JOBS = {  # example -> what makes its job small (a few rounds, few clients)
    "fedprox": ["algorithm.rounds=4", "algorithm.eval_every=2"],
    "cfl": ["algorithm.rounds=8", "algorithm.warmup=2", "algorithm.eval_every=4"],
    "early_stop": ["algorithm.rounds=6"],
    "mlp_model": ["algorithm.rounds=4", "algorithm.eval_every=2"],
    "fedasync": ["algorithm.cycles=2", "algorithm.eval_every=8", "algorithm.public_samples=6",
                 "algorithm.pretrain_epochs=1", "data.samples_min=10", "data.samples_max=20", "data.test_samples=8",
                 "model.channels=[2, 4]", "model.hidden=8"],
    "npz_clients": ["algorithm.rounds=4", "algorithm.eval_every=2"],
    "fedbuff": ["data.clients=6", "algorithm.rounds=12", "algorithm.eval_every=6"],
}


@pytest.mark.parametrize("example", sorted(EXAMPLE_JOBS))
def test_every_example_plug_in_runs_on_cuda_unchanged(example, fm_root, tmp_path, monkeypatch):
    from support.paths import EXAMPLES

    from raysoft.config import load_raw

    folder = EXAMPLES / example
    extra = list(EXAMPLE_JOBS[example])
    if example == "fedasync":
        extra.append(f"data.root={fm_root}")
    if example == "npz_clients":
        import importlib.util

        spec = importlib.util.spec_from_file_location("npz_make_files", folder / "make_files.py")
        make_files = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(make_files)
        make_files.write(tmp_path / "data")
        extra.append(f"data.folder={tmp_path / 'data'}")
    monkeypatch.chdir(folder)
    common = ["ray.backend=inprocess", "output.progress=none", *extra]
    gpu = raysoft.run(load_raw(folder / "job.yaml", [*common, f"train.device={DEVICE}"]), out=tmp_path / "gpu")
    cpu = raysoft.run(load_raw(folder / "job.yaml", [*common, "train.device=cpu"]), out=tmp_path / "cpu")
    g, c = _final(gpu), _final(cpu)
    rel = (g - c).abs() / np.maximum(c.abs(), 1e-2)
    _report(test="example", case=example, device=DEVICE, metrics=len(rel), max_rel_diff=float(rel.max()),
            identical=bool((g == c).all()))
    assert gpu.summary["rounds"] == cpu.summary["rounds"]
    assert rel.max() <= TOLERANCE, rel.sort_values().tail(3)


@pytest.mark.parametrize("case", ["fedsoft", "fedem", "local"])
def test_client_states_kept_off_the_gpu_give_the_same_numbers(case, fm_root, tmp_path):
    """``ray.client_state: host`` keeps the states in CPU memory, on the GPU only while used."""
    resident = raysoft.run(_config(case, fm_root, train={"device": DEVICE}), out=tmp_path / "memory")
    host = raysoft.run(_config(case, fm_root, train={"device": DEVICE}, ray={"client_state": "host"}),
                       out=tmp_path / "host")
    assert_same(resident, host)
