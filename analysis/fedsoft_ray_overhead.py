"""What running on Ray adds to a W4-FedSoft round (docs/performance.md#where-a-w3-upload-goes).

    .venv/bin/python analysis/fedsoft_ray_overhead.py [--rounds 3]

Runs the bench's W4-FedSoft (N = 1,000) for ``--rounds`` rounds in one process
(``ray.backend: inprocess``: every client on one thread, one after another) and on Ray (two
one-thread client actors), each in a fresh process, and prints each round's seconds on both and
their ratio. Two one-thread actors side by side run these kernels at 1.9-2.0x one thread
(analysis/two_actor_rates.py), so a ratio well below that is what the Ray backend adds: moving centers
and states, the coordinator, an actor left idle. The results are the same on both backends
(tests/e2e/test_digests.py).
"""

from __future__ import annotations

import argparse

from raysoft.bench import workload_config
from raysoft.bench.worker import call_in_fresh_process


def round_seconds(backend: str, rounds: int) -> list[float]:
    """Seconds of each round of W4-FedSoft on ``backend`` (in a fresh process: a Ray of its own)."""
    from raysoft.bench.worker import run_raysoft

    raw = workload_config("W4:fedsoft", rounds)
    raw["ray"] = {**raw.get("ray", {}), "backend": backend}
    return list(run_raysoft("W4", raw)["sec_per_round_all"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each run (the last evaluates)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds: rounds of each run, at least 1 (got {args.rounds})")
    seconds = {}
    for backend in ("inprocess", "ray"):
        seconds[backend] = call_in_fresh_process(round_seconds, backend, args.rounds, timeout=7200)
    print("| round | s in one process | s on Ray (two actors) | one process / Ray |")
    print("|---|---|---|---|")
    for t, (one, ray) in enumerate(zip(seconds["inprocess"], seconds["ray"])):
        print(f"| {t} | {one:.1f} | {ray:.1f} | {one / ray:.2f}x |")


if __name__ == "__main__":
    main()
