"""One rank of ``python -m benchmarks.pfl`` (started by :mod:`.launcher` with pfl's worker
variables): it loads the data file, runs W1 (:mod:`.fedsoft`) or W2 (:mod:`.fedavg`) with the
other ranks, and (rank 0) writes the result's JSON."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from pfl.internal.ops.selector import get_default_framework_module as get_ops

from .cli import parser, say_error, sigterm_as_exit
from .common import scalar, write_result
from .fedavg import run_fedavg
from .fedsoft import run_fedsoft


def rank_main(args: argparse.Namespace) -> dict:
    world = max(1, int(args.workers))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    with np.load(args.data) as data:
        seed = int(scalar(data, "seed"))
        # the same global seeds on every rank: pfl draws its datasets' and algorithms' random
        # states from numpy's global one, and expects them equal on all workers
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
        algorithm = str(scalar(data, "algorithm"))
        if algorithm == "fedavg":
            result = run_fedavg(data, args.out)
        elif algorithm == "fedsoft":
            result = run_fedsoft(data, args.out, args.state_dir)
        else:
            raise ValueError(f"unknown algorithm {algorithm!r} in the data file")
    if get_ops().distributed.global_rank == 0:
        write_result(args.out.resolve(), result)
    return result


def _end_subprocesses() -> None:
    """pfl's cohort sampler (W2 on several ranks) runs in a ``multiprocess`` subprocess that
    only an atexit hook would end."""
    try:
        import multiprocess

        for child in multiprocess.active_children():
            child.terminate()
            child.join(5)
    except Exception:  # noqa: BLE001 - best effort
        pass


def main(argv: list[str]) -> int:
    """A rank: its work, then (any failure: one line on stderr) an exit that no thread of
    torch.distributed or pfl can hold up."""
    args = parser().parse_args(argv)
    sigterm_as_exit()
    code = 0
    try:
        rank_main(args)
    except BaseException as exc:  # noqa: BLE001 - one line on stderr for any failure
        code = 1
        say_error(exc)
    _end_subprocesses()
    sys.stdout.flush()
    sys.stderr.flush()
    # not sys.exit: a thread of torch.distributed or pfl must not keep a rank alive
    os._exit(code)
