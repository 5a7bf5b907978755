"""``raysoft bench``: seconds per round of raysoft against the bare loop, Flower and pfl.

Each (workload, system) pair runs in a subprocess of this command (one process tree, one
sitting) while a sampler sums the resident memory of that subprocess and all its descendants
(Ray's raylet and workers included) every 0.2 s. Systems:

* ``raysoft``: the workload's config through :func:`raysoft.backends.run_backend` on local Ray
  (Ray's start-up is outside the per-round times, inside the total);
* ``bare``: one process, one model per client step, a plain Python loop over the selected clients
  with ``torch.optim`` and the same local steps and averaging (the same maths: the pure
  FedSoft sub-steps and the same client selection streams) - the honest floor of a naive
  implementation;
* ``flower``: W2's FedAvg in Flower's Ray simulation, in a virtual environment of its own
  (Flower pins another Ray release), on the very clients, selections and initial model of the
  bare loop (exported to an ``.npz``); see the checkout's ``benchmarks/flower.py``;
* ``pfl``: W1's FedSoft (written as a pfl algorithm) and W2's FedAvg in pfl 0.6.0's simulation
  (Apple's pfl-research; two worker processes), in a virtual environment of its own (pfl pins
  an older ``packaging``), on the bare loop's exported clients, initial models and random
  streams; see the checkout's ``benchmarks/pfl/``;
* ``floor``: a round's arithmetic at this sitting's matrix-multiply rate (:mod:`.floor`): for W2
  from FedAvg's selection stream, for W3 and W4 from the work raysoft's own run reported.

The peers' harnesses are not part of this package: they live in the ``benchmarks/`` folder of a
raysoft checkout, which :mod:`.peers` finds (beside the imported ``raysoft``, or at
``$RAYSOFT_BENCHMARKS``); without it their rows are left out, with one line saying why.

A round's time is the median over the rounds after the first (the warm-up); for W3 (a stream)
a "round" is N uploads, one per client on average, measured over groups of steps that applied
at least N. ``--long-run`` (:mod:`.longrun`) runs raysoft alone for many rounds and records its
memory over time.

``--device cuda`` runs them on the GPU: raysoft's client actors on ``--gpu-share`` of it each,
the bare loop and Flower on it, the floor at the GPU's fp32 matrix rate, and every row with the
GPU's utilisation and peak memory sampled from nvidia-smi (:mod:`.gpu`).

The modules: :mod:`.workloads` (W1-W5 and their systems), :mod:`.floor` (the floors), :mod:`.gpu`
(CUDA's presence, the GPU's matrix rate, the nvidia-smi sampler),
:mod:`.longrun` (the long-run memory mode), :mod:`.memory` (a process tree's
RSS and PSS), :mod:`.bare` (the bare loop), :mod:`.worker` (one measurement, in a subprocess:
``python -m raysoft.bench --worker ...``), :mod:`.runner` (the orchestration, bench.parquet and
bench.md), :mod:`.peers` (where the peers' harnesses and venvs are).
"""

from .memory import PeakSampler, tree_memory_mb
from .runner import COLUMNS, bench, main, markdown, round_stats
from .worker import worker
from .workloads import DEFAULT_ROUNDS, SYSTEMS, WORKLOADS, workload_config

__all__ = [
    "COLUMNS", "DEFAULT_ROUNDS", "PeakSampler", "SYSTEMS", "WORKLOADS", "bench", "main", "markdown",
    "round_stats", "tree_memory_mb", "worker", "workload_config",
]
