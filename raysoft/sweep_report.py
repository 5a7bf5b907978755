"""A sweep that talks and reports: its progress while the trials run, its table at the end (like
``raysoft compare``'s) and ``raysoft report SWEEP_DIR``'s figure of the metric over the grid.

A trial's score is its headline metric (``mse`` or ``accuracy``, ``summary.json``'s ``metric``)
of the best center on each distribution, averaged over the distributions (the quantity of the
FedSoft paper's Table 2, one number per trial); ``sweep.parquet`` holds it as ``best_center.<metric>``.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from .metrics import lower_is_better

TABLE = "sweep.md"


def score(summary: Mapping[str, Any]) -> tuple[str, float] | None:
    """(metric, the best center's metric averaged over the distributions) of a finished trial."""
    metric = summary.get("metric")
    dists = summary.get("distributions") or []
    values = [float(d[metric]) for d in dists if isinstance(d, Mapping) and d.get(metric) is not None]
    values = [v for v in values if math.isfinite(v)]
    if not isinstance(metric, str) or not values:
        return None
    return metric, sum(values) / len(values)


def _point_text(point: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def _num(value: float) -> str:
    return f"{value:.4g}"


def status_line(runs: Path, points: Sequence[Mapping[str, object]]) -> str:
    """``sweep: 3 of 8 trials done, 2 running, 3 left; best so far: trial 1 (algorithm.mu=0.1),
    best-center mse 12.3`` from the trials' run directories."""
    done, running, best = 0, 0, None
    for i in range(len(points)):
        d = runs / f"trial-{i:03d}"
        if (d / "summary.json").is_file():
            done += 1
            try:
                s = score(json.loads((d / "summary.json").read_text()))
            except (OSError, ValueError):
                s = None
            if s is not None and (best is None or (s[1] < best[2] if lower_is_better(s[0]) else s[1] > best[2])):
                best = (i, s[0], s[1])
        elif d.is_dir() or (runs / f".trial-{i:03d}.partial").is_dir():
            running += 1
    line = f"sweep: {done} of {len(points)} trials done, {running} running, {len(points) - done - running} left"
    if best is not None:
        i, metric, value = best
        line += f"; best so far: trial {i} ({_point_text(points[i])}), best-center {metric} {_num(value)}"
    return line


class Progress:
    """Prints :func:`status_line` on ``stream`` (stderr) whenever it changes, every ``every_s``
    seconds while the trials run, from a daemon thread; ``stop`` prints the last one."""

    def __init__(self, runs: Path, points: Sequence[Mapping[str, object]], every_s: float = 2.0,
                 stream: TextIO | None = None) -> None:
        self.runs, self.points, self.every_s = runs, points, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.last = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sweep-progress", daemon=True)

    def tick(self) -> None:
        line = status_line(self.runs, self.points)
        if line != self.last:
            self.last = line
            self.stream.write(line + "\n")
            self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    def __enter__(self) -> Progress:
        self.tick()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.tick()


def _metric_column(df: pd.DataFrame) -> str | None:
    cols = [c for c in df.columns if c.startswith("best_center.")]
    return cols[0] if cols else None


def table(df: pd.DataFrame) -> str:
    """sweep.md: one row per trial (its grid values, its score, local mean, seconds, run), the best
    trial marked."""
    grid = [c for c in df.columns if c.startswith("grid.")]
    col = _metric_column(df)
    metric = col.split(".", 1)[1] if col else None
    local = f"local_mean.{metric}" if metric and f"local_mean.{metric}" in df.columns else None
    head = ["trial", *(g[len("grid."):] for g in grid)]
    head += [f"best-center {metric} (mean over distributions)"] if col else []
    head += [f"local {metric} (mean over clients)"] if local else []
    head += ["seconds", "run"]
    best = None
    if col is not None and df[col].notna().any():
        best = int(df.loc[df[col].idxmin() if lower_is_better(metric or "") else df[col].idxmax(), "trial"])
    lines = [f"# Sweep: {len(df)} trials", ""]
    if best is not None and metric is not None:
        better = "lower" if lower_is_better(metric) else "higher"
        lines += [f"Best: trial {best} (**bold**; {better} {metric} is better).", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in df.to_dict("records"):
        cells = [str(r["trial"]), *(str(r[g]) for g in grid)]
        cells += [_num(r[col]) if col and pd.notna(r[col]) else "–"] if col else []
        cells += [_num(r[local]) if pd.notna(r[local]) else "–"] if local else []
        wall = r.get("wall_time_s")
        cells += [f"{wall:.1f}" if isinstance(wall, (int, float)) and pd.notna(wall) else "–",
                  Path(str(r["run_dir"])).name]
        if r["trial"] == best:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(df: pd.DataFrame, path: Path) -> Path | None:
    """The score over the grid: x the first grid key (other than seed) with more than one value,
    one line per value of the next such key, the mean over the rest (seeds) with each trial as a
    point. None when there is no score."""
    col = _metric_column(df)
    if col is None or not df[col].notna().any():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [c for c in df.columns if c.startswith("grid.") and df[c].nunique() > 1]
    keys = [c for c in grid if c != "grid.seed"] or grid or ["trial"]
    x, line = keys[0], (keys[1] if len(keys) > 1 else None)
    numeric = pd.api.types.is_numeric_dtype(df[x])
    positions = {v: i for i, v in enumerate(sorted(df[x].unique(), key=str))}
    fig, ax = plt.subplots(figsize=(6, 4))
    for value, part in (df.groupby(line, sort=True) if line else [(None, df)]):
        xs = part[x] if numeric else part[x].map(positions)
        mean = part.groupby(xs)[col].mean().sort_index()
        label = f"{line[len('grid.'):]}={value}" if line else None
        ax.plot(mean.index, mean.values, marker="o", label=label)
        ax.scatter(xs, part[col], s=12, alpha=0.4, color=ax.lines[-1].get_color())
    if not numeric:
        ax.set_xticks(list(positions.values()), [str(v) for v in positions])
    elif df[x].min() > 0 and df[x].max() / df[x].min() >= 100:
        ax.set_xscale("log")
    metric = col.split(".", 1)[1]
    ax.set_xlabel(x[len("grid."):] if x.startswith("grid.") else x)
    ax.set_ylabel(f"best-center {metric}, mean over distributions")
    rest = [c[len("grid."):] for c in grid if c not in (x, line)]
    ax.set_title("each point a trial" + (f"; lines: mean over {', '.join(rest)}" if rest else ""))
    if line:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def is_sweep_dir(path: str | Path) -> bool:
    p = Path(path)
    return (p / "sweep.yaml").is_file() and not (p / "summary.json").exists()


def report_sweep(path: str | Path) -> list[Path]:
    """``raysoft report SWEEP_DIR``: sweep.md and sweep_<metric>.png into the sweep directory."""
    from .errors import ConfigError

    p = Path(path)
    if not (p / "sweep.parquet").is_file():
        raise ConfigError(f"report: {p} is a sweep that has not finished (no sweep.parquet); "
                          f"raysoft sweep --resume {p} finishes it")
    df = pd.read_parquet(p / "sweep.parquet")
    written = [p / TABLE]
    (p / TABLE).write_text(table(df))
    col = _metric_column(df)
    if col is not None:
        figure = plot(df, p / f"sweep_{col.split('.', 1)[1]}.png")
        written += [figure] if figure else []
    return written


__all__ = ["Progress", "is_sweep_dir", "plot", "report_sweep", "score", "status_line", "table"]
