"""A sweep that talks and reports (issue #55): it was silent for its whole run, printed no table,
and ``raysoft report SWEEP_DIR`` said "not a run directory". The trials here are fake run
directories (a summary.json each); tests/test_sweep.py runs real sweeps on Ray."""

from __future__ import annotations

import io
import json

import pandas as pd
import yaml

from raysoft.cli import main
from raysoft.sweep_report import Progress, score, status_line, table

POINTS = [{"algorithm.mu": mu, "seed": seed} for mu in (0.01, 0.1, 1.0) for seed in (0, 1)]


def _summary(mse0: float, mse1: float) -> dict:
    return {"metric": "mse", "distributions": [{"distribution": 0, "best_center": 1, "mse": mse0},
                                               {"distribution": 1, "best_center": 0, "mse": mse1}],
            "local_mean": {"mse": mse0 / 2}, "wall_time_s": 1.5}


def _finish(runs, i, summary):
    d = runs / f"trial-{i:03d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps(summary))


def test_a_trial_scores_its_best_centers_mean():
    assert score(_summary(10.0, 20.0)) == ("mse", 15.0)
    assert score({"metric": "accuracy", "distributions": [{"accuracy": 0.5}, {"accuracy": 0.7}]})[1] == 0.6
    assert score({"metric": "mse"}) is None


def test_progress_says_done_running_left_and_the_best_so_far(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    assert status_line(runs, POINTS) == "sweep: 0 of 6 trials done, 0 running, 6 left"
    _finish(runs, 0, _summary(10.0, 20.0))  # 15
    _finish(runs, 3, _summary(4.0, 8.0))  # 6: the best
    (runs / "trial-001").mkdir()  # a checkpointed trial running
    (runs / ".trial-002.partial").mkdir()  # a trial without checkpoints running
    assert status_line(runs, POINTS) == ("sweep: 2 of 6 trials done, 2 running, 2 left; best so far: trial 3 "
                                         "(algorithm.mu=0.1, seed=1), best-center mse 6")
    out = io.StringIO()
    with Progress(runs, POINTS, every_s=60, stream=out):
        _finish(runs, 4, _summary(1.0, 2.0))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("sweep: 3 of 6 trials done, 2 running, 1 left; best so far: "
                                                    "trial 4 (algorithm.mu=1.0, seed=0), best-center mse 1.5")


def _sweep_dir(tmp_path):
    d = tmp_path / "sweep-x"
    runs = d / "runs"
    rows = []
    for i, point in enumerate(POINTS):
        s = _summary(10.0 * (1 + point["algorithm.mu"]) + point["seed"], 20.0)
        _finish(runs, i, s)
        rows.append({"trial": i, **{f"grid.{k}": v for k, v in point.items()}, "run_dir": str(runs / f"trial-{i:03d}"),
                     "best_center.mse": score(s)[1], "local_mean.mse": s["local_mean"]["mse"], "wall_time_s": 1.5})
    (d / "sweep.yaml").write_text(yaml.safe_dump({"grid": {"algorithm.mu": [0.01, 0.1, 1.0], "seed": [0, 1]}}))
    pd.DataFrame(rows).to_parquet(d / "sweep.parquet")
    return d


def test_the_table_marks_the_best_trial(tmp_path):
    text = table(pd.read_parquet(_sweep_dir(tmp_path) / "sweep.parquet"))
    lines = text.splitlines()
    assert lines[0] == "# Sweep: 6 trials"
    assert "Best: trial 0 (**bold**; lower mse is better)." in lines
    head = next(line for line in lines if line.startswith("| trial"))
    assert head == ("| trial | algorithm.mu | seed | best-center mse (mean over distributions) | local mse (mean over "
                    "clients) | seconds | run |")
    assert "| **0** | **0.01** | **0** | **15.05** | **5.05** | **1.5** | **trial-000** |" in lines
    assert "| 5 | 1.0 | 1 | 20.5 | 10.5 | 1.5 | trial-005 |" in lines


def test_report_of_a_sweep_dir_writes_its_table_and_figure(tmp_path, capsys):
    d = _sweep_dir(tmp_path)
    assert main(["report", str(d)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# Sweep: 6 trials" and out[-2:] == [str(d / "sweep.md"), str(d / "sweep_mse.png")]
    assert (d / "sweep_mse.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_an_unfinished_sweep_says_how_to_finish_it(tmp_path, capsys):
    d = _sweep_dir(tmp_path)
    (d / "sweep.parquet").unlink()
    assert main(["report", str(d)]) == 2
    assert capsys.readouterr().err == (f"raysoft report: report: {d} is a sweep that has not finished (no "
                                       f"sweep.parquet); raysoft sweep --resume {d} finishes it\n")
