"""The sum chain's latency against the number of client actors (docs/performance.md#the-sum-chain).

    .venv/bin/python analysis/sum_chain_latency.py [--actors 1 2 4 8 16] [--clients 32] [--repeats 5]

FedAvg's round sum made in the actors (``ray.reduce_in_actors``): each actor adds its clients'
weighted updates to the partial sum it receives and passes it on, in client-id order. This script
starts a local Ray with 2 CPUs, places ``--clients`` clients of W2's model (the 28x28 CNN,
1.66 M parameters, 6.6 MB a sum) on A actors (fractional CPUs), lets every client train once on
8 images (so that each actor keeps its updates), and times the chain alone
(``RayExecutor.accumulate``) and the tree (``ray.sum_shape: tree``, runs of ``--group``
clients), ``--repeats`` times per A. It prints one Markdown row per A: the median seconds of
each, the chain's seconds per actor, and each shape's critical path in sequential actor calls
(hops). On a machine with fewer cores than actors the actors cannot run the tree's branches at
once, so its seconds there are an upper bound; the hops are what a cluster of A nodes waits for.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import ray

from raysoft.algorithms import WeightedMean
from raysoft.backends.actors import RayExecutor
from raysoft.bench.workloads import workload_config
from raysoft.config import parse_config
from raysoft.data import Federation
from raysoft.models import build_model
from raysoft.params import get_flat


def tree_hops(blocks: list[list[int]], ids: list[int], group: int) -> int:
    """The tree's critical path in sequential actor calls: the longest run's chain (the actors
    its clients are on), one call per level of pairwise additions, and one for the start."""
    owner = {k: i for i, b in enumerate(blocks) for k in b}
    runs = [ids[i : i + group] for i in range(0, len(ids), group)]
    return max(len({owner[k] for k in r}) for r in runs) + math.ceil(math.log2(len(runs))) + 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--group", type=int, default=4, help="ray.sum_group of the tree")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    print(f"| actors | chain s | chain s per actor | chain hops | tree s (runs of {args.group}) | tree hops |\n"
          "|---|---|---|---|---|---|")
    for a in args.actors:
        raw = workload_config("W2", 1)
        raw["data"] = {**raw["data"], "clients": args.clients, "samples_min": 8, "samples_max": 8}
        raw["algorithm"] = {**raw["algorithm"], "clients_per_round": args.clients}
        per = -(-args.clients // a)
        raw["ray"] = {"backend": "ray", "clients_per_actor": per, "num_cpus_per_actor": round(2 / a, 4) - 1e-4,
                      "sum_group": args.group}
        cfg = parse_config(raw)
        blocks = [list(range(i, min(i + per, args.clients))) for i in range(0, args.clients, per)]
        ex = RayExecutor(cfg, blocks)
        fed = Federation(cfg.data, cfg.seed)
        model = get_flat(build_model(cfg.model, fed.info))
        ids = list(range(args.clients))
        times: dict[str, list[float]] = {"chain": [], "tree": []}
        for _ in range(args.repeats):
            for shape in ("chain", "tree"):
                ex.rc = cfg.ray.model_copy(update={"sum_shape": shape})
                flags = ex.call_for_reduction("train", ids, {"model": model}, 0)
                plan = WeightedMean(fed.sizes).plan({k: v[1] for k, v in flags.items()})
                began = time.perf_counter()
                ex.accumulate(plan)
                times[shape].append(time.perf_counter() - began)
        c, t = (statistics.median(times[x]) for x in ("chain", "tree"))
        print(f"| {len(blocks)} | {c:.4f} | {c / len(blocks):.4f} | {len(blocks)} | {t:.4f} | "
              f"{tree_hops(blocks, ids, args.group)} |", flush=True)
        for actor in ex.actors:
            ray.kill(actor)
    ray.shutdown()


if __name__ == "__main__":
    main()
