"""What one client's persistent state costs, per algorithm (docs/performance.md#client-state).

    .venv/bin/python analysis/client_state_bytes.py [--config jobs/compare_fmnist.yaml]

Runs one round of every synchronous algorithm on 4 clients of the config's data and model (all
of them training), checkpoints it, and prints the bytes of each client's state as
``ray.client_state: disk`` writes it (``torch.save``; resident, its tensors take the same bytes)
and what the tensors in it are.
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

import torch

import raysoft
from raysoft.compare import algorithm_configs
from raysoft.config import COMPARE_DEFAULT, load_raw
from raysoft.devices import tensors_in
from raysoft.runtime.checkpoint import load_checkpoint

VARIANTS = {"fedsoft (sgd + momentum)": ("fedsoft", []), "fedsoft (adam)": ("fedsoft", ["train.optimizer=adam"]),
            "fedem": ("fedem", []), "ifca": ("ifca", []), "fedavg": ("fedavg", []), "local": ("local", [])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(Path(__file__).parent.parent / "jobs" / "compare_fmnist.yaml"))
    args = ap.parse_args()
    print("| algorithm | MB per client | parameters in it |\n|---|---|---|")
    for label, (algo, extra) in VARIANTS.items():
        raw = load_raw(args.config, ["regimes={}", "data.clients=4", "algorithm.rounds=1",  # the shared SGD
                                     "algorithm.clients_per_round=4", "algorithm.eval_every=1",
                                     "ray.backend=inprocess", "output.progress=none",
                                     "output.checkpoint_every=1", "data.test_samples=10", *extra])
        cfg = algorithm_configs(raw, list(COMPARE_DEFAULT))[algo]
        with tempfile.TemporaryDirectory() as tmp:
            run = raysoft.run(cfg, out=tmp)
            states = load_checkpoint(run.run_dir)["clients"]
        sizes, numels = [], []
        for st in states.values():
            buf = io.BytesIO()
            torch.save(st, buf)
            sizes.append(buf.tell())
            seen = {}
            for obj in tensors_in(st):
                seen[id(obj)] = obj.numel()
            numels.append(sum(seen.values()))
        print(f"| {label} | {max(sizes) / 2**20:.2f} | {max(numels):,} |", flush=True)


if __name__ == "__main__":
    main()
