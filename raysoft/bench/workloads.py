"""The benchmark's reference workloads W1-W5 and the systems each is timed on."""

from __future__ import annotations

import math
from typing import Any

from ..config import ConfigError

WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
# raysoft first: W3's and W4's floors count the work of its run
SYSTEMS = {"W1": ("raysoft", "bare", "pfl"), "W2": ("raysoft", "bare", "flower", "pfl", "floor"),
           "W3": ("raysoft", "floor"), "W4": ("raysoft", "floor"), "W5": ("raysoft", "bare", "floor")}
PEERS = ("flower", "pfl")  # systems run from a venv of their own on the bare loop's export
VARIANTS = {"W4": ("fedsoft", "fedavg")}  # W4 runs as each of these algorithms: a row each
DEFAULT_ROUNDS = {"W1": 6, "W2": 6, "W3": 0, "W4": 4, "W5": 4}  # W3: 0 = 200 uploads
FEDAVG_FLOORS = ("W2", "W5")  # floors from FedAvg's selection stream; the others' from raysoft's run
DEFAULT_GPU_SHARE = 0.125  # --gpu-share: a GPU's share per client actor (8 actors on one GPU)


def gpu_actors(share: float) -> int:
    """Client actors of ``share`` GPU each that one GPU holds (Ray packs fractions within a GPU)."""
    if not 0 < share <= 1:
        raise ConfigError(f"--gpu-share: a GPU's share per client actor, above 0 and at most 1 (got {share:g})")
    return max(1, math.floor(1 / share + 1e-9))


def on_gpu(raw: dict[str, Any], share: float = DEFAULT_GPU_SHARE) -> dict[str, Any]:
    """A workload's config for ``--device cuda``: its client actors on ``share`` of one GPU
    each (``ray.num_gpus_per_actor``; an actor with a GPU share trains on it), one CPU each, as
    many as the GPU holds (:func:`gpu_actors`; a local Ray of that many CPUs, so that the GPU
    and not the CPU count bounds the pool), and ``train.gpu_rows`` the clients an actor trains a
    round (:func:`gpu_rows`), so that one chunk of the vectorised step holds them all. Client
    states stay on the GPU (``ray.client_state: memory``), W4:fedsoft's too, which the CPU bench
    keeps on disk: its 1,000 states of 19 MB are 19 GB of a GPU's memory (an H200 has 139)."""
    actors = gpu_actors(share)
    rows = gpu_rows(int(raw.get("algorithm", {}).get("clients_per_round", 8)), actors)
    return {**raw, "ray": {**raw.get("ray", {}), "num_gpus_per_actor": share, "num_cpus_per_actor": 1,
                           "num_cpus": actors, "client_state": "memory"},
            "train": {**raw.get("train", {}), "gpu_rows": rows}}


def gpu_rows(clients_per_round: int, actors: int) -> int:
    """The bench's ``train.gpu_rows`` on a GPU: the clients one of ``actors`` actors trains a
    round when a round's clients spread evenly, rounded up to a multiple of 8 (W2 at 8 actors: 8;
    on one actor: 64). A setting of the bench's runs, chosen from their packing: a run compared
    across packings keeps one value (docs/running.md#on-gpus)."""
    per_actor = math.ceil(clients_per_round / actors)
    return 8 * max(1, math.ceil(per_actor / 8))


def variants(name: str) -> list[str]:
    """The workload names a bench of ``name`` measures: ``W4:fedsoft``, ``W4:fedavg``; else itself."""
    return [f"{name}:{a}" for a in VARIANTS[name]] if name in VARIANTS else [name]


def workload_config(name: str, rounds: int, quick: bool = False) -> dict[str, Any]:
    """The config of a reference workload (``quick``: a small version, for a smoke test);
    ``W4:fedsoft`` / ``W4:fedavg`` name W4's algorithm (plain ``W4``: FedAvg); a suffix ``@N``
    (``W4:fedavg@300``) sets W4's population N (the scaling table)."""
    name, _, population = name.partition("@")
    name, _, algorithm = name.partition(":")
    if population and (name != "W4" or not population.isdigit() or int(population) < 60):
        raise ConfigError(
            f"--clients: only W4's population can be set, to 60 clients or more (got {name}@{population})"
        )
    if name == "W4":  # W2's data and CNN with N = 1,000 (rotations share images: see docs/performance.md)
        clients, channels, hidden = (20, [8, 16], 64) if quick else (int(population or 1000), [32, 64], 512)
        raw = workload_config("W2", rounds, quick)
        raw["data"] = {**raw["data"], "clients": clients}
        raw["model"] = {**raw["model"], "channels": channels, "hidden": hidden}
        if (algorithm or "fedavg") == "fedsoft":  # 60 clients per center a round, tau = 2, states on disk
            raw["algorithm"] = {"name": "fedsoft", "rounds": rounds, "clients_per_round": 6 if quick else 60,
                                "estimation_interval": 2, "sigma": 1e-4, "prox_weight": 0.1, "eval_every": rounds}
            raw["ray"] = {**raw["ray"], "client_state": "disk"}
        elif algorithm not in ("", "fedavg"):
            raise ConfigError(f"--workload: W4 runs as fedsoft or fedavg, not {algorithm!r}")
        return raw
    if algorithm:
        raise ConfigError(f"--workload: {name} has no algorithm variants (got {name}:{algorithm})")
    if name == "W5":  # FedAvg at N = 10,000: W2's data and CNN, 8-16 images a client, 100 clients a round
        raw = workload_config("W2", rounds, quick)
        raw["data"] = {**raw["data"], "clients": 200 if quick else 10_000, "samples_min": 8, "samples_max": 16}
        raw["algorithm"] = {**raw["algorithm"], "clients_per_round": 10 if quick else 100}
        return raw
    if name == "W1":  # FedSoft, synthetic linear regression (jobs/fedsoft_synthetic.yaml)
        clients, k = (10, 6) if quick else (100, 60)
        return {
            "seed": 0,
            "algorithm": {"name": "fedsoft", "rounds": rounds, "clients_per_round": k, "estimation_interval": 2,
                          "sigma": 1e-4, "prox_weight": 1.0, "eval_every": rounds},
            "data": {"name": "synthetic", "clients": clients, "distributions": 2, "partition": "10:90",
                     "theta_std": 10.0},
            "model": {"name": "linear", "init": "xavier_normal"},
            "train": {"optimizer": "adam", "lr": 0.005, "batch_size": 10, "local_epochs": 10},
            "ray": {"num_cpus": 2, "num_cpus_per_actor": 1},
        }
    if name == "W2":  # FedAvg, rotated Fashion-MNIST 0/180, the 28x28 CNN
        clients, k, channels, hidden = (10, 6, [8, 16], 64) if quick else (100, 60, [32, 64], 512)
        return {
            "seed": 0,
            "algorithm": {"name": "fedavg", "rounds": rounds, "clients_per_round": k, "eval_every": rounds},
            "data": {
                "name": "fmnist",
                "clients": clients,
                "distributions": 2,
                "partition": "10:90",
                "rotations": [0, 180],
                "test_samples": 1000,
            },
            "model": {"name": "cnn", "channels": channels, "hidden": hidden},
            "train": {
                "optimizer": "sgd",
                "lr": 0.05 if quick else 0.01,
                "momentum": 0.0,
                "batch_size": 32,
                "local_epochs": 1,
                "shuffle": True,
            },
            "ray": {"num_cpus": 2, "num_cpus_per_actor": 1},
        }
    if name == "W3":  # CCFL, rotated Fashion-MNIST K = 4, 80 clients, 200 uploads (rounds: N uploads each)
        clients = 8 if quick else 80
        uploads = rounds * clients if rounds else 200
        return {
            "seed": 0,
            "algorithm": {"name": "ccfl", "rounds": uploads, "eval_every": uploads,
                          "public_samples": 100 if quick else 400, "pretrain_epochs": 1,
                          "loss_reduction": "paper_scale", "alpha0": 0.025},
            "data": {"name": "fmnist", "clients": clients, "distributions": 4, "partition": "random",
                     "samples_min": 100 if quick else 500, "samples_max": 200 if quick else 2000,
                     "test_samples": 200 if quick else 1000},
            "model": {"name": "cnn", "channels": [8, 16] if quick else [16, 32], "hidden": 64 if quick else 128},
            "train": {"optimizer": "adam", "lr": 0.001, "batch_size": 128, "local_epochs": 1, "shuffle": True},
            "ray": {"num_cpus": 2},
        }
    raise ConfigError(f"--workload: unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
