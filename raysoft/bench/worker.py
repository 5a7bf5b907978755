"""One (workload, system) measurement, run in a subprocess of ``raysoft bench`` so that the
memory sampler sees that system's process tree alone."""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..config import parse_config
from .bare import bare_fedavg, bare_fedsoft
from .workloads import DEFAULT_GPU_SHARE, FEDAVG_FLOORS, on_gpu, workload_config

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

    import pyarrow as pa

    from ..config import Config

T = TypeVar("T")


def _quality_of(tables: Mapping[str, pa.Table], summary: Mapping[str, object], workload: str) -> tuple[float, str]:
    """W1: mean over distributions of the best center's MSE; W2 and W5 (FedAvg): the mean
    holdout accuracy of the global model; W3: the mean cluster-model accuracy of the last
    evaluation."""
    m = tables["metrics"].to_pandas()
    m = m[(m["scope"] == "cluster") & (m["step"] == m["step"].max())]
    if workload == "W1":
        best = m[m["metric"] == "mse"].groupby("eval_dist")["value"].min()
        return float(best.mean()), "center mse"
    acc = m[m["metric"] == "accuracy"]
    if workload in ("W2", "W5"):
        return float(acc[acc["entity"] == 0]["value"].mean()), "accuracy"
    return float(acc.groupby("eval_dist")["value"].max().mean()), "cluster accuracy"


def stream_rounds(marks: list[tuple[float, int]], work: Sequence[Mapping[str, float]],
                  n: int) -> tuple[list[float], list[dict[str, float]]]:
    """A stream's "rounds" of ``n`` uploads from its steps' progress marks (time, uploads applied
    so far) and the work reported with each: consecutive steps are taken together until they
    applied at least ``n`` uploads (a last group may hold fewer), and each group's seconds and
    work are scaled to ``n`` uploads. A step applies a varying number of uploads (it trains the
    clients whose replies are due, then applies uploads up to the next one not computed), so
    one step alone is a poor sample of the rate."""
    times: list[float] = []
    done: list[dict[str, float]] = []
    dt, du, acc = 0.0, 0, {}  # type: ignore[var-annotated]
    for (t0, r0), (t1, r1), w in zip(marks, marks[1:], work[1:]):
        dt, du = dt + t1 - t0, du + r1 - r0
        for kind, v in w.items():
            acc[kind] = acc.get(kind, 0) + v
        if du >= n:
            times.append(dt * n / du)
            done.append({kind: v * n / du for kind, v in acc.items()})
            dt, du, acc = 0.0, 0, {}
    if du > 0:
        times.append(dt * n / du)
        done.append({kind: v * n / du for kind, v in acc.items()})
    return times, done


def _call_and_put(out: Queue[tuple[bool, object]], fn: Callable[..., object], args: tuple[object, ...]) -> None:
    try:
        out.put((True, fn(*args)))
    except Exception:  # noqa: BLE001 - whatever fn raises: the parent raises it, with this traceback
        out.put((False, traceback.format_exc()))


def call_in_fresh_process(fn: Callable[..., T], *args: object, timeout: float) -> T:
    """``fn(*args)`` in a fresh (spawned) process, e.g. a run with a Ray of its own; its value
    (picklable). Raises TimeoutError, and kills the process, if it has not answered within
    ``timeout`` seconds; RuntimeError with the child's traceback if ``fn`` raised."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_call_and_put, args=(out, fn, args))
    proc.start()
    try:
        ok, value = out.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"{getattr(fn, '__name__', fn)} did not answer within {timeout:g} s") from None
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if not ok:
        raise RuntimeError(f"{getattr(fn, '__name__', fn)} failed in its process:\n{value}")
    return value


def _window(times: list[float]) -> tuple[float, float] | None:
    """The span of the timed rounds (after the warm-up) between progress marks at ``times``."""
    if len(times) < 2:
        return None
    return times[1] if len(times) > 2 else times[0], times[-1]


def run_raysoft(workload: str, raw: Mapping[str, object]) -> dict[str, object]:
    from ..api import check_data
    from ..backends import run_backend

    cfg = check_data(parse_config(raw))
    marks: list[tuple[float, int, int]] = []
    coordinator: list[tuple[float, int]] = []  # per round: busy seconds, bytes through it
    evaluations: list[tuple[float, int]] = []  # per evaluation after the first: its seconds, samples passed forward
    work: list[dict[str, int]] = []  # per mark: the samples of each kind of work since the last

    def on_progress(info: dict[str, Any]) -> None:
        marks.append((time.monotonic(), int(info["round"]), int(info.get("trained") or 0)))
        work.append(dict(info.get("work") or {}))
        if "coordinator_busy_s" in info:
            coordinator.append((float(info["coordinator_busy_s"]), int(info["coordinator_bytes"])))
        if "evaluate_s" in info:
            w = info.get("work") or {}
            evaluations.append((float(info["evaluate_s"]), sum(int(w.get(k, 0)) for k in EVAL_WORK)))

    start = time.monotonic()
    tables, summary = run_backend(cfg, "bench", on_progress)
    total = time.monotonic() - start
    if workload == "W3":  # a "round" is N uploads; the first advance is the initial evaluation
        times, done_w3 = stream_rounds([(m[0], m[1]) for m in marks[1:]], work[1:], cfg.data.clients)
        done: Sequence[Mapping[str, float]] = done_w3
        updates = [cfg.data.clients] * len(times)
    else:
        times = [b[0] - a[0] for a, b in zip(marks, marks[1:])]
        updates = [b[2] for b in marks[1:]]
        done = work[1:]
    quality, metric = _quality_of(tables, summary, workload)
    joined = None
    if workload == "W3":  # the upload by which every client has uploaded once (the stream's warm-up)
        rows = tables["metrics"].to_pandas()
        before = rows[(rows["scope"] == "client") & (rows["metric"] == "accuracy_before")]
        firsts = before.groupby("entity")["step"].min()
        joined = int(firsts.max()) if len(firsts) == cfg.data.clients else None
    return {"joined": joined,
            "sec_per_round_all": times, "updates": updates, "quality": quality, "quality_metric": metric,
            "total_s": total, "timed_window": _window([m[0] for m in marks]),
            "coordinator_busy_s_all": [c[0] for c in coordinator],
            "coordinator_bytes_all": [c[1] for c in coordinator], "work_all": done,
            "marks": [(m[0], m[1]) for m in marks],  # (time.monotonic(), round or upload) of each step
            **final_evaluation(workload, cfg, evaluations)}


EVAL_WORK = ("holdout", "evaluate", "served")  # the kinds of work of a synchronous evaluation
EVAL_TIMED = ("W5",)  # workloads whose final all-client evaluation is timed beside its floor


def final_evaluation(workload: str, cfg: Config, evaluations: list[tuple[float, int]]) -> dict[str, float]:
    """``eval_s``: the seconds of the run's final evaluation (every center on the holdout sets,
    every client's evaluate op and its served model on its test split), and ``eval_floor_s``:
    the floor of its forward passes (the samples it passed forward at one forward pass's FLOP,
    :func:`~raysoft.bench.floor.forward_flop_per_sample`, at this sitting's matrix rate), for
    the workloads of :data:`EVAL_TIMED`; nothing for the others."""
    if workload.partition("@")[0] not in EVAL_TIMED or not evaluations:
        return {}
    from .floor import device_rate, forward_flop_per_sample

    seconds, samples = evaluations[-1]
    rate, _ = device_rate("cuda" if cfg.ray.num_gpus_per_actor else "cpu")
    return {"eval_s": seconds, "eval_samples": samples,
            "eval_floor_s": samples * forward_flop_per_sample(cfg) / 1e9 / rate}


def worker(system: str, workload: str, rounds: int, quick: bool, out: Path, export: Path | None = None,
           device: str = "cpu", gpu_share: float = DEFAULT_GPU_SHARE) -> int:
    """Measure ``system`` on ``workload`` and write the result to the JSON file ``out`` (``export``:
    where the bare loop writes its clients for Flower and pfl). Started by :func:`raysoft.bench.bench`
    as ``python -m raysoft.bench [--device cuda --gpu-share S] --worker SYSTEM WORKLOAD ROUNDS QUICK
    OUT_JSON [EXPORT]`` (QUICK: 1 or 0), whose arguments raysoft/cli.py parses. ``device="cuda"``:
    raysoft's client actors on ``gpu_share`` of the GPU each (:func:`on_gpu`), the bare loop on
    the GPU, the floor at the GPU's matrix rate."""
    raw = workload_config(workload, rounds, quick)
    if system == "raysoft":
        res = run_raysoft(workload, on_gpu(raw, gpu_share) if device == "cuda" else raw)
    elif system == "floor":
        from .floor import floor_of_run, floor_w2

        # W2's and W5's floors follow FedAvg's selection stream; the others' count the work of
        # raysoft's own run of the workload (``export``: its result), which must come first
        if workload.partition("@")[0] in FEDAVG_FLOORS:
            res = floor_w2(raw, device)
        elif export is None:
            raise ValueError(f"the floor of {workload} needs raysoft's result of the workload (EXPORT)")
        else:
            res = floor_of_run(workload, raw, json.loads(Path(export).read_text()), device)
    elif workload == "W1":
        res = bare_fedsoft(raw, export, device)
    else:
        res = bare_fedavg(raw, export, device)
    out.write_text(json.dumps(res))
    return 0
