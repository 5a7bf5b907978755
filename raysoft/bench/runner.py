"""``raysoft bench``'s orchestration: every (workload, system) in a subprocess of its own
(Flower and pfl in their venvs, by the checkout's ``benchmarks/``: :mod:`.peers`), their timings
and peak memory in ``bench.parquet`` and ``bench.md``; with ``--device cuda`` on the GPU, with the
GPU's utilisation and memory per row (:mod:`.gpu`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict, TypeVar

import numpy as np

from ..config import ConfigError
from ..errors import first_line
from ..results import atomic_path
from .gpu import GpuSampler, cuda_available
from .memory import PeakSampler, tree_memory_mb
from .peers import MISSING, harness_module, load_harness, peer_venv

if TYPE_CHECKING:
    import pandas as pd

from .workloads import (
    DEFAULT_GPU_SHARE,
    DEFAULT_ROUNDS,
    FEDAVG_FLOORS,
    PEERS,
    SYSTEMS,
    gpu_actors,
    variants,
    workload_config,
)

DEVICES = ("cpu", "cuda")

COLUMNS = [
    "workload",
    "system",
    "algorithm",
    "clients",
    "sec_per_round",
    "updates_per_s",
    "peak_rss_mb",
    "peak_pss_mb",
    "rounds",
    "updates_per_round",
    "quality",
    "quality_metric",
    "total_s",
    "coordinator_busy_s",
    "coordinator_mb",
    "device",
    "gpu_util_pct",
    "gpu_util_max_pct",
    "peak_gpu_mb",
    "eval_s",  # W5: raysoft's final all-client evaluation, seconds
    "eval_floor_s",  # and the floor of its forward passes
]


class Measurement(TypedDict):
    """A measurement's result, as the worker (or a peer's harness, in the runner's terms) writes
    it to its JSON file: seconds of each round, client updates of each round, the quality
    reached, and the extra series of the systems that have them."""

    sec_per_round_all: list[float]
    updates: list[int]
    quality: float
    quality_metric: str
    total_s: float
    timed_window: NotRequired[list[float] | None]  # (start, end) of the timed rounds, monotonic seconds
    coordinator_busy_s_all: NotRequired[list[float]]
    coordinator_bytes_all: NotRequired[list[int]]
    eval_s: NotRequired[float]
    eval_floor_s: NotRequired[float]
    joined: NotRequired[int | None]  # W3: the upload by which every client has uploaded once
    work_all: NotRequired[list[dict[str, float]]]  # raysoft's: per timed round, the samples of each kind of work
    marks: NotRequired[list[tuple[float, int]]]  # raysoft's: (monotonic time, round or upload) of each step


class PeerResult(TypedDict, total=False):
    """What Flower's or pfl's harness (benchmarks/) writes: Flower's quality is its accuracy
    and its updates a fixed number of clients per round; pfl's are in the runner's terms."""

    sec_per_round: list[float]
    total_s: float
    timed_window: list[float] | None
    accuracy: float  # Flower
    clients_per_round: int  # Flower
    quality: float  # pfl
    quality_metric: str  # pfl
    updates: list[int]  # pfl


T = TypeVar("T")


def coordinator_stats(res: Measurement) -> tuple[float, float]:
    """(median busy seconds, median MB through the coordinator) over the timed rounds (after the
    warm-up), NaN for a system without a coordinator."""
    busy, sent = res.get("coordinator_busy_s_all") or [], res.get("coordinator_bytes_all") or []
    if not busy:
        return float("nan"), float("nan")
    return float(np.median(busy[1:] or busy)), float(np.median(sent[1:] or sent)) / 2**20



def round_stats(times: list[float], updates: list[int]) -> tuple[float, float]:
    """(median seconds per round after the warm-up round, client updates per second over the
    same rounds)."""
    if not times:
        raise ValueError("no rounds were timed")
    timed = times[1:] or times
    done = updates[1:] or updates
    return float(np.median(timed)), float(sum(done) / sum(timed))


DEFAULT_TIMEOUT_S = 7200.0  # one measurement (a system on a workload); W3's long run takes about 40 min here


def check_timeout(timeout: float) -> None:
    if not timeout > 0:
        raise ConfigError(f"--timeout: seconds a measurement may take, above 0 (got {timeout:g})")


def _measure(label: str, cmd: list[str], out_json: Path, timeout: float | None,
             series: bool = False) -> tuple[Measurement, PeakSampler]:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # always a fresh local Ray of the subprocess's own
    with tempfile.TemporaryFile() as err:
        # its own process group (Ray's processes join it): a timeout kills all of them
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
        with PeakSampler(proc.pid, series=series) as sampler:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise RuntimeError(f"{label}: timed out after {timeout:g} s (--timeout)") from None
        if code != 0:
            err.seek(0)
            lines = [ln for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
            raise RuntimeError(f"{label}: exit {code}: {lines[-1] if lines else ''}")
    return json.loads(out_json.read_text()), sampler


def _run_peer(system: str, venv_dir: Path, export: Path, out_json: Path,
              timeout: float | None, gpu_share: float = 0.0) -> tuple[Measurement, PeakSampler]:
    """Flower or pfl, from its venv (made first if need be), on the bare loop's ``export``; its
    result in the runner's terms and its memory (the peak of this process and its children,
    less this process's own). ``gpu_share`` > 0: Flower's clients on that share of the GPU each,
    as many actors as the GPU holds."""
    if system == "flower":
        flower = harness_module("flower_env")
        python = flower.ensure_flower_venv(venv_dir)
        actors = gpu_actors(gpu_share) if gpu_share > 0 else 2

        def run() -> PeerResult:
            return flower.run_flower(python, export, out_json, num_actors=actors, timeout=timeout,
                                     gpu_share=gpu_share)
    else:
        pfl = harness_module("pfl_env")
        python = pfl.ensure_pfl_venv(venv_dir)

        def run() -> PeerResult:
            return pfl.run_pfl(python, export, out_json, workers=2, timeout=timeout)

    own = tree_memory_mb(os.getpid())  # this process alone: no children now
    with PeakSampler(os.getpid()) as sampler:  # this process plus the peer's tree
        peer = run()
    # the peer's tree: the peak less this process. Never below 0: this process's PSS share of
    # pages it shares with others (torch's libraries) falls when another process maps them too
    sampler.peak, sampler.peak_pss = max(0.0, sampler.peak - own[0]), max(0.0, sampler.peak_pss - own[1])
    times = peer["sec_per_round"]
    if system == "flower":
        quality, metric, updates = peer["accuracy"], "accuracy", [peer["clients_per_round"]] * len(times)
    else:
        quality, metric, updates = peer["quality"], peer["quality_metric"], peer["updates"]
    return {"sec_per_round_all": times, "quality": quality, "quality_metric": metric, "total_s": peer["total_s"],
            "updates": updates, "timed_window": peer.get("timed_window")}, sampler


def peer_skip(system: str, venv_dir: str, device: str) -> str | None:
    """Why a peer is left out of this bench (None: it runs): ``skip`` asked for; no harness
    (:data:`~raysoft.bench.peers.MISSING`: raysoft not run from a checkout); on cuda, pfl (its
    script trains on the CPU) and a Flower venv not made yet (the GPU machine has no network to
    make one)."""
    if venv_dir == "skip":
        return "skip"
    if load_harness() is None:
        return MISSING
    if device != "cuda":
        return None
    if system == "pfl":
        return "pfl's script trains on the CPU: not a GPU peer"
    if not harness_module("flower_env").flower_venv_ready(Path(venv_dir)):
        return f"no complete Flower venv at {venv_dir} (on cuda it is not made: make it beforehand)"
    return None


def row(workload: str, system: str, cfg: Mapping[str, Mapping[str, object]], res: Measurement, peak_rss: float,
        peak_pss: float, device: str = "cpu", gpu: dict[str, float] | None = None) -> dict[str, object]:
    """One row of the bench table from a measurement's result ``res`` (the worker's JSON, or a
    peer's in the runner's terms), its peak memory and, on cuda, its GPU columns
    (:func:`raysoft.bench.gpu.gpu_summary`; NaN without)."""
    sec, ups = round_stats(res["sec_per_round_all"], res["updates"])
    busy, mb = coordinator_stats(res)
    nan = float("nan")
    gpu = gpu or {}
    return {"workload": workload, "system": system, "algorithm": cfg["algorithm"]["name"],
            "clients": cfg["data"]["clients"], "sec_per_round": sec, "updates_per_s": ups,
            "peak_rss_mb": peak_rss, "peak_pss_mb": peak_pss, "rounds": len(res["sec_per_round_all"]),
            "updates_per_round": float(np.mean(res["updates"])), "quality": res["quality"],
            "quality_metric": res["quality_metric"], "total_s": res["total_s"],
            "coordinator_busy_s": busy, "coordinator_mb": mb, "device": device,
            "gpu_util_pct": gpu.get("gpu_util_pct", nan), "gpu_util_max_pct": gpu.get("gpu_util_max_pct", nan),
            "peak_gpu_mb": gpu.get("peak_gpu_mb", nan), "eval_s": res.get("eval_s", nan),
            "eval_floor_s": res.get("eval_floor_s", nan)}


def bench(workloads: list[str], rounds: int | None, out: Path, quick: bool, flower: str,
          timeout: float | None = None, clients: int | None = None, pfl: str | None = None,
          device: str = "cpu", gpu_share: float = DEFAULT_GPU_SHARE) -> pd.DataFrame:
    """Run every (workload, system); write ``bench.parquet`` and return its table. ``clients``:
    W4's population (default 1,000); ``flower``, ``pfl``: those peers' venvs, or ``"skip"``;
    ``device="cuda"``: every system on the GPU (raysoft's and Flower's client actors on
    ``gpu_share`` of it each), nvidia-smi sampled during each measurement."""
    rows: list[dict[str, object]] = []
    scratch = Path(tempfile.mkdtemp(prefix="raysoft-bench-"))
    runs = [(w, v + (f"@{clients}" if clients and w == "W4" else "")) for w in workloads for v in variants(w)]
    device_args = ["--device", device, "--gpu-share", repr(gpu_share)] if device == "cuda" else []
    said_missing = False
    for w, name in runs:
        r = rounds or (3 if quick else DEFAULT_ROUNDS[w])  # W3: rounds of N uploads (0: 200 uploads)
        cfg = workload_config(name, 2, quick)
        export = scratch / f"{w}.npz"
        for system in SYSTEMS[w]:
            res_path = scratch / f"{name.replace(':', '-')}-{system}.json"
            gpu = GpuSampler() if device == "cuda" else None
            if system in PEERS:
                venv_dir = {"flower": flower, "pfl": pfl or str(peer_venv("pfl"))}[system]
                why = peer_skip(system, venv_dir, device)
                if why is not None:
                    if why == MISSING and not said_missing:  # one line for every peer row
                        print(f"flower, pfl: left out: {MISSING}", file=sys.stderr)
                        said_missing = True
                    elif why not in ("skip", MISSING):
                        print(f"{name} {system}: left out: {why}", file=sys.stderr)
                    continue
                with gpu if gpu is not None else nullcontext():
                    res, sampler = _run_peer(system, Path(venv_dir), export, res_path, timeout,
                                             gpu_share if device == "cuda" else 0.0)
            else:
                # the bare W1 and W2 loops export their clients for Flower and pfl; W3's and W4's
                # floors read raysoft's run
                extra = ([str(export)] if system == "bare" and w in ("W1", "W2") else
                         [str(scratch / f"{name.replace(':', '-')}-raysoft.json")]
                         if system == "floor" and w not in FEDAVG_FLOORS else [])
                cmd = [sys.executable, "-m", "raysoft.bench", *device_args, "--worker", system, name, str(r),
                       "1" if quick else "0", str(res_path)] + extra
                with gpu if gpu is not None else nullcontext():
                    res, sampler = _measure(f"{name} {system}", cmd, res_path, timeout)
            window = res.get("timed_window")
            summary = gpu.summary((window[0], window[1]) if window else None) if gpu is not None else None
            rows.append(row(w, system, cfg, res, sampler.peak, sampler.peak_pss, device, summary))
            new = rows[-1]
            gpu_text = (f", GPU {new['gpu_util_pct']:.0f}% busy, {new['peak_gpu_mb']:.0f} MB"
                        if gpu is not None and gpu.available else "")
            print(f"{name} {system}: {new['sec_per_round']:.3f} s/round, {new['updates_per_s']:.1f} updates/s, "
                  f"peak RSS {sampler.peak:.0f} MB, PSS {sampler.peak_pss:.0f} MB{gpu_text}", file=sys.stderr)
            write_table(rows, out)  # after every row: a later failure or timeout keeps the rows so far
    return write_table(rows, out)


def write_table(rows: list[dict[str, object]], out: Path) -> pd.DataFrame:
    """``bench.parquet`` (atomically) and ``bench.md`` in ``out`` from the rows so far; the table."""
    import pandas as pd

    table = pd.DataFrame(rows, columns=COLUMNS)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "bench.parquet") as tmp:
        table.to_parquet(tmp, index=False)
    with atomic_path(out / "bench.md") as tmp:
        tmp.write_text(markdown(table))
    return table


def _count(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and np.isnan(value)) else f"{int(value):,}"


def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None or np.isnan(value) else format(value, fmt)


def on_cuda(table: pd.DataFrame) -> bool:
    """Whether any row of the bench table ran on the GPU."""
    return "device" in table.columns and bool((table["device"] == "cuda").any())


def markdown(table: pd.DataFrame) -> str:
    """The bench table, with raysoft's speed-up over each other system of the same workload (the
    floor's is below 1: raysoft's seconds are that many times the floor's); a table with rows
    on the GPU has two more columns: the GPU's mean (highest) utilisation over the timed rounds
    and its peak memory."""
    gpu = on_cuda(table)
    lines = [
        "| workload | system | algorithm | N | s / round | updates / s | peak RSS (MB) | peak PSS (MB) | quality | "
        "raysoft speed-up | coordinator busy (s / round) | through the coordinator (MB / round) |"
        + (" GPU busy (%, mean / max) | peak GPU memory (MB) |" if gpu else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if gpu else ""),
    ]
    for _, r in table.iterrows():
        ray = table[(table["workload"] == r["workload"]) & (table["system"] == "raysoft")
                    & (table["algorithm"] == r["algorithm"])]["sec_per_round"]  # W4: each algorithm's own
        ratio = "–" if r["system"] == "raysoft" or ray.empty else f"{r['sec_per_round'] / float(ray.iloc[0]):.2f}×"
        quality = _num(r["quality"], ".4g")
        lines.append(f"| {r['workload']} | {r['system']} | {r.get('algorithm', '–')} | {_count(r.get('clients'))} | "
                     f"{r['sec_per_round']:.3f} | "
                     f"{r['updates_per_s']:.1f} | {r['peak_rss_mb']:.0f} | {r['peak_pss_mb']:.0f} | {quality} "
                     f"({r['quality_metric']}) | {ratio} | {_num(r.get('coordinator_busy_s'), '.3f')} | "
                     f"{_num(r.get('coordinator_mb'), '.1f')} |" + (gpu_cells(r) if gpu else ""))
    lines += evaluation_lines(table)
    return "\n".join(lines) + "\n"


def evaluation_lines(table: pd.DataFrame) -> list[str]:
    """Below the table, for each row with a timed final evaluation (W5's raysoft row): its
    seconds beside the floor of its forward passes."""
    if "eval_s" not in table.columns:
        return []
    out = []
    for _, r in table[table["eval_s"].notna()].iterrows():
        ratio = r["eval_s"] / r["eval_floor_s"] if r["eval_floor_s"] > 0 else float("nan")
        out.append(f"{r['workload']} {r['system']}: the final evaluation of all {_count(r.get('clients'))} clients "
                   f"took {r['eval_s']:.3f} s; the floor of its forward passes is {r['eval_floor_s']:.3f} s "
                   f"({_num(ratio, '.2f')}×).")
    return [""] + out if out else []


def gpu_cells(r: pd.Series) -> str:
    """A row's two GPU cells: "mean / max" utilisation and peak memory ("–" where not sampled)."""
    util, top = r.get("gpu_util_pct"), r.get("gpu_util_max_pct")
    busy = "–" if util is None or np.isnan(util) else f"{util:.0f} / {_num(top, '.0f')}"
    return f" {busy} | {_num(r.get('peak_gpu_mb'), '.0f')} |"


def check_request(workloads: list[str], rounds: int | None, timeout: float, min_rounds: int, why: str) -> None:
    """Refuse (:class:`~raysoft.config.ConfigError`) a bench request that cannot run: a timeout
    not above 0, an unknown workload, or fewer than ``min_rounds`` rounds (``why`` says why)."""
    check_timeout(timeout)
    for w in workloads:
        workload_config(w, 2)
    if rounds is not None and rounds < min_rounds:
        raise ConfigError(f"--rounds: {why}")


def command(measure: Callable[[], T], markdown: Callable[[T], str], out: str | Path,
            failures: tuple[type[Exception], ...] = (RuntimeError,)) -> int:
    """Run one bench command's ``measure``: print its table, then (last line) the directory
    holding its files, and return 0. Bad input: one line on stderr, exit 2; a failure of the
    kinds ``failures``: one line, exit 1."""
    try:
        table = measure()
    except ConfigError as err:
        print(f"raysoft bench: {err}", file=sys.stderr)
        return 2
    except failures as err:
        print(f"raysoft bench: {first_line(err)}", file=sys.stderr)
        return 1
    print(markdown(table), end="")
    print(Path(out).resolve())
    return 0


def check_device(device: str, gpu_share: float, has_cuda: Callable[[], bool] = cuda_available) -> None:
    """Refuse (:class:`~raysoft.config.ConfigError`, one line) ``--device cuda`` where torch
    finds no CUDA, an unknown device, and a GPU share outside (0, 1]."""
    if device not in DEVICES:
        raise ConfigError(f"--device: cpu or cuda (got {device!r})")
    gpu_actors(gpu_share)
    if device == "cuda" and not has_cuda():
        raise ConfigError("--device cuda: torch finds no CUDA on this machine (torch.cuda.is_available() is False); "
                          "run it on a machine with an NVIDIA GPU, or use --device cpu")


def main(workloads: list[str], rounds: int | None, out: str | Path, quick: bool, flower: str,
         clients: int | None = None, pfl: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
         device: str = "cpu", gpu_share: float = DEFAULT_GPU_SHARE) -> int:
    """``raysoft bench`` once raysoft/cli.py has parsed it: prints the bench table, then (last
    line) the directory holding bench.parquet. Bad input (``--device cuda`` without CUDA
    included, refused before anything starts): one line on stderr, exit 2; a system that fails
    or outlasts ``timeout`` seconds (each measurement): one line, exit 1."""

    def measure() -> pd.DataFrame:
        check_device(device, gpu_share)
        check_request(workloads, rounds, timeout, 2, "needs at least 2 (the first is the warm-up)")
        if flower != "skip" or pfl != "skip":
            load_harness()  # a RAYSOFT_BENCHMARKS that is no harness: refused before anything runs
        if clients is not None:
            if "W4" not in workloads:
                raise ConfigError("--clients: sets W4's population; add W4 to --workload")
            workload_config(f"W4@{clients}", 2)
        return bench(workloads, rounds, Path(out), quick, flower, timeout=timeout, clients=clients, pfl=pfl,
                     device=device, gpu_share=gpu_share)

    return command(measure, markdown, out)
