"""What ``ray.trim_memory`` costs in time (docs/performance.md, "What the trim costs").

    .venv/bin/python analysis/trim_memory_cost.py [--workload W1 W3] [--pairs 2]

Runs each workload of the bench on Ray with ``ray.trim_memory`` on and off, alternately
(``--pairs`` times each, so that both settings share the machine's state), and prints the
median seconds per round of each setting over its runs (a W3 round is N uploads, as the bench
counts it) and their ratio. The results are the same either way (tests/backends/test_allocator.py).
"""

from __future__ import annotations

import argparse
import statistics

from raysoft.bench import round_stats, workload_config
from raysoft.bench.worker import call_in_fresh_process
from raysoft.bench.workloads import DEFAULT_ROUNDS
from raysoft.config import ConfigError


def seconds_per_round(workload: str, trim: bool) -> float:
    """The bench's seconds per round of raysoft on ``workload`` (run in a fresh process: a Ray of its own)."""
    from raysoft.bench.worker import run_raysoft

    name = workload.split(":")[0]
    raw = workload_config(workload, DEFAULT_ROUNDS[name])
    raw["ray"] = {**raw.get("ray", {}), "trim_memory": trim}
    run = run_raysoft(name, raw)
    return round_stats(run["sec_per_round_all"], run["updates"])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload", nargs="+", default=["W1", "W3"], help="bench workloads (W1, W2, W3, W4:fedsoft, ...)"
    )
    parser.add_argument("--pairs", type=int, default=2, help="runs of each setting")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error(f"--pairs: runs of each setting, at least 1 (got {args.pairs})")
    for workload in args.workload:
        try:
            workload_config(workload, 1)
        except ConfigError as e:
            parser.error(str(e))
    print("| workload | s / round, trim on | s / round, trim off | on / off |")
    print("|---|---|---|---|")
    for workload in args.workload:
        seconds: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.pairs):
            for trim in (True, False):
                seconds[trim].append(call_in_fresh_process(seconds_per_round, workload, trim, timeout=3600))
        on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
        print(f"| {workload} | {on:.3f} | {off:.3f} | {on / off:.3f} |")


if __name__ == "__main__":
    main()
