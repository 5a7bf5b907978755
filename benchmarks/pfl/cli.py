"""The arguments of ``python -m benchmarks.pfl`` (the launcher's and its ranks') and its one-line
errors. Standard library only."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

NAME = "benchmarks/pfl"  # how its errors begin: "benchmarks/pfl: error: ..."
RANK_FLAG = "--rank-process"  # set by the launcher on the ranks it starts


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pfl",
                                     description="W1 (FedSoft) and W2 (FedAvg) in pfl's simulation")
    parser.add_argument("--data", required=True, type=Path, help="the benchmark's .npz (from raysoft's bare loop)")
    parser.add_argument("--out", required=True, type=Path, help="where to write the result JSON")
    parser.add_argument("--workers", type=int, default=2, help="pfl worker processes (ranks); default 2, one per core")
    parser.add_argument(RANK_FLAG, dest="state_dir", type=Path, help=argparse.SUPPRESS)
    return parser


class RankFailed(Exception):
    """A rank's own one-line error, passed on by the launcher."""


def one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, RankFailed) else f"{type(exc).__name__}: {exc}"
    return text.replace("\n", " ").strip()


def say_error(exc: BaseException) -> None:
    """The one line on stderr a failure (or an interruption) ends with."""
    msg = "interrupted" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else one_line(exc)
    sys.stdout.flush()
    print(f"{NAME}: error: {msg}", file=sys.stderr, flush=True)


def sigterm_as_exit() -> None:
    """SIGTERM ends the process as Ctrl-C would (through ``finally`` blocks), not at once."""

    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
