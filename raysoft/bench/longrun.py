"""``raysoft bench --long-run``: does a long simulation's memory stay flat?

Simulators whose memory grows round after round until the process is killed are a known
failure of FL tools. The long-run mode runs raysoft alone on each workload for many rounds
(W1 1,000 rounds, W2 100, W3 2,000 uploads; ``--rounds`` overrides, in rounds of N uploads for
W3) while the sampler of :mod:`.memory` records the whole process tree's RSS and PSS every
``interval`` seconds, each sample tagged with the round (W3: upload) it fell in. It writes
``memory.parquet`` (``workload``, ``elapsed_s``, ``round``, ``rss_mb``, ``pss_mb``),
``processes.parquet`` (the same samples per process: ``workload``, ``elapsed_s``, ``round``,
``pid``, ``role``, ``pss_mb``; roles as :func:`raysoft.bench.memory.role` names them: driver,
``ray::CoordinatorActor``, ``ray::ClientActor``, raylet, ...), ``memory.md`` (per workload: the
PSS after warm-up and its growth; then the same per role, so that a growth is attributed to the
processes that grow) and ``memory.png`` (each round's peak PSS against the round, a panel per
workload).

Growth: the warm-up is the first 10% of the rounds, or for a stream (W3) the uploads until
every client has uploaded once, if that is later (until then clients join and the working set of
their data and optimizer states is still being built: W3's 80 clients have all uploaded by its
upload 368); the growth is the peak PSS of the last 10% of the rounds over the peak PSS of the 10%
that follow the warm-up, less one. A simulation that leaks grows in proportion to its length; one
that does not stays near 0.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..results import atomic_path
from .runner import DEFAULT_TIMEOUT_S, _measure, check_request, command
from .workloads import workload_config

if TYPE_CHECKING:
    import pandas as pd

LONG_ROUNDS = {"W1": 1000, "W2": 100, "W3": 25, "W4": 20}  # W3: 25 rounds of 80 uploads = 2,000
QUICK_ROUNDS = {"W1": 30, "W2": 20, "W3": 20, "W4": 20}
SAMPLE_COLUMNS = ["workload", "elapsed_s", "round", "rss_mb", "pss_mb"]
PROCESS_COLUMNS = ["workload", "elapsed_s", "round", "pid", "role", "pss_mb"]


def tag_rounds(
    samples: list[tuple[float, float, float]], marks: list[tuple[float, int]]
) -> list[tuple[float, int, float, float]]:
    """Each sample (time, RSS, PSS) as (seconds since the first sample, the round or upload the
    run had reached when it was taken (0 before the first mark, -1 after the last: the shut-down),
    RSS, PSS)."""
    times = np.array([m[0] for m in marks])
    done = [m[1] for m in marks]
    t0 = samples[0][0] if samples else 0.0
    out = []
    for t, rss, pss in samples:
        i = int(np.searchsorted(times, t, side="right"))
        out.append((t - t0, -1 if i == len(done) else done[i - 1] if i else 0, rss, pss))
    return out


def warm_up(total: int, warmup: int = 0) -> tuple[int, int]:
    """(the rounds of the warm-up, the rounds of a window) of a run of ``total`` rounds: a window
    is 10% of the rounds (at least one); the warm-up one window, or ``warmup`` rounds if more."""
    window = max(1, int(np.ceil(0.1 * total)))
    return max(window, warmup), window


def growth(rounds: np.ndarray, pss: np.ndarray, total: int, warmup: int = 0) -> tuple[float, float, float]:
    """(peak PSS of the window after the warm-up, its growth, peak PSS of the last 10%) for samples
    tagged with ``rounds`` of a run of ``total`` rounds; see the module docstring. The warm-up is
    the first 10% of the rounds, or ``warmup`` rounds if more (a stream's: until every client has
    uploaded once); each window is 10% of the rounds."""
    warm, window = warm_up(total, warmup)
    after = (rounds >= warm) | (rounds < 0)
    first = pss[(rounds >= warm) & (rounds < warm + window)]
    if first.size == 0:  # rounds shorter than the sampling interval: the first sample after the warm-up
        first = pss[after][:1]
    last = pss[(rounds >= total - window) | (rounds < 0)]
    if first.size == 0 or last.size == 0:
        raise ValueError(f"too few samples to measure growth over {total} rounds")
    start = float(first.max())
    return start, float(last.max()) / start - 1.0 if start > 0 else float("nan"), float(last.max())


def role_growth(workload: str, processes: pd.DataFrame, total: int, warmup: int = 0) -> list[dict[str, object]]:
    """:func:`growth` of each role's PSS (summed over its processes at each sample) in the rows of
    ``processes`` (a frame with ``PROCESS_COLUMNS``' elapsed_s, round, pid, role, pss_mb), the
    largest at the end first; roles absent after the warm-up are left out."""
    sums = processes.pivot_table(index=["elapsed_s", "round"], columns="role", values="pss_mb", aggfunc="sum",
                                 fill_value=0.0).reset_index()
    rounds = sums["round"].to_numpy()
    rows = []
    for name in sums.columns.drop(["elapsed_s", "round"]):
        try:
            start, grew, end = growth(rounds, sums[name].to_numpy(), total, warmup)
        except ValueError:
            continue
        if start > 0:
            count = processes[processes.role == name].pid.nunique()
            rows.append({"workload": workload, "role": name, "processes": count, "pss_after_warmup_mb": start,
                         "pss_end_mb": end, "growth": grew})
    return sorted(rows, key=lambda r: -r["pss_end_mb"])


def figure(table: pd.DataFrame, path: Path) -> None:
    """The peak PSS of each round against the round, one panel per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(table["workload"]))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        part = table[(table["workload"] == name) & (table["round"] >= 0)].groupby("round")["pss_mb"].max()
        ax.plot(part.index, part.to_numpy() / 1024, lw=1.0)
        ax.set_title(name)
        ax.set_xlabel("upload" if name == "W3" else "round")
        ax.set_ylabel("peak PSS of the process tree (GB)")
        ax.set_ylim(0, part.max() / 1024 * 1.15)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def long_run(workloads: list[str], rounds: int | None, out: Path, quick: bool,
             timeout: float | None = None) -> pd.DataFrame:
    """Run raysoft alone on each workload for a long run; write memory.parquet, memory.md and
    memory.png into ``out``; return the per-workload growth table."""
    import pandas as pd

    scratch = Path(tempfile.mkdtemp(prefix="raysoft-longrun-"))
    samples, summary, per_process, roles = [], [], [], []
    for w in workloads:
        r = rounds or (QUICK_ROUNDS if quick else LONG_ROUNDS)[w]
        name = "W4:fedsoft" if w == "W4" else w
        res_path = scratch / f"{w}.json"
        cmd = [sys.executable, "-m", "raysoft.bench", "--worker", "raysoft", name, str(r), "1" if quick else "0",
               str(res_path)]
        res, sampler = _measure(f"{name} raysoft (long run)", cmd, res_path, timeout, series=True)
        total = r * workload_config(name, 2, quick)["data"]["clients"] if w == "W3" else r
        tagged = tag_rounds(sampler.samples or [], res["marks"])
        samples += [(w, *s) for s in tagged]
        at = {t: (e, i) for (t, _, _), (e, i, _, _) in zip(sampler.samples or [], tagged)}
        procs = pd.DataFrame([(w, *at[t], pid, role, p) for t, pid, role, p in sampler.processes or []],
                             columns=PROCESS_COLUMNS)
        per_process.append(procs)
        warmup = int(res.get("joined") or 0)
        roles += role_growth(w, procs, total, warmup)
        rr, pss = np.array([s[1] for s in tagged]), np.array([s[3] for s in tagged])
        start, grew, end = growth(rr, pss, total, warmup)
        summary.append({"workload": w, "rounds": total, "warmup": warm_up(total, warmup)[0],
                        "pss_after_warmup_mb": start, "pss_end_mb": end,
                        "growth": grew, "peak_pss_mb": sampler.peak_pss, "total_s": res["total_s"]})
        print(f"{name} long run: {total} {'uploads' if w == 'W3' else 'rounds'}, PSS {start:.0f} -> {end:.0f} MB "
              f"({grew:+.1%})", file=sys.stderr)
    table = pd.DataFrame(samples, columns=SAMPLE_COLUMNS)
    growth_table = pd.DataFrame(summary)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "memory.parquet") as tmp:
        table.to_parquet(tmp, index=False)
    with atomic_path(out / "processes.parquet") as tmp:
        pd.concat(per_process, ignore_index=True).to_parquet(tmp, index=False)
    figure(table, out / "memory.png")
    (out / "memory.md").write_text(markdown(growth_table) + "\n" + roles_markdown(pd.DataFrame(roles)))
    return growth_table


def markdown(table: pd.DataFrame) -> str:
    lines = ["| workload | rounds (W3: uploads) | warm-up | PSS after warm-up (MB) | PSS at the end (MB) | growth | "
             "peak PSS (MB) | total s |", "|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r['workload']} | {int(r['rounds']):,} | {int(r['warmup']):,} | "
                     f"{r['pss_after_warmup_mb']:.0f} | {r['pss_end_mb']:.0f} | {r['growth']:+.1%} | "
                     f"{r['peak_pss_mb']:.0f} | {r['total_s']:.0f} |")
    return "\n".join(lines) + "\n"


def roles_markdown(table: pd.DataFrame) -> str:
    """The growth of each role's PSS (:func:`role_growth`), a row a workload and role."""
    lines = ["| workload | role | processes | PSS after warm-up (MB) | PSS at the end (MB) | growth |",
             "|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r['workload']} | {r['role']} | {int(r['processes'])} | {r['pss_after_warmup_mb']:.0f} | "
                     f"{r['pss_end_mb']:.0f} | {r['growth']:+.1%} |")
    return "\n".join(lines) + "\n"


def main(workloads: list[str], rounds: int | None, out: str | Path, quick: bool,
         timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """``raysoft bench --long-run``: prints the growth table, then (last line) the directory
    holding memory.parquet. Bad input: one line, exit 2; a run that fails: one line, exit 1."""

    def measure() -> pd.DataFrame:
        why = "a long run needs at least 20 rounds (its warm-up is the first 10%)"
        check_request(workloads, rounds, timeout, 20, why)
        return long_run(workloads, rounds, Path(out), quick, timeout)

    return command(measure, markdown, out, (RuntimeError, ValueError))
