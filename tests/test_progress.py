"""Progress lines: the algorithm's name on every line, the ETA from the first report."""

import io

from raysoft import progress
from raysoft.progress import Progress


def test_lines_name_the_algorithm_and_the_eta_ignores_start_up(monkeypatch):
    clock = iter([100.0, 130.0, 130.0, 132.0, 132.0])  # start; first report 30 s later (start-up); 2 s a round
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = Progress(10, "lines", stream=out, label="fedsoft")
    bar({"round": 0, "headline": {"mse[0]": 1.0}})
    bar({"round": 1, "headline": {"mse[0]": 0.5}})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("fedsoft round 0/10  elapsed 0m30s  ETA 0m00s")
    # 2 s for the one round since the first report, 9 rounds left: 18 s (not 32 s / round)
    assert lines[1].startswith("fedsoft round 1/10  elapsed 0m32s  ETA 0m18s  mse[0] 0.5")


def test_rounds_without_a_headline_print_nothing_in_lines_mode():
    out = io.StringIO()
    bar = Progress(4, "lines", stream=out)
    bar({"round": 1, "headline": None})
    assert out.getvalue() == ""
