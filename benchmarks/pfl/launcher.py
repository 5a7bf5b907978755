"""The launcher of ``python -m benchmarks.pfl``: it starts ``--workers`` ranks (pfl's worker
processes, ``PFL_WORKER_ADDRESSES``/``PFL_WORKER_RANK`` on 127.0.0.1 and a free port), waits for
them, ends them all when one fails, and completes rank 0's JSON with the wall clock. Standard
library only: it holds no torch while the ranks run (its memory counts in pfl's).

The ranks form one process group of their own (rank 0 leads it; the others join it), which
what they start joins too: pfl's cohort sampler runs in a ``multiprocess`` subprocess of a rank,
which a rank stopped in the middle of an all-reduce may leave behind. Ending the ranks ends that
group, so nothing has to walk the process table (psutil is not in pfl's venv)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .cli import NAME, RANK_FLAG, RankFailed, parser, say_error, sigterm_as_exit

ROOT = Path(__file__).resolve().parents[2]  # the folder holding benchmarks/, for the ranks' python -m


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def end(procs: list[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM to the ranks still running, SIGKILL to those still there after ``grace``, and
    to what is left of their process group (what they started and left behind)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if procs:
        try:
            os.killpg(procs[0].pid, signal.SIGKILL)  # the ranks' group: rank 0 leads it
        except OSError:  # the group is gone already
            pass


def rank_env(rank: int, workers: int, addresses: str) -> dict[str, str]:
    """A rank's environment: pfl's worker variables (none for a single rank), the CPU as
    pfl's device, and ``benchmarks`` importable."""
    env = dict(os.environ, PFL_PYTORCH_DEVICE="cpu")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if workers > 1:
        env.update(PFL_WORKER_ADDRESSES=addresses, PFL_WORKER_RANK=str(rank))
    else:
        env.pop("PFL_WORKER_ADDRESSES", None)
        env.pop("PFL_WORKER_RANK", None)
    return env


def start_ranks(args: argparse.Namespace, out: Path, scratch: Path, logs: list[Path]) -> list[subprocess.Popen]:
    """The ranks, started; each one's stderr in its log. pfl makes them a torch.distributed
    group at tcp://<the first address>; the other addresses only count the ranks."""
    port = free_port()
    addresses = ",".join(f"127.0.0.1:{port + r}" for r in range(args.workers))
    procs: list[subprocess.Popen] = []
    try:
        for r in range(args.workers):
            cmd = [sys.executable, "-m", "benchmarks.pfl", "--data", str(args.data.resolve()), "--out", str(out),
                   "--workers", str(args.workers), RANK_FLAG, str(scratch)]
            group = 0 if not procs else procs[0].pid  # rank 0 leads a new group, the others join it
            with open(logs[r], "w") as err:
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                              env=rank_env(r, args.workers, addresses), process_group=group))
    except BaseException:
        end(procs)
        raise
    return procs


def wait_ranks(procs: list[subprocess.Popen]) -> int | None:
    """Wait until every rank has ended or one failed; the first failed rank (None: all ended well)."""
    while any(p.poll() is None for p in procs):
        failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        if failed is not None:
            return failed
        time.sleep(0.1)
    return next((r for r, p in enumerate(procs) if p.returncode != 0), None)


def launch(args: argparse.Namespace) -> int:
    """Start ``--workers`` ranks, wait for them, finish rank 0's JSON."""
    if args.workers < 1:
        raise ValueError("--workers must be at least 1")
    if not args.data.is_file():
        raise FileNotFoundError(f"no data file {args.data}")
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)  # rank 0 writes it afresh
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="raysoft-pfl-") as scratch_dir:
        scratch = Path(scratch_dir)
        logs = [scratch / f"rank{r}.err" for r in range(args.workers)]
        procs = start_ranks(args, out, scratch, logs)
        try:
            failed = wait_ranks(procs)
        finally:
            end(procs)
        if failed is not None:
            line = last_line(logs[failed]) or f"exit {procs[failed].returncode}"
            prefix = f"{NAME}: error: "
            raise RankFailed(f"rank {failed}: {line[len(prefix):] if line.startswith(prefix) else line}")
    result = json.loads(out.read_text())
    result["total_s"] = time.perf_counter() - t0
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The launcher: the result's path as the last line of stdout (exit 0), or one line on
    stderr (exit 1)."""
    args = parser().parse_args(argv)
    sigterm_as_exit()  # end the ranks as on Ctrl-C rather than die at once
    try:
        launch(args)
    except BaseException as exc:  # one line on stderr for any failure
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            raise
        say_error(exc)
        return 1
    print(args.out.resolve(), flush=True)
    return 0
