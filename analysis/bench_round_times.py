"""Per-round seconds and the client actors' loads of a bench workload (docs/performance.md#scale).

    .venv/bin/python analysis/bench_round_times.py W2 [--rounds 7] [--set ray.balance=clients ...]

Runs one bench workload (W1, W2, W4:fedavg, W4:fedsoft, W4:fedavg@300, ...) on local Ray, as
``raysoft bench`` does but in this process and without the memory sampler, and prints one line
per round: its seconds, each actor's training samples (``actor_samples``), the clients trained
away from their actor (``clients_moved``); then the median of the rounds after the first
(warm-up) and before the last (which evaluates).
"""

from __future__ import annotations

import argparse
import statistics
import time

from raysoft.api import check_data
from raysoft.backends import run_backend
from raysoft.bench.workloads import workload_config
from raysoft.config import ConfigError, apply_overrides, parse_config
from raysoft.options import add_overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("--rounds", type=int, default=7)
    add_overrides(ap)
    args = ap.parse_args()
    try:
        cfg = check_data(parse_config(apply_overrides(workload_config(args.workload, args.rounds), args.overrides)))
    except ConfigError as err:
        ap.error(str(err))
    marks: list[tuple[float, dict]] = []
    run_backend(cfg, "round-times", lambda info: marks.append((time.monotonic(), info)))
    secs = []
    for (t0, _), (t1, info) in zip(marks, marks[1:]):
        secs.append(t1 - t0)
        print(f"round {info['round']}: {t1 - t0:.3f} s  actor_samples {info.get('actor_samples')}  "
              f"clients_moved {info.get('clients_moved')}")
    timed = secs[1:-1] or secs
    print(f"median over the {len(timed)} rounds after the first and before the last: {statistics.median(timed):.3f} s")


if __name__ == "__main__":
    main()
