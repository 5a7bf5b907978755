"""Where a W2 round's time and memory go (docs/performance.md): the figures behind the analysis.

    .venv/bin/python analysis/fedavg_cnn_round_anatomy.py

Prints, for W2 of `raysoft bench` (FedAvg, the 32/64/512 CNN, batch 32, 60 of 100 clients):
1. FLOP of one training step per sample (``torch.utils.flop_counter``) and the samples trained
   in rounds 0-5, hence the GFLOP of a round;
2. this machine's fp32 matrix-multiply rate on 1 and 2 threads, hence the floor of a round;
3. the CNN's training rate at batch 32, 64 and 128 on one thread;
4. ms per step: one single-thread process alone, two at once, one process with two threads;
5. the split of each round's selected clients (and their steps) between the two actors' blocks;
6. per-process PSS at the peak of a 3-round raysoft run (driver, coordinator, actors, Ray);
7. the private memory that importing torch, then torchvision, costs a fresh process.
Steps 1, 3 and 4 train on real W2 client images.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from raysoft.algorithms.common import uniform_selection
from raysoft.bench import floor, workload_config
from raysoft.bench.memory import tree_processes
from raysoft.config import parse_config
from raysoft.data import Federation
from raysoft.rng import numpy_rng


def step_fn(batch: int):
    """One training step of W2's CNN on a batch of real W2 client images."""
    return floor.step_fn(parse_config(workload_config("W2", 1)), batch)


def seconds_per_step(batch: int, steps: int) -> float:
    step = step_fn(batch)
    for _ in range(3):
        step()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - began) / steps


def _child(threads: int, steps: int) -> str:
    here = str(Path(__file__).parent)
    code = (
        f"import torch; torch.set_num_threads({threads}); import sys; sys.path.insert(0, {here!r}); "
        f"from fedavg_cnn_round_anatomy import seconds_per_step; print(seconds_per_step(32, {steps}))"
    )
    return code


def concurrent_ms(procs: list[int], steps: int = 100) -> list[float]:
    """ms per step of len(procs) processes started together (procs[i] = torch threads of i)."""
    running = [subprocess.Popen([sys.executable, "-c", _child(t, steps)], stdout=subprocess.PIPE, text=True)
               for t in procs]
    return [1000 * float(p.communicate()[0].split()[-1]) for p in running]


def per_process_peak() -> tuple[float, list[tuple[float, str]]]:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "raysoft.bench", "--worker", "raysoft", "W2", "3", "0",
                                 str(Path(tmp) / "res.json")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        best, snapshot = 0.0, []
        while proc.poll() is None:
            rows = [(pss, name) for _, name, _, pss in tree_processes(proc.pid)]
            total = sum(r[0] for r in rows)
            if total > best:
                best, snapshot = total, rows
            time.sleep(0.3)
    return best, sorted(snapshot, reverse=True)


def import_cost_mb() -> list[float]:
    """Private (anonymous) PSS of a fresh process after import torch, then torchvision."""
    code = ("def anon():\n"
            "    return [int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('Pss_Anon')][0]\n"
            "a = anon()\nimport torch\nb = anon()\nimport torchvision.datasets, torchvision.transforms.functional\n"
            "print(b - a, anon() - b)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return [int(v) / 1024 for v in out.split()]


def main() -> None:
    torch.set_num_threads(1)
    cfg = parse_config(workload_config("W2", 6))
    per_sample = floor.flop_per_sample(cfg)
    sizes = np.asarray(Federation(cfg.data, cfg.seed).sizes)
    print(f"1. {per_sample / 1e6:.1f} MFLOP per trained sample")
    blocks = []
    for t in range(6):
        sel = uniform_selection(cfg.data.clients, cfg.algorithm.clients_per_round, numpy_rng(cfg.seed, "select", t))
        half = cfg.data.clients // 2
        steps = [int(sum(np.ceil(sizes[k] / 32) for k in sel if (k >= half) == side)) for side in (False, True)]
        clients = [int(sum((k >= half) == side for k in sel)) for side in (False, True)]
        blocks.append((t, int(sizes[sel].sum()), clients, steps, max(steps) / (sum(steps) / 2) - 1))
    samples = np.mean(floor.round_samples(cfg, 6))
    print(f"   round samples {floor.round_samples(cfg, 6)} -> {samples * per_sample / 1e9:.0f} GFLOP a round")
    rates = {threads: floor.matmul_gflops(threads) for threads in (1, 2)}
    print(f"2. matmul {rates[1]:.1f} GFLOP/s (1 thread), {rates[2]:.1f} (2 threads) -> floor "
          f"{samples * per_sample / 1e9 / rates[2]:.2f} s a round (raysoft bench's floor row)")
    for batch in (32, 64, 128):
        sec = seconds_per_step(batch, max(10, 1600 // batch))
        print(f"3. batch {batch}: {per_sample * batch / sec / 1e9:.1f} GFLOP/s on one thread")
    print(f"4. ms per step: one 1-thread process alone {concurrent_ms([1])[0]:.1f}; two 1-thread processes at once "
          f"{', '.join(f'{v:.1f}' for v in concurrent_ms([1, 1]))}; one 2-thread process {concurrent_ms([2])[0]:.1f}")
    for t, _, clients, steps, over in blocks:
        print(
            f"5. round {t}: clients per actor {clients}, steps {steps}, busier actor +{100 * over:.0f}% over the mean"
        )
    total, rows = per_process_peak()
    print(f"6. peak PSS of a 3-round raysoft W2 run: {total:.0f} MB; the largest processes:")
    for mb, name in rows[:6]:
        print(f"   {mb:7.0f} MB  {name}")
    torch_mb, tv_mb = import_cost_mb()
    print(f"7. private memory of a fresh process: import torch +{torch_mb:.0f} MB, then torchvision +{tv_mb:.0f} MB")


if __name__ == "__main__":
    main()
