"""Progress lines: the algorithm's name on every line, the ETA from the first report."""

import io
import re

from raysoft import progress
from raysoft.progress import Progress


def test_lines_name_the_algorithm_and_the_eta_ignores_start_up(monkeypatch):
    clock = iter([100.0, 130.0, 130.0, 132.0, 132.0])  # start; first report 30 s later (start-up); 2 s a round
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = Progress(10, "lines", stream=out, label="fedsoft")
    bar({"round": 0, "headline": {"best center mse dist 0": 445.0, "dist 1": 363.25}})
    bar({"round": 1, "headline": {"best center mse dist 0": 0.5, "dist 1": 12.0}})
    lines = out.getvalue().splitlines()
    # no ETA before a round has been timed (it said ETA 0m00s); every figure in one format (445 beside 363.3)
    assert lines[0] == "fedsoft round 0/10  elapsed 0m30s  best center mse dist 0 445.0  dist 1 363.2"
    # 2 s for the one round since the first report, 9 rounds left: 18 s (not 32 s / round)
    assert lines[1] == "fedsoft round 1/10  elapsed 0m32s  ETA 0m18s  best center mse dist 0 0.5  dist 1 12.0"


def test_the_figures_say_what_they_are_in_rounds_and_streams_alike():
    from raysoft.progress import _fmt_headline

    assert _fmt_headline({"cluster accuracy dist 0": 0.8125, "dist 1": 0.79, "local models accuracy": 0.75}) == (
        "cluster accuracy dist 0 81.2%  dist 1 79.0%  local models accuracy 75.0%")
    assert _fmt_headline({"best center mse dist 0": 269.81, "local models mse": 0.01234}) == (
        "best center mse dist 0 269.8  local models mse 0.0123")


def test_rounds_without_a_headline_print_nothing_in_lines_mode():
    out = io.StringIO()
    bar = Progress(4, "lines", stream=out)
    bar({"round": 1, "headline": None})
    assert out.getvalue() == ""


EVENTS = [{"step": 3, "kind": "fault_injected", "detail": "kill actor 1", "client": -1},
          {"step": 3, "kind": "late_update", "detail": "op train: missed the round deadline", "client": 7}]


def test_what_a_run_survives_is_one_line_each_as_it_happens():
    out = io.StringIO()
    bar = Progress(4, "lines", stream=out, label="ifca")
    bar({"round": 3, "headline": None, "events": EVENTS})
    assert out.getvalue().splitlines() == ["ifca round 3: fault_injected: kill actor 1",
                                           "ifca round 3: late_update, client 7: op train: missed the round deadline"]


def test_an_event_line_starts_below_the_bar_and_none_is_silent():
    out = io.StringIO()
    bar = Progress(4, "bar", stream=out)
    bar({"round": 2, "headline": None})
    bar({"round": 3, "headline": None, "events": EVENTS[:1]})
    text = out.getvalue()
    assert "round 3: fault_injected: kill actor 1" in re.split(r"[\r\n]", text)  # a line of its own, not glued
    assert "3/4" in text.rsplit("kill actor 1", 1)[1]  # the bar is drawn again below it
    quiet = io.StringIO()
    Progress(4, "none", stream=quiet)({"round": 3, "headline": None, "events": EVENTS})
    assert quiet.getvalue() == ""


def test_a_rounds_client_events_are_one_line_a_kind():
    # the README's straggler clock said 1,312 late_update lines in 50 rounds, burying the progress line
    late = [{"step": 4, "kind": "late_update", "client": k,
             "detail": f"op train: would take {20 + k} simulated s, past the round deadline of 20 s"} for k in
            (41, 3, 8, 12, 40, 9, 77)]
    nan = [{"step": 4, "kind": "nan_update", "detail": "op train: non-finite update", "client": k} for k in (5, 6)]
    out = io.StringIO()
    Progress(50, "lines", stream=out, label="fedsoft")({"round": 4, "headline": None,
                                                        "events": [*late[:3], *nan, *late[3:], EVENTS[0]]})
    assert out.getvalue().splitlines() == [
        "fedsoft round 4: late_update, 7 clients (3, 8, 9, 12, 40, ...); each one in events.parquet",
        "fedsoft round 4: nan_update, 2 clients (5, 6): op train: non-finite update; each one in events.parquet",
        "fedsoft round 3: fault_injected: kill actor 1"]


def test_a_closed_bar_stays_as_it_was_and_draws_nothing_more():
    """A stopped run closes its bar before the stop message: the message's line is the last."""
    out = io.StringIO()
    bar = Progress(5, "bar", stream=out)
    bar({"round": 2, "headline": None})
    bar.close()
    drawn = out.getvalue()
    assert "2/5" in drawn and drawn.endswith("\n") and bar.bar is None
    out.write("raysoft: run stopped by SIGINT\n")
    bar.close()  # twice is harmless
    assert out.getvalue() == drawn + "raysoft: run stopped by SIGINT\n"


def test_a_round_replayed_after_a_recovery_is_said_once():
    # a run that recovers from its last checkpoint (round 3) replays round 4: its line was said twice
    out = io.StringIO()
    bar = Progress(6, "lines", stream=out, label="fedsoft")
    for r in (3, 4, 4, 5):
        bar({"round": r, "headline": {"mse[0]": float(r)}})
    rounds = [line.split()[2] for line in out.getvalue().splitlines()]
    assert rounds == ["3/6", "4/6", "5/6"]
